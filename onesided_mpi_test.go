//go:build mpi && cgo

package ddstore_test

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/ddstore-go/ddstore"
	"github.com/ddstore-go/ddstore/internal/mpirun"
	"github.com/ddstore-go/ddstore/internal/testutil"
)

// mpiReadsEnv marks the copies of the test binary that mpirun starts as
// the ranks of TestMPIReads; its value is the case's width.
const mpiReadsEnv = "DDSTORE_TEST_MPI_READS"

// TestMPIReads: the ranks of an mpirun launch, on two simulated nodes, each
// with a store of Method "mpi", read every row of the other node with MPI
// gets from their own process (none through the agents), also across
// replica groups, and the rows are right.
func TestMPIReads(t *testing.T) {
	if os.Getenv(mpiReadsEnv) != "" {
		t.Skip("a rank of TestMPIReads")
	}
	launcher, err := mpirun.Find()
	if err != nil {
		t.Skip(err)
	}
	for _, c := range []struct{ np, width int }{{2, 0}, {4, 0}, {4, 2}} {
		t.Run(fmt.Sprintf("%d ranks width %d", c.np, c.width), func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
			defer cancel()
			args := append(launcher.Args(c.np), testutil.SelfTestArgs(t, "TestMPIReadsRank")...)
			runDir := t.TempDir()
			if err := os.Chmod(runDir, 0o700); err != nil {
				t.Fatal(err)
			}
			cmd := exec.CommandContext(ctx, launcher.Path, args...)
			cmd.Env = append(os.Environ(), mpiReadsEnv+"="+strconv.Itoa(c.width), reuseBinEnv+"="+ddstoreBin,
				"DDSTORE_TEST_RENDEZVOUS="+freeAddr(t), "DDSTORE_TEST_RUN_DIR="+runDir,
				fmt.Sprintf("DDSTORE_TEST_NAMESPACE=mpireads-%d-%d", os.Getpid(), c.np*10+c.width), testutil.NoRaceExitPause)
			out, err := cmd.CombinedOutput()
			if err != nil || bytes.Count(out, []byte("--- PASS: TestMPIReadsRank")) != c.np || bytes.Contains(out, []byte("FAIL")) {
				logs, _ := filepath.Glob(filepath.Join(runDir, "*.log"))
				for _, l := range logs {
					b, _ := os.ReadFile(l)
					t.Logf("%s:\n%s", l, b)
				}
				t.Fatalf("%s -np %d: %v\n%s", launcher.Path, c.np, err, out)
			}
		})
	}
}

// mpiRow is the content of global row g: g in every 8-byte word.
func mpiRow(g int64, rb int) []byte {
	b := make([]byte, rb)
	for o := 0; o+8 <= rb; o += 8 {
		binary.LittleEndian.PutUint64(b[o:], uint64(g)*1000+uint64(o))
	}
	return b
}

func TestMPIReadsRank(t *testing.T) {
	ws := os.Getenv(mpiReadsEnv)
	if ws == "" {
		t.Skip("run by TestMPIReads under mpirun")
	}
	width, _ := strconv.Atoi(ws)
	rank, size, ok := mpirun.Rank()
	if !ok || size < 2 {
		t.Fatalf("no MPI rank in the environment")
	}
	// Two simulated nodes: halves of the ranks, or, with replica groups of
	// consecutive ranks, alternating, so that each group spans both.
	node := rank * 2 / size
	if width > 0 {
		node = rank % 2
	}
	local, localSize := 0, 0
	for r := range size {
		n := r * 2 / size
		if width > 0 {
			n = r % 2
		}
		if n == node {
			if r < rank {
				local++
			}
			localSize++
		}
	}
	s, err := ddstore.Open(ddstore.Config{Method: ddstore.MethodMPI, Rank: rank, Size: size, LocalRank: local, LocalSize: localSize,
		Node: fmt.Sprintf("n%d", node), Namespace: os.Getenv("DDSTORE_TEST_NAMESPACE"), RunDir: os.Getenv("DDSTORE_TEST_RUN_DIR"),
		AgentBinary: ddstoreBin, AgentArgs: []string{"--rendezvous", os.Getenv("DDSTORE_TEST_RENDEZVOUS"), "--peer-listen", "127.0.0.1:0", "--idle-exit", "5s"},
		Width: width})
	if err != nil {
		t.Fatal(err)
	}
	_, grank, gsize := s.Group()
	const rb = 1000
	count := func(r int) int64 { return int64(40 + 7*r) }
	var first, total int64
	for r := range gsize {
		if r < grank {
			first += count(r)
		}
		total += count(r)
	}
	rows := make([]byte, 0, count(grank)*rb)
	for g := first; g < first+count(grank); g++ {
		rows = append(rows, mpiRow(g, rb)...)
	}
	if err := s.Add("v", rows, rb/8, 8); err != nil {
		t.Fatal(err)
	}
	// Every row, in a shuffled batch; then single rows; then a range
	// across every shard.
	idx := make([]int64, total)
	for i := range idx {
		idx[i] = int64(i)
	}
	rand.Shuffle(len(idx), func(i, j int) { idx[i], idx[j] = idx[j], idx[i] })
	dst := make([]byte, total*rb)
	if err := s.GetBatch("v", dst, idx); err != nil {
		t.Fatal(err)
	}
	for i, g := range idx {
		if !bytes.Equal(dst[int64(i)*rb:int64(i+1)*rb], mpiRow(g, rb)) {
			t.Fatalf("rank %d: batch row %d (global %d) is wrong", rank, i, g)
		}
	}
	one := make([]byte, rb)
	for g := range total {
		if err := s.Get("v", one, g); err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(one, mpiRow(g, rb)) {
			t.Fatalf("rank %d: row %d is wrong", rank, g)
		}
	}
	if err := s.Get("v", dst, 0); err != nil {
		t.Fatal(err)
	}
	for g := range total {
		if !bytes.Equal(dst[g*rb:(g+1)*rb], mpiRow(g, rb)) {
			t.Fatalf("rank %d: range row %d is wrong", rank, g)
		}
	}
	p, err := s.Profile("v")
	if err != nil {
		t.Fatal(err)
	}
	if p.RemoteRows == 0 || p.OneSided != p.RemoteRows {
		t.Fatalf("rank %d: %d rows of other nodes, %d of them by MPI gets: want all", rank, p.RemoteRows, p.OneSided)
	}
	if err := s.Free("v"); err != nil {
		t.Fatal(err)
	}
	if err := s.Get("v", one, 0); !errors.Is(err, ddstore.ErrFreed) {
		t.Fatalf("read after Free: %v, want ErrFreed", err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
}

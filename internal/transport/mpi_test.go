//go:build mpi && cgo

package transport

// The MPI transport between real MPI ranks: TestConformanceMPI and
// TestMPIWorldOfOne run this test binary under mpirun, where TestMPIRank
// plays each rank (it skips when not started so). The ranks meet through
// files in a directory: each writes its world id, and each owner node the
// address its peer server listens on; from then on the suite drives the
// owners over TCP (conformance_test.go).

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/ddstore-go/ddstore/internal/base"
	"github.com/ddstore-go/ddstore/internal/mpirun"
	"github.com/ddstore-go/ddstore/internal/testutil"
	"github.com/ddstore-go/ddstore/internal/wire"
)

const (
	mpiRankEnv = "DDSTORE_MPI_TEST_DIR" // set for the ranks: the meeting directory
	mpiRB      = 4096                   // bytes per row
)

func launchRanks(t *testing.T, np int, timeout time.Duration) {
	t.Helper()
	launcher, err := mpirun.Find()
	if err != nil {
		t.Skip(err)
	}
	dir := t.TempDir()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	args := append(launcher.Args(np), testutil.SelfTestArgs(t, "TestMPIRank")...)
	cmd := exec.CommandContext(ctx, launcher.Path, args...)
	cmd.Env = append(os.Environ(), mpiRankEnv+"="+dir, testutil.NoRaceExitPause)
	out, err := cmd.CombinedOutput()
	if err != nil || !bytes.Contains(out, []byte("--- PASS: TestMPIRank")) || bytes.Contains(out, []byte("FAIL")) {
		t.Fatalf("mpirun -np %d: %v\n%s", np, err, out)
	}
	t.Logf("mpirun -np %d:\n%s", np, out)
}

// TestConformanceMPI runs the conformance suite between three ranks: rank
// 0 reads, ranks 1 and 2 are its owner nodes.
func TestConformanceMPI(t *testing.T) {
	if os.Getenv(mpiRankEnv) != "" {
		t.Skip("a rank of the launch")
	}
	launchRanks(t, 3, 4*time.Minute)
}

// TestMPIWorldOfOne: an agent started alone is a world of one.
func TestMPIWorldOfOne(t *testing.T) {
	if os.Getenv(mpiRankEnv) != "" {
		t.Skip("a rank of the launch")
	}
	launchRanks(t, 1, time.Minute)
}

// meeting is the directory the ranks meet in.
type meeting string

func (d meeting) put(t *testing.T, name string, b []byte) {
	t.Helper()
	tmp := filepath.Join(string(d), name+".tmp")
	if err := os.WriteFile(tmp, b, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, filepath.Join(string(d), name)); err != nil {
		t.Fatal(err)
	}
}

func (d meeting) wait(t *testing.T, name string) []byte {
	t.Helper()
	var b []byte
	testutil.WaitFor(t, time.Minute, func() (err error) {
		b, err = os.ReadFile(filepath.Join(string(d), name))
		return err
	})
	return b
}

// mpiOpen opens this rank's engine as an agent does, and checks what MPI
// promises beyond the suite: one MPI per process, and one world id that
// every rank agrees on.
func mpiOpen(t *testing.T, d meeting, rank, size int, pool *Pool) *MPI {
	t.Helper()
	e, err := Open(KindMPI, EngineOptions{Pool: pool, Timeout: 30 * time.Second, Grace: confGrace, Logger: discardLog()})
	if err != nil {
		t.Fatal(err)
	}
	m := e.(*MPI)
	if m2, err := NewMPI(MPIOptions{}); m2 != nil || !errors.Is(err, base.ErrArgument) {
		t.Errorf("second NewMPI in one process: %v, %v; want ErrArgument", m2, err)
	}
	if m.Size() != size || m.Rank() != rank || m.World() == 0 || !m.Serial() || !m.Collective() {
		t.Fatalf("rank %d of %d, world %#x, serial %v, collective %v; the launcher says rank %d of %d",
			m.Rank(), m.Size(), m.World(), m.Serial(), m.Collective(), rank, size)
	}
	d.put(t, fmt.Sprintf("world.%d", rank), binary.LittleEndian.AppendUint64(nil, m.World()))
	for r := range size {
		if w := binary.LittleEndian.Uint64(d.wait(t, fmt.Sprintf("world.%d", r))); w != m.World() {
			t.Fatalf("world %#x here, %#x on rank %d", m.World(), w, r)
		}
	}
	return m
}

// TestMPIRank plays one rank of TestConformanceMPI (rank 0 runs the suite,
// the others are its owner nodes) or the only rank of TestMPIWorldOfOne.
func TestMPIRank(t *testing.T) {
	dir := os.Getenv(mpiRankEnv)
	if dir == "" {
		t.Skip("run by TestConformanceMPI and TestMPIWorldOfOne under mpirun")
	}
	d := meeting(dir)
	rank, size, ok := mpirun.Rank()
	if !ok {
		t.Fatal("the launcher gave no rank")
	}
	if size == 1 {
		mpiWorldOfOne(t)
		return
	}
	if size != 3 {
		t.Fatalf("a launch of %d ranks, want 3", size)
	}
	if rank > 0 {
		pool := NewPool(Options{})
		o, err := startConfOwner(mpiOpen(t, d, rank, size, pool), pool)
		if err != nil {
			t.Fatal(err)
		}
		d.put(t, fmt.Sprintf("owner.%d", rank), []byte(o.Addr()))
		if err := o.serve(); err != nil { // until the suite closes it
			t.Fatal(err)
		}
		return
	}
	testEngine(t, KindMPI, func(t *testing.T) confNet {
		n := confNet{pool: NewPool(Options{})}
		m := mpiOpen(t, d, rank, size, n.pool)
		n.reader = m
		for k := range n.owners {
			n.owners[k] = string(d.wait(t, fmt.Sprintf("owner.%d", k+1)))
		}
		n.specific = func(t *testing.T) {
			mpiOtherWorld(t, &n, m)
			mpiBatch(t, &n, m)
		}
		return n
	})
}

// mpiOtherWorld: a peer whose window names another MPI world (an agent of
// another launch) is refused before any get.
func mpiOtherWorld(t *testing.T, n *confNet, m *MPI) {
	n.mustCall(t, 0, opConfPublish, confVar{Name: "other-world", ID: 60, RowBytes: mpiRB, Shards: []confShard{{0, 2}}}, nil)
	describe := m.opts.Describe
	m.opts.Describe = func(ctx context.Context, addr, name string, id int64) (wire.Window, error) {
		w, err := describe(ctx, addr, name, id)
		w.World++
		return w, err
	}
	defer func() { m.opts.Describe = describe }()
	err := m.Fetch(context.Background(), n.owners[0], "other-world", 60, []int64{0}, [][]byte{make([]byte, mpiRB)})
	if !errors.Is(err, base.ErrArgument) || !strings.Contains(err.Error(), "MPI world") {
		t.Errorf("peer of another world: %v, want ErrArgument", err)
	}
}

// mpiBatch: one FetchBatch over both owners reads every row right; once
// owner 0's shards were freed and their name taken by another table
// (maybe at the same addresses) while the reader still knew the old
// window, a batch of the old table is ErrFreed, laid to owner 0's part —
// never rows of the new table — and, owner 1's taken too, a batch of the
// new table reads the new rows.
func mpiBatch(t *testing.T, n *confNet, m *MPI) {
	s := confSpread{name: "batch", id: 70, rb: 512, rows: [3]int64{40, 20, 10}}
	n.publish(t, s)
	globals := []int64{confBase + 61, confBase, confBase + 45, confBase + 65, confBase + 59, confBase + 1, confBase + 62}
	read := func(id int64) (*confDst, int, error) {
		dst := newConfDst(len(globals), s.rb, true)
		parts := []FetchPart{{Addr: n.owners[0]}, {Addr: n.owners[1]}}
		for i, g := range globals {
			p := &parts[s.owner(g)]
			p.Globals, p.Dst = append(p.Globals, g), append(p.Dst, dst.rows[i])
		}
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		i, err := m.FetchBatch(ctx, s.name, id, parts)
		return dst, i, err
	}
	dst, _, err := read(s.id)
	if err != nil {
		t.Fatalf("a batch over both owners: %v", err)
	}
	if err := dst.check(s.name, s.id, globals); err != nil {
		t.Fatal(err)
	}

	// Owner 0's window described with the token of another table (as if
	// its shard had left the window after the description): the token
	// check fails for that owner alone, on both tries, and the batch is
	// ErrFreed rather than rows.
	other := confVar{Name: "batch-other", ID: 72, RowBytes: s.rb, Shards: []confShard{{0, 2}}}
	n.mustCall(t, 0, opConfPublish, other, nil)
	ow, err := m.opts.Describe(context.Background(), n.owners[0], other.Name, other.ID)
	if err != nil || len(ow.Shards) != 1 {
		t.Fatalf("the window of %q: %+v, %v", other.Name, ow, err)
	}
	describe := m.opts.Describe
	m.opts.Describe = func(ctx context.Context, addr, name string, id int64) (wire.Window, error) {
		w, err := describe(ctx, addr, name, id)
		if addr == n.owners[0] && name == s.name {
			w.Shards = slices.Clone(w.Shards)
			for k := range w.Shards {
				w.Shards[k].Token = ow.Shards[0].Token
			}
		}
		return w, err
	}
	m.cache.forget(n.owners[0], s.name)
	_, i, err := read(s.id)
	m.opts.Describe = describe
	m.cache.forget(n.owners[0], s.name)
	wantErr(t, "a batch whose token check fails on one owner", err, base.ErrFreed)
	if err != nil && i != 0 {
		t.Errorf("the batch's error is laid to part %d, want 0 (the owner whose token did not hold): %v", i, err)
	}

	next := s
	next.id = 71
	var w confWithdrawn
	n.mustCall(t, 0, opConfFree, confName{other.Name}, &w)
	n.mustCall(t, 0, opConfFree, confName{s.name}, &w)
	n.mustCall(t, 0, opConfPublish, next.parts()[0], nil)
	_, i, err = read(s.id)
	wantErr(t, "a batch of a table freed on one owner, its name taken again", err, base.ErrFreed)
	if err != nil && i != 0 {
		t.Errorf("the batch's error is laid to part %d, want 0 (the owner that freed): %v", i, err)
	}
	n.mustCall(t, 1, opConfFree, confName{s.name}, &w)
	n.mustCall(t, 1, opConfPublish, next.parts()[1], nil)
	if dst, _, err = read(next.id); err != nil {
		t.Fatalf("a batch of the new table: %v", err)
	}
	if err := dst.check(next.name, next.id, globals); err != nil {
		t.Fatal(err)
	}
	for k := range n.owners {
		n.mustCall(t, k, opConfFree, confName{s.name}, &w)
	}
}

// mpiWorldOfOne: alone in its world, the transport makes no window (Open
// MPI 4.1 cannot), exposes nothing, and refuses reads of other nodes.
func mpiWorldOfOne(t *testing.T) {
	m, err := NewMPI(MPIOptions{Grace: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	if m.Size() != 1 || m.Rank() != 0 {
		t.Fatalf("rank %d of %d, want the only rank", m.Rank(), m.Size())
	}
	mem, err := unix.Mmap(-1, 0, 2*mpiRB, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED|unix.MAP_ANONYMOUS)
	if err != nil {
		t.Fatal(err)
	}
	e, err := m.Expose(mem, 7)
	if err != nil || e.Exposed() {
		t.Fatalf("Expose in a world of one: %+v, %v; want nothing exposed", e, err)
	}
	unmapped := false
	m.Withdraw(e, func() { unmapped = true; unix.Munmap(mem) })
	if !unmapped {
		t.Error("Withdraw of an unexposed shard did not unmap at once")
	}
	err = m.Fetch(context.Background(), "elsewhere", "x", 7, []int64{0}, [][]byte{make([]byte, mpiRB)})
	if !errors.Is(err, base.ErrArgument) || !strings.Contains(err.Error(), "only rank") {
		t.Errorf("Fetch in a world of one: %v, want ErrArgument", err)
	}
	if err := m.Close(); err != nil {
		t.Fatal(err)
	}
}

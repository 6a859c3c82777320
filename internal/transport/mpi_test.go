//go:build mpi && cgo

package transport

// The MPI transport between real MPI ranks: TestMPI runs this test binary
// under mpirun, where TestMPIRank plays each rank (it skips when not started
// so). The ranks meet through files in a directory: rank 1 writes the
// window of its shards (what PeerWindow would answer), rank 0 reads with
// Fetch, and each step waits for a file of the other's.

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
	"strings"
	"sync"
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
	mpiRowsA   = 300                    // rows of shard A (global rows [0, 300))
	mpiRowsB   = 50                     // rows of shard B (global rows [300, 350))
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

// TestMPI: two ranks, then a world of one.
func TestMPI(t *testing.T) {
	if os.Getenv(mpiRankEnv) != "" {
		t.Skip("a rank of TestMPI")
	}
	t.Run("two ranks", func(t *testing.T) { launchRanks(t, 2, 2*time.Minute) })
	t.Run("one rank", func(t *testing.T) { launchRanks(t, 1, time.Minute) })
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

// describe is PeerWindow over the meeting directory: "window.NAME" holds
// the encoded window of variable NAME, "freed.NAME.ID" says it was freed.
func (d meeting) describe(ctx context.Context, addr, name string, id int64) (wire.Window, error) {
	if _, err := os.Stat(filepath.Join(string(d), fmt.Sprintf("freed.%s.%d", name, id))); err == nil {
		return wire.Window{}, base.Errorf(base.ErrFreed, "variable %q (id %d) was freed", name, id)
	}
	b, err := os.ReadFile(filepath.Join(string(d), "window."+name))
	if err != nil {
		return wire.Window{}, base.Errorf(base.ErrUnknown, "no variable %q: %v", name, err)
	}
	return wire.DecodeWindow(b)
}

// shard is mapped memory (MPI keeps pointers to it: not Go memory).
func shard(t *testing.T, rows int, first int64) []byte {
	t.Helper()
	mem, err := unix.Mmap(-1, 0, rows*mpiRB, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED|unix.MAP_ANONYMOUS)
	if err != nil {
		t.Fatal(err)
	}
	for r := range rows {
		fillRow(mem[r*mpiRB:(r+1)*mpiRB], first+int64(r))
	}
	return mem
}

func fillRow(row []byte, g int64) {
	for w := 0; w < len(row); w += 8 {
		binary.LittleEndian.PutUint64(row[w:], uint64(g)<<20|uint64(w))
	}
}

func rowIs(row []byte, g int64) bool {
	want := make([]byte, len(row))
	fillRow(want, g)
	return bytes.Equal(row, want)
}

func TestMPIRank(t *testing.T) {
	dir := os.Getenv(mpiRankEnv)
	if dir == "" {
		t.Skip("run by TestMPI under mpirun")
	}
	d := meeting(dir)
	m, err := NewMPI(MPIOptions{Describe: d.describe, Grace: 200 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	if m2, err := NewMPI(MPIOptions{Describe: d.describe}); m2 != nil || !errors.Is(err, base.ErrArgument) {
		t.Errorf("second NewMPI in one process: %v, %v; want ErrArgument", m2, err)
	}
	if m.Size() == 1 {
		mpiWorldOfOne(t, m)
		return
	}
	if m.Size() != 2 || m.Rank() < 0 || m.Rank() > 1 || m.World() == 0 {
		t.Fatalf("rank %d of %d, world %#x", m.Rank(), m.Size(), m.World())
	}
	d.put(t, fmt.Sprintf("world.%d", m.Rank()), binary.LittleEndian.AppendUint64(nil, m.World()))
	if w := binary.LittleEndian.Uint64(d.wait(t, fmt.Sprintf("world.%d", 1-m.Rank()))); w != m.World() {
		t.Fatalf("world %#x here, %#x on the other rank", m.World(), w)
	}
	if m.Rank() == 1 {
		mpiOwner(t, m, d)
	} else {
		mpiReader(t, m, d)
	}
	if err := m.Close(); err != nil { // collective: both ranks get here
		t.Fatal(err)
	}
	if err := m.Fetch(context.Background(), "rank1", "x", 7, []int64{0}, [][]byte{make([]byte, mpiRB)}); !errors.Is(err, base.ErrClosed) {
		t.Errorf("Fetch after Close: %v, want ErrClosed", err)
	}
}

// mpiWorldOfOne: alone in its world, the transport makes no window (Open
// MPI 4.1 cannot), exposes nothing, and refuses reads of other nodes.
func mpiWorldOfOne(t *testing.T, m *MPI) {
	mem := shard(t, 2, 0)
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

func mpiOwner(t *testing.T, m *MPI, d meeting) {
	a, b := shard(t, mpiRowsA, 0), shard(t, mpiRowsB, mpiRowsA)
	ea, err := m.Expose(a, 7)
	if err != nil {
		t.Fatal(err)
	}
	eb, err := m.Expose(b, 7)
	if err != nil {
		t.Fatal(err)
	}
	w := wire.Window{World: m.World(), Rank: int64(m.Rank()), RowBytes: mpiRB, Shards: []wire.WindowShard{
		{First: 0, Rows: mpiRowsA, Addr: ea.Addr, Token: ea.Token},
		{First: mpiRowsA, Rows: mpiRowsB, Addr: eb.Addr, Token: eb.Token},
	}}
	var enc wire.Encoder
	w.Encode(&enc)
	d.put(t, "window.x", enc.Bytes())

	// The reader has read; now shard A goes (its variable freed), and a
	// new one takes its place, maybe at the same address, with another id.
	d.wait(t, "read")
	unmapped := make(chan struct{})
	d.put(t, "freed.x.7", nil)
	m.Withdraw(ea, func() { unix.Munmap(a); close(unmapped) })
	select {
	case <-unmapped:
		t.Fatal("unmapped before the grace period")
	case <-time.After(50 * time.Millisecond):
	}
	<-unmapped
	a2 := shard(t, mpiRowsA, 1000)
	ea2, err := m.Expose(a2, 8)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("shard A at %#x, its successor at %#x", ea.Addr, ea2.Addr)
	d.put(t, "replaced", nil)
	d.wait(t, "done")
	m.Withdraw(eb, func() { unix.Munmap(b) })
	m.Withdraw(ea2, func() { unix.Munmap(a2) })
}

func mpiReader(t *testing.T, m *MPI, d meeting) {
	d.wait(t, "window.x")
	ctx := context.Background()
	const total = mpiRowsA + mpiRowsB
	read := func(globals []int64) ([]byte, error) {
		buf := make([]byte, len(globals)*mpiRB)
		dst := make([][]byte, len(globals))
		for i := range dst {
			dst[i] = buf[i*mpiRB : (i+1)*mpiRB]
		}
		return buf, m.Fetch(ctx, "rank1", "x", 7, globals, dst)
	}
	check := func(buf []byte, globals []int64) error {
		for i, g := range globals {
			if !rowIs(buf[i*mpiRB:(i+1)*mpiRB], g) {
				return fmt.Errorf("row %d (position %d) read wrong: %x", g, i, buf[i*mpiRB:i*mpiRB+16])
			}
		}
		return nil
	}

	// Every row at once, in order (gets merged), then random batches with
	// repeats across both shards, from several goroutines at once.
	all := make([]int64, total)
	for i := range all {
		all[i] = int64(i)
	}
	buf, err := read(all)
	if err != nil {
		t.Fatal(err)
	}
	if err := check(buf, all); err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	errs := make([]error, 8)
	for gr := range errs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(gr), 3))
			for range 50 {
				idx := make([]int64, 1+rng.IntN(256))
				for i := range idx {
					idx[i] = rng.Int64N(total)
				}
				buf, err := read(idx)
				if err == nil {
					err = check(buf, idx)
				}
				if err != nil {
					errs[gr] = err
					return
				}
			}
		}()
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		t.Fatal(err)
	}
	// A row the window does not hold, and a context already over.
	if _, err := read([]int64{total}); !errors.Is(err, base.ErrArgument) {
		t.Errorf("row beyond the window: %v, want ErrArgument", err)
	}
	cctx, cancel := context.WithCancel(ctx)
	cancel()
	if err := m.Fetch(cctx, "rank1", "x", 7, []int64{0}, [][]byte{make([]byte, mpiRB)}); !errors.Is(err, base.ErrTimeout) {
		t.Errorf("cancelled context: %v, want ErrTimeout", err)
	}
	// A peer of another world is refused before any get.
	other := func(ctx context.Context, addr, name string, id int64) (wire.Window, error) {
		w, err := d.describe(ctx, addr, name, id)
		w.World++
		return w, err
	}
	m.opts.Describe = other
	if err := m.Fetch(ctx, "rank1-other", "x", 7, []int64{0}, [][]byte{make([]byte, mpiRB)}); !errors.Is(err, base.ErrArgument) || !strings.Contains(err.Error(), "MPI world") {
		t.Errorf("peer of another world: %v, want ErrArgument", err)
	}
	m.opts.Describe = d.describe

	d.put(t, "read", nil)
	// The cached window still names shard A: once it is withdrawn (and
	// maybe replaced by another at the same address), rows of it fail
	// with ErrFreed, never come back as the newer shard's.
	d.wait(t, "replaced")
	for _, g := range []int64{5, mpiRowsA - 1} {
		buf, err := read([]int64{g})
		if !errors.Is(err, base.ErrFreed) {
			t.Errorf("row %d of a withdrawn shard: %v (row read as %x), want ErrFreed", g, err, buf[:16])
		}
	}
	d.put(t, "done", nil)
}

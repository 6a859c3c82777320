package tier

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/ddstore-go/ddstore/internal/base"
	"github.com/ddstore-go/ddstore/internal/testutil"
)

const rb = 16

// rawFile writes n rows of rb bytes, row g filled with byte g.
func rawFile(t *testing.T, n int) string {
	t.Helper()
	b := make([]byte, n*rb)
	for g := range n {
		for i := range rb {
			b[g*rb+i] = byte(g)
		}
	}
	p := filepath.Join(t.TempDir(), "rows.bin")
	if err := os.WriteFile(p, b, 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// newTier is a tier of 100 rows, 10 held by shards, its prefetcher run as
// a goroutine the test waits for; admit is the budget.
func newTier(t *testing.T, admit func(int64, func(string) string) (func(), error)) (*Tier, *Counters) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	c := &Counters{}
	tr := New(Config{Name: "v", Spec: rawFile(t, 100), RowBytes: rb, Held: 10, Total: 100, StagingBytes: 8 * rb,
		Admit: admit, Context: ctx, Timeout: 5 * time.Second, Counters: c,
		Go: func(f func()) { wg.Add(1); go func() { defer wg.Done(); f() }() }})
	t.Cleanup(func() {
		tr.Close()
		cancel()
		wg.Wait()
	})
	return tr, c
}

func noBudget(int64, func(string) string) (func(), error) { return func() {}, nil }

func checkRows(t *testing.T, rows []int64, dst [][]byte) {
	t.Helper()
	for i, g := range rows {
		if !bytes.Equal(dst[i], bytes.Repeat([]byte{byte(g)}, rb)) {
			t.Errorf("row %d: % x", g, dst[i])
		}
	}
}

func buffers(n int) [][]byte {
	dst := make([][]byte, n)
	for i := range dst {
		dst[i] = make([]byte, rb)
	}
	return dst
}

// Rows close together in the file, asked in any order and repeated, are
// read with one read.
func TestReadCoalesces(t *testing.T) {
	tr, c := newTier(t, noBudget)
	rows := []int64{50, 12, 13, 51, 12}
	dst := buffers(len(rows))
	if err := tr.Read(context.Background(), rows, dst); err != nil {
		t.Fatal(err)
	}
	checkRows(t, rows, dst)
	if c.Reads.Load() != 1 || c.Rows.Load() != 5 || c.Bytes.Load() != (51-12+1)*rb {
		t.Errorf("reads %d rows %d bytes %d: want 1 read of 5 rows, %d bytes", c.Reads.Load(), c.Rows.Load(), c.Bytes.Load(), (51-12+1)*rb)
	}
	// ReadAny reads rows the shards hold too (their node is gone).
	rows = []int64{3, 0}
	dst = buffers(2)
	if err := tr.ReadAny(context.Background(), rows, dst); err != nil {
		t.Fatal(err)
	}
	checkRows(t, rows, dst)
}

// Rows read ahead are served from staging; the staging is charged to the
// budget once, at the first Prefetch, and given back when the tier stops.
func TestPrefetchServesFromStaging(t *testing.T) {
	var mu sync.Mutex
	var charged int64
	tr, c := newTier(t, func(n int64, _ func(string) string) (func(), error) {
		mu.Lock()
		charged += n
		mu.Unlock()
		return func() { mu.Lock(); charged -= n; mu.Unlock() }, nil
	})
	rows := []int64{60, 61, 62, 63}
	if err := tr.Prefetch(append(rows, 5)); err != nil { // row 5 is held: not read ahead
		t.Fatal(err)
	}
	mu.Lock()
	if charged != 8*rb {
		t.Errorf("charged %d bytes, want the staging's %d", charged, 8*rb)
	}
	mu.Unlock()
	testutil.WaitFor(t, 5*time.Second, func() error {
		if n := c.Prefetched.Load(); n < int64(len(rows)) {
			return fmt.Errorf("%d rows read ahead, want %d", n, len(rows))
		}
		return nil
	})
	dst := buffers(len(rows))
	if err := tr.Read(context.Background(), rows, dst); err != nil {
		t.Fatal(err)
	}
	checkRows(t, rows, dst)
	if c.Staged.Load() != int64(len(rows)) {
		t.Errorf("%d rows served from staging, want %d", c.Staged.Load(), len(rows))
	}
	// A prefetch of a row just read on demand, unannounced, comes too
	// late: it is not read a second time.
	if err := tr.Read(context.Background(), []int64{70}, buffers(1)); err != nil {
		t.Fatal(err)
	}
	if err := tr.Prefetch([]int64{70}); err != nil || c.Late.Load() != 1 {
		t.Errorf("late prefetch: %v, %d late, want 1", err, c.Late.Load())
	}
	// Rows read after their announcement, announced again at once (the
	// next epoch's reads of a short epoch), are read ahead again and
	// served from staging.
	if err := tr.Prefetch(rows); err != nil || c.Late.Load() != 1 {
		t.Errorf("announced again: %v, %d late, want 1 (row 70's)", err, c.Late.Load())
	}
	testutil.WaitFor(t, 5*time.Second, func() error {
		if n := c.Prefetched.Load(); n < int64(2*len(rows)) {
			return fmt.Errorf("%d rows read ahead, want %d", n, 2*len(rows))
		}
		return nil
	})
	dst = buffers(len(rows))
	if err := tr.Read(context.Background(), rows, dst); err != nil {
		t.Fatal(err)
	}
	checkRows(t, rows, dst)
	if c.Staged.Load() != int64(2*len(rows)) {
		t.Errorf("%d rows served from staging, want %d", c.Staged.Load(), 2*len(rows))
	}
}

// A budget that refuses the staging fails the Prefetch; a closed tier
// fails every read with ErrFreed.
func TestRefusals(t *testing.T) {
	refuse := base.Errorf(base.ErrArgument, "no room")
	tr, _ := newTier(t, func(int64, func(string) string) (func(), error) { return nil, refuse })
	if err := tr.Prefetch([]int64{50}); !errors.Is(err, refuse) {
		t.Errorf("Prefetch beyond the budget: %v, want its refusal", err)
	}
	tr.Close()
	if err := tr.Read(context.Background(), []int64{50}, buffers(1)); !errors.Is(err, base.ErrFreed) {
		t.Errorf("Read of a closed tier: %v, want ErrFreed", err)
	}
	if err := tr.Prefetch([]int64{50}); !errors.Is(err, base.ErrFreed) {
		t.Errorf("Prefetch of a closed tier: %v, want ErrFreed", err)
	}
	if _, err := Open(rawFile(t, 5), "", rb, 6); !errors.Is(err, base.ErrGeometry) {
		t.Errorf("a file of 5 rows for 6: %v, want ErrGeometry", err)
	}
}

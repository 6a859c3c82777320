package transport

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/ddstore-go/ddstore/internal/base"
	"github.com/ddstore-go/ddstore/internal/wire"
)

// testWindow: rows of 16 bytes; shard A holds rows [0, 10) at 0x10000,
// shard B rows [10, 12) at 0x90000, shard C rows [20, 25) at 0xA0000.
var testWindow = wire.Window{World: 1, Rank: 1, RowBytes: 16, Shards: []wire.WindowShard{
	{First: 0, Rows: 10, Addr: 0x10000, Token: 0x100},
	{First: 10, Rows: 2, Addr: 0x90000, Token: 0x108},
	{First: 20, Rows: 5, Addr: 0xA0000, Token: 0x110},
}}

func addr(b []byte) uintptr { return uintptr(unsafe.Pointer(unsafe.SliceData(b))) }

// rowsOf cuts buf into rows of rb bytes.
func rowsOf(buf []byte, rb int) [][]byte {
	var out [][]byte
	for i := 0; i+rb <= len(buf); i += rb {
		out = append(out, buf[i:i+rb:i+rb])
	}
	return out
}

func TestPlanGets(t *testing.T) {
	buf := make([]byte, 8*16)
	dst := rowsOf(buf, 16)
	p := planPool.Get().(*getPlan)
	defer planPool.Put(p)
	// 3, 4, 5 are adjacent at both ends: one get; 9 then 10 are adjacent
	// in memory here but not in the owner's (other shard): two; 7 after 10
	// goes backwards: one more; 24 and 20 are in shard C.
	if err := p.plan(&testWindow, "n1", []int64{3, 4, 5, 9, 10, 7, 24, 20}, dst); err != nil {
		t.Fatal(err)
	}
	want := []struct {
		dst uintptr
		src int64
		n   int32
	}{
		{addr(dst[0]), 0x10000 + 3*16, 48},
		{addr(dst[3]), 0x10000 + 9*16, 16},
		{addr(dst[4]), 0x90000, 16},
		{addr(dst[5]), 0x10000 + 7*16, 16},
		{addr(dst[6]), 0xA0000 + 4*16, 16},
		{addr(dst[7]), 0xA0000, 16},
	}
	if len(p.lens) != len(want) {
		t.Fatalf("%d gets %v, want %d", len(p.lens), p.lens, len(want))
	}
	for i, w := range want {
		if p.dst[i] != w.dst || p.src[i] != w.src || p.lens[i] != w.n {
			t.Errorf("get %d: %#x <- %#x (%d), want %#x <- %#x (%d)", i, p.dst[i], p.src[i], p.lens[i], w.dst, w.src, w.n)
		}
	}
	if len(p.tokens) != 3 || p.tokens[0] != 0x100 || p.tokens[1] != 0x108 || p.tokens[2] != 0x110 || len(p.got) != 3 {
		t.Errorf("tokens %#x (got %d), want 0x100 0x108 0x110 once each", p.tokens, len(p.got))
	}
	if p.bytes() != 8*16 {
		t.Errorf("plan moves %d bytes, want %d", p.bytes(), 8*16)
	}

	// Grouped by shard, each shard's gets in their order, offsets from
	// the shard's start.
	p.group(&testWindow)
	if fmt.Sprint(p.base, p.count) != fmt.Sprint([]int64{0x10000, 0x90000, 0xA0000}, []int32{3, 1, 2}) {
		t.Fatalf("groups: bases %#x counts %v", p.base, p.count)
	}
	wantT := []int64{3 * 16, 9 * 16, 7 * 16, 0, 4 * 16, 0}
	wantO := []uintptr{addr(dst[0]), addr(dst[3]), addr(dst[5]), addr(dst[4]), addr(dst[6]), addr(dst[7])}
	wantL := []int32{48, 16, 16, 16, 16, 16}
	for i := range wantT {
		if p.tdisp[i] != wantT[i] || p.odisp[i] != wantO[i] || p.glens[i] != wantL[i] {
			t.Errorf("grouped get %d: %#x <- +%#x (%d), want %#x <- +%#x (%d)", i, p.odisp[i], p.tdisp[i], p.glens[i], wantO[i], wantT[i], wantL[i])
		}
	}

	// The plan is reused: a second batch starts afresh.
	if err := p.plan(&testWindow, "n1", []int64{11}, dst[:1]); err != nil {
		t.Fatal(err)
	}
	if len(p.lens) != 1 || p.src[0] != 0x90000+16 || len(p.tokens) != 1 || p.tokens[0] != 0x108 {
		t.Errorf("second plan: %#x %v tokens %#x", p.src, p.lens, p.tokens)
	}
}

// TestPlanShardsSideBySide: two shards adjacent in the owner's memory
// (mmap places them so) are still read with a get each.
func TestPlanShardsSideBySide(t *testing.T) {
	w := wire.Window{World: 1, Rank: 1, RowBytes: 16, Shards: []wire.WindowShard{
		{First: 0, Rows: 2, Addr: 0x20000, Token: 8},
		{First: 2, Rows: 2, Addr: 0x20020, Token: 16},
	}}
	dst := rowsOf(make([]byte, 4*16), 16)
	p := planPool.Get().(*getPlan)
	defer planPool.Put(p)
	if err := p.plan(&w, "n1", []int64{0, 1, 2, 3}, dst); err != nil {
		t.Fatal(err)
	}
	if len(p.lens) != 2 || p.lens[0] != 32 || p.lens[1] != 32 || p.src[1] != 0x20020 {
		t.Errorf("gets %#x %v, want one per shard", p.src, p.lens)
	}
}

func TestPlanRefuses(t *testing.T) {
	p := planPool.Get().(*getPlan)
	defer planPool.Put(p)
	dst := rowsOf(make([]byte, 32), 16)
	for _, g := range []int64{12, 19, 25, -1} {
		err := p.plan(&testWindow, "n1", []int64{0, g}, dst)
		if !errors.Is(err, base.ErrArgument) {
			t.Errorf("row %d (in no shard): %v, want ErrArgument", g, err)
		}
	}
	if err := p.plan(&testWindow, "n1", []int64{0}, [][]byte{make([]byte, 8)}); !errors.Is(err, base.ErrArgument) {
		t.Errorf("short destination: %v, want ErrArgument", err)
	}
}

// TestPlanHugeRows: a run longer than one MPI get (counts are C ints) is
// cut, and merging never makes a get longer than MaxMPIGet. No memory is
// touched: the plan only computes addresses.
func TestPlanHugeRows(t *testing.T) {
	const rb = MaxMPIGet + MaxMPIGet/2
	w := wire.Window{World: 1, Rank: 1, RowBytes: rb, Shards: []wire.WindowShard{{First: 0, Rows: 4, Addr: 1 << 40, Token: 8}}}
	// Two adjacent rows into adjacent buffers: address space only, never
	// touched.
	big, err := unix.Mmap(-1, 0, 2*rb, unix.PROT_NONE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS|unix.MAP_NORESERVE)
	if err != nil {
		t.Skipf("cannot reserve %d bytes of address space: %v", 2*rb, err)
	}
	defer unix.Munmap(big)
	dst := [][]byte{big[:rb:rb], big[rb:]}
	p := planPool.Get().(*getPlan)
	defer planPool.Put(p)
	if err := p.plan(&w, "n1", []int64{1, 2}, dst); err != nil {
		t.Fatal(err)
	}
	var total int64
	for i, n := range p.lens {
		if n <= 0 || n > MaxMPIGet {
			t.Fatalf("get %d of %d bytes", i, n)
		}
		if i > 0 && p.src[i] != p.src[i-1]+int64(p.lens[i-1]) {
			t.Fatalf("get %d does not continue get %d", i, i-1)
		}
		total += int64(n)
	}
	if total != 2*rb || len(p.lens) != 3 || p.src[0] != 1<<40+rb {
		t.Errorf("%d gets of %v bytes from %#x, want 3 covering %d bytes from %#x", len(p.lens), p.lens, p.src[0], 2*rb, 1<<40+rb)
	}
}

func TestWindowCache(t *testing.T) {
	var ws windows
	w := testWindow
	if ws.get("a", "x", 1) != nil {
		t.Fatal("empty cache answered")
	}
	ws.put("a", "x", 1, &w)
	if ws.get("a", "x", 1) != &w || ws.get("a", "x", 2) != nil || ws.get("b", "x", 1) != nil {
		t.Fatal("cache keyed wrongly")
	}
	ws.put("a", "x", 2, &w) // a new table id replaces the old one
	if ws.get("a", "x", 1) != nil || ws.get("a", "x", 2) != &w {
		t.Fatal("new id did not replace the old one")
	}
	ws.forget("a", "x")
	if ws.get("a", "x", 2) != nil {
		t.Fatal("forgotten window answered")
	}
	for i := range maxCachedWindows + 1 {
		ws.put("a", string(rune('a'+i%26))+string(rune(i)), 1, &w)
	}
	if len(ws.m) > maxCachedWindows {
		t.Fatalf("cache holds %d windows, bound %d", len(ws.m), maxCachedWindows)
	}
}

func TestSlotAlloc(t *testing.T) {
	var a slotAlloc
	for want := range 3 {
		if s, err := a.take(3, "mpi"); err != nil || s != want {
			t.Fatalf("take %d: %d, %v", want, s, err)
		}
	}
	if _, err := a.take(3, "mpi"); !errors.Is(err, base.ErrArgument) || !strings.Contains(err.Error(), "transport mpi: 3 shards exposed already") {
		t.Fatalf("a fourth of 3: %v", err)
	}
	a.give(1)
	if s, err := a.take(3, "mpi"); err != nil || s != 1 {
		t.Fatalf("after give(1): %d, %v", s, err)
	}
}

// TestFetchOneSided: the retry protocol both one-sided transports share.
func TestFetchOneSided(t *testing.T) {
	errRead := base.Errorf(base.ErrPeer, "rows from peer n1: broken")
	type try struct {
		stale bool
		err   error
	}
	for _, c := range []struct {
		name   string
		tries  []try
		closed bool
		cancel bool
		want   error // nil, or the sentinel the error wraps
		calls  int
	}{
		{"first try", []try{{}}, false, false, nil, 1},
		{"stale, then a new window", []try{{stale: true}, {}}, false, false, nil, 2},
		{"stale twice: freed while read", []try{{stale: true}, {stale: true}}, false, false, base.ErrFreed, 2},
		{"an error is not retried", []try{{err: errRead}}, false, false, base.ErrPeer, 1},
		{"closed meanwhile", []try{{err: errRead}}, true, false, base.ErrClosed, 1},
		{"closed, stale", []try{{stale: true}}, true, false, base.ErrClosed, 1},
		{"context ended", nil, false, true, base.ErrTimeout, 0},
	} {
		t.Run(c.name, func(t *testing.T) {
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			if c.cancel {
				cancel()
			}
			var closed atomic.Bool
			closed.Store(c.closed)
			calls := 0
			err := fetchOneSided(ctx, "n1", "x", &closed, func() (bool, error) {
				tr := c.tries[calls]
				calls++
				return tr.stale, tr.err
			})
			if calls != c.calls {
				t.Errorf("%d tries, want %d", calls, c.calls)
			}
			if c.want == nil && err != nil || c.want != nil && !errors.Is(err, c.want) {
				t.Errorf("got %v, want %v", err, c.want)
			}
		})
	}
}

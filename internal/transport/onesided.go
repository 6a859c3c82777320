package transport

// What the two one-sided engines (mpi.go, fabric.go) share, and needs
// neither MPI nor libfabric: what an exposed shard is, the cache of the
// windows other agents described, the planning of a batch into reads
// (gets), the token slots, and the retry protocol around one try.

import (
	"context"
	"fmt"
	"slices"
	"sort"
	"sync"
	"sync/atomic"
	"unsafe"

	"github.com/ddstore-go/ddstore/internal/base"
	"github.com/ddstore-go/ddstore/internal/wire"
)

// Exposure is a shard exposed for one-sided reads (Engine.Expose): in
// this agent's MPI window, or registered with libfabric.
type Exposure struct {
	Addr  uint64 // remote address of the shard's first byte
	Token uint64 // remote address of the word holding the table id; 0: not exposed
	mem   []byte
	slot  int
}

// Exposed says whether the shard can be read by other nodes (over tcp,
// or in an MPI world of one rank, none is).
func (e Exposure) Exposed() bool { return e.Token != 0 }

// FetchPart is one node's part of a batch that reads several nodes' rows
// of one variable at once (MPI.FetchBatch): rows Globals of node Addr's
// shards into Dst.
type FetchPart struct {
	Addr    string
	Globals []int64
	Dst     [][]byte
}

// windowKey names a cached window: a node's agent and a variable.
type windowKey struct{ addr, name string }

// windowCache caches the windows other agents described, one per node
// and variable name (a new table id replaces the old one), for a one-sided
// transport whose window description is W.
type windowCache[W any] struct {
	mu sync.Mutex // guards m; a leaf (lock order: internal/LOCKS.md)
	m  map[windowKey]cachedWindow[W]
}

type cachedWindow[W any] struct {
	w  *W
	id int64 // the table id it describes
}

// maxCachedWindows bounds the cache; past it, it starts again empty (a
// described window costs one control round trip).
const maxCachedWindows = 4096

func (ws *windowCache[W]) get(addr, name string, id int64) *W {
	ws.mu.Lock()
	defer ws.mu.Unlock()
	if c, ok := ws.m[windowKey{addr, name}]; ok && c.id == id {
		return c.w
	}
	return nil
}

func (ws *windowCache[W]) put(addr, name string, id int64, w *W) {
	ws.mu.Lock()
	defer ws.mu.Unlock()
	if ws.m == nil || len(ws.m) >= maxCachedWindows {
		ws.m = make(map[windowKey]cachedWindow[W])
	}
	ws.m[windowKey{addr, name}] = cachedWindow[W]{w, id}
}

func (ws *windowCache[W]) forget(addr, name string) {
	ws.mu.Lock()
	defer ws.mu.Unlock()
	delete(ws.m, windowKey{addr, name})
}

// getPlan is a batch as the gets that move it: piece i is lens[i] bytes
// from the owner's MPI address src[i] to local address dst[i]; then the
// owner's words at tokens must still hold the table id.
type getPlan struct {
	dst    []uintptr
	src    []int64 // MPI_Aint
	lens   []int32
	shard  []int32 // index in the window's shards of each get
	tokens []int64
	got    []uint64 // the tokens as read
	seen   map[uint64]struct{}

	// The gets grouped by shard (group): shard k's are entries
	// [first, first+count) of odisp (local addresses), tdisp (offsets in
	// the shard) and glens; it is read with one MPI_Get of an hindexed
	// datatype from its base. MPI looks up a dynamic window's attachment on
	// every MPI_Get (Open MPI's osc rdma: a blocking read of the target's
	// region count, and of its region table under a lock when it changed,
	// over the network on other nodes), so one get per shard and batch
	// costs that once, not once a row.
	base   []int64
	count  []int32
	odisp  []uintptr
	tdisp  []int64
	glens  []int32
	bucket []int32 // scratch: gets per window shard
}

var planPool = sync.Pool{New: func() any { return &getPlan{seen: make(map[uint64]struct{})} }}

func (p *getPlan) reset() {
	p.dst, p.src, p.lens, p.shard, p.tokens = p.dst[:0], p.src[:0], p.lens[:0], p.shard[:0], p.tokens[:0]
	clear(p.seen)
}

// plan turns rows of one node into gets: each global is found among the
// window's shards; a row that continues the previous one at both ends
// (consecutive rows into consecutive buffers, as a range Get asks) and in
// the same shard extends its get rather than adding one. (Two shards may lie
// next to each other in memory, but a get must stay within one attachment:
// MPI fails one that spans two with MPI_ERR_RMA_RANGE.)
func (p *getPlan) plan(w *wire.Window, node string, globals []int64, dst [][]byte) error {
	p.reset()
	rb := w.RowBytes
	last := -1 // the shard of the last get: a get never spans two (each is its own attachment)
	for i, g := range globals {
		if int64(len(dst[i])) != rb {
			return base.Errorf(base.ErrArgument, "row %d: a %d-byte destination for rows of %d bytes", g, len(dst[i]), rb)
		}
		k := sort.Search(len(w.Shards), func(k int) bool { return w.Shards[k].First+w.Shards[k].Rows > g })
		if k == len(w.Shards) || g < w.Shards[k].First {
			return base.Errorf(base.ErrArgument, "row %d is in no shard node %q exposes in its MPI window", g, node)
		}
		s := &w.Shards[k]
		off := (g - s.First) * rb
		src := int64(s.Addr) + off
		if _, ok := p.seen[s.Token]; !ok {
			p.seen[s.Token] = struct{}{}
			p.tokens = append(p.tokens, int64(s.Token))
		}
		if rb == 0 {
			continue
		}
		d := uintptr(unsafe.Pointer(unsafe.SliceData(dst[i])))
		for left := rb; left > 0; {
			var n int64
			if j := len(p.lens) - 1; j >= 0 && last == k && p.lens[j] < MaxMPIGet && p.src[j]+int64(p.lens[j]) == src && p.dst[j]+uintptr(p.lens[j]) == d {
				n = min(left, MaxMPIGet-int64(p.lens[j]))
				p.lens[j] += int32(n)
			} else {
				n = min(left, MaxMPIGet)
				p.dst, p.src, p.lens = append(p.dst, d), append(p.src, src), append(p.lens, int32(n))
				p.shard = append(p.shard, int32(k))
			}
			src, d, left = src+n, d+uintptr(n), left-n
			last = k
		}
	}
	if cap(p.got) < len(p.tokens) {
		p.got = make([]uint64, len(p.tokens))
	}
	p.got = p.got[:len(p.tokens)]
	return nil
}

// group sorts the plan's gets by shard (stably: a shard's gets keep their
// order) into base, count, odisp, tdisp and glens.
func (p *getPlan) group(w *wire.Window) {
	p.base, p.count = p.base[:0], p.count[:0]
	p.odisp, p.tdisp, p.glens = p.odisp[:0], p.tdisp[:0], p.glens[:0]
	if cap(p.bucket) < len(w.Shards) {
		p.bucket = make([]int32, len(w.Shards))
	}
	p.bucket = p.bucket[:len(w.Shards)]
	clear(p.bucket)
	for _, k := range p.shard {
		p.bucket[k]++
	}
	// bucket[k] becomes where shard k's gets start.
	at := int32(0)
	for k, n := range p.bucket {
		if n > 0 {
			p.base = append(p.base, int64(w.Shards[k].Addr))
			p.count = append(p.count, n)
		}
		p.bucket[k] = at
		at += n
	}
	n := len(p.lens)
	p.odisp, p.tdisp, p.glens = slices.Grow(p.odisp, n)[:n], slices.Grow(p.tdisp, n)[:n], slices.Grow(p.glens, n)[:n]
	for i, k := range p.shard {
		j := p.bucket[k]
		p.bucket[k]++
		p.odisp[j], p.tdisp[j], p.glens[j] = p.dst[i], p.src[i]-int64(w.Shards[k].Addr), p.lens[i]
	}
}

// bytes is what the plan moves.
func (p *getPlan) bytes() int64 {
	var n int64
	for _, l := range p.lens {
		n += int64(l)
	}
	return n
}

// slotAlloc hands out the token slots of a one-sided transport (mpi,
// fabric): indices below a bound, returned ones first. Its owner locks it.
type slotAlloc struct {
	free []int
	next int
}

// take returns a free slot, or an error naming the transport when all max
// are in use.
func (a *slotAlloc) take(max int, transport string) (int, error) {
	if n := len(a.free); n > 0 {
		s := a.free[n-1]
		a.free = a.free[:n-1]
		return s, nil
	}
	if a.next == max {
		return 0, base.Errorf(base.ErrArgument, "transport %s: %d shards exposed already, the most one agent can", transport, max)
	}
	a.next++
	return a.next - 1, nil
}

// give returns slot s.
func (a *slotAlloc) give(s int) { a.free = append(a.free, s) }

// fetchOneSided runs the retry protocol of both one-sided transports (mpi,
// fabric) around read, one try at reading a batch out of the window its
// owner described: nil when every row came and every token still held the
// table id; stale when a token no longer did or a read fell outside the
// window, so the shard left it (freed, or its agent stopping) — read forgot
// the window, and the batch is read once more against the owner's new
// description; a second stale try means the variable was freed while being
// read. Any error of a transport closed meanwhile becomes ErrClosed.
func fetchOneSided(ctx context.Context, addr, name string, closed *atomic.Bool, read func() (stale bool, err error)) error {
	for attempt := 0; ; attempt++ {
		if err := ctx.Err(); err != nil {
			return fmt.Errorf("%w: fetch from peer %s: %w", base.ErrTimeout, addr, err)
		}
		stale, err := read()
		if !stale && err == nil {
			return nil
		}
		if closed.Load() {
			return base.Errorf(base.ErrClosed, "transport closed")
		}
		if !stale {
			return err
		}
		if attempt > 0 {
			return base.Errorf(base.ErrFreed, "variable %q was freed on peer %s while being read", name, addr)
		}
	}
}

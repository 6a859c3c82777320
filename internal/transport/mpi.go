//go:build mpi && cgo

package transport

// The MPI transport: agents started as the ranks of one MPI world (one per
// node, by mpirun or srun --mpi=pmix) read each other's rows with
// passive-target one-sided gets. Each agent has one dynamic window
// (MPI_Win_create_dynamic, locked for all targets once) and attaches each
// shard when its variable is published; a reader learns where a node's
// shards lie once per variable (Describe: the PeerWindow control op) and
// then moves a whole batch with one cgo call: a get per row (adjacent rows
// merged), one flush, then a get of the shards' tokens, which must still
// hold the table id. The owner clears a token before it detaches its
// shard, and unmaps it only a grace period later, so rows read while the
// token held are rows of that variable, and a get in flight never meets
// unmapped memory.
//
// Control traffic (join, publish, lookup, free, drop) stays on TCP.

/*
// (the MPI to link: mpi_flags*.go; the C: mpi_calls.c)
#include "mpi_calls.h"
*/
import "C"

import (
	"context"
	crand "crypto/rand"
	"encoding/binary"
	"fmt"
	"log/slog"
	"os"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/ddstore-go/ddstore/internal/base"
	"github.com/ddstore-go/ddstore/internal/wire"
)

// MPIBuilt says whether this binary has the MPI transport (build tag mpi).
const MPIBuilt = true

// MPILibrary names the MPI library this binary is linked with, as the
// start of MPI_Get_library_version says ("Open MPI v4.1.4", "MPICH
// Version: 4.0.2"); "" without the tag.
func MPILibrary() string {
	buf := make([]byte, C.MPI_MAX_LIBRARY_VERSION_STRING)
	var n C.int
	C.ddst_library((*C.char)(unsafe.Pointer(&buf[0])), &n)
	s := string(buf[:max(min(int(n), len(buf)), 0)])
	if i := strings.IndexAny(s, "\n\x00,"); i >= 0 {
		s = s[:i]
	}
	return strings.Join(strings.Fields(s), " ")
}

// tokenSlots is how many shards an agent can expose at once: each has a
// word in one block of C memory attached to the window at start.
const tokenSlots = 1 << 16

// perRowBelow is the number of gets (rows, adjacent ones merged) up to
// which a batch is a get per row rather than a get of indexed datatypes
// per shard.
const perRowBelow = 8

// getPerRow makes a batch one MPI_Get per row (merged where adjacent)
// instead of one per shard (DDSTORE_MPI_GET=row; to compare the two).
var getPerRow = os.Getenv("DDSTORE_MPI_GET") == "row"

// progressEvery is how often an agent enters MPI outside its own gets
// (ddst_progress_loop): DDSTORE_MPI_PROGRESS (a Go duration), else 1 ms
// with Open MPI, whose one-sided component reads the target's memory
// without it (shared memory, RDMA), and 100 µs with other MPIs: MPICH over
// UCX answers a get of a dynamic window only when the target enters the
// library, a few times per batch (2.1 ms a single-row get at 1 ms, 0.34 ms
// at 100 µs; an idle agent then takes 8% of a core, 1.4% at 1 ms:
// docs/build_tags.md).
func progressEvery() time.Duration {
	if d, err := time.ParseDuration(os.Getenv("DDSTORE_MPI_PROGRESS")); err == nil && d > 0 {
		return d
	}
	if strings.HasPrefix(MPILibrary(), "Open MPI") {
		return time.Millisecond
	}
	return 100 * time.Microsecond
}

// started makes MPI once per process: MPI cannot be initialized again.
var started atomic.Bool

// MPI is the MPI transport of one agent: its rank in the world, its
// window, and the windows of other agents it has read from.
type MPI struct {
	opts              MPIOptions
	log               *slog.Logger
	rank, size        int
	world             uint64
	windowed, ownsMPI bool

	// getMu makes one batch of gets at a time: Open MPI's one-sided
	// component spins on its locks when threads share a window, which on
	// few cores costs more than taking turns (docs/benchmarks.md). Lock
	// order: getMu, life, then slots or retired (internal/LOCKS.md).
	getMu sync.Mutex
	cache windows
	// life is read-locked around attaching, detaching and the
	// collectives, and write-locked to end MPI: nothing calls MPI after
	// MPI_Finalize.
	life   sync.RWMutex
	ended  bool        // MPI is finalized (life held)
	closed atomic.Bool // Close has begun: no more fetches or exposures

	// slots is a leaf (lock order: internal/LOCKS.md).
	slots struct {
		sync.Mutex
		mem   unsafe.Pointer // tokenSlots words, C memory, attached for the window's life
		addr  uint64         // its MPI address
		alloc slotAlloc
	}
	// retired is taken under life (lock order: internal/LOCKS.md).
	retired struct {
		sync.Mutex
		timed map[*time.Timer]func() // unmaps waiting for their grace period
		held  []func()               // unmaps waiting for Close
		done  bool
	}
	// progressEvery is the interval of the progress loop (progressEvery()).
	progressEvery time.Duration
	wg            sync.WaitGroup
}

var _ Engine = (*MPI)(nil)

// NewMPI joins the MPI world this process was started in (mpirun, srun
// --mpi=pmix; a process started alone is a world of one) with
// MPI_THREAD_MULTIPLE, and, when the world has other ranks, makes this
// agent's window. It is collective: every agent of the world must call it.
// One per process.
func NewMPI(opts MPIOptions) (*MPI, error) {
	if !started.CompareAndSwap(false, true) {
		return nil, base.Errorf(base.ErrArgument, "transport mpi: MPI was already started in this process (one agent per MPI rank)")
	}
	opts = opts.withDefaults()
	if int(C.ddst_aint_size()) != 8 {
		return nil, base.Errorf(base.ErrArgument, "transport mpi: MPI_Aint of %d bytes, want 8", int(C.ddst_aint_size()))
	}
	m := &MPI{opts: opts, log: opts.Logger}
	var provided, rank, size, ours C.int
	if rc := C.ddst_init(&provided, &rank, &size, &ours); rc != C.MPI_SUCCESS {
		return nil, mpiError(rc, "MPI_Init_thread")
	}
	m.rank, m.size, m.ownsMPI = int(rank), int(size), ours != 0
	if provided != C.ddst_thread_multiple() {
		C.ddst_finalize(ours)
		return nil, base.Errorf(base.ErrArgument, "transport mpi: the MPI library gives thread level %d, not MPI_THREAD_MULTIPLE (%d), which the agent needs (its goroutines call MPI from any thread): use an MPI built with thread support",
			int(provided), int(C.ddst_thread_multiple()))
	}
	var world [8]byte
	crand.Read(world[:])
	w := C.uint64_t(binary.LittleEndian.Uint64(world[:]) | 1) // never 0
	if rc := C.ddst_bcast_u64(&w); rc != C.MPI_SUCCESS {
		C.ddst_finalize(ours)
		return nil, mpiError(rc, "MPI_Bcast")
	}
	m.world = uint64(w)
	m.retired.timed = make(map[*time.Timer]func())
	if m.size > 1 {
		// Open MPI 4.1 fails to make a window of one rank (MPI_Win_create
		// and MPI_Win_create_dynamic alike); a world of one has no other
		// node to read from, so it makes none.
		if rc := C.ddst_win_create(); rc != C.MPI_SUCCESS {
			C.ddst_finalize(ours)
			return nil, mpiError(rc, "MPI_Win_create_dynamic")
		}
		m.windowed = true
		m.slots.mem = C.calloc(tokenSlots, 8)
		var addr C.MPI_Aint
		if rc := C.ddst_attach(m.slots.mem, tokenSlots*8, &addr); rc != C.MPI_SUCCESS {
			C.ddst_finalize(ours)
			return nil, mpiError(rc, "MPI_Win_attach")
		}
		m.slots.addr = uint64(addr)
		m.progressEvery = progressEvery()
		m.wg.Add(1)
		go m.progress()
	}
	m.log.Info("MPI transport", "library", MPILibrary(), "rank", m.rank, "size", m.size, "window", m.windowed, "progress", m.progressEvery)
	return m, nil
}

// Rank is this agent's rank in MPI_COMM_WORLD.
func (m *MPI) Rank() int { return m.rank }

// Size is the number of ranks (agents) in the world.
func (m *MPI) Size() int { return m.size }

// World identifies this MPI world (one launch), the same on every rank.
func (m *MPI) World() uint64 { return m.world }

// progress runs the progress loop on this goroutine's thread (a cgo call
// that returns when Close ends it).
func (m *MPI) progress() {
	defer m.wg.Done()
	C.ddst_progress_loop(C.int64_t(m.progressEvery))
}

// Expose attaches a shard's memory to the window, its token holding the
// table id. mem must not be Go memory (a mapped segment): MPI keeps it.
// In a world of one it exposes nothing (Exposure.Exposed is false).
func (m *MPI) Expose(mem []byte, id int64) (Exposure, error) {
	m.life.RLock()
	defer m.life.RUnlock()
	if !m.windowed || len(mem) == 0 || m.closed.Load() {
		return Exposure{mem: mem, slot: -1}, nil
	}
	slot, err := m.takeSlot()
	if err != nil {
		return Exposure{}, err
	}
	var addr C.MPI_Aint
	if rc := C.ddst_attach(unsafe.Pointer(unsafe.SliceData(mem)), C.MPI_Aint(len(mem)), &addr); rc != C.MPI_SUCCESS {
		m.giveSlot(slot)
		return Exposure{}, mpiError(rc, "MPI_Win_attach")
	}
	m.token(slot).Store(uint64(id))
	return Exposure{Addr: uint64(addr), Token: m.slots.addr + uint64(slot)*8, mem: mem, slot: slot}, nil
}

// Allgather is MPI_Allgather over the world: every rank passes as many
// words; the result holds rank r's at [r*len(mine), (r+1)*len(mine)).
// Collective.
func (m *MPI) Allgather(mine []uint64) ([]uint64, error) {
	all := make([]uint64, len(mine)*m.size)
	if len(mine) == 0 {
		return all, nil
	}
	m.life.RLock()
	defer m.life.RUnlock()
	if m.ended {
		return nil, base.Errorf(base.ErrClosed, "transport closed")
	}
	if rc := C.ddst_allgather_u64((*C.uint64_t)(unsafe.Pointer(&mine[0])), C.int(len(mine)), (*C.uint64_t)(unsafe.Pointer(&all[0]))); rc != C.MPI_SUCCESS {
		return nil, mpiError(rc, "MPI_Allgather")
	}
	return all, nil
}

// Barrier is MPI_Barrier over the world. Collective.
func (m *MPI) Barrier() error {
	m.life.RLock()
	defer m.life.RUnlock()
	if m.ended {
		return base.Errorf(base.ErrClosed, "transport closed")
	}
	if rc := C.ddst_barrier(); rc != C.MPI_SUCCESS {
		return mpiError(rc, "MPI_Barrier")
	}
	return nil
}

// Withdraw takes a shard out of the window: its token cleared first (a
// reader that gets it afterwards drops what it read), then detached (later
// gets fail), then, a grace period later, unmap is called, so that a get
// issued just before the detach still reads mapped memory. At Close,
// pending unmaps run once every agent has freed its window.
func (m *MPI) Withdraw(e Exposure, unmap func()) {
	m.life.RLock()
	defer m.life.RUnlock()
	if e.slot < 0 || !e.Exposed() || m.ended {
		// Not in the window, or the window is gone with MPI: nobody can
		// read it any more.
		unmap()
		return
	}
	m.token(e.slot).Store(0)
	if rc := C.ddst_detach(unsafe.Pointer(unsafe.SliceData(e.mem))); rc != C.MPI_SUCCESS {
		m.log.Warn("MPI_Win_detach failed; keeping the shard mapped until the agent stops", "err", mpiError(rc, "MPI_Win_detach"))
		m.retire(unmap, false)
		return
	}
	m.giveSlot(e.slot)
	m.retire(unmap, true)
}

func (m *MPI) retire(unmap func(), timed bool) {
	m.retired.Lock()
	defer m.retired.Unlock()
	if m.retired.done {
		unmap()
		return
	}
	if !timed {
		m.retired.held = append(m.retired.held, unmap)
		return
	}
	var t *time.Timer
	t = time.AfterFunc(m.opts.Grace, func() {
		m.retired.Lock()
		f, ok := m.retired.timed[t]
		delete(m.retired.timed, t)
		m.retired.Unlock()
		if ok {
			f()
		}
	})
	m.retired.timed[t] = unmap
}

func (m *MPI) token(slot int) *atomic.Uint64 {
	return (*atomic.Uint64)(unsafe.Add(m.slots.mem, slot*8))
}

func (m *MPI) takeSlot() (int, error) {
	m.slots.Lock()
	defer m.slots.Unlock()
	return m.slots.alloc.take(tokenSlots, "mpi")
}

func (m *MPI) giveSlot(s int) {
	m.slots.Lock()
	m.slots.alloc.give(s)
	m.slots.Unlock()
}

// Fetch reads rows of node addr's shards of a variable straight out of its
// window (FetchBatch of one part).
func (m *MPI) Fetch(ctx context.Context, addr, name string, id int64, globals []int64, dst [][]byte) error {
	_, err := m.FetchBatch(ctx, name, id, []FetchPart{{Addr: addr, Globals: globals, Dst: dst}})
	return err
}

// FetchBatch reads the parts' rows of a variable, each part's out of its
// node's window, as one batch of gets (ddst_fetch_batch): every node's row
// gets, one flush, every node's token gets, one more flush; then every
// token must still hold id. A node whose token did not, or whose gets fell
// outside its window, was left by the shard (freed, or its agent
// stopping): its window is forgotten and its part read once more against
// its new description, with the other such nodes' in one batch; stale a
// second time, the variable was freed while being read (ErrFreed). No
// row is taken without its node's token check. On an error, the index of
// the part it concerns comes with it; rows of the other parts may have
// been written. The gets cannot be interrupted once issued: MPI bounds
// them, not ctx (a peer that dies ends the MPI job). Any error of a
// transport closed meanwhile is ErrClosed.
func (m *MPI) FetchBatch(ctx context.Context, name string, id int64, parts []FetchPart) (int, error) {
	for i := range parts {
		if len(parts[i].Dst) != len(parts[i].Globals) {
			return i, base.Errorf(base.ErrArgument, "%d rows into %d buffers", len(parts[i].Globals), len(parts[i].Dst))
		}
	}
	b := batchPool.Get().(*getBatch)
	defer batchPool.Put(b)
	b.todo = b.todo[:0]
	for i := range parts {
		if len(parts[i].Globals) > 0 {
			b.todo = append(b.todo, i)
		}
	}
	if len(b.todo) > 0 && m.closed.Load() {
		return 0, base.Errorf(base.ErrClosed, "transport closed")
	}
	for attempt := 0; len(b.todo) > 0; attempt++ {
		if err := ctx.Err(); err != nil {
			return b.todo[0], fmt.Errorf("%w: fetch from peer %s: %w", base.ErrTimeout, parts[b.todo[0]].Addr, err)
		}
		i, err := m.try(ctx, name, id, parts, b)
		if err == nil && len(b.todo) == 0 {
			return 0, nil
		}
		if m.closed.Load() {
			return i, base.Errorf(base.ErrClosed, "transport closed")
		}
		if err != nil {
			return i, err
		}
		if attempt > 0 {
			return b.todo[0], base.Errorf(base.ErrFreed, "variable %q was freed on peer %s while being read", name, parts[b.todo[0]].Addr)
		}
	}
	return 0, nil
}

// try reads the parts b.todo names in one batch of gets, and leaves in
// b.todo those that came stale; an error comes with its part's index.
func (m *MPI) try(ctx context.Context, name string, id int64, parts []FetchPart, b *getBatch) (int, error) {
	b.reset()
	for j, i := range b.todo {
		w, err := m.window(ctx, parts[i].Addr, name, id)
		if err != nil {
			return i, err
		}
		p := b.plan(j)
		if err := p.plan(w, parts[i].Addr, parts[i].Globals, parts[i].Dst); err != nil {
			return i, err
		}
		b.add(w, p)
	}
	rc := m.get(b)
	runtime.KeepAlive(parts)
	if rc != C.MPI_SUCCESS {
		for _, i := range b.todo {
			m.cache.forget(parts[i].Addr, name)
		}
		i := b.todo[0]
		return i, fmt.Errorf("%w: rows of %q from peer %s (MPI rank %d): %w", base.ErrPeer, name, parts[i].Addr, b.wins[0].Rank, mpiError(rc, "MPI_Win_flush"))
	}
	stale := b.todo[:0] // filtered in place: stale never passes the index read
	tok := 0
	for j, i := range b.todo {
		rc := C.int(b.rcs[j])
		got := b.got[tok : tok+int(b.ntok[j])]
		tok += int(b.ntok[j])
		if rc == C.MPI_SUCCESS && slices.ContainsFunc(got, func(g uint64) bool { return g != uint64(id) }) {
			rc = C.DDST_STALE
		}
		if rc == C.MPI_SUCCESS {
			continue
		}
		m.cache.forget(parts[i].Addr, name)
		if rc != C.DDST_STALE && C.ddst_is_range_error(rc) == 0 {
			return i, fmt.Errorf("%w: rows of %q from peer %s (MPI rank %d): %w", base.ErrPeer, name, parts[i].Addr, b.wins[j].Rank, mpiError(rc, "MPI_Get"))
		}
		stale = append(stale, i)
	}
	b.todo = stale
	return 0, nil
}

// get runs a batch's gets (ddst_fetch_batch), one batch at a time:
// C.MPI_SUCCESS or a flush's MPI error code; each node's own in b.rcs.
func (m *MPI) get(b *getBatch) C.int {
	m.getMu.Lock()
	defer m.getMu.Unlock()
	if m.closed.Load() {
		return C.MPI_ERR_OTHER
	}
	return C.ddst_fetch_batch(C.int(len(b.target)), ptr[C.int](b.target),
		ptr[C.int](b.nget), ptr[C.uintptr_t](b.dst), ptr[C.MPI_Aint](b.src), ptr[C.int](b.lens),
		ptr[C.int](b.nshard), ptr[C.MPI_Aint](b.base), ptr[C.int](b.count), ptr[C.MPI_Aint](b.odisp), ptr[C.MPI_Aint](b.tdisp), ptr[C.int](b.glens),
		ptr[C.int](b.ntok), ptr[C.MPI_Aint](b.tok), ptr[C.uint64_t](b.got), ptr[C.int](b.rcs))
}

// ptr is s's first element as a C pointer of the same layout; nil when s
// is empty.
func ptr[T, E any](s []E) *T {
	if len(s) == 0 {
		return nil
	}
	return (*T)(unsafe.Pointer(&s[0]))
}

// getBatch is a batch of several nodes' plans as ddst_fetch_batch takes
// it: node j is MPI rank target[j], read by nget[j] plain gets (dst, src,
// lens) or by nshard[j] gets of shards (base, count; odisp, tdisp, glens),
// then by ntok[j] token gets (tok into got); rcs[j] is how its gets went.
type getBatch struct {
	todo  []int     // the parts to read, by index
	plans []getPlan // node j's
	wins  []*wire.Window

	target, nget, nshard, ntok, rcs []int32
	dst                             []uintptr
	src                             []int64
	lens                            []int32
	base, tdisp                     []int64
	count, glens                    []int32
	odisp                           []uintptr
	tok                             []int64
	got                             []uint64
}

var batchPool = sync.Pool{New: func() any { return new(getBatch) }}

func (b *getBatch) reset() {
	clear(b.wins)
	b.wins = b.wins[:0]
	b.target, b.nget, b.nshard, b.ntok, b.rcs = b.target[:0], b.nget[:0], b.nshard[:0], b.ntok[:0], b.rcs[:0]
	b.dst, b.src, b.lens = b.dst[:0], b.src[:0], b.lens[:0]
	b.base, b.count, b.odisp, b.tdisp, b.glens = b.base[:0], b.count[:0], b.odisp[:0], b.tdisp[:0], b.glens[:0]
	b.tok, b.got = b.tok[:0], b.got[:0]
}

// plan is node j's plan, reused from earlier batches.
func (b *getBatch) plan(j int) *getPlan {
	if j == len(b.plans) {
		b.plans = append(b.plans, getPlan{seen: make(map[uint64]struct{})})
	}
	return &b.plans[j]
}

// add appends a node's plan to the batch: a plain get per row (merged
// where adjacent) for a few, a get per shard (indexed datatypes at both
// ends) from perRowBelow on, unless DDSTORE_MPI_GET=row.
func (b *getBatch) add(w *wire.Window, p *getPlan) {
	b.wins = append(b.wins, w)
	b.target = append(b.target, int32(w.Rank))
	if getPerRow || len(p.lens) <= perRowBelow {
		// Making and freeing the two datatypes of a shard's get costs
		// more than they save for a few rows.
		b.nget, b.nshard = append(b.nget, int32(len(p.lens))), append(b.nshard, 0)
		b.dst, b.src, b.lens = append(b.dst, p.dst...), append(b.src, p.src...), append(b.lens, p.lens...)
	} else {
		p.group(w)
		b.nget, b.nshard = append(b.nget, 0), append(b.nshard, int32(len(p.count)))
		b.base, b.count = append(b.base, p.base...), append(b.count, p.count...)
		b.odisp, b.tdisp, b.glens = append(b.odisp, p.odisp...), append(b.tdisp, p.tdisp...), append(b.glens, p.glens...)
	}
	b.ntok, b.rcs = append(b.ntok, int32(len(p.tokens))), append(b.rcs, 0)
	b.tok = append(b.tok, p.tokens...)
	b.got = append(b.got, p.got...)
}

// window is node addr's window of a variable, described once per table id.
func (m *MPI) window(ctx context.Context, addr, name string, id int64) (*wire.Window, error) {
	if w := m.cache.get(addr, name, id); w != nil {
		return w, nil
	}
	if !m.windowed {
		return nil, base.Errorf(base.ErrArgument, "transport mpi: this agent is the only rank of its MPI world, so it cannot read rows of peer %s: start one agent per node in one MPI launch", addr)
	}
	w, err := m.opts.Describe(ctx, addr, name, id)
	if err != nil {
		return nil, err
	}
	if w.World != m.world {
		return nil, base.Errorf(base.ErrArgument, "transport mpi: peer %s is not in this agent's MPI world (started by another launch, or over tcp): start every agent of the job in one MPI launch", addr)
	}
	if w.Rank < 0 || w.Rank >= int64(m.size) || int(w.Rank) == m.rank {
		return nil, base.Errorf(base.ErrProtocol, "transport mpi: peer %s says it is MPI rank %d (this agent is rank %d of %d)", addr, w.Rank, m.rank, m.size)
	}
	m.cache.put(addr, name, id, &w)
	return &w, nil
}

// Close ends the transport: the window is freed and MPI finalized (both
// collective: Close returns once every agent of the world has closed),
// then the shards withdrawn meanwhile are unmapped.
func (m *MPI) Close() error {
	if !m.closed.CompareAndSwap(false, true) {
		return nil
	}
	C.ddst_progress_end()
	m.wg.Wait()
	m.getMu.Lock() // no batch in flight
	m.life.Lock()  // no attach or detach
	rc := C.ddst_finalize(boolInt(m.ownsMPI))
	m.ended = true
	m.life.Unlock()
	m.getMu.Unlock()
	m.retired.Lock()
	m.retired.done = true
	timed, held := m.retired.timed, m.retired.held
	m.retired.timed, m.retired.held = nil, nil
	m.retired.Unlock()
	for t, f := range timed {
		// A timer that fired after the swap finds its entry gone and
		// leaves the unmap to this loop.
		t.Stop()
		f()
	}
	for _, f := range held {
		f()
	}
	if m.slots.mem != nil {
		C.free(m.slots.mem)
		m.slots.mem = nil
	}
	if rc != C.MPI_SUCCESS {
		return mpiError(rc, "MPI_Finalize")
	}
	return nil
}

func boolInt(b bool) C.int {
	if b {
		return 1
	}
	return 0
}

// mpiError turns an MPI error code into an error naming the call.
func mpiError(rc C.int, call string) error {
	var buf [C.MPI_MAX_ERROR_STRING + 1]C.char
	var n C.int
	C.ddst_error_string(rc, &buf[0], &n)
	return base.Errorf(base.ErrPeer, "%s: %s (MPI error %d)", call, C.GoStringN(&buf[0], n), int(rc))
}

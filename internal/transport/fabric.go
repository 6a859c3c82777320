//go:build fabric && cgo

package transport

// The libfabric transport: each agent opens its own reliable-datagram
// endpoint (FI_EP_RDM; agents are not MPI ranks) and registers each shard
// (FI_REMOTE_READ) when its variable is published; a reader learns the
// owner's endpoint name, the shards' remote addresses and keys once per
// variable (the PeerWindow control op, over TCP) and then moves a whole
// batch with one cgo call: reads of the shards' token words, an fi_read
// per row (adjacent rows merged), the token words again, each wave waited
// for on the completion queue; the tokens must hold the table id. The
// owner clears a token at once when it withdraws a shard, and closes its
// memory region and unmaps it only a grace period later (a read of a
// closed region makes tcp;ofi_rxm shut the connection).
//
// Progress. Providers with manual progress (tcp;ofi_rxm) serve a read
// only while the target calls into libfabric: DDStore's fi_read path
// deadlocks on loopback because its target only polls when it reads
// itself. Here every agent runs its own progress loop, asleep in
// fi_cq_sread until a peer's request wakes it, so an agent whose clients
// are idle still serves reads (TestClusterFabricIdleTarget,
// TestFabricProgressNeeded).

/*
#cgo pkg-config: libfabric
// (the C: fabric_calls.c)
#include "fabric_calls.h"
*/
import "C"

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"runtime"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/ddstore-go/ddstore/internal/base"
)

// FabricBuilt says whether this binary has the libfabric transport (build
// tag fabric).
const FabricBuilt = true

// FabricLibrary names the libfabric this binary runs with ("libfabric
// 1.17"); "" without the tag.
func FabricLibrary() string {
	v := uint32(C.ddsf_version())
	return fmt.Sprintf("libfabric %d.%d", v>>16, v&0xffff)
}

// progressPoll is how long each call of the progress loop serves the
// endpoint (sleeping in fi_cq_sread between requests) before it lets
// Close in.
const progressPoll = 500 // µs

// fabricSlots is how many shards an agent can expose at once: each has a
// token word in one registered block of C memory.
const fabricSlots = 1 << 16

// tokenKeyRequested is the key the token words are registered under where
// the provider lets the application choose keys; shard s gets s+1.
const tokenKeyRequested = 1 << 40

// Fabric is the libfabric transport of one agent: its endpoint, its
// registered shards and token words, and the endpoints of other agents it
// has read from.
type Fabric struct {
	opts     FabricOptions
	log      *slog.Logger
	f        *C.ddsf
	provider string
	name     []byte
	virt     bool // remote addresses are virtual addresses, not offsets

	wins windowCache[FabricWindow]
	// peers guards m; taken before life (lock order: internal/LOCKS.md).
	peers struct {
		sync.Mutex
		m map[string]C.fi_addr_t
	}
	// life is read-locked by every call into libfabric but Close, which
	// write-locks it to close the endpoint. Lock order: peers, life, then
	// slots or retired (internal/LOCKS.md).
	life   sync.RWMutex
	ended  bool
	closed atomic.Bool

	// slots is a leaf (lock order: internal/LOCKS.md).
	slots struct {
		sync.Mutex
		mem   unsafe.Pointer // fabricSlots+1 words, C memory, registered for the endpoint's life
		mr    *C.struct_fid_mr
		key   uint64
		mrs   map[int]*C.struct_fid_mr
		keys  map[int]uint64
		alloc slotAlloc
	}
	// retired is taken under life (lock order: internal/LOCKS.md).
	retired struct {
		sync.Mutex
		timed map[*time.Timer]func()
		done  bool
	}
	stop chan struct{}
	wg   sync.WaitGroup
}

var _ Engine = (*Fabric)(nil)

// NewFabric opens this agent's endpoint and starts its progress loop.
func NewFabric(opts FabricOptions) (*Fabric, error) {
	opts = opts.withDefaults()
	prov := opts.Provider
	if prov == "" {
		prov = os.Getenv("DDSTORE_FABRIC")
	}
	var cprov *C.char
	if prov != "" {
		cprov = C.CString(prov)
		defer C.free(unsafe.Pointer(cprov))
	}
	fb := &Fabric{opts: opts, log: opts.Logger, stop: make(chan struct{})}
	var step *C.char
	if rc := C.ddsf_open(cprov, &fb.f, &step); rc != 0 {
		what := "any provider"
		if prov != "" {
			what = fmt.Sprintf("provider %q", prov)
		}
		return nil, base.Errorf(base.ErrArgument, "transport fabric: %s: no RDM endpoint with RMA reads from %s: %s (fi_info -p NAME lists a provider's endpoints; DDSTORE_FABRIC names one)",
			C.GoString(step), what, fabricStrerror(rc))
	}
	fb.provider = C.GoString(C.ddsf_prov(fb.f))
	fb.virt = C.ddsf_virt(fb.f) != 0
	var buf [256]byte
	n := C.size_t(len(buf))
	if rc := C.ddsf_name(fb.f, unsafe.Pointer(&buf[0]), &n); rc != 0 {
		C.ddsf_free(fb.f)
		return nil, fabricError(rc, "fi_getname")
	}
	fb.name = append([]byte(nil), buf[:n]...)
	fb.peers.m = make(map[string]C.fi_addr_t)
	fb.retired.timed = make(map[*time.Timer]func())
	fb.slots.mrs, fb.slots.keys = make(map[int]*C.struct_fid_mr), make(map[int]uint64)
	fb.slots.mem = C.calloc(fabricSlots+1, 8)
	var key C.uint64_t
	if rc := C.ddsf_reg(fb.f, fb.slots.mem, (fabricSlots+1)*8, tokenKeyRequested, &fb.slots.mr, &key); rc != 0 {
		C.free(fb.slots.mem)
		C.ddsf_free(fb.f)
		return nil, fabricError(rc, "fi_mr_reg")
	}
	fb.slots.key = uint64(key)
	if !opts.NoProgress {
		fb.wg.Add(1)
		go fb.progress()
	}
	fb.log.Info("libfabric transport", "provider", fb.provider, "manual_progress", C.ddsf_manual(fb.f) != 0, "virtual_addresses", fb.virt)
	return fb, nil
}

// Provider is the provider the endpoint is of (e.g. "tcp;ofi_rxm").
func (fb *Fabric) Provider() string { return fb.provider }

// Name is this agent's endpoint name, for readers' address vectors.
func (fb *Fabric) Name() []byte { return fb.name }

// TokenKey is the key of this agent's token words.
func (fb *Fabric) TokenKey() uint64 { return fb.slots.key }

// Key is the key of an exposed shard's memory region.
func (fb *Fabric) Key(e Exposure) uint64 {
	fb.slots.Lock()
	defer fb.slots.Unlock()
	return fb.slots.keys[e.slot]
}

// progress polls the completion queue for as long as the transport is
// open: on a provider with manual progress it is what serves other agents'
// reads of this one's shards, whatever this agent's clients do.
func (fb *Fabric) progress() {
	defer fb.wg.Done()
	for {
		select {
		case <-fb.stop:
			return
		default:
		}
		fb.life.RLock()
		if !fb.ended {
			C.ddsf_progress(fb.f, progressPoll)
		}
		fb.life.RUnlock()
	}
}

// Expose registers a shard's memory for remote reads, its token holding
// the table id. mem must not be Go memory (a mapped segment).
func (fb *Fabric) Expose(mem []byte, id int64) (Exposure, error) {
	fb.life.RLock()
	defer fb.life.RUnlock()
	if len(mem) == 0 || fb.closed.Load() {
		return Exposure{mem: mem, slot: -1}, nil
	}
	slot, err := fb.takeSlot()
	if err != nil {
		return Exposure{}, err
	}
	var mr *C.struct_fid_mr
	var key C.uint64_t
	if rc := C.ddsf_reg(fb.f, unsafe.Pointer(unsafe.SliceData(mem)), C.size_t(len(mem)), C.uint64_t(slot+1), &mr, &key); rc != 0 {
		fb.giveSlot(slot)
		return Exposure{}, fabricError(rc, "fi_mr_reg")
	}
	fb.slots.Lock()
	fb.slots.mrs[slot], fb.slots.keys[slot] = mr, uint64(key)
	fb.slots.Unlock()
	fb.token(slot).Store(uint64(id))
	e := Exposure{Token: uint64(slot+1) * 8, mem: mem, slot: slot}
	if fb.virt {
		e.Addr = uint64(uintptr(unsafe.Pointer(unsafe.SliceData(mem))))
		e.Token += uint64(uintptr(fb.slots.mem))
	}
	return e, nil
}

// Withdraw takes a shard out of reach: its token cleared at once (a
// reader checks it before and after its reads, and drops what it read),
// then, a grace period later, its memory region closed and unmap called.
// The region stays open meanwhile because tcp;ofi_rxm shuts the connection
// on a read of a closed region, failing every later read of that peer.
func (fb *Fabric) Withdraw(e Exposure, unmap func()) {
	fb.life.RLock()
	defer fb.life.RUnlock()
	if e.slot < 0 || !e.Exposed() || fb.ended {
		unmap()
		return
	}
	fb.token(e.slot).Store(0)
	fb.retire(func() {
		fb.unregister(e.slot)
		unmap()
	})
}

// unregister closes a withdrawn shard's memory region and frees its slot.
func (fb *Fabric) unregister(slot int) {
	fb.slots.Lock()
	mr := fb.slots.mrs[slot]
	delete(fb.slots.mrs, slot)
	delete(fb.slots.keys, slot)
	fb.slots.Unlock()
	fb.life.RLock()
	if mr != nil && !fb.ended {
		if rc := C.ddsf_unreg(mr); rc != 0 {
			fb.log.Warn("closing a shard's memory region", "err", fabricError(rc, "fi_close"))
		}
	}
	fb.life.RUnlock()
	fb.giveSlot(slot)
}

func (fb *Fabric) retire(unmap func()) {
	fb.retired.Lock()
	defer fb.retired.Unlock()
	if fb.retired.done {
		unmap()
		return
	}
	var t *time.Timer
	t = time.AfterFunc(fb.opts.Grace, func() {
		fb.retired.Lock()
		f, ok := fb.retired.timed[t]
		delete(fb.retired.timed, t)
		fb.retired.Unlock()
		if ok {
			f()
		}
	})
	fb.retired.timed[t] = unmap
}

func (fb *Fabric) token(slot int) *atomic.Uint64 {
	return (*atomic.Uint64)(unsafe.Add(fb.slots.mem, (slot+1)*8))
}

func (fb *Fabric) takeSlot() (int, error) {
	fb.slots.Lock()
	defer fb.slots.Unlock()
	return fb.slots.alloc.take(fabricSlots, "fabric")
}

func (fb *Fabric) giveSlot(s int) {
	fb.slots.Lock()
	fb.slots.alloc.give(s)
	fb.slots.Unlock()
}

// fabricPlan is a getPlan plus each piece's key and remote address as
// unsigned words.
type fabricPlan struct {
	getPlan
	keys []uint64
	src  []uint64
	lens []uint64
	tok  []uint64
}

var fabricPlans = sync.Pool{New: func() any { return &fabricPlan{getPlan: getPlan{seen: make(map[uint64]struct{})}} }}

// Fetch reads rows of node addr's shards of a variable straight out of its
// registered memory. Issued reads are not interrupted by ctx: the provider
// completes or fails each (a lost peer fails its connection).
func (fb *Fabric) Fetch(ctx context.Context, addr, name string, id int64, globals []int64, dst [][]byte) error {
	if len(globals) == 0 {
		return nil
	}
	if len(dst) != len(globals) {
		return base.Errorf(base.ErrArgument, "%d rows into %d buffers", len(globals), len(dst))
	}
	if fb.closed.Load() {
		return base.Errorf(base.ErrClosed, "transport closed")
	}
	p := fabricPlans.Get().(*fabricPlan)
	defer fabricPlans.Put(p)
	return fetchOneSided(ctx, addr, name, &fb.closed, func() (bool, error) {
		w, err := fb.window(ctx, addr, name, id)
		if err != nil {
			return false, err
		}
		peer, err := fb.peer(w.Name)
		if err != nil {
			return false, err
		}
		if err := p.plan(&w.Window, addr, globals, dst); err != nil {
			return false, err
		}
		p.keys, p.src, p.lens = p.keys[:0], p.src[:0], p.lens[:0]
		for i := range p.getPlan.lens {
			p.keys = append(p.keys, w.Keys[p.shard[i]])
			p.src = append(p.src, uint64(p.getPlan.src[i]))
			p.lens = append(p.lens, uint64(p.getPlan.lens[i]))
		}
		p.tok = p.tok[:0]
		for _, t := range p.tokens {
			p.tok = append(p.tok, uint64(t))
		}
		// A read of a node whose agent is gone never completes
		// (tcp;ofi_rxm retries the connection): it gets half the time
		// left, so that the caller has the other half to read the rows
		// elsewhere (a backing file).
		timeout := fb.opts.Grace
		if d, ok := ctx.Deadline(); ok {
			timeout = max(time.Until(d)/2, time.Millisecond)
		}
		rc := fb.read(peer, p, w.TokenKey, id, timeout)
		runtime.KeepAlive(dst)
		if rc == 0 {
			return false, nil
		}
		fb.wins.forget(addr, name)
		switch {
		case rc == C.DDSF_TIMEOUT:
			// Reads still queued may complete later: into the batch's
			// bounce buffer and the tokens' C memory, left allocated;
			// never into dst. ErrPeer, not ErrTimeout: the caller then
			// reads the rows elsewhere where it can.
			return false, fmt.Errorf("%w: rows of %q from peer %s: no completion within %v (its agent is gone, or unreachable over libfabric)", base.ErrPeer, name, addr, timeout.Round(time.Millisecond))
		case fabricStale(rc):
			return true, nil
		}
		return false, fmt.Errorf("%w: rows of %q from peer %s: %w", base.ErrPeer, name, addr, fabricError(rc, "fi_read"))
	})
}

// read runs a plan: 0, C.DDSF_STALE when a token no longer holds id, or a
// negative libfabric error.
func (fb *Fabric) read(peer C.fi_addr_t, p *fabricPlan, tokKey uint64, id int64, timeout time.Duration) C.int {
	var dst *C.uintptr_t
	var src, lens, keys *C.uint64_t
	if len(p.lens) > 0 {
		dst = (*C.uintptr_t)(unsafe.Pointer(&p.dst[0]))
		src = (*C.uint64_t)(unsafe.Pointer(&p.src[0]))
		lens = (*C.uint64_t)(unsafe.Pointer(&p.lens[0]))
		keys = (*C.uint64_t)(unsafe.Pointer(&p.keys[0]))
	}
	fb.life.RLock()
	if fb.ended {
		fb.life.RUnlock()
		return -C.FI_ESHUTDOWN
	}
	// The token words land in C memory: after a timeout a late read may
	// still write them.
	got := C.calloc(C.size_t(len(p.tok)), 8)
	rc := C.ddsf_fetch(fb.f, peer, C.int64_t(timeout), C.int(len(p.lens)), dst, src, lens, keys, C.int(len(p.tok)),
		(*C.uint64_t)(unsafe.Pointer(&p.tok[0])), C.uint64_t(tokKey), (*C.uint64_t)(got), C.uint64_t(id))
	fb.life.RUnlock()
	if rc != C.DDSF_TIMEOUT {
		C.free(got)
	}
	return rc
}

// peer is the address-vector entry of an endpoint name, inserted once.
func (fb *Fabric) peer(name []byte) (C.fi_addr_t, error) {
	fb.peers.Lock()
	defer fb.peers.Unlock()
	if a, ok := fb.peers.m[string(name)]; ok {
		return a, nil
	}
	fb.life.RLock()
	defer fb.life.RUnlock()
	if fb.ended {
		return 0, base.Errorf(base.ErrClosed, "transport closed")
	}
	c := C.CBytes(name)
	defer C.free(c)
	var a C.fi_addr_t
	if rc := C.ddsf_insert(fb.f, c, &a); rc != 0 {
		return 0, fabricError(rc, "fi_av_insert")
	}
	fb.peers.m[string(name)] = a
	return a, nil
}

// window is node addr's window of a variable, described once per table id.
func (fb *Fabric) window(ctx context.Context, addr, name string, id int64) (*FabricWindow, error) {
	if w := fb.wins.get(addr, name, id); w != nil {
		return w, nil
	}
	w, err := fb.opts.Describe(ctx, addr, name, id)
	if err != nil {
		return nil, err
	}
	if w.Provider != fb.provider {
		return nil, base.Errorf(base.ErrArgument, "transport fabric: peer %s uses provider %q, this agent %q: start every agent of the job with the same DDSTORE_FABRIC", addr, w.Provider, fb.provider)
	}
	fb.wins.put(addr, name, id, &w)
	return &w, nil
}

// Close stops the progress loop, closes the endpoint and every memory
// region, then unmaps the shards withdrawn meanwhile. Not collective: other
// agents reading from this one get errors, as from a lost peer.
func (fb *Fabric) Close() error {
	if !fb.closed.CompareAndSwap(false, true) {
		return nil
	}
	close(fb.stop)
	fb.wg.Wait()
	fb.life.Lock()
	fb.slots.Lock()
	for s, mr := range fb.slots.mrs {
		C.ddsf_unreg(mr)
		delete(fb.slots.mrs, s)
	}
	C.ddsf_unreg(fb.slots.mr)
	fb.slots.Unlock()
	C.ddsf_free(fb.f)
	fb.ended = true
	fb.life.Unlock()
	fb.retired.Lock()
	fb.retired.done = true
	timed := fb.retired.timed
	fb.retired.timed = nil
	fb.retired.Unlock()
	for t, f := range timed {
		t.Stop()
		f()
	}
	fb.slots.Lock()
	C.free(fb.slots.mem)
	fb.slots.mem = nil
	fb.slots.Unlock()
	return nil
}

// fabricStale says whether a failed batch may have met a withdrawn shard:
// a token no longer holding the id, or a read of a closed memory region,
// which providers fail as canceled (tcp;ofi_rxm), a bad key or no access.
func fabricStale(rc C.int) bool {
	switch rc {
	case C.DDSF_STALE, -C.FI_ECANCELED, -C.FI_EACCES, -C.FI_EINVAL, -C.FI_ENOKEY:
		return true
	}
	return false
}

func fabricStrerror(rc C.int) string {
	if rc < 0 {
		rc = -rc
	}
	return C.GoString(C.fi_strerror(rc))
}

// fabricError turns a negative libfabric return into an error naming the
// call.
func fabricError(rc C.int, call string) error {
	if rc == C.DDSF_STALE {
		return base.Errorf(base.ErrFreed, "%s: the shard was withdrawn", call)
	}
	return base.Errorf(base.ErrPeer, "%s: %s (libfabric error %d)", call, fabricStrerror(rc), int(-rc))
}

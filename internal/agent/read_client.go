package agent

// The requesting side of a read: a client's Read split by owner — rows of
// this node copied from its segments, rows of the backing file read by the
// storage tier, rows of other nodes fetched by the row engine — and a
// client's Prefetch handed to the tier.

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"

	"github.com/ddstore-go/ddstore/internal/base"
	"github.com/ddstore-go/ddstore/internal/layout"
	"github.com/ddstore-go/ddstore/internal/wire"
)

// fanout is a session's reusable scratch for splitting a batch by owner
// node, so a read allocates nothing per row.
type fanout struct {
	nodes  []nodeRows
	pieces []piece
	backed nodeRows // rows of the backing file
}

type nodeRows struct {
	globals []int64
	dst     [][]byte
}

// piece is one Fetch of a read: rows of one node, at most a share of them.
type piece struct {
	node    string
	addr    string
	globals []int64
	dst     [][]byte
	err     error
}

// splitBytes is the size from which a node's rows are fetched in pieces.
const splitBytes = 512 << 10

// cutPieces makes f.pieces of the rows f gathered per node of t: one
// request per owner node, a large one cut into as many pieces as there are
// connections to that node (one per splitBytes at most), so that both ends
// move rows on several cores at once — unless the engine is serial (it
// takes turns anyway).
func (a *Agent) cutPieces(f *fanout, t *wire.Table, serial bool) {
	f.pieces = f.pieces[:0]
	for i := range t.Nodes {
		n := &f.nodes[i]
		if len(n.globals) == 0 {
			continue
		}
		a.stats.fetches.Add(1)
		k := 1
		if !serial {
			var nb int64
			for _, d := range n.dst {
				nb += int64(len(d))
			}
			k = max(1, int(min(int64(a.connsPerPeer()), nb/splitBytes)))
		}
		per := (len(n.globals) + k - 1) / k
		for lo := 0; lo < len(n.globals); lo += per {
			hi := min(lo+per, len(n.globals))
			f.pieces = append(f.pieces, piece{node: t.Nodes[i], addr: t.Addrs[i], globals: n.globals[lo:hi], dst: n.dst[lo:hi]})
		}
	}
}

// current says whether v, read-locked, is still the variable of the table
// id a client looked up: ErrFreed if it was freed, or freed and created
// again since.
func (v *variable) current(id int64) error {
	if v.gone {
		return base.Errorf(base.ErrFreed, "variable %q was freed", v.name)
	}
	if id != v.table.ID {
		return base.Errorf(base.ErrFreed, "variable %q was freed and created again since this client looked it up", v.name)
	}
	return nil
}

// readLock is what a client's read holds while it copies: its receive
// region's lock, and the variable's read lock until the node-local
// copies are done (unlockVar), so that a Free of this node's shards need
// not wait for the fetches of other nodes' rows.
type readLock struct {
	reg  *region
	v    *variable
	held bool // v.mu read-locked
}

// lockRead takes receive region id and v's read lock for a read of the
// variable as looked up in table tableID (v.current).
func (a *Agent) lockRead(v *variable, id uint32, tableID int64) (readLock, error) {
	reg, err := a.regions.use(id)
	if err != nil {
		return readLock{}, err
	}
	v.mu.RLock()
	l := readLock{reg: reg, v: v, held: true}
	if err := v.current(tableID); err != nil {
		l.release()
		return readLock{}, err
	}
	return l, nil
}

func (l *readLock) unlockVar() {
	if l.held {
		l.v.mu.RUnlock()
		l.held = false
	}
}

func (l *readLock) relockVar() {
	l.v.mu.RLock()
	l.held = true
}

// release lets go of both locks (v's if still held).
func (l *readLock) release() {
	l.unlockVar()
	l.reg.mu.RUnlock()
}

// read serves a client's Read: rows of this node are copied from the
// segments, rows of other nodes are fetched from their agents concurrently
// (one request per owner node, cut into pieces when large), straight into
// the client's receive region.
func (a *Agent) read(ctx context.Context, s *session, m *wire.Read) error {
	v, err := a.lookup(ctx, m.Name)
	if err != nil {
		return err
	}
	l, err := a.lockRead(v, m.Region, m.ID)
	if err != nil {
		return err
	}
	defer l.release()
	reg := l.reg
	if err := v.lay.CheckAll(m.Globals); err != nil {
		return err
	}
	if v.rag != nil {
		if v.index == nil {
			// Not built on this node yet (a client of a reading job's
			// first Read): build it, then read.
			l.unlockVar()
			if err := a.ensureIndex(ctx, v); err != nil {
				return err
			}
			l.relockVar()
			if v.gone || v.index == nil {
				return base.Errorf(base.ErrFreed, "variable %q was freed", m.Name)
			}
		}
		return a.readRagged(ctx, s, v, m, reg.mem, l.unlockVar)
	}
	rb := v.lay.Bytes()
	size := int64(len(reg.mem))
	t := v.table
	f := &s.fan
	for len(f.nodes) < len(t.Nodes) {
		f.nodes = append(f.nodes, nodeRows{})
	}
	for i := range t.Nodes {
		f.nodes[i].globals, f.nodes[i].dst = f.nodes[i].globals[:0], f.nodes[i].dst[:0]
	}
	f.backed.globals, f.backed.dst = f.backed.globals[:0], f.backed.dst[:0]
	for i, off := range m.Offsets {
		if off < 0 || off > size-rb {
			return base.Errorf(base.ErrBuffer, "row %d of the read goes to offset %d of a %d-byte receive region (rows of %d bytes)", i, off, size, rb)
		}
	}
	for i, g := range m.Globals {
		off := m.Offsets[i]
		dst := reg.mem[off : off+rb : off+rb]
		rank, local := v.lay.Owner(g)
		if rank == layout.Backed {
			f.backed.globals = append(f.backed.globals, g)
			f.backed.dst = append(f.backed.dst, dst)
			continue
		}
		if seg := v.byRank[rank]; seg != nil {
			copy(dst, seg.Data[local*rb:(local+1)*rb])
			continue
		}
		n := &f.nodes[t.RankNode[rank]]
		n.globals = append(n.globals, g)
		n.dst = append(n.dst, dst)
	}
	// The local copies are done; remote rows need only the table, not the
	// segments, so let a Free of this node's shards proceed.
	l.unlockVar()
	a.stats.readRows.Add(int64(len(m.Globals)))

	a.cutPieces(f, t, a.rows.Serial())
	// The first piece is fetched on this goroutine, unless rows of the
	// backing file are to be read here meanwhile.
	var wg sync.WaitGroup
	first := 1
	if len(f.backed.globals) > 0 {
		first = 0
	}
	for i := first; i < len(f.pieces); i++ {
		p := &f.pieces[i]
		wg.Add(1)
		go func() {
			defer wg.Done()
			p.err = a.rows.Fetch(ctx, p.addr, m.Name, t.ID, p.globals, p.dst)
		}()
	}
	var backedErr error
	if first == 0 {
		tctx, cancel := context.WithTimeout(ctx, a.cfg.Timeout)
		backedErr = v.tier.Read(tctx, f.backed.globals, f.backed.dst)
		cancel()
	} else if len(f.pieces) > 0 {
		p := &f.pieces[0]
		p.err = a.rows.Fetch(ctx, p.addr, m.Name, t.ID, p.globals, p.dst)
	}
	wg.Wait()
	clear(f.backed.dst)
	if backedErr != nil {
		return backedErr
	}
	fetch := func(p *piece, addr string) error { return a.rows.Fetch(ctx, addr, m.Name, t.ID, p.globals, p.dst) }
	fallback := a.tierFallback(ctx, v.tier)
	for i := range f.pieces {
		if err := a.settlePiece(ctx, v, &f.pieces[i], fetch, fallback); err != nil {
			return err
		}
	}
	clear(f.pieces)
	for i := range t.Nodes {
		clear(f.nodes[i].dst)
	}
	return nil
}

// settlePiece deals with a fetched piece's error and returns what the read
// is to fail with, or nil once the piece's rows are in. A freed variable
// means this node's table is stale: it is forgotten, and the error goes
// back as it is. A node that did not answer may have restarted elsewhere
// (a new port): the coordinator is asked where it is now, and the piece
// fetched there once; failing that — or when the node answers that it
// holds no such variable — fallback (when not nil) may still fill the
// piece.
func (a *Agent) settlePiece(ctx context.Context, v *variable, p *piece, fetch func(p *piece, addr string) error, fallback func(p *piece, err error) error) error {
	err := p.err
	if err == nil {
		return nil
	}
	if errors.Is(err, base.ErrFreed) {
		a.forgetStale(v)
		return err
	}
	if errors.Is(err, base.ErrPeer) {
		if addr, ok := a.refreshAddr(ctx, v, p.node, p.addr); ok {
			if err = fetch(p, addr); err == nil {
				return nil
			}
		}
	}
	// A node that answers but holds no such variable lost its shard (an
	// agent started again that could not re-adopt it): as good as gone.
	if fallback != nil && (errors.Is(err, base.ErrPeer) || errors.Is(err, base.ErrUnknown)) {
		if err = fallback(p, err); err == nil {
			return nil
		}
	}
	return fmt.Errorf("rows of %q on node %q: %w", v.name, p.node, err)
}

// refreshAddr asks the coordinator for node's address now; when it is not
// old, the variable's table takes it (a copy: readers may hold the old one)
// and it is returned.
func (a *Agent) refreshAddr(ctx context.Context, v *variable, node, old string) (string, bool) {
	ctx, cancel := context.WithTimeout(ctx, a.cfg.Timeout)
	defer cancel()
	var addr string
	if c := a.coord.Load(); c != nil {
		addr = c.addr(node)
	} else {
		caddr, err := a.coordinatorAddr(ctx)
		if err != nil || caddr == "" {
			return "", false
		}
		m := wire.PeerNodes{Node: node}
		body, err := a.pool.Call(ctx, caddr, wire.OpPeerNodes, m.Encode)
		if err != nil {
			return "", false
		}
		nodes, err := wire.DecodeTable(body)
		if err != nil {
			return "", false
		}
		for i, n := range nodes.Nodes {
			if n == node {
				addr = nodes.Addrs[i]
			}
		}
	}
	if addr == "" || addr == old {
		return "", false
	}
	v.mu.Lock()
	if t := v.table; t != nil {
		nt := *t
		nt.Addrs = slices.Clone(t.Addrs)
		for i, n := range nt.Nodes {
			if n == node {
				nt.Addrs[i] = addr
			}
		}
		v.table = &nt
	}
	v.mu.Unlock()
	a.stats.addrRefreshes.Add(1)
	a.log.Info("a node's agent moved; using its new address", "node", node, "old", old, "new", addr)
	return addr, true
}

// prefetch starts reading rows of a variable's backing file into staging
// memory, for a Read to come; it returns without waiting.
func (a *Agent) prefetch(ctx context.Context, m *wire.Fetch) error {
	v, err := a.lookup(ctx, m.Name)
	if err != nil {
		return err
	}
	// A ragged variable's tier comes with the node's index, which a
	// reading job's node builds at its first use.
	if err := a.ensureIndex(ctx, v); err != nil {
		return err
	}
	v.mu.RLock()
	defer v.mu.RUnlock()
	if err := v.current(m.ID); err != nil {
		return err
	}
	switch {
	case v.tier == nil:
		return base.Errorf(base.ErrArgument, "variable %q has no backing file: its rows are all in memory, there is nothing to prefetch", m.Name)
	}
	if err := v.lay.CheckAll(m.Globals); err != nil {
		return fmt.Errorf("variable %q: %w", m.Name, err)
	}
	return v.tier.Prefetch(m.Globals)
}

// forgetStale drops a cached table of a variable this node holds no shard
// of, after an owner said it was freed: the next lookup asks the
// coordinator again (nodes with shards learn of frees through PeerDrop).
func (a *Agent) forgetStale(v *variable) {
	a.mu.Lock()
	v.mu.RLock()
	stale := len(v.segs) == 0
	v.mu.RUnlock()
	if !stale || a.mu.vars[v.name] != v {
		a.mu.Unlock()
		return
	}
	delete(a.mu.vars, v.name)
	held := v.heldBytes() // a ragged variable's node index, if built here
	a.mu.Unlock()
	if held > 0 {
		v.drop()
		a.shardBytes.Add(-held)
	}
}

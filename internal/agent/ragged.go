package agent

// Ragged variables on the agent: the checks of a ragged shard, the node's
// index of every row (built once per variable from the local shards and,
// for other nodes' ranks, one PeerOffsets stream per rank), a client's Read
// of ragged rows and a peer's Fetch of them. Ragged rows move between nodes
// over the TCP Fetch path whatever the engine: the one-sided engines
// address rows as row × row bytes, which ragged rows are not.

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"

	"github.com/ddstore-go/ddstore/internal/base"
	"github.com/ddstore-go/ddstore/internal/layout"
	"github.com/ddstore-go/ddstore/internal/naming"
	"github.com/ddstore-go/ddstore/internal/shm"
	"github.com/ddstore-go/ddstore/internal/source"
	"github.com/ddstore-go/ddstore/internal/tier"
	"github.com/ddstore-go/ddstore/internal/wire"
)

// checkKind checks what Shard fields the kind of rows asks for.
func checkKind(m wire.Shard) error {
	switch m.Kind {
	case wire.KindRows:
		if m.Items != 0 || len(m.Shape) != 0 {
			return base.Errorf(base.ErrGeometry, "variable %q: fixed rows with %d items and trailing shape %v: want neither", m.Name, m.Items, m.Shape)
		}
		return nil
	case wire.KindRagged:
	default:
		return base.Errorf(base.ErrGeometry, "variable %q: rows of kind %d: want %d (fixed) or %d (ragged)", m.Name, m.Kind, wire.KindRows, wire.KindRagged)
	}
	if len(m.Shape) > wire.MaxShape {
		return base.Errorf(base.ErrGeometry, "variable %q: %d trailing dimensions: want at most %d", m.Name, len(m.Shape), wire.MaxShape)
	}
	disp := int64(1)
	for _, d := range m.Shape {
		if d < 1 || d > (1<<40)/disp {
			return base.Errorf(base.ErrGeometry, "variable %q: trailing shape %v: want dimensions >= 1", m.Name, m.Shape)
		}
		disp *= d
	}
	switch {
	case disp != m.Disp:
		return base.Errorf(base.ErrGeometry, "variable %q: trailing shape %v is %d items per unit, disp says %d", m.Name, m.Shape, disp, m.Disp)
	case m.Items < 0:
		return base.Errorf(base.ErrGeometry, "variable %q: %d items: want >= 0", m.Name, m.Items)
	case m.Rows > 1<<40:
		return base.Errorf(base.ErrGeometry, "variable %q: %d ragged rows in one shard: want at most 2^40", m.Name, m.Rows)
	case m.Items > 0 && m.Disp*m.ItemSize > (1<<46)/m.Items:
		return base.Errorf(base.ErrGeometry, "variable %q: %d units of %d bytes is too large for one shard", m.Name, m.Items, m.Disp*m.ItemSize)
	case m.Backing != "" && !naming.IsPair(m.Backing):
		return base.Errorf(base.ErrArgument, "variable %q: ragged rows with backing file %s: want a pair of values and offsets datasets", m.Name, m.Backing)
	}
	return nil
}

// shardHeader is the segment header of a declared shard.
func shardHeader(m wire.Shard) shm.Header {
	h := shm.Header{Rank: m.Rank, Rows: m.Rows, Disp: m.Disp, ItemSize: m.ItemSize}
	if m.Kind == wire.KindRagged {
		h.Kind, h.Items = shm.KindRagged, m.Items
	}
	return h
}

// ragged is what the agent keeps of a ragged variable once published.
type ragged struct {
	// first[r] is rank r's first unit in the job-wide values; first[P] all
	// of them.
	first []int64
	// ub is the bytes of one unit (disp × itemsize).
	ub int64
}

func newRagged(t *wire.Table) *ragged {
	g := &ragged{first: make([]int64, len(t.ShardItems)+1), ub: t.Disp * t.ItemSize}
	for r, n := range t.ShardItems {
		g.first[r+1] = g.first[r] + n
	}
	return g
}

// localRow is row l of a local ragged shard: its bytes, checked against
// the shard (its offsets were checked at publish; nobody but the agent
// maps the segment writable since, but a bound costs nothing).
func (g *ragged) localRow(seg *shm.Segment, l int64) ([]byte, error) {
	off := seg.Offsets
	if l < 0 || l+1 >= int64(len(off)) {
		return nil, base.Errorf(base.ErrInternal, "row %d of a shard of %d rows", l, len(off)-1)
	}
	lo, hi := off[l], off[l+1]
	if lo < 0 || hi < lo || hi > seg.Header.Items {
		return nil, base.Errorf(base.ErrInternal, "shard %s: row %d at units [%d, %d) of %d", seg.Path, l, lo, hi, seg.Header.Items)
	}
	return seg.Data[lo*g.ub : hi*g.ub : hi*g.ub], nil
}

// ensureIndex builds the node's index of a ragged variable if it has none:
// a segment of N+1 job-wide offsets, which the node's clients map
// read-only. Local ranks' offsets come from their shards, the others' from
// their agents (PeerOffsets); with a backing file, every row's come from
// its offsets dataset, checked against the shards, and the tier that reads
// the rows only the file holds is made on the index. The caller holds no
// lock of v's; the index is built once (indexMu), outside v.mu, since it
// waits on other nodes.
func (a *Agent) ensureIndex(ctx context.Context, v *variable) error {
	v.mu.RLock()
	t, done, gone := v.table, v.index != nil, v.gone
	v.mu.RUnlock()
	if t == nil || !t.Ragged() || done {
		return nil
	}
	if gone {
		return base.Errorf(base.ErrFreed, "variable %q was freed", v.name)
	}
	v.indexMu.Lock()
	defer v.indexMu.Unlock()
	v.mu.RLock()
	done, byRank, lay, g := v.index != nil, v.byRank, v.lay, v.rag
	v.mu.RUnlock()
	if done {
		return nil
	}
	n, items := lay.Held(), g.first[len(g.first)-1]
	var offsets source.Source
	if t.Backing != "" {
		// Every rank's agent checked the offsets at publish: here they
		// are read once, into the index.
		var values source.Source
		var err error
		values, offsets, err = tier.OpenPair(t.Backing, t.Dtype, g.ub, t.Total)
		if err != nil {
			return fmt.Errorf("variable %q: %w", v.name, err)
		}
		values.Close()
		defer offsets.Close()
		n = lay.Total()
		last := []int64{0}
		if err := tier.ReadOffsets(offsets, n, last); err != nil {
			return fmt.Errorf("variable %q: ragged offsets: %w", v.name, err)
		}
		items = last[0]
	}
	h := shm.Header{Rank: -1, Rows: n, Disp: t.Disp, ItemSize: t.ItemSize, Kind: shm.KindIndex, Items: items}
	size := shm.DataBytes(h)
	release, err := a.admit(size, true, func(s string) string { return fmt.Sprintf("variable %q: the index of its %d rows, %s", v.name, n, s) })
	if err != nil {
		return err
	}
	release()
	path := shm.IndexPath(a.cfg.Namespace, a.cfg.Node, v.name, shm.NewNonce())
	seg, err := shm.Create(path, h)
	if err == nil && offsets != nil {
		err = fillBackedIndex(t, lay, byRank, g, offsets, seg.Offsets)
	} else if err == nil {
		err = a.fillIndex(ctx, v, t, byRank, seg.Offsets)
	}
	if err == nil {
		err = seg.CheckOffsets(0)
	}
	if err == nil {
		v.mu.Lock()
		if v.gone {
			err = base.Errorf(base.ErrFreed, "variable %q was freed", v.name)
		} else {
			v.setIndex(a, seg)
		}
		v.mu.Unlock()
	}
	if err != nil {
		if seg != nil {
			seg.Close()
			shm.Remove(path)
		}
		a.shardBytes.Add(-size)
		return fmt.Errorf("variable %q: building its index: %w", v.name, err)
	}
	a.saveManifest()
	return nil
}

// fillIndex writes every row's job-wide offsets into idx (N+1 entries):
// local ranks' from their shards, the others' from their agents, every
// rank's at once (at most indexFetches requests in flight), each rank's
// rows in order; the first error cancels the others' and is returned once
// all have stopped.
func (a *Agent) fillIndex(ctx context.Context, v *variable, t *wire.Table, byRank []*shm.Segment, idx []int64) error {
	g := v.rag
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	sem := make(chan struct{}, indexFetches)
	var wg sync.WaitGroup
	var once sync.Once
	var first error
	var row int64
	for r, rows := range t.ShardRows {
		from, at := g.first[r], row
		row += rows
		if seg := byRank[r]; seg != nil {
			for l, o := range seg.Offsets[:rows] {
				idx[at+int64(l)] = from + o
			}
			continue
		}
		if rows == 0 {
			continue
		}
		wg.Go(func() {
			sem <- struct{}{}
			defer func() { <-sem }()
			if err := a.fetchOffsets(ctx, t, r, idx[at:at+rows], from); err != nil {
				once.Do(func() { first = err })
				cancel(err)
			}
		})
	}
	wg.Wait()
	idx[row] = g.first[len(g.first)-1]
	if first != nil {
		return first
	}
	// A fetch stops, saying nothing, once ctx is done: the caller's, here.
	return context.Cause(ctx)
}

// indexFetches bounds the PeerOffsets requests one index has in flight.
const indexFetches = 8

// fetchOffsets reads rank r's offsets from its node's agent into dst (one
// per row of its shard), shifted by from, its first job-wide unit.
func (a *Agent) fetchOffsets(ctx context.Context, t *wire.Table, r int, dst []int64, from int64) error {
	node := t.RankNode[r]
	rows := int64(len(dst))
	for lo := int64(0); lo < rows; lo += wire.MaxOffsets {
		if err := ctx.Err(); err != nil {
			return nil // another rank's fetch failed: its error is the one returned
		}
		cnt := min(rows-lo, wire.MaxOffsets)
		off, err := a.peerOffsets(ctx, t.Addrs[node], t, r, lo, cnt)
		if err != nil {
			return fmt.Errorf("rank %d's offsets from node %q: %w", r, t.Nodes[node], err)
		}
		if int64(len(off)) != cnt+1 || (lo == 0 && off[0] != 0) || (lo+cnt == rows && off[cnt] != t.ShardItems[r]) {
			return base.Errorf(base.ErrProtocol, "rank %d's offsets [%d, %d] from node %q: %d values from %d to %d, for a shard of %d units",
				r, lo, lo+cnt, t.Nodes[node], len(off), off[0], off[len(off)-1], t.ShardItems[r])
		}
		for l, o := range off[:cnt] {
			dst[lo+int64(l)] = from + o
		}
	}
	return nil
}

// setIndex installs the node's index of a ragged variable and, with a
// backing file, the tier that reads the file's rows by it; the caller
// holds v.mu (W).
func (v *variable) setIndex(a *Agent, seg *shm.Segment) {
	v.index = seg
	if t := v.table; t.Backing != "" {
		v.tier = tier.New(tier.Config{Name: t.Name, Spec: t.Backing, Dtype: t.Dtype, RowBytes: v.rag.ub, Offsets: seg.Offsets,
			Held: v.lay.Held(), Total: t.Total, StagingBytes: a.cfg.StagingBytes, Admit: a.admitStaging,
			Go: a.go_, Context: a.ctx, Timeout: a.cfg.Timeout, Counters: &a.stats.tier})
	}
}

// fillBackedIndex reads the N+1 offsets of a ragged variable's backing
// file into idx, the node's index, and checks them against the shards,
// which hold the file's first rows: each rank's units, and the local
// ranks' rows one by one.
func fillBackedIndex(t *wire.Table, lay *layout.Layout, byRank []*shm.Segment, g *ragged, offsets source.Source, idx []int64) error {
	if err := tier.ReadOffsets(offsets, 0, idx); err != nil {
		return fmt.Errorf("ragged offsets: %w", err)
	}
	var row int64
	for r, rows := range t.ShardRows {
		if got := idx[row+rows] - idx[row]; got != t.ShardItems[r] {
			return base.Errorf(base.ErrGeometry, "rank %d's shard holds rows [%d, %d) of %d units; the backing file's offsets say %d",
				r, row, row+rows, t.ShardItems[r], got)
		}
		if seg := byRank[r]; seg != nil {
			for l, o := range seg.Offsets[:rows+1] {
				if idx[row+int64(l)]-g.first[r] != o {
					return base.Errorf(base.ErrGeometry, "rank %d's shard: row %d (global %d) starts at unit %d of the shard; the backing file's offsets say %d",
						r, l, row+int64(l), o, idx[row+int64(l)]-g.first[r])
				}
			}
		}
		row += rows
	}
	return nil
}

// peerOffsets asks the agent at addr for rank r's offsets [first,
// first+count].
func (a *Agent) peerOffsets(ctx context.Context, addr string, t *wire.Table, r int, first, count int64) ([]int64, error) {
	ctx, cancel := context.WithTimeout(ctx, a.cfg.Timeout)
	defer cancel()
	m := wire.PeerOffsets{Name: t.Name, ID: t.ID, Rank: int64(r), First: first, Count: count}
	body, err := a.pool.Call(ctx, addr, wire.OpPeerOffsets, m.Encode)
	if err != nil {
		return nil, err
	}
	o, err := wire.DecodeOffsets(body)
	return o.Offsets, err
}

// offsets answers PeerOffsets: a local rank's offsets of a ragged shard.
func (a *Agent) offsets(m wire.PeerOffsets) (func(*wire.Encoder), error) {
	v, err := a.served(m.Name, m.ID)
	if err != nil {
		return nil, err
	}
	defer v.mu.RUnlock()
	if !v.table.Ragged() {
		return nil, base.Errorf(base.ErrArgument, "variable %q has rows of one size: it has no offsets", m.Name)
	}
	if m.Rank < 0 || m.Rank >= int64(len(v.byRank)) || v.byRank[m.Rank] == nil {
		return nil, base.Errorf(base.ErrArgument, "variable %q: rank %d's shard is not on node %q", m.Name, m.Rank, a.cfg.Node)
	}
	seg := v.byRank[m.Rank]
	rows := seg.Header.Rows
	if m.First < 0 || m.Count < 0 || m.Count > wire.MaxOffsets || m.First > rows-m.Count {
		return nil, base.Errorf(base.ErrIndex, "variable %q: offsets of rows [%d, +%d) of rank %d's shard of %d rows (at most %d at once)",
			m.Name, m.First, m.Count, m.Rank, rows, wire.MaxOffsets)
	}
	// A copy: the reply is encoded after v.mu is released, when the
	// segment may be unmapped.
	r := wire.Offsets{Offsets: slices.Clone(seg.Offsets[m.First : m.First+m.Count+1])}
	return r.Encode, nil
}

// raggedRows serves a Fetch of ragged rows: slices of this node's shards.
// The caller holds v.mu (R) and has checked the indices.
func (h *peerHandler) raggedRows(v *variable, globals []int64, rows [][]byte) ([][]byte, error) {
	a := (*Agent)(h)
	var n int64
	for _, gi := range globals {
		rank, local := v.lay.Owner(gi)
		if rank == layout.Backed {
			return rows[:0], base.Errorf(base.ErrArgument, "row %d of %q is in its backing file, not on node %q: read it from the file", gi, v.name, a.cfg.Node)
		}
		seg := v.byRank[rank]
		if seg == nil {
			return rows[:0], base.Errorf(base.ErrArgument, "row %d of %q belongs to rank %d on node %q, not on node %q",
				gi, v.name, rank, v.table.Nodes[v.table.RankNode[rank]], a.cfg.Node)
		}
		row, err := v.rag.localRow(seg, local)
		if err != nil {
			return rows[:0], err
		}
		rows = append(rows, row)
		n += int64(len(row))
	}
	a.stats.servedRows.Add(int64(len(globals)))
	a.stats.servedBytes.Add(n)
	return rows, nil
}

// readRagged serves a client's Read of a ragged variable: every row's size
// from the node's index, rows of this node copied from the shards, the
// others fetched from their agents, one Fetch per node (over TCP,
// whatever the engine), straight into the client's region. The caller
// holds v.mu (R), which readRagged releases before the fetches (unlock).
func (a *Agent) readRagged(ctx context.Context, s *session, v *variable, m *wire.Read, mem []byte, unlock func()) error {
	idx := v.index.Offsets
	g, t, f := v.rag, v.table, &s.fan
	size := int64(len(mem))
	for len(f.nodes) < len(t.Nodes) {
		f.nodes = append(f.nodes, nodeRows{})
	}
	for i := range t.Nodes {
		f.nodes[i].globals, f.nodes[i].dst = f.nodes[i].globals[:0], f.nodes[i].dst[:0]
	}
	f.backed.globals, f.backed.dst = f.backed.globals[:0], f.backed.dst[:0]
	for i, gi := range m.Globals {
		off, nb := m.Offsets[i], (idx[gi+1]-idx[gi])*g.ub
		if off < 0 || off > size-nb {
			return base.Errorf(base.ErrBuffer, "row %d of the read (global %d, %d bytes) goes to offset %d of a %d-byte receive region", i, gi, nb, off, size)
		}
	}
	for i, gi := range m.Globals {
		off, nb := m.Offsets[i], (idx[gi+1]-idx[gi])*g.ub
		dst := mem[off : off+nb : off+nb]
		rank, local := v.lay.Owner(gi)
		if rank == layout.Backed {
			if nb > 0 {
				f.backed.globals = append(f.backed.globals, gi)
				f.backed.dst = append(f.backed.dst, dst)
			}
			continue
		}
		if seg := v.byRank[rank]; seg != nil {
			row, err := g.localRow(seg, local)
			if err != nil {
				return err
			}
			copy(dst, row)
			continue
		}
		node := t.RankNode[rank]
		n := &f.nodes[node]
		n.globals = append(n.globals, gi)
		n.dst = append(n.dst, dst)
	}
	tr := v.tier
	unlock()
	a.stats.readRows.Add(int64(len(m.Globals)))
	// Ragged rows travel over the TCP Fetch path on every engine, which
	// is never serial.
	a.cutPieces(f, t, false)
	fetch := func(p *piece, addr string) error { return a.pool.Fetch(ctx, addr, m.Name, t.ID, p.globals, p.dst) }
	var backed func() error
	if len(f.backed.globals) > 0 {
		backed = func() error {
			tctx, cancel := context.WithTimeout(ctx, a.cfg.Timeout)
			defer cancel()
			return tr.Read(tctx, f.backed.globals, f.backed.dst)
		}
	}
	err := a.fetchPieces(ctx, v, f.pieces, fetch, backed, a.tierFallback(ctx, tr))
	clear(f.pieces)
	clear(f.backed.dst)
	for i := range t.Nodes {
		clear(f.nodes[i].dst)
	}
	return err
}

// fetchPieces fetches pieces concurrently (the first on this goroutine,
// unless backed, the read of rows of the backing file, runs there
// meanwhile) and handles their errors: a stale table, a node that moved,
// one that is gone (fallback, when not nil: settlePiece).
func (a *Agent) fetchPieces(ctx context.Context, v *variable, pieces []piece, fetch func(p *piece, addr string) error,
	backed func() error, fallback func(p *piece, err error) error) error {
	if len(pieces) == 0 && backed == nil {
		return nil
	}
	first := 1
	if backed != nil {
		first = 0
	}
	done := make(chan struct{}, len(pieces))
	for i := first; i < len(pieces); i++ {
		p := &pieces[i]
		go func() {
			defer func() { done <- struct{}{} }()
			p.err = fetch(p, p.addr)
		}()
	}
	var backedErr error
	if backed != nil {
		backedErr = backed()
	} else {
		pieces[0].err = fetch(&pieces[0], pieces[0].addr)
	}
	for i := first; i < len(pieces); i++ {
		<-done
	}
	if backedErr != nil {
		return backedErr
	}
	for i := range pieces {
		if err := a.settlePiece(ctx, v, &pieces[i], fetch, fallback); err != nil {
			return err
		}
	}
	return nil
}

// tierFallback is settlePiece's fallback for a variable with a backing
// file (tr; nil: none): the rows of a node that is gone or unreachable are
// read from the file, which holds every row.
func (a *Agent) tierFallback(ctx context.Context, tr *tier.Tier) func(p *piece, err error) error {
	if tr == nil {
		return nil
	}
	return func(p *piece, err error) error {
		tctx, cancel := context.WithTimeout(ctx, a.cfg.Timeout)
		ferr := tr.ReadAny(tctx, p.globals, p.dst)
		cancel()
		if ferr != nil {
			return errors.Join(err, ferr)
		}
		a.stats.peerFallbackRows.Add(int64(len(p.globals)))
		return nil
	}
}

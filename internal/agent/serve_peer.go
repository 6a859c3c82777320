package agent

// The serving side of the peer protocol: rows of this node's segments for
// other nodes' Fetch, and the control ops any agent answers (the
// coordinator's are dispatched to coordinator.go).

import (
	"context"
	"sync"
	"time"

	"github.com/ddstore-go/ddstore/internal/base"
	"github.com/ddstore-go/ddstore/internal/layout"
	"github.com/ddstore-go/ddstore/internal/shm"
	"github.com/ddstore-go/ddstore/internal/wire"
)

// peerHandler is the agent as seen by other agents.
type peerHandler Agent

// Rows serves a Fetch: slices of this node's segments, read-locked until
// they are sent.
func (h *peerHandler) Rows(name string, id int64, globals []int64, rows [][]byte) ([][]byte, func(), error) {
	a := (*Agent)(h)
	v, err := a.served(name, id)
	if err != nil {
		return rows, nil, err
	}
	if err := v.lay.CheckAll(globals); err != nil {
		v.mu.RUnlock()
		return rows, nil, err
	}
	if v.rag != nil {
		rows, err := h.raggedRows(v, globals, rows)
		if err != nil {
			v.mu.RUnlock()
			return rows, nil, err
		}
		return rows, v.mu.RUnlock, nil
	}
	rb := v.lay.Bytes()
	for _, g := range globals {
		rank, local := v.lay.Owner(g)
		if rank == layout.Backed {
			v.mu.RUnlock()
			return rows[:0], nil, base.Errorf(base.ErrArgument, "row %d of %q is in its backing file, not on node %q: read it from the file",
				g, name, a.cfg.Node)
		}
		seg := v.byRank[rank]
		if seg == nil {
			v.mu.RUnlock()
			return rows[:0], nil, base.Errorf(base.ErrArgument, "row %d of %q belongs to rank %d on node %q, not on node %q",
				g, name, rank, v.table.Nodes[v.table.RankNode[rank]], a.cfg.Node)
		}
		rows = append(rows, seg.Data[local*rb:(local+1)*rb])
	}
	a.stats.servedRows.Add(int64(len(globals)))
	a.stats.servedBytes.Add(int64(len(globals)) * rb)
	return rows, v.mu.RUnlock, nil
}

// RowsRange serves a FetchRange: the rows [start, start+count) of this
// node's shards, a slice per shard, read-locked until they are sent.
func (h *peerHandler) RowsRange(name string, id, start, count int64, rows [][]byte) ([][]byte, func(), error) {
	a := (*Agent)(h)
	v, err := a.served(name, id)
	if err != nil {
		return rows, nil, err
	}
	if v.rag != nil {
		v.mu.RUnlock()
		return rows, nil, base.Errorf(base.ErrArgument, "variable %q has ragged rows: a range of them is fetched row by row", name)
	}
	spans, err := v.lay.Spans(start, count)
	if err != nil {
		v.mu.RUnlock()
		return rows, nil, err
	}
	rb := v.lay.Bytes()
	for _, sp := range spans {
		var seg *shm.Segment
		if sp.Rank != layout.Backed {
			seg = v.byRank[sp.Rank]
		}
		if seg == nil {
			v.mu.RUnlock()
			return rows[:0], nil, base.Errorf(base.ErrArgument, "rows [%d, %d) of %q are not all on node %q", start, start+count, name, a.cfg.Node)
		}
		rows = append(rows, seg.Data[sp.Local*rb:(sp.Local+sp.Count)*rb])
	}
	a.stats.servedRows.Add(count)
	a.stats.servedBytes.Add(count * rb)
	return rows, v.mu.RUnlock, nil
}

// served is a published variable of this node that a peer asks for by
// name and table id, read-locked (the caller unlocks it).
func (a *Agent) served(name string, id int64) (*variable, error) {
	a.mu.Lock()
	v := a.mu.vars[name]
	a.mu.Unlock()
	if v == nil {
		return nil, base.Errorf(base.ErrUnknown, "node %q holds no variable %q", a.cfg.Node, name)
	}
	v.mu.RLock()
	if v.table == nil && !v.gone && len(v.segs) > 0 {
		// This node's shards exist: the round is completing and its reply
		// is on its way here. Wait for it, boundedly.
		v.mu.RUnlock()
		t := time.NewTimer(a.cfg.Timeout)
		select {
		case <-v.ready:
		case <-t.C:
		case <-a.ctx.Done():
		}
		t.Stop()
		v.mu.RLock()
	}
	if v.gone || v.table == nil {
		v.mu.RUnlock()
		return nil, base.Errorf(base.ErrUnknown, "node %q holds no published variable %q", a.cfg.Node, name)
	}
	if v.table.ID != id {
		v.mu.RUnlock()
		return nil, base.Errorf(base.ErrFreed, "variable %q was freed and created again since the reader looked it up", name)
	}
	return v, nil
}

// Control answers the peer protocol's control ops; the coordinator's are
// coordinatorOp's.
func (h *peerHandler) Control(ctx context.Context, op wire.Op, body []byte) (func(*wire.Encoder), error) {
	a := (*Agent)(h)
	if isCoordinatorOp(op) {
		return a.countCoordinatorOp(ctx, op, body)
	}
	switch op {
	case wire.OpPeerGather:
		if a.coord.Load() != nil {
			// A node whose tree does not tell the coordinator apart
			// (its address in the table not the one joined) sends it
			// here: a PeerRound.
			return a.countCoordinatorOp(ctx, wire.OpPeerRound, body)
		}
		m, err := wire.DecodeRound(body)
		if err != nil {
			return nil, err
		}
		return a.peerGather(ctx, m)
	case wire.OpPeerDrop:
		m, err := wire.DecodeDrop(body)
		if err != nil {
			return nil, err
		}
		a.drop(m.Name, m.ID)
		return nil, nil
	case wire.OpPeerDropTree:
		m, err := wire.DecodeDropTree(body)
		if err != nil {
			return nil, err
		}
		// Answered once the nodes below have dropped theirs too (or
		// failed), so that the coordinator's last Free returns after.
		var wg sync.WaitGroup
		wg.Go(func() { a.dropAlong(m.Name, m.ID, m.Nodes, m.Addrs) })
		a.drop(m.Name, m.ID)
		wg.Wait()
		return nil, nil
	case wire.OpPeerTable:
		m, err := wire.DecodeDrop(body)
		if err != nil {
			return nil, err
		}
		return a.peerTable(ctx, m)
	case wire.OpPeerInfo:
		t := wire.Text{Text: a.infoJSON()}
		return t.Encode, nil
	case wire.OpPeerWindow:
		m, err := wire.DecodePeerWindow(body)
		if err != nil {
			return nil, err
		}
		return a.window(m.Name, m.ID)
	case wire.OpPeerOffsets:
		m, err := wire.DecodePeerOffsets(body)
		if err != nil {
			return nil, err
		}
		return a.offsets(m)
	}
	return nil, base.Errorf(base.ErrProtocol, "unknown peer op %d", op)
}

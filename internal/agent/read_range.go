package agent

// A client's ReadRange: contiguous rows of a variable of fixed-size rows,
// cut by owner — runs of this node copied from its segments, each other
// node's run fetched in one FetchRange (cut into pieces when large) —
// straight into the client's receive region. One request, whatever the
// rows' size: a record of bytes of a uint8 variable is one ReadRange, not
// a Read of one index per byte. Rows of a backing file go the way of Read.

import (
	"context"
	"sync"

	"github.com/ddstore-go/ddstore/internal/base"
	"github.com/ddstore-go/ddstore/internal/layout"
	"github.com/ddstore-go/ddstore/internal/transport"
	"github.com/ddstore-go/ddstore/internal/wire"
)

// rangePiece is one FetchRange of a ReadRange: rows [start, start+count)
// of one node, into dst.
type rangePiece struct {
	piece
	start, count int64
	dst          []byte
}

func (a *Agent) readRange(ctx context.Context, s *session, m wire.ReadRange) error {
	v, err := a.lookup(ctx, m.Name)
	if err != nil {
		return err
	}
	v.mu.RLock()
	backed := v.table != nil && v.lay.Total() > v.lay.Held() && m.Start+m.Count > v.lay.Held()
	rb := v.lay.Bytes()
	v.mu.RUnlock()
	if backed && m.Count >= 0 {
		// Rows of the backing file: the storage tier reads them row by
		// row, so the range goes as the Read of its rows.
		r := &s.read
		r.Name, r.Region, r.ID = m.Name, m.Region, m.ID
		r.Globals, r.Offsets = r.Globals[:0], r.Offsets[:0]
		for i := int64(0); i < m.Count; i++ {
			r.Globals = append(r.Globals, m.Start+i)
			r.Offsets = append(r.Offsets, m.Offset+i*rb)
		}
		return a.read(ctx, s, r)
	}
	l, err := a.lockRead(v, m.Region, m.ID)
	if err != nil {
		return err
	}
	defer l.release()
	reg := l.reg
	if v.rag != nil {
		return base.Errorf(base.ErrArgument, "variable %q has ragged rows: a range of them is read with Read", m.Name)
	}
	spans, err := v.lay.Spans(m.Start, m.Count)
	if err != nil {
		return err
	}
	size := int64(len(reg.mem))
	if m.Offset < 0 || m.Offset > size || m.Count*rb > size-m.Offset {
		return base.Errorf(base.ErrBuffer, "rows [%d, %d) of %d bytes go to offset %d of a %d-byte receive region", m.Start, m.Start+m.Count, rb, m.Offset, size)
	}
	t := v.table
	pieces := s.ranges[:0]
	off := m.Offset
	for _, sp := range spans {
		n := sp.Count * rb
		dst := reg.mem[off : off+n] // uncapped: the next rank's run of the same node extends it
		off += n
		if sp.Rank == layout.Backed { // not reached: backed ranges went to read above
			return base.Errorf(base.ErrInternal, "variable %q: rows of the backing file in a range read", m.Name)
		}
		if seg := v.byRank[sp.Rank]; seg != nil {
			copy(dst, seg.Data[sp.Local*rb:sp.Local*rb+n])
			continue
		}
		ni := t.RankNode[sp.Rank]
		start := v.lay.First(sp.Rank) + sp.Local
		if k := len(pieces) - 1; k >= 0 && pieces[k].node == t.Nodes[ni] && pieces[k].start+pieces[k].count == start {
			// The next rank's rows on the same node: the same request.
			p := &pieces[k]
			p.count += sp.Count
			p.dst = p.dst[:len(p.dst)+int(n)]
			continue
		}
		pieces = append(pieces, rangePiece{piece: piece{node: t.Nodes[ni], addr: t.Addrs[ni]}, start: start, count: sp.Count, dst: dst})
	}
	// The local copies are done; remote rows need only the table.
	l.unlockVar()
	a.stats.readRows.Add(m.Count)
	pieces = a.cutRanges(pieces, rb)
	s.ranges = pieces
	defer clear(s.ranges)

	var wg sync.WaitGroup
	for i := 1; i < len(pieces); i++ {
		p := &pieces[i]
		wg.Add(1)
		go func() {
			defer wg.Done()
			p.err = a.fetchRange(ctx, p.addr, m.Name, t.ID, p.start, p.count, p.dst)
		}()
	}
	if len(pieces) > 0 {
		p := &pieces[0]
		p.err = a.fetchRange(ctx, p.addr, m.Name, t.ID, p.start, p.count, p.dst)
	}
	wg.Wait()
	for i := range pieces {
		p := &pieces[i]
		fetch := func(_ *piece, addr string) error {
			return a.fetchRange(ctx, addr, m.Name, t.ID, p.start, p.count, p.dst)
		}
		if err := a.settlePiece(ctx, v, &p.piece, fetch, nil); err != nil {
			return err
		}
	}
	return nil
}

// cutRanges cuts each node's run into as many pieces as there are
// connections to it (one per splitBytes at most), as cutPieces does for a
// Read, so that both ends move rows on several cores at once — unless the
// engine is serial.
func (a *Agent) cutRanges(pieces []rangePiece, rb int64) []rangePiece {
	n := len(pieces)
	for i := 0; i < n; i++ {
		a.stats.fetches.Add(1)
		p := pieces[i]
		k := int64(1)
		if !a.rows.Serial() {
			k = max(1, min(int64(a.connsPerPeer()), int64(len(p.dst))/splitBytes))
		}
		if k == 1 || p.count < k {
			continue
		}
		per := (p.count + k - 1) / k
		pieces[i].count = per
		pieces[i].dst = p.dst[: per*rb : per*rb]
		for lo := per; lo < p.count; lo += per {
			c := min(per, p.count-lo)
			pieces = append(pieces, rangePiece{piece: p.piece, start: p.start + lo, count: c, dst: p.dst[lo*rb : (lo+c)*rb : (lo+c)*rb]})
		}
	}
	return pieces
}

// fetchRange reads rows [start, start+count) of the node at addr into dst:
// one FetchRange with an engine that has it (tcp), else a Fetch of each row.
func (a *Agent) fetchRange(ctx context.Context, addr, name string, id, start, count int64, dst []byte) error {
	if rf, ok := a.rows.(transport.RangeFetcher); ok {
		return rf.FetchRange(ctx, addr, name, id, start, count, dst)
	}
	if count == 0 {
		return nil
	}
	rb := int64(len(dst)) / count
	globals := make([]int64, count)
	rows := make([][]byte, count)
	for i := range globals {
		globals[i] = start + int64(i)
		rows[i] = dst[int64(i)*rb : int64(i+1)*rb : int64(i+1)*rb]
	}
	return a.rows.Fetch(ctx, addr, name, id, globals, rows)
}

package client

// Ragged variables as a rank sees them: creating one from values and
// lengths, the node's index of every row (mapped read-only from the
// agent's index segment, so a row's extent costs no round trip), and
// batch reads that pack rows into one destination, node-local rows
// straight from shared memory, the others in one Read to the agent.

import (
	"fmt"
	"time"

	"github.com/ddstore-go/ddstore/internal/base"
	"github.com/ddstore-go/ddstore/internal/layout"
	"github.com/ddstore-go/ddstore/internal/naming"
	"github.com/ddstore-go/ddstore/internal/shm"
	"github.com/ddstore-go/ddstore/internal/wire"
)

// ragged is a ragged variable's geometry on this rank.
type ragged struct {
	index *shm.Segment
	off   []int64 // N+1 job-wide offsets, in units
	first []int64 // per rank its first unit; first[P] all of them
	ub    int64   // bytes of a unit: disp × itemsize
	shape []int64
}

// raggedShard is what a rank declares of its ragged shard.
type raggedShard struct {
	items int64
	shape []int64
}

// openRagged maps the node's index named by a ragged variable's table.
func openRagged(t *wire.Table, lay *layout.Layout) (*ragged, error) {
	if t.Index == "" {
		return nil, base.Errorf(base.ErrProtocol, "the agent's table of a ragged variable names no index")
	}
	seg, err := shm.Open(t.Index, false)
	if err != nil {
		return nil, err
	}
	if seg.Dropped() {
		seg.Close()
		return nil, &staleTable{base.Errorf(base.ErrFreed, "index %s was dropped since the agent answered", t.Index)}
	}
	g := &ragged{index: seg, off: seg.Offsets, first: make([]int64, len(t.ShardItems)+1), ub: t.Disp * t.ItemSize, shape: t.Shape}
	for r, n := range t.ShardItems {
		g.first[r+1] = g.first[r] + n
	}
	// With a backing file, the index holds every row, the shards' and
	// the file's, so more units than the shards.
	held := g.first[len(g.first)-1]
	if h := seg.Header; h.Kind != shm.KindIndex || h.Rows != lay.Total() || h.Items != held && (t.Backing == "" || h.Items < held) {
		seg.Close()
		return nil, base.Errorf(base.ErrProtocol, "index %s of %d rows and %d units; the table says %d rows and %d units", t.Index, h.Rows, h.Items, lay.Total(), held)
	}
	return g, nil
}

// RaggedShape checks a ragged variable's trailing shape and returns disp,
// the items in one unit of a row (1 for no trailing dimensions).
func RaggedShape(name string, shape []int64) (int64, error) {
	if len(shape) > wire.MaxShape {
		return 0, base.Errorf(base.ErrGeometry, "variable %q: %d trailing dimensions: want at most %d", name, len(shape), wire.MaxShape)
	}
	disp := int64(1)
	for _, d := range shape {
		if d < 1 || d > layout.MaxRowBytes/disp {
			return 0, base.Errorf(base.ErrGeometry, "variable %q: trailing shape %v: want dimensions >= 1", name, shape)
		}
		disp *= d
	}
	return disp, nil
}

// CreateRagged creates a ragged variable whose shard on this rank is rows
// of lengths[i] units (of shape's product of items of itemsize bytes, type
// dtype), packed in values. Collective, like Create; bad, when not nil,
// is this rank's error found before (a dtype unknown), which fails the
// round for every rank.
func (s *Store) CreateRagged(name string, values []byte, lengths []int64, shape []int64, dtype string, itemsize int64, bad error, b *Backing) error {
	return s.CreateRaggedFrom(name, int64(len(values)), func(dst []byte) error { copy(dst, values); return nil }, lengths, shape, dtype, itemsize, bad, b)
}

// CreateRaggedFrom is CreateRagged of values of nbytes bytes that read
// writes into the shard, in shared memory, before the variable is
// published: an error of read fails the round for every rank.
func (s *Store) CreateRaggedFrom(name string, nbytes int64, read func(dst []byte) error, lengths []int64, shape []int64, dtype string, itemsize int64, bad error, b *Backing) error {
	disp, err := RaggedShape(name, shape)
	if bad == nil {
		bad = err
	}
	if bad == nil {
		bad = RowError(name, disp, itemsize)
	}
	var items int64
	if bad == nil {
		for i, n := range lengths {
			if n < 0 {
				bad = base.Errorf(base.ErrGeometry, "variable %q: lengths[%d] = %d: want >= 0", name, i, n)
				break
			}
			if n > 1<<46-items {
				bad = base.Errorf(base.ErrGeometry, "variable %q: lengths add up to more than 2^46", name)
				break
			}
			items += n
		}
	}
	ub := disp * itemsize
	if bad == nil && (items > (1<<46)/ub || items*ub != nbytes) {
		bad = base.Errorf(base.ErrGeometry, "variable %q: lengths add up to %d units of %d bytes (%d bytes), but the values are %d bytes",
			name, items, ub, items*ub, nbytes)
	}
	if bad == nil && b != nil {
		var sent string
		sent, bad = naming.CheckRaggedBacking(name, b.File, b.Offsets, b.Rows, int64(len(lengths)))
		b = &Backing{File: sent, Rows: b.Rows}
	}
	if bad != nil {
		return s.create(name, 0, max(disp, 1), max(itemsize, 1), dtype, bad, nil, &raggedShard{shape: shape}, nil, false)
	}
	fill := func(seg *shm.Segment) error {
		var o int64
		for i, n := range lengths {
			seg.Offsets[i] = o
			o += n
		}
		seg.Offsets[len(lengths)] = o
		if int64(len(seg.Data)) != nbytes {
			return base.Errorf(base.ErrInternal, "variable %q: shard segment of %d bytes of values for %d", name, len(seg.Data), nbytes)
		}
		return read(seg.Data)
	}
	if shape == nil {
		shape = []int64{}
	}
	return s.create(name, int64(len(lengths)), disp, itemsize, dtype, nil, b, &raggedShard{items: items, shape: shape}, fill, true)
}

// readRagged is read (stale.go) of a ragged variable.
func (s *Store) readRagged(name string, f func(v *variable) error) error {
	return s.read(name, func(v *variable) error {
		if v.rag == nil {
			return base.Errorf(base.ErrArgument, "variable %q has rows of one size (%d bytes): read it with Get or GetBatch", name, v.rb)
		}
		return f(v)
	})
}

// notRagged refuses a fixed-row operation on a ragged variable.
func notRagged(v *variable, op string) error {
	if v.rag != nil {
		return base.Errorf(base.ErrArgument, "variable %q has ragged rows: %s takes rows of one size; read it with GetRagged", v.name, op)
	}
	return nil
}

// sizes fills lengths (when not nil) with the rows' lengths in units and
// returns their bytes in all, after checking every index.
func (v *variable) sizes(indices, lengths []int64) (int64, error) {
	if lengths != nil && len(lengths) != len(indices) {
		return 0, base.Errorf(base.ErrArgument, "variable %q: %d lengths for %d indices: want as many", v.name, len(lengths), len(indices))
	}
	off, total := v.rag.off, uint64(v.lay.Total())
	var units int64
	for i, g := range indices {
		if uint64(g) >= total {
			return 0, fmt.Errorf("variable %q: %w", v.name, v.lay.CheckAll(indices))
		}
		n := off[g+1] - off[g]
		if lengths != nil {
			lengths[i] = n
		}
		units += n
	}
	return units * v.rag.ub, nil
}

// RaggedSizes fills lengths with the lengths (in units of the trailing
// shape) of rows indices of a ragged variable and returns the bytes they
// take packed: what GetRagged needs, read from the node's index with no
// request to the agent.
func (s *Store) RaggedSizes(name string, indices, lengths []int64) (int64, error) {
	var n int64
	err := s.readRagged(name, func(v *variable) error {
		var err error
		n, err = v.sizes(indices, lengths)
		return err
	})
	return n, err
}

// GetRagged reads rows indices of a ragged variable packed into dst, row
// after row, and their lengths into lengths (nil: not wanted); it returns
// the bytes written. A dst too small fails before any row is read.
func (s *Store) GetRagged(name string, dst []byte, indices, lengths []int64) (int64, error) {
	var n int64
	err := s.readRagged(name, func(v *variable) error {
		var err error
		n, err = s.getRagged(v, name, dst, indices, lengths)
		return err
	})
	return n, err
}

// getRagged is GetRagged of v, read-locked.
func (s *Store) getRagged(v *variable, name string, dst []byte, indices, lengths []int64) (int64, error) {
	need, err := v.sizes(indices, lengths)
	if err != nil {
		return 0, err
	}
	if need > int64(len(dst)) {
		return 0, base.Errorf(base.ErrBuffer, "variable %q: destination of %d bytes for %d ragged rows of %d bytes: want at least %d",
			name, len(dst), len(indices), need, need)
	}
	t0 := time.Now()
	g := v.rag
	var pos, stored int64
	var remote, at, size []int64
	// Node-local rows go in runs: rows that follow one another in a shard
	// and in dst (a batch of neighbouring indices) are one copy.
	var run []byte
	runRank, runLo, runHi, runAt := -1, int64(0), int64(0), int64(0)
	for _, gi := range indices {
		nb := (g.off[gi+1] - g.off[gi]) * g.ub
		r, _ := v.lay.Owner(gi)
		if r == layout.Backed {
			// Only in the backing file: the agent reads it.
			if nb > 0 {
				remote, at, size = append(remote, gi), append(at, pos), append(size, nb)
				stored++
			}
		} else if src := v.local[r]; src != nil {
			lo := (g.off[gi] - g.first[r]) * g.ub
			if lo < 0 || lo+nb > int64(len(src)) {
				return 0, base.Errorf(base.ErrInternal, "variable %q: row %d at bytes [%d, %d) of rank %d's shard of %d", name, gi, lo, lo+nb, r, len(src))
			}
			if r == runRank && lo == runHi && pos == runAt+runHi-runLo {
				runHi += nb
			} else {
				copy(dst[runAt:runAt+runHi-runLo], run[runLo:runHi])
				run, runRank, runLo, runHi, runAt = src, r, lo, lo+nb, pos
			}
		} else if nb > 0 {
			remote, at, size = append(remote, gi), append(at, pos), append(size, nb)
		}
		pos += nb
	}
	copy(dst[runAt:runAt+runHi-runLo], run[runLo:runHi])
	err = s.fetchRagged(v, dst, remote, at, size)
	p := &v.prof
	p.calls.Add(1)
	p.rows.Add(int64(len(indices)))
	p.bytes.Add(need)
	p.localRows.Add(int64(len(indices) - len(remote)))
	p.storageRows.Add(stored)
	if len(remote) > 0 {
		p.remoteRows.Add(int64(len(remote)) - stored)
		p.remoteCalls.Add(1)
		p.waitNs.Add(int64(time.Since(t0)))
	}
	if err != nil {
		return 0, err
	}
	return need, nil
}

// GetRaggedRow reads one row of a ragged variable into dst and returns its
// bytes.
func (s *Store) GetRaggedRow(name string, dst []byte, index int64) (int64, error) {
	return s.GetRagged(name, dst, []int64{index}, nil)
}

// fetchRagged reads rows globals of other nodes through the agent, row k
// (size[k] bytes) to dst[at[k]:]: one request, written straight into dst
// when it lies in a receive buffer, else into the lane's staging region
// and copied.
func (s *Store) fetchRagged(v *variable, dst []byte, globals, at, size []int64) error {
	const maxRows = 1 << 20 // 16 bytes a row in a bounded frame
	for len(globals) > maxRows {
		if err := s.fetchRagged(v, dst, globals[:maxRows], at[:maxRows], size[:maxRows]); err != nil {
			return err
		}
		globals, at, size = globals[maxRows:], at[maxRows:], size[maxRows:]
	}
	if len(globals) == 0 || s.tryDirectRagged(v, dst, globals, at, size) {
		return nil
	}
	err := s.withLane(func(l *lane) error {
		m := &l.read
		m.Name, m.ID = v.name, v.id
		m.Globals, m.Offsets = append(m.Globals[:0], globals...), m.Offsets[:0]
		rbuf, off := s.recvOf(dst)
		var stage []byte
		if rbuf != nil {
			m.Region = rbuf.id.Load()
			for _, a := range at {
				m.Offsets = append(m.Offsets, off+a)
			}
		} else {
			var total int64
			for _, n := range size {
				m.Offsets = append(m.Offsets, total)
				total += n
			}
			var err error
			if stage, m.Region, err = l.staging(int(total), s.cfg.Timeout); err != nil {
				return err
			}
		}
		if err := s.callRead(l, rbuf); err != nil {
			return fmt.Errorf("variable %q: %w", v.name, err)
		}
		if stage != nil {
			for k, a := range at {
				o := m.Offsets[k]
				copy(dst[a:a+size[k]], stage[o:o+size[k]])
			}
		}
		return nil
	})
	if err == nil {
		s.readdress(v)
	}
	return err
}

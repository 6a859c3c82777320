package client

// Reads: Get and GetBatch copy the node's rows out of shared memory and
// send the rest to the agent (or, with Method "mpi", read them with MPI
// gets first).

import (
	"fmt"
	"time"

	"github.com/ddstore-go/ddstore/internal/base"
	"github.com/ddstore-go/ddstore/internal/layout"
)

// Get reads len(dst)/rowBytes consecutive rows from global row start; the
// range may span several ranks' shards.
func (s *Store) Get(name string, dst []byte, start int64) error {
	return s.read(name, func(v *variable) error { return s.get(v, name, dst, start) })
}

// get is Get of v, read-locked.
func (s *Store) get(v *variable, name string, dst []byte, start int64) error {
	if err := notRagged(v, "Get"); err != nil {
		return err
	}
	if int64(len(dst))%v.rb != 0 || len(dst) == 0 {
		return base.Errorf(base.ErrBuffer, "variable %q: destination of %d bytes: want a whole, nonzero number of %d-byte rows (disp %d x itemsize %d)",
			name, len(dst), v.rb, v.lay.Disp, v.lay.ItemSize)
	}
	n := int64(len(dst)) / v.rb
	spans, err := v.lay.Spans(start, n)
	if err != nil {
		return fmt.Errorf("variable %q: %w", name, err)
	}
	t0 := time.Now()
	var remote []int64
	var pos, stored int64
	for _, sp := range spans {
		if sp.Rank == layout.Backed {
			for k := int64(0); k < sp.Count; k++ {
				remote = append(remote, pos+k)
			}
			stored += sp.Count
		} else if src := v.local[sp.Rank]; src != nil {
			copy(dst[pos*v.rb:(pos+sp.Count)*v.rb], src[sp.Local*v.rb:])
		} else {
			for k := int64(0); k < sp.Count; k++ {
				remote = append(remote, pos+k)
			}
		}
		pos += sp.Count
	}
	at := func(i int) int64 { return start + int64(i) }
	err = s.fetchRemote(v, dst, remote, at)
	v.count(n, int64(len(remote)), stored, t0)
	return err
}

// GetBatch reads rows indices[i] into dst[i*rowBytes:]; indices may come in
// any order, repeat, and belong to any rank. Every index is checked before
// any row is read.
func (s *Store) GetBatch(name string, dst []byte, indices []int64) error {
	return s.read(name, func(v *variable) error { return s.getBatch(v, name, dst, indices) })
}

// getBatch is GetBatch of v, read-locked.
func (s *Store) getBatch(v *variable, name string, dst []byte, indices []int64) error {
	if err := notRagged(v, "GetBatch"); err != nil {
		return err
	}
	rb := v.rb
	if int64(len(dst)) != int64(len(indices))*rb {
		return base.Errorf(base.ErrBuffer, "variable %q: destination of %d bytes for %d rows of %d bytes (disp %d x itemsize %d): want %d bytes",
			name, len(dst), len(indices), rb, v.lay.Disp, v.lay.ItemSize, int64(len(indices))*rb)
	}
	if err := v.lay.CheckAll(indices); err != nil {
		return fmt.Errorf("variable %q: %w", name, err)
	}
	t0 := time.Now()
	var remote []int64
	var stored int64
	var err error
	for i, g := range indices {
		r, loc := v.lay.Owner(g)
		if r == layout.Backed {
			stored++
		} else if src := v.local[r]; src != nil {
			o := int64(i) * rb
			copy(dst[o:o+rb], src[loc*rb:(loc+1)*rb])
			continue
		}
		remote = append(remote, int64(i))
	}
	err = s.fetchRemote(v, dst, remote, func(i int) int64 { return indices[i] })
	v.count(int64(len(indices)), int64(len(remote)), stored, t0)
	return err
}

// fetchRemote reads the rows at positions pos of dst that this node does
// not hold: from this process with MPI gets where the variable is in the
// window (Method "mpi"), the rest through the agent.
func (s *Store) fetchRemote(v *variable, dst []byte, pos []int64, at func(int) int64) error {
	if v.windowed && len(pos) > 0 {
		var err error
		if pos, err = s.readOneSided(v, dst, pos, at); err != nil {
			return err
		}
	}
	return s.fetch(v, dst, pos, at)
}

// count records a read of rows, remote of them through the agent, stored
// of those from the backing file.
func (v *variable) count(rows, remote, stored int64, t0 time.Time) {
	p := &v.prof
	p.calls.Add(1)
	p.rows.Add(rows)
	p.bytes.Add(rows * v.rb)
	p.localRows.Add(rows - remote)
	p.storageRows.Add(stored)
	if remote > 0 {
		p.remoteRows.Add(remote - stored)
		p.remoteCalls.Add(1)
		p.waitNs.Add(int64(time.Since(t0)))
	}
}

// fetch reads the rows at positions pos of dst (global index at(i)) from
// other nodes through the agent: one request, rows written by the agent
// straight into dst when dst lies in a receive buffer from AllocRecv, else
// into the lane's staging region and copied.
func (s *Store) fetch(v *variable, dst []byte, pos []int64, at func(int) int64) error {
	// A request carries 16 bytes per row and frames are bounded: very
	// large batches go in several requests.
	const maxRows = 1 << 20
	for len(pos) > maxRows {
		if err := s.fetch(v, dst, pos[:maxRows], at); err != nil {
			return err
		}
		pos = pos[maxRows:]
	}
	if len(pos) == 0 || s.tryDirect(v, dst, pos, at) {
		return nil
	}
	err := s.withLane(func(l *lane) error { return s.fetchOn(l, v, dst, pos, at) })
	if err == nil {
		s.readdress(v)
	}
	return err
}

// fetchOn is one attempt of fetch, on lane l.
func (s *Store) fetchOn(l *lane, v *variable, dst []byte, pos []int64, at func(int) int64) error {
	rb := v.rb
	m := &l.read
	m.Name, m.ID = v.name, v.id
	m.Globals, m.Offsets = m.Globals[:0], m.Offsets[:0]
	rbuf, off := s.recvOf(dst)
	var stage []byte
	var err error
	if rbuf != nil {
		m.Region = rbuf.id.Load()
		for _, p := range pos {
			m.Globals = append(m.Globals, at(int(p)))
			m.Offsets = append(m.Offsets, off+p*rb)
		}
	} else {
		stage, m.Region, err = l.staging(len(pos)*int(rb), s.cfg.Timeout)
		if err != nil {
			return err
		}
		for k, p := range pos {
			m.Globals = append(m.Globals, at(int(p)))
			m.Offsets = append(m.Offsets, int64(k)*rb)
		}
	}
	if err = s.callRead(l, rbuf); err != nil {
		return fmt.Errorf("variable %q: %w", v.name, err)
	}
	if stage != nil {
		for k, p := range pos {
			copy(dst[p*rb:(p+1)*rb], stage[int64(k)*rb:])
		}
	}
	return nil
}

//go:build mpi && cgo

package client

import (
	"context"
	"strconv"
	"sync"

	"github.com/ddstore-go/ddstore/internal/base"
	"github.com/ddstore-go/ddstore/internal/transport"
	"github.com/ddstore-go/ddstore/internal/wire"
)

// mpiReads is MethodMPI: the MPI transport's window and gets, run in the
// trainer's process. Rank r of the store's replica group is MPI rank
// first+r; a shard's window is described by an allgather when its
// variable is created, not asked of an agent.
type mpiReads struct {
	m     *transport.MPI
	first int
	addrs []string             // addr(r), by group rank
	mu    sync.Mutex           // guards wins; a leaf (lock order: internal/LOCKS.md)
	wins  map[string]windowsOf // by the variable's wire name
}

// windowsOf are the windows of one table's shards, by group rank.
type windowsOf struct {
	id   int64
	wins []wire.Window
}

// mpiReadsBuilt says whether this build has MethodMPI (tag mpi).
const mpiReadsBuilt = true

func newOneSided(s *Store) (oneSided, error) {
	o := &mpiReads{first: s.grp.first, wins: make(map[string]windowsOf)}
	m, err := transport.NewMPI(transport.MPIOptions{Describe: o.describe})
	if err != nil {
		return nil, err
	}
	if m.Rank() != s.id.Rank || m.Size() != s.id.Size {
		m.Close()
		return nil, base.Errorf(base.ErrArgument, "method %q: this process is MPI rank %d of %d but store rank %d of %d: the store's ranks must be those of MPI_COMM_WORLD", MethodMPI, m.Rank(), m.Size(), s.id.Rank, s.id.Size)
	}
	o.m = m
	o.addrs = make([]string, m.Size())
	for r := range o.addrs {
		o.addrs[r] = strconv.Itoa(r)
	}
	return o, nil
}

func (o *mpiReads) expose(v *variable) error {
	e, err := o.m.Expose(v.own, v.id)
	if err != nil {
		return err
	}
	v.mu.Lock()
	v.exp = e
	v.mu.Unlock()
	all, err := o.m.Allgather([]uint64{e.Addr, e.Token})
	if err != nil {
		return err
	}
	n := v.lay.Ranks()
	ws := make([]wire.Window, n)
	for r := range n {
		w := o.first + r
		first, rows := v.lay.First(r), v.lay.ShardRows(r)
		ws[r] = wire.Window{World: o.m.World(), Rank: int64(w), RowBytes: v.rb}
		if all[2*w+1] != 0 {
			ws[r].Shards = []wire.WindowShard{{First: first, Rows: rows, Addr: all[2*w], Token: all[2*w+1]}}
		}
	}
	o.mu.Lock()
	o.wins[v.name] = windowsOf{id: v.id, wins: ws}
	o.mu.Unlock()
	v.mu.Lock()
	v.windowed = true
	v.mu.Unlock()
	return nil
}

// describe is the transport's Describe: the window of rank addr's shard,
// from what expose gathered.
func (o *mpiReads) describe(_ context.Context, addr, name string, id int64) (wire.Window, error) {
	r, err := strconv.Atoi(addr)
	o.mu.Lock()
	w, ok := o.wins[name]
	o.mu.Unlock()
	if err != nil || !ok || w.id != id || r < 0 || r >= len(w.wins) {
		return wire.Window{}, base.Errorf(base.ErrFreed, "variable %q was freed", name)
	}
	return w.wins[r], nil
}

func (o *mpiReads) fetch(ctx context.Context, v *variable, parts []transport.FetchPart) (int, error) {
	return o.m.FetchBatch(ctx, v.name, v.id, parts)
}

// addr is group rank r as describe parses it.
func (o *mpiReads) addr(r int) string { return o.addrs[r] }

func (o *mpiReads) withdraw(v *variable, unmap func()) {
	o.mu.Lock()
	if w, ok := o.wins[v.name]; ok && w.id == v.id {
		delete(o.wins, v.name)
	}
	o.mu.Unlock()
	o.m.Withdraw(v.exp, unmap)
}

func (o *mpiReads) barrier() error { return o.m.Barrier() }

func (o *mpiReads) close() error { return o.m.Close() }

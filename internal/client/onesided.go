package client

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"sync"

	"github.com/ddstore-go/ddstore/internal/base"
	"github.com/ddstore-go/ddstore/internal/layout"
	"github.com/ddstore-go/ddstore/internal/transport"
)

// The read methods (ddstore.Config.Method, which documents them).
const (
	MethodAgent = "agent"
	MethodMPI   = "mpi"
)

// oneSided reads rows of other ranks' shards from this process
// (MethodMPI): onesided_mpi.go with the tag mpi, else
// onesided_nompi.go, which refuses.
type oneSided interface {
	// expose is collective over the world: this rank's shard of v goes
	// into the window, and v learns where every rank's shard lies.
	expose(v *variable) error
	// fetch reads the parts' rows of v, part i's all in the shard of the
	// rank whose addr is parts[i].Addr, as one batch of gets; an error
	// comes with the index of the part it concerns.
	fetch(ctx context.Context, v *variable, parts []transport.FetchPart) (int, error)
	// addr is how a part names rank r.
	addr(r int) string
	// barrier waits for every rank of the world (Free and Close are
	// collective: no rank's shard leaves the window while others read it).
	barrier() error
	// withdraw takes v's shard out of the window; unmap runs once no get
	// can still be reading it.
	withdraw(v *variable, unmap func())
	// close ends MPI; collective.
	close() error
}

func checkMethod(cfg Config) error {
	switch cfg.Method {
	case "", MethodAgent:
		return nil
	case MethodMPI:
		if cfg.Reader {
			return base.Errorf(base.ErrArgument, "method %q with Reader: a reader is not in the publishing job's MPI world; it reads through the agent", MethodMPI)
		}
		if !mpiReadsBuilt {
			return errNoMPIReads()
		}
		return nil
	}
	return base.Errorf(base.ErrArgument, "method %q: want %q or %q", cfg.Method, MethodAgent, MethodMPI)
}

func errNoMPIReads() error {
	return base.Errorf(base.ErrArgument, "method %q: this program was built without MPI: rebuild with -tags mpi (cgo and an MPI library: docs/build_tags.md)", MethodMPI)
}

// oneSidedScratch is readOneSided's reusable memory, so that a read
// allocates nothing per row.
type oneSidedScratch struct {
	owners  []int   // owner rank of each position
	order   []int   // the positions' indices, by owner
	globals []int64 // the rows of other ranks, by owner
	rows    [][]byte
	ranks   []int // the owners read, and where their rows start in globals
	starts  []int
	parts   []transport.FetchPart
}

var oneSidedScratchPool = sync.Pool{New: func() any { return new(oneSidedScratch) }}

// readOneSided reads the rows at positions pos of dst (global index at(i))
// that other ranks' shards hold, every owner's in one fetch (one batch of
// gets), and returns the positions left for the agent: rows only the
// backing file holds.
func (s *Store) readOneSided(v *variable, dst []byte, pos []int64, at func(int) int64) ([]int64, error) {
	sc := oneSidedScratchPool.Get().(*oneSidedScratch)
	defer func() {
		clear(sc.rows)
		clear(sc.parts)
		oneSidedScratchPool.Put(sc)
	}()
	sc.owners, sc.order = sc.owners[:0], sc.order[:0]
	for k, p := range pos {
		r, _ := v.lay.Owner(at(int(p)))
		sc.owners, sc.order = append(sc.owners, r), append(sc.order, k)
	}
	slices.SortFunc(sc.order, func(a, b int) int { return cmp.Compare(sc.owners[a], sc.owners[b]) })
	rb := v.rb
	var left []int64
	sc.globals, sc.rows, sc.ranks, sc.starts = sc.globals[:0], sc.rows[:0], sc.ranks[:0], sc.starts[:0]
	for lo := 0; lo < len(sc.order); {
		r := sc.owners[sc.order[lo]]
		hi := lo + 1
		for hi < len(sc.order) && sc.owners[sc.order[hi]] == r {
			hi++
		}
		if r == layout.Backed {
			for _, k := range sc.order[lo:hi] {
				left = append(left, pos[k])
			}
		} else {
			sc.ranks, sc.starts = append(sc.ranks, r), append(sc.starts, len(sc.globals))
			for _, k := range sc.order[lo:hi] {
				p := pos[k]
				sc.globals, sc.rows = append(sc.globals, at(int(p))), append(sc.rows, dst[p*rb:(p+1)*rb:(p+1)*rb])
			}
		}
		lo = hi
	}
	if len(sc.ranks) == 0 {
		return left, nil
	}
	sc.parts = sc.parts[:0]
	for j, r := range sc.ranks {
		lo, hi := sc.starts[j], len(sc.globals)
		if j+1 < len(sc.starts) {
			hi = sc.starts[j+1]
		}
		sc.parts = append(sc.parts, transport.FetchPart{Addr: s.one.addr(r), Globals: sc.globals[lo:hi:hi], Dst: sc.rows[lo:hi:hi]})
	}
	// MPI bounds its gets, not a context: there is nothing to cancel.
	if i, err := s.one.fetch(context.Background(), v, sc.parts); err != nil {
		return nil, fmt.Errorf("variable %q: rows of rank %d: %w", v.name, sc.ranks[i], err)
	}
	v.prof.oneSidedRows.Add(int64(len(sc.globals)))
	return left, nil
}

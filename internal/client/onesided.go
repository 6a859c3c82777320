package client

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"sync"

	"github.com/ddstore-go/ddstore/internal/base"
	"github.com/ddstore-go/ddstore/internal/layout"
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
	// fetch reads rows globals, all in rank r's shard of v, into dst.
	fetch(ctx context.Context, v *variable, r int, globals []int64, dst [][]byte) error
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
	globals []int64 // one owner's rows
	rows    [][]byte
}

var oneSidedScratchPool = sync.Pool{New: func() any { return new(oneSidedScratch) }}

// readOneSided reads the rows at positions pos of dst (global index at(i))
// that other ranks' shards hold, with one fetch per owner rank, and returns
// the positions left for the agent: rows only the backing file holds.
func (s *Store) readOneSided(v *variable, dst []byte, pos []int64, at func(int) int64) ([]int64, error) {
	sc := oneSidedScratchPool.Get().(*oneSidedScratch)
	defer func() {
		clear(sc.rows)
		oneSidedScratchPool.Put(sc)
	}()
	sc.owners, sc.order = sc.owners[:0], sc.order[:0]
	for k, p := range pos {
		r, _ := v.lay.Owner(at(int(p)))
		sc.owners, sc.order = append(sc.owners, r), append(sc.order, k)
	}
	slices.SortFunc(sc.order, func(a, b int) int { return cmp.Compare(sc.owners[a], sc.owners[b]) })
	// MPI bounds its gets, not a context: there is nothing to cancel.
	ctx := context.Background()
	rb := v.rb
	var left []int64
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
			sc.globals, sc.rows = sc.globals[:0], sc.rows[:0]
			for _, k := range sc.order[lo:hi] {
				p := pos[k]
				sc.globals, sc.rows = append(sc.globals, at(int(p))), append(sc.rows, dst[p*rb:(p+1)*rb:(p+1)*rb])
			}
			if err := s.one.fetch(ctx, v, r, sc.globals, sc.rows); err != nil {
				return nil, fmt.Errorf("variable %q: rows of rank %d: %w", v.name, r, err)
			}
			v.prof.oneSidedRows.Add(int64(hi - lo))
		}
		lo = hi
	}
	return left, nil
}

package ddstore

import (
	"context"
	"fmt"

	"github.com/ddstore-go/ddstore/internal/base"
	"github.com/ddstore-go/ddstore/internal/layout"
)

// Read methods (Config.Method): how a Store reads rows of other nodes.
const (
	// MethodAgent reads them through this node's agent, which fetches them
	// from the owners' agents (the default).
	MethodAgent = "agent"
	// MethodMPI reads them from this process with passive-target MPI gets
	// out of the owners' shards (DDStore's method 0): the store's ranks are
	// the ranks of MPI_COMM_WORLD of the launch that started this process,
	// each exposing its shard of every variable it creates in an MPI
	// window. Needs a build with the tag mpi.
	MethodMPI = "mpi"
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

// readOneSided reads the rows at positions pos of dst (global index at(i))
// that other ranks' shards hold, with one fetch per owner rank, and returns
// the positions left for the agent: rows only the backing file holds.
func (s *Store) readOneSided(v *variable, dst []byte, pos []int64, at func(int) int64) ([]int64, error) {
	rb := v.rb
	owners := make([]int, len(pos))
	same := true
	for k, p := range pos {
		owners[k], _ = v.lay.Owner(at(int(p)))
		same = same && owners[k] == owners[0]
	}
	// MPI bounds its gets, not a context: there is nothing to cancel.
	ctx := context.Background()
	read := func(r int, ps []int64) error {
		globals := make([]int64, len(ps))
		rows := make([][]byte, len(ps))
		for k, p := range ps {
			globals[k], rows[k] = at(int(p)), dst[p*rb:(p+1)*rb:(p+1)*rb]
		}
		if err := s.one.fetch(ctx, v, r, globals, rows); err != nil {
			return fmt.Errorf("variable %q: rows of rank %d: %w", v.name, r, err)
		}
		v.prof.oneSidedRows.Add(int64(len(ps)))
		return nil
	}
	if same && owners[0] != layout.Backed {
		return nil, read(owners[0], pos)
	}
	byRank := make(map[int][]int64)
	var left []int64
	for k, p := range pos {
		if r := owners[k]; r == layout.Backed {
			left = append(left, p)
		} else {
			byRank[r] = append(byRank[r], p)
		}
	}
	for r, ps := range byRank {
		if err := read(r, ps); err != nil {
			return nil, err
		}
	}
	return left, nil
}

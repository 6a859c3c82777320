//go:build !mpi || !cgo

package transport

import "context"

// MPIBuilt says whether this binary has the MPI transport (build tag mpi).
const MPIBuilt = false

// MPILibrary names the MPI library a build with the tag mpi links; "" here.
func MPILibrary() string { return "" }

// MPI is the MPI transport; this build has none (no tag mpi): NewMPI fails
// and says how to get one.
type MPI struct{}

// NewMPI fails: the binary was built without the tag mpi.
func NewMPI(MPIOptions) (*MPI, error) { return nil, errNoMPI() }

func (*MPI) Fetch(context.Context, string, string, int64, []int64, [][]byte) error { return errNoMPI() }
func (*MPI) Close() error                                                          { return nil }
func (*MPI) Expose([]byte, int64) (Exposure, error)                                { return Exposure{}, errNoMPI() }
func (*MPI) Withdraw(_ Exposure, unmap func())                                     { unmap() }
func (*MPI) Rank() int                                                             { return 0 }
func (*MPI) Size() int                                                             { return 1 }
func (*MPI) World() uint64                                                         { return 0 }

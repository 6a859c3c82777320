//go:build !mpi || !cgo

package client

// mpiReadsBuilt says whether this build has MethodMPI (tag mpi).
const mpiReadsBuilt = false

func newOneSided(*Store) (oneSided, error) {
	return nil, errNoMPIReads()
}

//go:build !mpi || !cgo

package ddstore

// mpiReadsBuilt says whether this build has MethodMPI (tag mpi).
const mpiReadsBuilt = false

func newOneSided(*Store) (oneSided, error) {
	return nil, errNoMPIReads()
}

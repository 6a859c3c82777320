//go:build !mpi || !cgo

package ddstore_test

// mpiBuilt says whether this test binary has Method "mpi" (tag mpi).
const mpiBuilt = false

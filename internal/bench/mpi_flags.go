//go:build mpi && cgo && !mpich

package bench

// The MPI this package links: whichever Debian's alternatives name mpi-c
// (Open MPI where both are installed). Build with the tags "mpi mpich" to
// link MPICH instead (mpi_flags_mpich.go).

// #cgo pkg-config: mpi-c
import "C"

//go:build mpi && cgo && mpich

package transport

// The MPI this package links with the tags "mpi mpich": MPICH (Debian's
// libmpich-dev), also where Open MPI is installed and named mpi-c.

// #cgo pkg-config: mpich
import "C"

//go:build !hdf5 || !cgo

package source

import "github.com/ddstore-go/ddstore/internal/base"

// HDF5 says whether this build reads HDF5 files.
const HDF5 = false

func openHDF5(file, dataset string, opts Options) (Source, error) { return nil, errNoHDF5(file) }

func noDataset(file string) error { return errNoHDF5(file) }

func errNoHDF5(file string) error {
	return base.Errorf(base.ErrArgument,
		"source %s is an HDF5 file and ddstore was built without HDF5: rebuild with `go build -tags hdf5 ./cmd/ddstore` (cgo and the HDF5 C library: Debian's libhdf5-dev); see docs/build_tags.md", file)
}

package ddstore

import (
	"fmt"

	"github.com/ddstore-go/ddstore/internal/client"
	"github.com/ddstore-go/ddstore/internal/naming"
)

// Backing is a file that holds every row of a variable, for a dataset
// larger than the memory the job gives it: the shards hold the file's first
// rows (rank r's shard rows [first_r, first_r+n_r) of the file, in rank
// order), and reads of the others go to the file — through the node's
// agent, which reads them on demand, sorted and coalesced by position in
// the file, or ahead of use when told what comes next (Prefetch).
type Backing struct {
	// File is a .npy file, an HDF5 dataset as FILE:DATASET (agents built
	// with -tags hdf5), or a raw file of rows; a relative name is made
	// absolute here. Every node's agent opens it: on several nodes it must
	// be on a shared filesystem.
	File string
	// Rows is how many rows the variable has in all: at least the sum of
	// the shards, at most the file's.
	Rows int64
	// Offsets, for a ragged variable only (AddRaggedBacked), names its
	// offsets dataset as File names its values: a .npy file or an HDF5
	// dataset (FILE:DATASET), 1-D, of at least Rows+1 integers (int64,
	// int32, uint64 or uint32), from 0, never decreasing, the last one
	// the number of units the values hold. File is then the flat values,
	// of shape (units, *trailing shape): row i is units [offsets[i],
	// offsets[i+1]). The usual pair: two datasets of one HDF5 file, or
	// two .npy files.
	Offsets string
}

// AddBacked is AddAs for a variable whose rows all lie in a backing file,
// of which this rank's shard holds rows (the file's rows from this rank's
// first global row, see Backing). Every rank calls it with the same
// Backing; ranks that disagree all get ErrGeometry, and a file that cannot
// be opened, or whose rows are not disp items of dtype, fails the Add on
// every rank.
func (s *Store) AddBacked(name string, rows []byte, disp int64, dtype Dtype, b Backing) error {
	nrows, size, err := typedAdd(name, rows, disp, dtype)
	if err == nil {
		b, err = b.check(name, nrows)
	}
	return s.c.Create(name, rows, nrows, disp, size, string(dtype), err, (*client.Backing)(&b))
}

// InitBacked is InitAs for a variable with a backing file: this rank's
// shard is nrows zero-filled rows, to be filled (through Shard) with the
// file's rows from this rank's first global row before they are read.
func (s *Store) InitBacked(name string, nrows, disp int64, dtype Dtype, b Backing) error {
	size, err := typedInit(name, nrows, disp, dtype)
	if err == nil {
		b, err = b.check(name, nrows)
	}
	return s.c.Create(name, nil, nrows, disp, size, string(dtype), err, (*client.Backing)(&b))
}

// check validates a Backing and makes its file name absolute.
func (b Backing) check(name string, nrows int64) (Backing, error) {
	if b.Offsets != "" {
		return b, fmt.Errorf("%w: variable %q: backing offsets %s: offsets are for a ragged variable (AddRaggedBacked); fixed rows need only File", ErrArgument, name, b.Offsets)
	}
	f, err := naming.CheckBacking(name, b.File, b.Rows, nrows)
	if err != nil {
		return b, err
	}
	b.File = f
	return b, nil
}

// Prefetch tells the node's agent which rows of a variable with a backing
// file this rank will read soon (the storage reads of its next steps, as a
// schedule says), so that it reads them from the file now, into staging
// memory, and a GetBatch of them later finds them there. Rows the shards
// hold are skipped; rows beyond the staging room are read on demand. It
// returns without waiting for the reads.
func (s *Store) Prefetch(name string, indices []int64) error {
	return s.c.Prefetch(name, indices)
}

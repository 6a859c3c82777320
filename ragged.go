package ddstore

// Ragged variables: rows of a length of their own (graphs of n_i atoms,
// token sequences), in items of one type, with an optional fixed trailing
// shape.

import "github.com/ddstore-go/ddstore/internal/client"

// AddRagged creates a ragged variable whose shard on this rank is
// len(lengths) rows, row i being lengths[i] units of the trailing shape
// (shape's product of items of type dtype; no shape: one item), packed in
// values, row after row. A row of positions [n_i, 3] is AddRagged(name,
// values, lengths, Float32, 3). Every rank calls it, with its own rows
// (possibly none); it returns once every rank has. Lengths that are
// negative or do not add up to the values, or ranks that disagree on the
// type or the trailing shape, fail it on every rank with ErrGeometry,
// naming the values; the store keeps working.
func (s *Store) AddRagged(name string, values []byte, lengths []int64, dtype Dtype, shape ...int64) error {
	size, err := dtype.ItemSize()
	return s.c.CreateRagged(name, values, lengths, shape, string(dtype), size, err, nil)
}

// AddRaggedBacked is AddRagged for a ragged variable whose rows all lie in
// a backing file, a pair of datasets (Backing: File the values, Offsets
// the offsets), of which this rank's shard holds rows: the file's rows
// from this rank's first global row, as for AddBacked. The node's agent
// reads the offsets once into the node's index and the other rows from
// the values, coalesced and ahead of use (Prefetch). Every rank calls it
// with the same Backing; a pair that cannot be opened, offsets that
// decrease or do not end at the values' length, values of another type
// or trailing shape, or shards whose rows are not the file's fail it on
// every rank.
func (s *Store) AddRaggedBacked(name string, values []byte, lengths []int64, dtype Dtype, b Backing, shape ...int64) error {
	size, err := dtype.ItemSize()
	return s.c.CreateRagged(name, values, lengths, shape, string(dtype), size, err, (*client.Backing)(&b))
}

// AddRaggedFrom is AddRagged (AddRaggedBacked when b is not nil) of
// values of nbytes bytes that read writes straight into this rank's shard
// in shared memory (a file's rows, with no copy in between), before the
// variable is published. An error of read, as any bad input, fails the
// add on every rank; the store keeps working.
func (s *Store) AddRaggedFrom(name string, nbytes int64, read func(values []byte) error, lengths []int64, dtype Dtype, b *Backing, shape ...int64) error {
	size, err := dtype.ItemSize()
	return s.c.CreateRaggedFrom(name, nbytes, read, lengths, shape, string(dtype), size, err, (*client.Backing)(b))
}

// RaggedSizes fills lengths (one per index; in units of the trailing
// shape) with the lengths of rows indices of a ragged variable and returns
// the bytes they take packed, which is what GetRagged needs of its
// destination. It reads the node's index in shared memory: no request.
func (s *Store) RaggedSizes(name string, indices, lengths []int64) (int64, error) {
	return s.c.RaggedSizes(name, indices, lengths)
}

// GetRagged reads rows indices of a ragged variable (any order, repeats,
// any owner) packed into dst, row after row, and their lengths into
// lengths (one per index, or nil); it returns the bytes written. Rows of
// this node are copied from shared memory; the others come in one request
// to the node's agent, written straight into dst when it lies in a buffer
// from AllocRecv. A dst smaller than the rows fails with ErrBuffer, naming
// both sizes, before any row is read; a bad index with ErrIndex.
func (s *Store) GetRagged(name string, dst []byte, indices, lengths []int64) (int64, error) {
	return s.c.GetRagged(name, dst, indices, lengths)
}

// GetRaggedRow reads one row of a ragged variable into dst and returns its
// bytes.
func (s *Store) GetRaggedRow(name string, dst []byte, index int64) (int64, error) {
	return s.c.GetRaggedRow(name, dst, index)
}

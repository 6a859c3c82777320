// Package source reads the rows of a dataset file — a .npy array, an HDF5
// dataset or a raw file of fixed-size rows — straight into a caller's
// buffer (ingest reads into a rank's shard in shared memory), in large
// reads aligned to the file's natural read unit.
//
// A row is everything under the first dimension: a dataset of shape
// (N, 3, 32, 32) has N rows of 3·32·32 items. Items keep the bytes the file
// holds (little-endian), so a row read here is the row numpy or h5py would
// return.
package source

import (
	"math"
	"slices"
	"strings"

	"github.com/ddstore-go/ddstore/internal/base"
	"github.com/ddstore-go/ddstore/internal/layout"
	"github.com/ddstore-go/ddstore/internal/naming"
)

// geometry is what every source knows of its rows, and the Source methods
// that report it.
type geometry struct {
	rows      int64
	rowShape  []int64
	dtype     string
	itemSize  int64
	rowBytes  int64
	chunkRows int64
}

func (g *geometry) Rows() int64       { return g.rows }
func (g *geometry) RowShape() []int64 { return slices.Clone(g.rowShape) }
func (g *geometry) Dtype() string     { return g.dtype }
func (g *geometry) ItemSize() int64   { return g.itemSize }
func (g *geometry) ChunkRows() int64  { return g.chunkRows }

// Source is a dataset of Rows rows, each RowShape items of Dtype. Its
// methods are safe for concurrent use; ReadRows from several goroutines is
// how Read gets its parallelism.
type Source interface {
	// Rows is the length of the first dimension.
	Rows() int64
	// RowShape is the shape of one row (the dimensions after the first);
	// empty for a 1-D dataset.
	RowShape() []int64
	// Dtype names the items' type as ddstore does: bool, int8, int16,
	// int32, int64, uint8, uint16, uint32, uint64, float16, bfloat16,
	// float32, float64.
	Dtype() string
	// ItemSize is the size of one item in bytes.
	ItemSize() int64
	// ReadRows reads rows [start, start+count) into dst, which must hold
	// exactly count rows.
	ReadRows(start, count int64, dst []byte) error
	// ChunkRows is the natural read unit in rows: an HDF5 dataset's chunk,
	// or a default of about DefaultChunkBytes for flat files. Reads that
	// begin and end on multiples of it never read a chunk twice.
	ChunkRows() int64
	// Close releases the file.
	Close() error
}

// Options say how to read a file whose format does not say it all.
type Options struct {
	// RowBytes is the size of a row of a raw file (required there). For a
	// .npy or HDF5 file, when set, the file's rows must be this size.
	RowBytes int64
	// Dtype is the item type of a raw file (default uint8, one item per
	// byte). For a .npy or HDF5 file, when set, the file's must match.
	Dtype string
	// ChunkBytes sets ChunkRows of files that have no chunks of their own
	// (.npy, raw, contiguous HDF5); default DefaultChunkBytes.
	ChunkBytes int64
}

// DefaultChunkBytes is the read unit of files without chunks: large enough
// that a read costs far more than the call, small enough to spread a shard
// over several readers.
const DefaultChunkBytes = 4 << 20

// Open opens the dataset spec names (see naming.ParseSpec).
func Open(spec string, opts Options) (Source, error) {
	sp, err := naming.ParseSpec(spec, opts.RowBytes > 0)
	if err != nil {
		return nil, err
	}
	if opts.RowBytes < 0 {
		return nil, base.Errorf(base.ErrArgument, "source %s: row size %d bytes: want > 0", spec, opts.RowBytes)
	}
	if opts.ChunkBytes < 0 {
		return nil, base.Errorf(base.ErrArgument, "source %s: chunk of %d bytes: want > 0", spec, opts.ChunkBytes)
	}
	if opts.Dtype != "" {
		if _, ok := layout.ItemSize(opts.Dtype); !ok {
			return nil, base.Errorf(base.ErrArgument, "source %s: unknown dtype %q: want one of %s", spec, opts.Dtype, strings.Join(layout.Dtypes(), ", "))
		}
	}
	var src Source
	switch sp.Kind {
	case naming.KindNPY:
		src, err = openNPY(sp.File, opts)
	case naming.KindRaw:
		src, err = openRaw(sp.File, opts)
	case naming.KindHDF5:
		if sp.Dataset == "" {
			// Say which datasets there are when we can.
			return nil, noDataset(sp.File)
		}
		src, err = openHDF5(sp.File, sp.Dataset, opts)
	}
	if err != nil {
		return nil, err
	}
	if err := checkAgainst(spec, src, opts); err != nil {
		src.Close()
		return nil, err
	}
	return src, nil
}

// checkAgainst compares a self-describing file with what the caller
// expects of it.
func checkAgainst(spec string, src Source, opts Options) error {
	if opts.Dtype != "" && opts.Dtype != src.Dtype() {
		return base.Errorf(base.ErrArgument, "source %s holds items of %s, not %s", spec, src.Dtype(), opts.Dtype)
	}
	if rb := RowBytes(src); opts.RowBytes > 0 && opts.RowBytes != rb {
		return base.Errorf(base.ErrArgument, "source %s has rows of %d bytes (shape %v of %s), not %d", spec, rb, src.RowShape(), src.Dtype(), opts.RowBytes)
	}
	return nil
}

// RowBytes is the size of one row of src.
func RowBytes(src Source) int64 { return Disp(src.RowShape()) * src.ItemSize() }

// Disp is the number of items in a row of the given shape.
func Disp(rowShape []int64) int64 {
	d := int64(1)
	for _, n := range rowShape {
		d *= n
	}
	return d
}

// checkGeometry bounds a dataset's shape so that every size derived from it
// fits in an int64.
func checkGeometry(name string, shape []int64, itemSize int64) error {
	if len(shape) == 0 {
		return base.Errorf(base.ErrArgument, "source %s is a scalar (shape ()): want at least one dimension, the rows", name)
	}
	total := itemSize
	for _, n := range shape {
		if n < 0 {
			return base.Errorf(base.ErrArgument, "source %s: shape %v has a negative dimension", name, shape)
		}
		if n == 0 {
			total = 0
			continue
		}
		if total > math.MaxInt64/n {
			return base.Errorf(base.ErrArgument, "source %s: shape %v of %d-byte items is more bytes than an int64 counts", name, shape, itemSize)
		}
		total *= n
	}
	if Disp(shape[1:]) == 0 {
		return base.Errorf(base.ErrArgument, "source %s: shape %v: rows of zero items", name, shape)
	}
	return nil
}

// checkRead validates the arguments of ReadRows.
func checkRead(name string, rows, rowBytes, start, count int64, dst []byte) error {
	if start < 0 || count < 0 || start > rows || count > rows-start {
		return base.Errorf(base.ErrIndex, "source %s: rows [%d, %d) are outside [0, %d)", name, start, start+count, rows)
	}
	if int64(len(dst)) != count*rowBytes {
		return base.Errorf(base.ErrBuffer, "source %s: destination of %d bytes for %d rows of %d bytes: want %d", name, len(dst), count, rowBytes, count*rowBytes)
	}
	return nil
}

// chunkRowsFor is the read unit of a file without chunks.
func chunkRowsFor(rowBytes, chunkBytes int64) int64 {
	if chunkBytes <= 0 {
		chunkBytes = DefaultChunkBytes
	}
	return max(1, chunkBytes/rowBytes)
}

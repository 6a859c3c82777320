package source

import (
	"errors"
	"io"
	"os"

	"github.com/ddstore-go/ddstore/internal/base"
	"github.com/ddstore-go/ddstore/internal/layout"
	"github.com/ddstore-go/ddstore/internal/naming"
)

// flat is a file whose rows lie one after another from an offset on: a
// .npy array after its header, or a raw file. Reads are preads, so any
// number of goroutines read at once.
type flat struct {
	f    *os.File
	name string
	off  int64 // where row 0 begins
	geometry
}

func (s *flat) Close() error { return s.f.Close() }

func (s *flat) ReadRows(start, count int64, dst []byte) error {
	if err := checkRead(s.name, s.rows, s.rowBytes, start, count, dst); err != nil {
		return err
	}
	if count == 0 {
		return nil
	}
	// ReadAt loops over short reads (and the kernel's 2 GiB bound per call).
	_, err := s.f.ReadAt(dst, s.off+start*s.rowBytes)
	if errors.Is(err, io.EOF) {
		fi, serr := s.f.Stat()
		size := int64(-1)
		if serr == nil {
			size = fi.Size()
		}
		return base.Errorf(base.ErrArgument, "source %s: rows [%d, %d) end at byte %d but the file has %d bytes now (truncated while open?)",
			s.name, start, start+count, s.off+(start+count)*s.rowBytes, size)
	}
	if err != nil {
		return naming.FileError(s.name, err)
	}
	return nil
}

// openRaw opens a file of rows of opts.RowBytes bytes.
func openRaw(name string, opts Options) (Source, error) {
	if opts.RowBytes <= 0 {
		return nil, base.Errorf(base.ErrArgument, "source %s: a raw file needs its row size in bytes (--row-bytes)", name)
	}
	dtype := opts.Dtype
	if dtype == "" {
		dtype = "uint8"
	}
	is, _ := layout.ItemSize(dtype) // Open checked the name
	if opts.RowBytes%is != 0 {
		return nil, base.Errorf(base.ErrArgument, "source %s: rows of %d bytes are not a whole number of %d-byte %s items", name, opts.RowBytes, is, dtype)
	}
	f, size, err := openRegular(name)
	if err != nil {
		return nil, err
	}
	if size%opts.RowBytes != 0 {
		f.Close()
		return nil, base.Errorf(base.ErrArgument, "source %s: %d bytes is not a whole number of %d-byte rows (%d rows and %d bytes over: truncated, or another row size?)",
			name, size, opts.RowBytes, size/opts.RowBytes, size%opts.RowBytes)
	}
	return &flat{f: f, name: name, geometry: geometry{rows: size / opts.RowBytes, rowShape: []int64{opts.RowBytes / is}, dtype: dtype,
		itemSize: is, rowBytes: opts.RowBytes, chunkRows: chunkRowsFor(opts.RowBytes, opts.ChunkBytes)}}, nil
}

// openRegular opens a regular file for reading and returns its size.
func openRegular(name string) (*os.File, int64, error) {
	f, err := os.Open(name)
	if err != nil {
		return nil, 0, naming.FileError(name, err)
	}
	fi, err := f.Stat()
	if err != nil {
		f.Close()
		return nil, 0, naming.FileError(name, err)
	}
	if !fi.Mode().IsRegular() {
		f.Close()
		return nil, 0, base.Errorf(base.ErrArgument, "source %s is not a regular file (%v)", name, fi.Mode().Type())
	}
	return f, fi.Size(), nil
}

package ddstore

import (
	"strings"

	"github.com/ddstore-go/ddstore/internal/base"
	"github.com/ddstore-go/ddstore/internal/client"
	"github.com/ddstore-go/ddstore/internal/layout"
)

// Dtype names the type of a variable's items, the way numpy and torch name
// them. Typed variables let clients check a destination's type (the Python
// client refuses to read float32 rows into int32, which DDStore allows).
type Dtype string

// The item types ddstore knows.
const (
	Bool     Dtype = "bool"
	Int8     Dtype = "int8"
	Int16    Dtype = "int16"
	Int32    Dtype = "int32"
	Int64    Dtype = "int64"
	Uint8    Dtype = "uint8"
	Uint16   Dtype = "uint16"
	Uint32   Dtype = "uint32"
	Uint64   Dtype = "uint64"
	Float16  Dtype = "float16"
	BFloat16 Dtype = "bfloat16"
	Float32  Dtype = "float32"
	Float64  Dtype = "float64"
)

// ItemSize is the size of one item (internal/layout holds the sizes), or
// an error naming the valid types.
func (d Dtype) ItemSize() (int64, error) {
	if n, ok := layout.ItemSize(string(d)); ok {
		return n, nil
	}
	return 0, base.Errorf(base.ErrArgument, "dtype %q: want one of %s", string(d), strings.Join(layout.Dtypes(), ", "))
}

// InitAs is Init for a typed variable: nrows zero-filled rows of disp items
// of type dtype.
func (s *Store) InitAs(name string, nrows, disp int64, dtype Dtype) error {
	size, err := typedInit(name, nrows, disp, dtype)
	return s.c.Create(name, nil, nrows, disp, size, string(dtype), err, nil)
}

// typedInit checks InitAs's geometry: the item size of dtype, or why not.
func typedInit(name string, nrows, disp int64, dtype Dtype) (int64, error) {
	size, err := dtype.ItemSize()
	if err == nil {
		err = client.RowError(name, disp, size)
	}
	if err == nil && nrows < 0 {
		err = base.Errorf(base.ErrGeometry, "variable %q: %d rows: want >= 0", name, nrows)
	}
	return size, err
}

// AddAs is Add for a typed variable: rows of disp items of type dtype.
func (s *Store) AddAs(name string, rows []byte, disp int64, dtype Dtype) error {
	nrows, size, err := typedAdd(name, rows, disp, dtype)
	return s.c.Create(name, rows, nrows, disp, size, string(dtype), err, nil)
}

// typedAdd checks AddAs's rows: how many there are and the item size of
// dtype, or why not.
func typedAdd(name string, rows []byte, disp int64, dtype Dtype) (nrows, size int64, err error) {
	size, err = dtype.ItemSize()
	if err == nil {
		err = client.RowError(name, disp, size)
	}
	if err == nil && int64(len(rows))%(disp*size) != 0 {
		err = base.Errorf(base.ErrBuffer, "variable %q: %d bytes is not a whole number of %d-byte rows (disp %d x %s)", name, len(rows), disp*size, disp, dtype)
	}
	if err == nil {
		nrows = int64(len(rows)) / (disp * size)
	}
	return nrows, size, err
}

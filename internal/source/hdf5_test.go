//go:build hdf5 && cgo

package source

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/ddstore-go/ddstore/internal/base"
)

// h5Case is a dataset h5py writes: make(dtype, shape) stored with the
// given h5py create_dataset keywords.
type h5Case struct {
	Name   string         `json:"name"`
	Dtype  string         `json:"dtype"` // a numpy dtype string ('>i4' for big-endian)
	Shape  []int64        `json:"shape"`
	Kwargs map[string]any `json:"kwargs"`
	// Rows is how many leading rows are written (-1: all); the rest keep
	// the fill value and, chunked, are never stored.
	Rows int64  `json:"rows"`
	Want string `json:"-"` // the ddstore dtype
	// How rows are read: "contiguous" or "chunks" with preads, "library"
	// through H5Dread.
	Path string `json:"-"`
}

func writeH5Cases(t *testing.T, file string, cases []h5Case, userblock int) {
	t.Helper()
	js, err := json.Marshal(cases)
	if err != nil {
		t.Fatal(err)
	}
	runPython(t, pyMake+`
import h5py
path, dir, ub = sys.argv[1], sys.argv[2], int(sys.argv[3])
with h5py.File(path, 'w', userblock_size=ub) as f:
    for c in json.loads(sys.argv[4]):
        a = make(np.dtype(c['dtype']).newbyteorder('='), tuple(c['shape'])).astype(c['dtype'])
        kw = c['kwargs'] or {}
        if isinstance(kw.get('chunks'), list):
            kw['chunks'] = tuple(kw['chunks'])
        d = f.create_dataset(c['name'], shape=a.shape, dtype=a.dtype, **kw)
        n = a.shape[0] if c['rows'] < 0 else c['rows']
        if n > 0:
            d[:n] = a[:n]
        a[n:] = 0
        save_bin(dir + '/' + c['name'].replace('/', '_') + '.bin', a)
`, file, filepath.Dir(file), fmt.Sprint(userblock), string(js))
}

func TestHDF5(t *testing.T) {
	needPython(t, "numpy", "h5py")
	dir := t.TempDir()
	chunked := func(rows int64) map[string]any { return map[string]any{"chunks": []int64{rows, 3, 5}} }
	cases := []h5Case{
		{Name: "contiguous", Dtype: "<f4", Shape: []int64{1000, 3, 5}, Want: "float32", Path: "contiguous"},
		{Name: "chunked", Dtype: "<i8", Shape: []int64{1000, 3, 5}, Kwargs: chunked(64), Want: "int64", Path: "chunks"},
		{Name: "gzip", Dtype: "<u2", Shape: []int64{1000, 3, 5}, Kwargs: map[string]any{"chunks": []int64{50, 3, 5}, "compression": "gzip", "compression_opts": 4}, Want: "uint16", Path: "chunks"},
		{Name: "shuffle", Dtype: "<f8", Shape: []int64{777, 6}, Kwargs: map[string]any{"chunks": []int64{100, 6}, "compression": "gzip", "shuffle": true}, Want: "float64", Path: "chunks"},
		{Name: "shuffle-only", Dtype: "<i4", Shape: []int64{500, 3}, Kwargs: map[string]any{"chunks": []int64{64, 3}, "shuffle": true}, Want: "int32", Path: "chunks"},
		{Name: "shuffle-int8", Dtype: "|i1", Shape: []int64{500, 3}, Kwargs: map[string]any{"chunks": []int64{64, 3}, "shuffle": true, "compression": "gzip"}, Want: "int8", Path: "chunks"},
		{Name: "fletcher32", Dtype: "<f4", Shape: []int64{500, 3}, Kwargs: map[string]any{"chunks": []int64{64, 3}, "fletcher32": true, "compression": "gzip"}, Want: "float32", Path: "library"},
		{Name: "gzip-big-endian", Dtype: ">i8", Shape: []int64{500, 3}, Kwargs: map[string]any{"chunks": []int64{64, 3}, "compression": "gzip"}, Want: "int64", Path: "library"},
		{Name: "gzip-unwritten", Dtype: "<f4", Shape: []int64{1000, 2}, Kwargs: map[string]any{"chunks": []int64{64, 2}, "compression": "gzip"}, Rows: 300, Want: "float32", Path: "chunks"},
		{Name: "partial-chunks", Dtype: "<i4", Shape: []int64{1000, 4}, Kwargs: map[string]any{"chunks": []int64{32, 2}}, Want: "int32", Path: "library"},
		{Name: "unwritten", Dtype: "<i2", Shape: []int64{1000, 4}, Kwargs: map[string]any{"chunks": []int64{100, 4}}, Rows: 250, Want: "int16", Path: "chunks"},
		{Name: "big-endian", Dtype: ">i4", Shape: []int64{500, 3}, Want: "int32", Path: "library"},
		{Name: "big-endian-float", Dtype: ">f8", Shape: []int64{500, 3}, Kwargs: map[string]any{"chunks": []int64{7, 3}}, Want: "float64", Path: "library"},
		{Name: "bool", Dtype: "bool", Shape: []int64{999}, Kwargs: map[string]any{"chunks": []int64{100}}, Want: "bool", Path: "chunks"},
		{Name: "float16", Dtype: "<f2", Shape: []int64{300, 2}, Want: "float16", Path: "contiguous"},
		{Name: "int8", Dtype: "|i1", Shape: []int64{300}, Want: "int8", Path: "contiguous"},
		{Name: "uint8", Dtype: "|u1", Shape: []int64{300, 2, 2, 2}, Kwargs: map[string]any{"chunks": true}, Want: "uint8"},
		{Name: "uint32", Dtype: "<u4", Shape: []int64{300}, Kwargs: map[string]any{"chunks": []int64{1}}, Want: "uint32", Path: "chunks"},
		{Name: "uint64", Dtype: "<u4", Shape: []int64{300}, Kwargs: map[string]any{"chunks": []int64{1000}, "maxshape": []any{nil}}, Want: "uint32", Path: "chunks"},
		{Name: "g/nested", Dtype: "<i4", Shape: []int64{10}, Want: "int32", Path: "contiguous"},
		{Name: "empty", Dtype: "<f4", Shape: []int64{0, 3}, Want: "float32"},
	}
	for i := range cases {
		if cases[i].Rows == 0 {
			cases[i].Rows = -1
		}
	}
	for _, ub := range []int{0, 512} {
		t.Run(fmt.Sprintf("userblock=%d", ub), func(t *testing.T) {
			file := filepath.Join(dir, fmt.Sprintf("ub%d", ub), "data.h5")
			if err := os.MkdirAll(filepath.Dir(file), 0o755); err != nil {
				t.Fatal(err)
			}
			writeH5Cases(t, file, cases, ub)
			for _, c := range cases {
				t.Run(c.Name, func(t *testing.T) {
					src, err := Open(file+":"+c.Name, Options{ChunkBytes: 1000})
					if err != nil {
						t.Fatal(err)
					}
					defer src.Close()
					if src.Dtype() != c.Want || src.Rows() != c.Shape[0] || fmt.Sprint(src.RowShape()) != fmt.Sprint(c.Shape[1:]) {
						t.Fatalf("dtype %s, rows %d, row shape %v; want %s, %v", src.Dtype(), src.Rows(), src.RowShape(), c.Want, c.Shape)
					}
					h := src.(*h5Source)
					if c.Path != "" && c.Shape[0] > 0 {
						path := map[direct]string{viaLibrary: "library", contiguous: "contiguous", chunks: "chunks"}[h.direct]
						if path != c.Path {
							t.Errorf("rows read through %s, want %s", path, c.Path)
						}
					}
					if ch, ok := c.Kwargs["chunks"].([]int64); ok && src.ChunkRows() != ch[0] {
						t.Errorf("ChunkRows %d, want the chunk's %d", src.ChunkRows(), ch[0])
					}
					want, err := os.ReadFile(filepath.Join(filepath.Dir(file), strings.ReplaceAll(c.Name, "/", "_")+".bin"))
					if err != nil {
						t.Fatal(err)
					}
					checkSource(t, src, want)
				})
			}
		})
	}
	t.Run("concurrent", func(t *testing.T) {
		// Several sources of one file read at once (the library lock
		// serializes what must be).
		file := filepath.Join(dir, "ub0", "data.h5")
		var wg sync.WaitGroup
		for _, name := range []string{"gzip", "chunked", "contiguous", "shuffle", "unwritten"} {
			wg.Go(func() {
				src, err := Open(file+":"+name, Options{})
				if err != nil {
					t.Error(err)
					return
				}
				defer src.Close()
				want, _ := os.ReadFile(filepath.Join(dir, "ub0", name+".bin"))
				got := make([]byte, len(want))
				for range 5 {
					if err := Read(context.Background(), src, 0, src.Rows(), got, ReadOptions{Workers: 4, PieceBytes: 1}); err != nil {
						t.Error(err)
						return
					}
					if string(got) != string(want) {
						t.Errorf("%s: concurrent reads differ", name)
						return
					}
				}
			})
		}
		wg.Wait()
	})
}

// TestHDF5Bad: what cannot be read is a clear error that names the file
// and the dataset.
func TestHDF5Bad(t *testing.T) {
	needPython(t, "numpy", "h5py")
	dir := t.TempDir()
	file := filepath.Join(dir, "bad.h5")
	runPython(t, `
import sys, numpy as np, h5py
with h5py.File(sys.argv[1], 'w') as f:
    f['data'] = np.arange(10, dtype=np.int32)
    f['g/x'] = np.arange(4.0)
    f['scalar'] = np.float32(3)
    f['strings'] = np.array([b'ab', b'cd'])
    f['compound'] = np.zeros(4, dtype=[('a', '<i4'), ('b', '<f8')])
    f['complex'] = np.zeros(4, dtype=np.complex64)
    f.create_dataset('null', data=h5py.Empty('f4'))
    f.create_group('grp')
    f['enum'] = np.zeros(3, dtype=h5py.enum_dtype({'A': 0, 'B': 1, 'C': 2}, basetype='i2'))
with h5py.File(sys.argv[2], 'w') as f:
    pass
`, file, filepath.Join(dir, "nodata.h5"))
	notH5 := filepath.Join(dir, "text.h5")
	if err := os.WriteFile(notH5, []byte("not hdf5\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct{ spec, want string }{
		{file + ":/nope", `has no dataset "/nope" (datasets there: /complex, /compound, /data, /enum, /g/x, /null, /scalar, /strings)`},
		{file + ":/grp", `has no dataset "/grp"`},
		{file + ":g/nope", `has no dataset "g/nope"`},
		{file, "name the dataset as FILE:DATASET (datasets there: /complex, /compound, /data"},
		{filepath.Join(dir, "nodata.h5"), "name the dataset as FILE:DATASET (it holds no datasets)"},
		{filepath.Join(dir, "missing.h5") + ":/data", "missing.h5: no such file or directory"},
		{filepath.Join(dir, "missing.h5"), "missing.h5: no such file or directory"},
		{notH5 + ":/data", "is not an HDF5 file"},
		{file + ":/scalar", "is a scalar"},
		{file + ":/strings", "it holds strings"},
		{file + ":/compound", "compound items"},
		{file + ":/complex", "compound items"},
		{file + ":/null", "null"},
	} {
		t.Run(filepath.Base(tc.spec), func(t *testing.T) {
			src, err := Open(tc.spec, Options{})
			if err == nil {
				src.Close()
				t.Fatal("no error")
			}
			if !errors.Is(err, base.ErrArgument) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error %q: want ErrArgument saying %q", err, tc.want)
			}
			if !strings.Contains(err.Error(), strings.SplitN(tc.spec, ".h5", 2)[0]) {
				t.Fatalf("error %q does not name the file", err)
			}
		})
	}
	if _, err := Open(filepath.Join(dir, "missing.h5:/data"), Options{}); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("missing file: %v does not match fs.ErrNotExist", err)
	}
	// An enum other than h5py's bool reads as its integers.
	src, err := Open(file+":/enum", Options{})
	if err != nil {
		t.Fatal(err)
	}
	if src.Dtype() != "int16" {
		t.Errorf("enum of int16: dtype %s", src.Dtype())
	}
	src.Close()
	// What the caller expects is checked, and a closed source says so.
	if _, err := Open(file+":/data", Options{Dtype: "float32"}); !errors.Is(err, base.ErrArgument) || !strings.Contains(err.Error(), "holds items of int32, not float32") {
		t.Errorf("dtype mismatch: %v", err)
	}
	src, err = Open(file+":/data", Options{})
	if err != nil {
		t.Fatal(err)
	}
	src.Close()
	if err := src.(*h5Source).readLibrary(0, 1, make([]byte, 4)); !errors.Is(err, base.ErrClosed) {
		t.Errorf("read after Close: %v", err)
	}
}

// TestHDF5SkippedFilters: a chunk whose optional filters were skipped
// (its filter mask says which) reads as the library reads it.
func TestHDF5SkippedFilters(t *testing.T) {
	needPython(t, "numpy", "h5py")
	dir := t.TempDir()
	file := filepath.Join(dir, "mask.h5")
	runPython(t, `
import sys, zlib, numpy as np, h5py
a = np.arange(256 * 4, dtype='<i4').reshape(256, 4) * 3
def shuffled(x):
    return np.ascontiguousarray(x.view(np.uint8).reshape(-1, 4).T).tobytes()
with h5py.File(sys.argv[1], 'w') as f:
    d = f.create_dataset('gzip', shape=a.shape, dtype=a.dtype, chunks=(64, 4), compression='gzip')
    d[64:] = a[64:]
    d.id.write_direct_chunk((0, 0), a[:64].tobytes(), filter_mask=1)   # deflate skipped
    d = f.create_dataset('both', shape=a.shape, dtype=a.dtype, chunks=(64, 4), compression='gzip', shuffle=True)
    d[:] = a
    d.id.write_direct_chunk((64, 0), shuffled(a[64:128]), filter_mask=2)  # shuffle applied, deflate skipped
    d.id.write_direct_chunk((128, 0), zlib.compress(a[128:192].tobytes()), filter_mask=1)  # shuffle skipped
    d.id.write_direct_chunk((192, 0), a[192:].tobytes(), filter_mask=3)  # both skipped
    assert (f['both'][:] == a).all() and (f['gzip'][:] == a).all()
open(sys.argv[2], 'wb').write(a.tobytes())
`, file, filepath.Join(dir, "a.bin"))
	want, err := os.ReadFile(filepath.Join(dir, "a.bin"))
	if err != nil {
		t.Fatal(err)
	}
	for _, ds := range []string{"gzip", "both"} {
		src, err := Open(file+":"+ds, Options{})
		if err != nil {
			t.Fatal(err)
		}
		if h := src.(*h5Source); h.direct != chunks {
			t.Errorf("%s: read through %v", ds, h.direct)
		}
		checkSource(t, src, want)
		src.Close()
	}
}

package source

import (
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/ddstore-go/ddstore/internal/base"
	"github.com/ddstore-go/ddstore/internal/layout"
)

const python = "/usr/bin/python3"

// needPython skips the test unless python3 can import every module named.
func needPython(t testing.TB, modules ...string) {
	t.Helper()
	for _, m := range modules {
		if out, err := exec.Command(python, "-c", "import "+m).CombinedOutput(); err != nil {
			t.Skipf("%s cannot import %s (Debian: apt-get install python3-%s): %v: %s", python, m, m, err, bytes.TrimSpace(out))
		}
	}
}

// runPython runs a Python program with args and fails the test if it fails.
func runPython(t testing.TB, code string, args ...string) {
	t.Helper()
	out, err := exec.Command(python, append([]string{"-c", code}, args...)...).CombinedOutput()
	if err != nil {
		t.Fatalf("python: %v\n%s", err, out)
	}
}

// pyMake is the Python that makes the test arrays: make(dtype, shape) is
// deterministic random data over each type's whole range.
const pyMake = `
import json, sys
import numpy as np
import numpy.lib.format as fmt
rng = np.random.default_rng(7)
def make(dt, shape):
    dt = np.dtype(dt)
    if dt.kind == 'b':
        return rng.random(shape) > 0.5
    if dt.kind == 'f':
        return (rng.standard_normal(shape) * 1000).astype(dt)
    info = np.iinfo(dt)
    return rng.integers(info.min, info.max, size=shape, dtype=dt, endpoint=True)
def save_bin(path, a):
    # what a reader must return: little-endian, C order
    open(path, 'wb').write(np.ascontiguousarray(a.astype(a.dtype.newbyteorder('<'))).tobytes())
`

type npyCase struct {
	Name    string  `json:"name"`
	Dtype   string  `json:"dtype"`
	Shape   []int64 `json:"shape"`
	Version []int   `json:"version"` // nil: np.save's choice
}

func writeNPYCases(t *testing.T, dir string, cases []npyCase) {
	t.Helper()
	js, err := json.Marshal(cases)
	if err != nil {
		t.Fatal(err)
	}
	runPython(t, pyMake+`
d = sys.argv[1]
for c in json.loads(sys.argv[2]):
    a = make(c['dtype'], tuple(c['shape']))
    p = d + '/' + c['name'] + '.npy'
    if c['version'] is None:
        np.save(p, a)
    else:
        with open(p, 'wb') as f:
            fmt.write_array(f, a, version=tuple(c['version']))
    save_bin(d + '/' + c['name'] + '.bin', a)
`, dir, string(js))
}

// checkSource reads every row of src, whole and in random ranges, and
// compares with want.
func checkSource(t *testing.T, src Source, want []byte) {
	t.Helper()
	rb := RowBytes(src)
	if int64(len(want)) != src.Rows()*rb {
		t.Fatalf("%d rows of %d bytes, but numpy wrote %d bytes", src.Rows(), rb, len(want))
	}
	got := make([]byte, len(want))
	if err := src.ReadRows(0, src.Rows(), got); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, want) {
		t.Fatalf("ReadRows of all %d rows differs from numpy's bytes", src.Rows())
	}
	got = make([]byte, len(want))
	if err := Read(context.Background(), src, 0, src.Rows(), got, ReadOptions{Workers: 3, PieceBytes: 1}); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, want) {
		t.Fatalf("Read of all %d rows differs from numpy's bytes", src.Rows())
	}
	r := rand.New(rand.NewPCG(1, 2))
	for range 20 {
		if src.Rows() == 0 {
			break
		}
		start := r.Int64N(src.Rows())
		count := r.Int64N(src.Rows()-start) + 1
		buf := make([]byte, count*rb)
		if err := src.ReadRows(start, count, buf); err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(buf, want[start*rb:(start+count)*rb]) {
			t.Fatalf("rows [%d, %d) differ", start, start+count)
		}
	}
}

func TestNPY(t *testing.T) {
	needPython(t, "numpy")
	dir := t.TempDir()
	var cases []npyCase
	for _, dt := range []string{"int8", "uint16", "int32", "int64", "float16", "float32", "float64", "bool", "uint8", "int16", "uint32", "uint64"} {
		for _, shape := range [][]int64{{1000}, {37, 3, 5}} {
			for _, v := range [][]int{nil, {1, 0}, {2, 0}, {3, 0}} {
				cases = append(cases, npyCase{Name: fmt.Sprintf("%s-%d-v%v", dt, len(shape), v), Dtype: dt, Shape: shape, Version: v})
			}
		}
	}
	cases = append(cases, npyCase{Name: "empty", Dtype: "float32", Shape: []int64{0, 4}},
		npyCase{Name: "wide", Dtype: "float64", Shape: []int64{3, 100000}})
	writeNPYCases(t, dir, cases)
	for _, c := range cases {
		t.Run(c.Name, func(t *testing.T) {
			path := filepath.Join(dir, c.Name+".npy")
			src, err := Open(path, Options{ChunkBytes: 4096})
			if err != nil {
				t.Fatal(err)
			}
			defer src.Close()
			if src.Dtype() != c.Dtype || src.Rows() != c.Shape[0] || fmt.Sprint(src.RowShape()) != fmt.Sprint(c.Shape[1:]) {
				t.Fatalf("dtype %s, rows %d, row shape %v; want %s, %v", src.Dtype(), src.Rows(), src.RowShape(), c.Dtype, c.Shape)
			}
			if is, _ := layout.ItemSize(c.Dtype); src.ItemSize() != is {
				t.Fatalf("item size %d, want %d", src.ItemSize(), is)
			}
			if want := max(1, 4096/RowBytes(src)); src.ChunkRows() != want {
				t.Errorf("ChunkRows %d, want %d", src.ChunkRows(), want)
			}
			want, err := os.ReadFile(filepath.Join(dir, c.Name+".bin"))
			if err != nil {
				t.Fatal(err)
			}
			checkSource(t, src, want)
		})
	}
	// What the caller expects of a self-describing file is checked.
	p := filepath.Join(dir, "int32-3-v[].npy")
	if _, err := Open(p, Options{Dtype: "float32"}); !errors.Is(err, base.ErrArgument) || !strings.Contains(err.Error(), "holds items of int32, not float32") {
		t.Errorf("dtype mismatch: %v", err)
	}
	if _, err := Open(p, Options{RowBytes: 4}); !errors.Is(err, base.ErrArgument) || !strings.Contains(err.Error(), "rows of 60 bytes (shape [3 5] of int32), not 4") {
		t.Errorf("row size mismatch: %v", err)
	}
	if src, err := Open(p, Options{RowBytes: 60, Dtype: "int32"}); err != nil {
		t.Errorf("matching expectations: %v", err)
	} else {
		src.Close()
	}
}

// TestNPYBad: every file numpy can write that ingest cannot use, and every
// damaged one, is a clear error naming the file and what is wrong.
func TestNPYBad(t *testing.T) {
	needPython(t, "numpy")
	dir := t.TempDir()
	runPython(t, pyMake+`
d = sys.argv[1]
a = make('float32', (100, 7))
np.save(d + '/fortran.npy', np.asfortranarray(a))
np.save(d + '/big.npy', a.astype('>f4'))
np.save(d + '/object.npy', np.array([1, 'x', None], dtype=object), allow_pickle=True)
np.save(d + '/complex.npy', np.zeros(4, dtype=np.complex64))
np.save(d + '/struct.npy', np.zeros(4, dtype=[('a', '<i4'), ('b', '<f8')]))
np.save(d + '/scalar.npy', np.float32(3))
np.save(d + '/strings.npy', np.array(['ab', 'cd']))
np.save(d + '/zerowidth.npy', np.zeros((5, 0), dtype=np.int8))
np.save(d + '/truncated.npy', a)
np.save(d + '/truncated-header.npy', a)
`, dir)
	trunc := func(name string, size int64) {
		if err := os.Truncate(filepath.Join(dir, name), size); err != nil {
			t.Fatal(err)
		}
	}
	trunc("truncated.npy", 128+100*7*4-5)
	trunc("truncated-header.npy", 50)
	if err := os.WriteFile(filepath.Join(dir, "text.npy"), []byte("x,y\n1,2\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct{ file, want string }{
		{"fortran.npy", "fortran_order is True"},
		{"big.npy", `dtype ">f4" is big-endian`},
		{"object.npy", "Python objects"},
		{"complex.npy", `dtype "<c8" (kind 'c')`},
		{"struct.npy", "structured dtype"},
		{"scalar.npy", "is a scalar (shape ())"},
		{"strings.npy", `dtype "<U2"`},
		{"zerowidth.npy", "rows of zero items"},
		{"truncated.npy", "is truncated: its header says shape (100, 7) of <f4, 2800 bytes of data after a 128-byte header, but the file has 2923 bytes (5 short)"},
		{"truncated-header.npy", "truncated .npy header"},
		{"text.npy", "not a .npy file"},
		{"missing.npy", "no such file or directory"},
	} {
		t.Run(tc.file, func(t *testing.T) {
			path := filepath.Join(dir, tc.file)
			src, err := Open(path, Options{})
			if err == nil {
				src.Close()
				t.Fatalf("no error")
			}
			if !errors.Is(err, base.ErrArgument) || !strings.Contains(err.Error(), path) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error %q: want ErrArgument naming %s and saying %q", err, path, tc.want)
			}
		})
	}
	if _, err := Open(filepath.Join(dir, "missing.npy"), Options{}); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("missing file: %v does not match fs.ErrNotExist", err)
	}
}

func TestNPYHeader(t *testing.T) {
	mk := func(major byte, dict string) []byte {
		b := append([]byte("\x93NUMPY"), major, 0)
		if major == 1 {
			b = binary.LittleEndian.AppendUint16(b, uint16(len(dict)))
		} else {
			b = binary.LittleEndian.AppendUint32(b, uint32(len(dict)))
		}
		return append(b, dict...)
	}
	for _, tc := range []struct {
		major byte
		dict  string
		shape []int64
		descr string
		fo    bool
		err   string
	}{
		{1, "{'descr': '<f4', 'fortran_order': False, 'shape': (3, 4), }      \n", []int64{3, 4}, "<f4", false, ""},
		{2, `{"shape": (5,), "fortran_order": True, "descr": "|b1"}`, []int64{5}, "|b1", true, ""},
		{1, "{'descr': '<i8', 'fortran_order': False, 'shape': (3L, 4L)}", []int64{3, 4}, "<i8", false, ""},
		{1, "{'descr': '<i8', 'fortran_order': False, 'shape': ()}", []int64{}, "<i8", false, ""},
		{3, "{'descr': '<u2', 'fortran_order': False, 'shape': ( 2 , 3 , 4 ) }", []int64{2, 3, 4}, "<u2", false, ""},
		{1, "{'descr': '<f4', 'fortran_order': False, 'shape': (3)}", nil, "", false, "shape 3 is not a tuple"},
		{1, "{'descr': '<f4', 'fortran_order': False, 'shape': [3]}", nil, "", false, "shape [3] is not a tuple"},
		{1, "{'descr': '<f4', 'fortran_order': False, 'shape': (-3,)}", nil, "", false, "non-negative"},
		{1, "{'descr': '<f4', 'fortran_order': 0, 'shape': (3,)}", nil, "", false, "fortran_order 0 is not True or False"},
		{1, "{'descr': '<f4', 'shape': (3,)}", nil, "", false, `has no "fortran_order"`},
		{1, "{'descr': '<f4', 'fortran_order': False, 'shape': (3,), 'x': 1}", nil, "", false, "exactly the keys"},
		{1, "{'descr': '<f4', 'descr': '<f4', 'fortran_order': False, 'shape': (3,)}", nil, "", false, "twice"},
		{1, "{'descr': '<f4', 'fortran_order': False, 'shape': (3,)} x", nil, "", false, "after the dict"},
		{1, "{'descr': '<f4', 'fortran_order': False, 'shape': (3,", nil, "", false, "unexpected end"},
		{1, "{'descr': '<f4", nil, "", false, "unterminated string"},
		{1, "{'descr': [('a', '<i4')], 'fortran_order': False, 'shape': (3,)}", nil, "", false, "structured dtype"},
		{1, "{'descr': '<f4', 'fortran_order': False, 'shape': (99999999999999999999,)}", nil, "", false, "out of range"},
		{1, "[1, 2]", nil, "", false, "not a dict"},
		{1, strings.Repeat("(", 100), nil, "", false, "nested more than"},
	} {
		h, err := readNPYHeader(bytes.NewReader(mk(tc.major, tc.dict)))
		if tc.err != "" {
			if err == nil || !strings.Contains(err.Error(), tc.err) {
				t.Errorf("%q: error %v, want %q", tc.dict, err, tc.err)
			}
			continue
		}
		if err != nil || fmt.Sprint(h.shape) != fmt.Sprint(tc.shape) || h.descr != tc.descr || h.fortran != tc.fo {
			t.Errorf("%q: %+v, %v", tc.dict, h, err)
		}
		if want := int64(len(tc.dict)) + map[byte]int64{1: 10, 2: 12, 3: 12}[tc.major]; h.dataOff != want {
			t.Errorf("%q: data at %d, want %d", tc.dict, h.dataOff, want)
		}
	}
	for _, b := range [][]byte{
		[]byte("\x93NUMPY\x04\x00\x10\x00"),
		[]byte("\x93NUMPY\x01\x01\x10\x00"),
		[]byte("\x93NUMPY\x02\x00\xff\xff\xff\xff"),
		[]byte("\x93NUMP"),
	} {
		if _, err := readNPYHeader(bytes.NewReader(b)); err == nil {
			t.Errorf("%q: no error", b)
		}
	}
}

// FuzzNPYHeader: no header makes the decoder panic, and what it accepts
// is a dict whose shape has no negative dimension.
func FuzzNPYHeader(f *testing.F) {
	f.Add([]byte("\x93NUMPY\x01\x00\x46\x00{'descr': '<f4', 'fortran_order': False, 'shape': (3, 4), }           \n"))
	f.Add([]byte("\x93NUMPY\x02\x00\x10\x00\x00\x00{'descr':[(1,)]}"))
	f.Add([]byte("\x93NUMPY\x03\x00\x05\x00\x00\x00(((((("))
	f.Fuzz(func(t *testing.T, b []byte) {
		h, err := readNPYHeader(bytes.NewReader(b))
		if err != nil {
			return
		}
		for _, n := range h.shape {
			if n < 0 {
				t.Fatalf("shape %v accepted", h.shape)
			}
		}
		if h.dataOff > int64(len(b)) {
			t.Fatalf("data at %d after a %d-byte input", h.dataOff, len(b))
		}
	})
}

func TestRaw(t *testing.T) {
	dir := t.TempDir()
	data := make([]byte, 24*1000)
	for i := range data {
		data[i] = byte(i*7 + i/13)
	}
	path := filepath.Join(dir, "rows.bin")
	if err := os.WriteFile(path, data, 0o644); err != nil {
		t.Fatal(err)
	}
	src, err := Open(path, Options{RowBytes: 24})
	if err != nil {
		t.Fatal(err)
	}
	if src.Rows() != 1000 || src.Dtype() != "uint8" || src.ItemSize() != 1 || fmt.Sprint(src.RowShape()) != "[24]" || src.ChunkRows() != DefaultChunkBytes/24 {
		t.Errorf("raw: rows %d dtype %s itemsize %d shape %v chunk %d", src.Rows(), src.Dtype(), src.ItemSize(), src.RowShape(), src.ChunkRows())
	}
	checkSource(t, src, data)
	src.Close()

	src, err = Open(path, Options{RowBytes: 24, Dtype: "float64", ChunkBytes: 100})
	if err != nil {
		t.Fatal(err)
	}
	if src.Rows() != 1000 || src.Dtype() != "float64" || src.ItemSize() != 8 || fmt.Sprint(src.RowShape()) != "[3]" || src.ChunkRows() != 4 {
		t.Errorf("raw float64: rows %d dtype %s itemsize %d shape %v chunk %d", src.Rows(), src.Dtype(), src.ItemSize(), src.RowShape(), src.ChunkRows())
	}
	checkSource(t, src, data)
	// Reads out of range and into the wrong buffer are refused.
	if err := src.ReadRows(999, 2, make([]byte, 48)); !errors.Is(err, base.ErrIndex) {
		t.Errorf("rows past the end: %v", err)
	}
	if err := src.ReadRows(-1, 1, make([]byte, 24)); !errors.Is(err, base.ErrIndex) {
		t.Errorf("negative start: %v", err)
	}
	if err := src.ReadRows(0, 2, make([]byte, 47)); !errors.Is(err, base.ErrBuffer) {
		t.Errorf("short buffer: %v", err)
	}
	src.Close()

	for _, tc := range []struct {
		opts Options
		want string
	}{
		{Options{RowBytes: 23}, "24000 bytes is not a whole number of 23-byte rows (1043 rows and 11 bytes over"},
		{Options{RowBytes: 7000}, "is not a whole number of 7000-byte rows (3 rows and 3000 bytes over"},
		{Options{RowBytes: 6, Dtype: "float32"}, "rows of 6 bytes are not a whole number of 4-byte float32 items"},
		{Options{RowBytes: 24, Dtype: "complex64"}, `unknown dtype "complex64"`},
		{Options{RowBytes: -1}, "unknown format"},
		{Options{}, "unknown format"},
	} {
		src, err := Open(path, tc.opts)
		if err == nil {
			src.Close()
			t.Errorf("%+v: no error", tc.opts)
			continue
		}
		if !errors.Is(err, base.ErrArgument) || !strings.Contains(err.Error(), path) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%+v: error %q, want %q", tc.opts, err, tc.want)
		}
	}
	if _, err := Open(filepath.Join(dir, "none.bin"), Options{RowBytes: 4}); !errors.Is(err, fs.ErrNotExist) || !errors.Is(err, base.ErrArgument) {
		t.Errorf("missing raw file: %v", err)
	}
	if _, err := Open(dir, Options{RowBytes: 4}); !errors.Is(err, base.ErrArgument) || !strings.Contains(err.Error(), "not a regular file") {
		t.Errorf("a directory: %v", err)
	}
}

// TestNoHDF5: a build without the hdf5 tag says so and how to get it.
func TestNoHDF5(t *testing.T) {
	if HDF5 {
		t.Skip("built with HDF5")
	}
	for _, spec := range []string{"x.h5:/data", "x.h5"} {
		_, err := Open(spec, Options{})
		if !errors.Is(err, base.ErrArgument) || !strings.Contains(err.Error(), "built without HDF5") || !strings.Contains(err.Error(), "-tags hdf5") {
			t.Errorf("Open(%q) without HDF5: %v", spec, err)
		}
	}
}

func TestPlan(t *testing.T) {
	for _, tc := range []struct {
		start, count, chunk, rb, piece int64
		want                           string
	}{
		{0, 10, 4, 1, 4, "[{0 4} {4 4} {8 2}]"},
		{3, 10, 4, 1, 4, "[{3 1} {4 4} {8 4} {12 1}]"},
		{3, 10, 4, 1, 8, "[{3 5} {8 5}]"},
		{3, 10, 4, 1, 1, "[{3 1} {4 4} {8 4} {12 1}]"}, // a piece is at least a chunk
		{5, 2, 4, 1, 1, "[{5 2}]"},
		{0, 0, 4, 1, 1, "[]"},
		{0, 7, 100, 1, 1, "[{0 7}]"},
	} {
		if got := fmt.Sprint(Plan(tc.start, tc.count, tc.chunk, tc.rb, tc.piece)); got != tc.want {
			t.Errorf("Plan(%d, %d, chunk %d, rb %d, piece %d) = %s, want %s", tc.start, tc.count, tc.chunk, tc.rb, tc.piece, got, tc.want)
		}
	}
	// Properties: the pieces tile the range in order, every boundary inside
	// it lies on a chunk boundary, and each piece is one step of whole
	// chunks (so never more than the larger of a piece and a chunk).
	r := rand.New(rand.NewPCG(3, 4))
	for range 2000 {
		start, count := r.Int64N(1000), r.Int64N(1000)
		chunk, rb, piece := r.Int64N(50)+1, r.Int64N(64)+1, r.Int64N(4096)+1
		ps := Plan(start, count, chunk, rb, piece)
		at := start
		step := chunk * max(1, piece/rb/chunk)
		for i, p := range ps {
			if p.Start != at || p.Count <= 0 || p.Count > step {
				t.Fatalf("Plan(%d, %d, %d, %d, %d): piece %d %+v", start, count, chunk, rb, piece, i, p)
			}
			if i > 0 && p.Start%chunk != 0 {
				t.Fatalf("Plan(%d, %d, %d, %d, %d): piece %d %+v begins inside a chunk", start, count, chunk, rb, piece, i, p)
			}
			at += p.Count
		}
		if at != start+count {
			t.Fatalf("Plan(%d, %d, %d, %d, %d) covers up to %d", start, count, chunk, rb, piece, at)
		}
	}
}

// memSource is a Source over a byte slice that records its reads.
type memSource struct {
	data      []byte
	rows, rb  int64
	chunkRows int64
	failAt    int64 // a read that includes this row fails; -1: none
	mu        sync.Mutex
	reads     []Piece
	inFlight  atomic.Int64
}

func (m *memSource) Rows() int64       { return m.rows }
func (m *memSource) RowShape() []int64 { return []int64{m.rb} }
func (m *memSource) Dtype() string     { return "uint8" }
func (m *memSource) ItemSize() int64   { return 1 }
func (m *memSource) ChunkRows() int64  { return m.chunkRows }
func (m *memSource) Close() error      { return nil }
func (m *memSource) ReadRows(start, count int64, dst []byte) error {
	m.inFlight.Add(1)
	defer m.inFlight.Add(-1)
	if err := checkRead("mem", m.rows, m.rb, start, count, dst); err != nil {
		return err
	}
	m.mu.Lock()
	m.reads = append(m.reads, Piece{start, count})
	m.mu.Unlock()
	if m.failAt >= start && m.failAt < start+count {
		return base.Errorf(base.ErrArgument, "row %d is unreadable", m.failAt)
	}
	copy(dst, m.data[start*m.rb:(start+count)*m.rb])
	return nil
}

func newMemSource(r *rand.Rand, rows, rb, chunk int64) *memSource {
	m := &memSource{data: make([]byte, rows*rb), rows: rows, rb: rb, chunkRows: chunk, failAt: -1}
	for i := range m.data {
		m.data[i] = byte(r.Uint32())
	}
	return m
}

// TestReadMatchesNaive: the parallel chunk-aligned reader returns what
// reading row by row does, in one read per piece of its plan.
func TestReadMatchesNaive(t *testing.T) {
	r := rand.New(rand.NewPCG(5, 6))
	for range 300 {
		rows, rb, chunk := r.Int64N(500)+1, r.Int64N(40)+1, r.Int64N(60)+1
		m := newMemSource(r, rows, rb, chunk)
		start := r.Int64N(rows + 1)
		count := r.Int64N(rows - start + 1)
		o := ReadOptions{Workers: r.IntN(8) + 1, PieceBytes: r.Int64N(4000) + 1}
		var progress atomic.Int64
		o.Progress = func(n int64) { progress.Add(n) }
		got := make([]byte, count*rb)
		if err := Read(context.Background(), m, start, count, got, o); err != nil {
			t.Fatal(err)
		}
		naive := make([]byte, 0, count*rb)
		row := make([]byte, rb)
		for g := start; g < start+count; g++ {
			if err := m.ReadRows(g, 1, row); err != nil {
				t.Fatal(err)
			}
			naive = append(naive, row...)
		}
		if !bytes.Equal(got, naive) {
			t.Fatalf("rows %d, rb %d, chunk %d, [%d, %d), %+v: differs from row-by-row reads", rows, rb, chunk, start, start+count, o)
		}
		if progress.Load() != count {
			t.Fatalf("progress counted %d rows of %d", progress.Load(), count)
		}
		plan := Plan(start, count, chunk, rb, o.PieceBytes)
		if n := len(m.reads) - int(count); n != len(plan) {
			t.Fatalf("%d reads for a plan of %d pieces", n, len(plan))
		}
	}
}

func TestReadErrors(t *testing.T) {
	r := rand.New(rand.NewPCG(7, 8))
	m := newMemSource(r, 1000, 8, 10)
	m.failAt = 555
	err := Read(context.Background(), m, 0, 1000, make([]byte, 8000), ReadOptions{Workers: 4, PieceBytes: 80})
	if !errors.Is(err, base.ErrArgument) || !strings.Contains(err.Error(), "row 555 is unreadable") {
		t.Fatalf("Read past a bad row: %v", err)
	}
	if n := m.inFlight.Load(); n != 0 {
		t.Fatalf("%d reads still running after Read returned", n)
	}
	if len(m.reads) == 100 {
		t.Logf("every piece was read despite the error (possible, not expected)")
	}
	m.failAt = -1
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := Read(ctx, m, 0, 1000, make([]byte, 8000), ReadOptions{}); !errors.Is(err, base.ErrClosed) || !errors.Is(err, context.Canceled) {
		t.Fatalf("Read with a cancelled context: %v", err)
	}
	if err := Read(context.Background(), m, 990, 11, make([]byte, 88), ReadOptions{}); !errors.Is(err, base.ErrIndex) {
		t.Fatalf("Read past the end: %v", err)
	}
	if err := Read(context.Background(), m, 0, 10, make([]byte, 81), ReadOptions{}); !errors.Is(err, base.ErrBuffer) {
		t.Fatalf("Read into a wrong buffer: %v", err)
	}
}

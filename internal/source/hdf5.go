//go:build hdf5 && cgo

package source

// HDF5 datasets through the HDF5 C library (Debian: libhdf5-dev, whose
// serial build lives under hdf5/serial; elsewhere set CGO_CFLAGS and
// CGO_LDFLAGS). The library need not be thread-safe, so every call into it
// holds h5lib. Rows that lie in the file as they lie in memory — a contiguous
// dataset, or unfiltered chunks that span whole rows, stored little-endian
// — are read with preads outside the lock, from any number of goroutines;
// everything else (gzip, shuffle, big-endian, fill values) goes through
// H5Dread of a hyperslab straight into the destination.

/*
#cgo CFLAGS: -I/usr/include/hdf5/serial
#cgo linux,amd64 LDFLAGS: -L/usr/lib/x86_64-linux-gnu/hdf5/serial
#cgo linux,arm64 LDFLAGS: -L/usr/lib/aarch64-linux-gnu/hdf5/serial
#cgo LDFLAGS: -lhdf5 -lz
#include <stdint.h>
#include <stdlib.h>
#include <stdio.h>
#include <string.h>
#include <hdf5.h>
#include <zlib.h>

typedef struct {
	hid_t file, dset, ftype, mtype;
	int tclass;                      // H5T_class_t of the file's type
	size_t tsize;                    // its size in bytes
	int isigned;                     // integers and enums: signed
	size_t spos, epos, esize, mpos, msize; // floats: the bit fields
	int enum_bool;                   // h5py's bool: an enum FALSE=0, TRUE=1 of a 1-byte integer
	int same;                        // the memory type is the file's: reads copy bytes
	int ndims;                       // -1: a null dataspace; 0: a scalar
	hsize_t dims[H5S_MAX_RANK];
	int layout;                      // H5D_layout_t
	hsize_t cdims[H5S_MAX_RANK];     // chunked: the chunk's shape
	int nfilters;
	int filters[8];                  // the pipeline's filter ids, as applied when writing
	int64_t offset;                  // contiguous: where the data lie, -1 if nowhere
	hsize_t storage;                 // bytes stored
	hsize_t userblock;
} ddh5_info;

typedef struct {
	char first[512], last[512];
	int n;
} ddh5_err;

static herr_t ddh5_walk(unsigned n, const H5E_error2_t *e, void *data) {
	ddh5_err *er = data;
	const char *d = e->desc ? e->desc : "";
	if (er->n == 0) snprintf(er->first, sizeof er->first, "%s", d);
	snprintf(er->last, sizeof er->last, "%s", d);
	er->n++;
	return 0;
}

// ddh5_errmsg writes the outermost and innermost messages of HDF5's error
// stack (the call that failed, and why).
static void ddh5_errmsg(char *buf, size_t n) {
	ddh5_err er;
	er.n = 0;
	er.first[0] = er.last[0] = 0;
	H5Ewalk2(H5E_DEFAULT, H5E_WALK_DOWNWARD, ddh5_walk, &er);
	if (er.n == 0) snprintf(buf, n, "HDF5 gave no reason");
	else if (er.n == 1 || strcmp(er.first, er.last) == 0) snprintf(buf, n, "%s", er.first);
	else snprintf(buf, n, "%s: %s", er.first, er.last);
}

// ddh5_quiet stops HDF5 printing error stacks: its errors come back as Go
// errors. A thread-safe build (Debian's) keeps the setting per thread, and
// a goroutine's C calls run on any thread, so every entry point calls it.
static void ddh5_quiet(void) { H5Eset_auto2(H5E_DEFAULT, NULL, NULL); }

static void ddh5_close(ddh5_info *in) {
	ddh5_quiet();
	if (in->mtype >= 0) H5Tclose(in->mtype);
	if (in->ftype >= 0) H5Tclose(in->ftype);
	if (in->dset >= 0) H5Dclose(in->dset);
	if (in->file >= 0) H5Fclose(in->file);
	in->mtype = in->ftype = in->dset = in->file = -1;
}

// ddh5_isbool says whether an enum is h5py's bool.
static int ddh5_isbool(hid_t t) {
	if (H5Tget_nmembers(t) != 2) return 0;
	int ok = 1;
	for (unsigned i = 0; i < 2 && ok; i++) {
		char *name = H5Tget_member_name(t, i);
		signed char v = -1;
		if (name == NULL || H5Tget_member_value(t, i, &v) < 0) ok = 0;
		else if (strcmp(name, i == 0 ? "FALSE" : "TRUE") != 0 || v != (signed char)i) ok = 0;
		if (name) H5free_memory(name);
	}
	return ok;
}

// ddh5_open opens a dataset and describes it. It returns 0, or 1 when
// the file is not HDF5, 2 when it cannot be opened, 3 when the dataset
// cannot be; err says why. Handles opened stay in in (ddh5_close).
static int ddh5_open(const char *path, const char *name, ddh5_info *in, char *err, size_t errn) {
	ddh5_quiet();
	memset(in, 0, sizeof *in);
	in->file = in->dset = in->ftype = in->mtype = -1;
	in->offset = -1;
	if (H5Fis_hdf5(path) <= 0) { ddh5_errmsg(err, errn); return 1; }
	in->file = H5Fopen(path, H5F_ACC_RDONLY, H5P_DEFAULT);
	if (in->file < 0) { ddh5_errmsg(err, errn); return 2; }
	in->dset = H5Dopen2(in->file, name, H5P_DEFAULT);
	if (in->dset < 0) { ddh5_errmsg(err, errn); return 3; }

	in->ftype = H5Dget_type(in->dset);
	in->tclass = H5Tget_class(in->ftype);
	in->tsize = H5Tget_size(in->ftype);
	if (in->tclass == H5T_INTEGER) {
		in->isigned = H5Tget_sign(in->ftype) == H5T_SGN_2;
	} else if (in->tclass == H5T_FLOAT) {
		H5Tget_fields(in->ftype, &in->spos, &in->epos, &in->esize, &in->mpos, &in->msize);
	} else if (in->tclass == H5T_ENUM) {
		hid_t super = H5Tget_super(in->ftype);
		if (super >= 0) {
			in->isigned = H5Tget_class(super) == H5T_INTEGER && H5Tget_sign(super) == H5T_SGN_2;
			H5Tclose(super);
		}
		in->enum_bool = in->tsize == 1 && ddh5_isbool(in->ftype);
	}
	if (in->tclass == H5T_INTEGER || in->tclass == H5T_FLOAT || in->tclass == H5T_ENUM) {
		in->mtype = H5Tcopy(in->ftype);
		if (in->tsize > 1 && H5Tget_order(in->ftype) != H5T_ORDER_LE && H5Tset_order(in->mtype, H5T_ORDER_LE) < 0) {
			H5Tclose(in->mtype);
			in->mtype = -1;
		}
		in->same = in->mtype >= 0 && H5Tequal(in->mtype, in->ftype) > 0;
	}

	hid_t space = H5Dget_space(in->dset);
	H5S_class_t sc = H5Sget_simple_extent_type(space);
	if (sc == H5S_SIMPLE) {
		in->ndims = H5Sget_simple_extent_ndims(space);
		H5Sget_simple_extent_dims(space, in->dims, NULL);
	} else {
		in->ndims = sc == H5S_SCALAR ? 0 : -1;
	}
	H5Sclose(space);

	hid_t dcpl = H5Dget_create_plist(in->dset);
	in->layout = H5Pget_layout(dcpl);
	if (in->layout == H5D_CHUNKED && in->ndims > 0) H5Pget_chunk(dcpl, in->ndims, in->cdims);
	in->nfilters = H5Pget_nfilters(dcpl);
	for (int i = 0; i < in->nfilters && i < 8; i++) {
		unsigned flags = 0, conf = 0;
		size_t nelmts = 0;
		in->filters[i] = H5Pget_filter2(dcpl, i, &flags, &nelmts, NULL, 0, NULL, &conf);
	}
	if (in->layout == H5D_CONTIGUOUS && H5Pget_external_count(dcpl) == 0) {
		haddr_t a = H5Dget_offset(in->dset);
		if (a != HADDR_UNDEF) in->offset = (int64_t)a;
	}
	H5Pclose(dcpl);
	in->storage = H5Dget_storage_size(in->dset);
	hid_t fcpl = H5Fget_create_plist(in->file);
	H5Pget_userblock(fcpl, &in->userblock);
	H5Pclose(fcpl);
	return 0;
}

// ddh5_read reads rows [start, start+count) into dst, a memory space of
// the same shape: H5Dread writes the rows straight into dst.
static int ddh5_read(ddh5_info *in, hsize_t start, hsize_t count, void *dst, char *err, size_t errn) {
	ddh5_quiet();
	hsize_t off[H5S_MAX_RANK], cnt[H5S_MAX_RANK];
	for (int i = 0; i < in->ndims; i++) { off[i] = 0; cnt[i] = in->dims[i]; }
	off[0] = start;
	cnt[0] = count;
	hid_t fspace = H5Dget_space(in->dset);
	hid_t mspace = H5Screate_simple(in->ndims, cnt, NULL);
	herr_t st = -1;
	if (fspace >= 0 && mspace >= 0 && H5Sselect_hyperslab(fspace, H5S_SELECT_SET, off, NULL, cnt, NULL) >= 0)
		st = H5Dread(in->dset, in->mtype, mspace, fspace, H5P_DEFAULT, dst);
	if (st < 0) ddh5_errmsg(err, errn);
	if (mspace >= 0) H5Sclose(mspace);
	if (fspace >= 0) H5Sclose(fspace);
	return st < 0;
}

// ddh5_chunk finds the stored chunk that holds row (addr -1: none stored,
// the rows are fill values). It returns -1 where the library cannot say.
static int ddh5_chunk(ddh5_info *in, hsize_t row, int64_t *addr, int64_t *size, unsigned *mask) {
	ddh5_quiet();
#if H5_VERSION_GE(1, 10, 5)
	hsize_t off[H5S_MAX_RANK];
	for (int i = 0; i < in->ndims; i++) off[i] = 0;
	off[0] = row;
	haddr_t a = HADDR_UNDEF;
	hsize_t s = 0;
	if (H5Dget_chunk_info_by_coord(in->dset, off, mask, &a, &s) < 0) return -1;
	*addr = a == HADDR_UNDEF ? -1 : (int64_t)a;
	*size = (int64_t)s;
	return 0;
#else
	return -1;
#endif
}

// ddh5_inflate undoes HDF5's deflate filter (a zlib stream); zlib is
// thread-safe, so chunks inflate in parallel outside the library's lock.
// It returns the bytes written, or -1.
static int64_t ddh5_inflate(void *dst, size_t dstn, const void *src, size_t srcn) {
	uLongf n = dstn;
	if (uncompress(dst, &n, src, srcn) != Z_OK) return -1;
	return (int64_t)n;
}

// ddh5_unshuffle undoes HDF5's shuffle filter for items [e0, e0+n) of a
// chunk of total items of size bytes: byte j of item e lies at j*total+e.
static void ddh5_unshuffle(unsigned char *dst, const unsigned char *src, size_t size, size_t total, size_t e0, size_t n) {
	for (size_t j = 0; j < size; j++) {
		const unsigned char *in = src + j * total + e0;
		unsigned char *out = dst + j;
		for (size_t e = 0; e < n; e++) out[e * size] = in[e];
	}
}

typedef struct {
	char *buf;
	size_t cap, len;
	int count, max;
} ddh5_list;

static herr_t ddh5_visit(hid_t g, const char *name, const H5L_info_t *info, void *data) {
	ddh5_list *l = data;
	if (info->type != H5L_TYPE_HARD) return 0;
	hid_t o = H5Oopen(g, name, H5P_DEFAULT);
	if (o < 0) return 0;
	if (H5Iget_type(o) == H5I_DATASET) {
		int n = snprintf(l->buf + l->len, l->cap - l->len, "/%s\n", name);
		if (n > 0 && (size_t)n < l->cap - l->len) l->len += n;
		l->count++;
	}
	H5Oclose(o);
	return l->count >= l->max;
}

// ddh5_datasets lists up to max datasets of a file, one a line.
static int ddh5_datasets(const char *path, char *buf, size_t cap, int max) {
	ddh5_quiet();
	buf[0] = 0;
	hid_t f = H5Fopen(path, H5F_ACC_RDONLY, H5P_DEFAULT);
	if (f < 0) return -1;
	ddh5_list l = {buf, cap, 0, 0, max};
	H5Lvisit(f, H5_INDEX_NAME, H5_ITER_INC, ddh5_visit, &l);
	H5Fclose(f);
	return l.count;
}
*/
import "C"

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"sync"
	"unsafe"

	"github.com/ddstore-go/ddstore/internal/base"
	"github.com/ddstore-go/ddstore/internal/layout"
	"github.com/ddstore-go/ddstore/internal/naming"
)

// HDF5 says whether this build reads HDF5 files.
const HDF5 = true

// h5lib serializes calls into the HDF5 library, which is not thread-safe
// unless built so (Debian's is, with one lock inside: calls never run in
// parallel either way). It also guards every h5Source's addrs and closed.
// A leaf, taken under a tier's rw (lock order: internal/LOCKS.md).
var h5lib sync.Mutex

func h5lock() { h5lib.Lock() }

const errBufSize = 1024

func cString(b []C.char) string { return C.GoString(&b[0]) }

// direct says how rows can be read without the library.
type direct int

const (
	viaLibrary direct = iota // H5Dread
	contiguous               // one pread at off + row*rowBytes
	chunks                   // preads at each chunk's address, inflated here if filtered
)

// filter is a step of a chunk's pipeline that this package undoes itself.
type filter uint8

const (
	deflate filter = 1 << iota
	shuffle
)

// chunkLoc is where a chunk lies: addr -1 when the library must read it
// (not stored: fill values; or stored otherwise than readable here), -2
// when not yet looked up. filters are the steps applied to it (an optional
// filter that did not shrink a chunk is skipped for it).
type chunkLoc struct {
	addr, size int64
	filters    filter
}

type h5Source struct {
	name string // FILE:DATASET, for messages
	in   C.ddh5_info
	geometry
	direct   direct
	pipeline []filter   // chunks: the filters as applied when writing
	f        *os.File   // direct reads
	off      int64      // contiguous: where row 0 lies; chunks: added to each chunk's address
	locs     []chunkLoc // chunks: per chunk (guarded by h5lib)
	closed   bool       // guarded by h5lib
	bufs     sync.Pool  // *[]byte of a chunk's bytes, for filtered chunks
}

func openHDF5(file, dataset string, opts Options) (Source, error) {
	name := file + ":" + dataset
	fi, err := os.Stat(file)
	if err != nil {
		return nil, naming.FileError(file, err)
	}
	if !fi.Mode().IsRegular() {
		return nil, base.Errorf(base.ErrArgument, "source %s is not a regular file (%v)", file, fi.Mode().Type())
	}
	s := &h5Source{name: name}
	cfile, cds := C.CString(file), C.CString(dataset)
	defer C.free(unsafe.Pointer(cfile))
	defer C.free(unsafe.Pointer(cds))
	msg := make([]C.char, errBufSize)
	h5lock()
	rc := C.ddh5_open(cfile, cds, &s.in, &msg[0], errBufSize)
	h5lib.Unlock()
	fail := func(err error) (Source, error) {
		h5lock()
		C.ddh5_close(&s.in)
		h5lib.Unlock()
		if s.f != nil {
			s.f.Close()
		}
		return nil, err
	}
	switch rc {
	case 1:
		return fail(base.Errorf(base.ErrArgument, "source %s is not an HDF5 file", file))
	case 2:
		return fail(base.Errorf(base.ErrArgument, "source %s: HDF5 cannot open it: %s", file, cString(msg)))
	case 3:
		return fail(base.Errorf(base.ErrArgument, "source %s has no dataset %q%s: %s", file, dataset, datasetList(file), cString(msg)))
	}
	in := &s.in
	if s.dtype, err = h5Dtype(in); err != nil {
		return fail(base.Errorf(base.ErrArgument, "source %s: %v", name, err))
	}
	if in.mtype < 0 {
		return fail(base.Errorf(base.ErrArgument, "source %s: HDF5 cannot convert its %s items to little-endian", name, s.dtype))
	}
	s.itemSize, _ = layout.ItemSize(s.dtype)
	if in.ndims < 0 {
		return fail(base.Errorf(base.ErrArgument, "source %s has an empty (null) dataspace: no rows", name))
	}
	shape := make([]int64, in.ndims)
	for i := range shape {
		shape[i] = int64(in.dims[i])
	}
	if err := checkGeometry(name, shape, s.itemSize); err != nil {
		return fail(err)
	}
	s.rows, s.rowShape = shape[0], shape[1:]
	s.rowBytes = Disp(s.rowShape) * s.itemSize
	s.chunkRows = chunkRowsFor(s.rowBytes, opts.ChunkBytes)
	if in.layout == C.H5D_CHUNKED {
		s.chunkRows = max(1, int64(in.cdims[0]))
	}
	if err := s.planDirect(file); err != nil {
		return fail(err)
	}
	return s, nil
}

// h5Dtype names the ddstore type of a dataset's items.
func h5Dtype(in *C.ddh5_info) (string, error) {
	size := int64(in.tsize)
	ints := map[int64]string{1: "int8", 2: "int16", 4: "int32", 8: "int64"}
	uints := map[int64]string{1: "uint8", 2: "uint16", 4: "uint32", 8: "uint64"}
	switch in.tclass {
	case C.H5T_INTEGER, C.H5T_ENUM:
		if in.tclass == C.H5T_ENUM && in.enum_bool != 0 {
			return "bool", nil
		}
		m := uints
		if in.isigned != 0 {
			m = ints
		}
		if n, ok := m[size]; ok {
			return n, nil
		}
		return "", fmt.Errorf("%d-byte integers: want 1, 2, 4 or 8 bytes", size)
	case C.H5T_FLOAT:
		f := [4]int64{int64(in.epos), int64(in.esize), int64(in.mpos), int64(in.msize)}
		switch {
		case size == 2 && f == [4]int64{10, 5, 0, 10}:
			return "float16", nil
		case size == 2 && f == [4]int64{7, 8, 0, 7}:
			return "bfloat16", nil
		case size == 4 && f == [4]int64{23, 8, 0, 23}:
			return "float32", nil
		case size == 8 && f == [4]int64{52, 11, 0, 52}:
			return "float64", nil
		}
		return "", fmt.Errorf("%d-byte floats of exponent bits %d and mantissa bits %d are not IEEE half, single or double (or bfloat16)", size, in.esize, in.msize)
	}
	classes := map[C.int]string{C.H5T_TIME: "time", C.H5T_STRING: "strings", C.H5T_BITFIELD: "bitfields", C.H5T_OPAQUE: "opaque",
		C.H5T_COMPOUND: "compound items (a structured dtype)", C.H5T_REFERENCE: "references", C.H5T_VLEN: "variable-length items",
		C.H5T_ARRAY: "array items"}
	what, ok := classes[C.int(in.tclass)]
	if !ok {
		what = fmt.Sprintf("items of type class %d", in.tclass)
	}
	return "", fmt.Errorf("it holds %s: want bool, integer or float items", what)
}

// planDirect decides whether rows can be read with preads and where they
// lie. A file with a user block is checked against the library, since
// versions of HDF5 differ on whether chunk addresses count it.
func (s *h5Source) planDirect(file string) error {
	in := &s.in
	if in.same == 0 || s.rows == 0 {
		return nil
	}
	switch {
	case in.layout == C.H5D_CONTIGUOUS && in.offset >= 0 && int64(in.storage) >= s.rows*s.rowBytes:
		s.direct, s.off = contiguous, int64(in.offset)
	case in.layout == C.H5D_CHUNKED && s.wholeRowChunks() && s.knownPipeline():
		s.direct = chunks
		s.locs = make([]chunkLoc, (s.rows+s.chunkRows-1)/s.chunkRows)
		for i := range s.locs {
			s.locs[i].addr = -2
		}
	default:
		return nil
	}
	f, err := os.Open(file)
	if err != nil {
		return naming.FileError(file, err)
	}
	s.f = f
	if in.userblock == 0 {
		return nil
	}
	// Find a stored row and see which offset reads it as the library does.
	row := int64(0)
	if s.direct == chunks {
		row = -1
		for k := range int64(len(s.locs)) {
			if l := s.chunkLocs(k, k); l[0].addr >= 0 {
				row = k * s.chunkRows
				break
			}
		}
		if row < 0 {
			return nil // nothing stored: every read goes through the library
		}
	}
	want := make([]byte, s.rowBytes)
	if err := s.readLibrary(row, 1, want); err != nil {
		return err
	}
	off0 := s.off
	for _, extra := range []int64{0, int64(in.userblock)} {
		s.off = off0 + extra
		got := make([]byte, s.rowBytes)
		if err := s.readDirect(row, 1, got); err == nil && bytes.Equal(got, want) {
			return nil
		}
	}
	s.direct, s.off = viaLibrary, 0 // neither: trust only the library
	return nil
}

// knownPipeline says whether this package can undo every filter of the
// dataset's chunks: deflate and shuffle, as h5py writes them.
func (s *h5Source) knownPipeline() bool {
	if s.in.nfilters > 8 {
		return false
	}
	s.pipeline = nil
	for i := range int(s.in.nfilters) {
		switch s.in.filters[i] {
		case C.H5Z_FILTER_DEFLATE:
			s.pipeline = append(s.pipeline, deflate)
		case C.H5Z_FILTER_SHUFFLE:
			s.pipeline = append(s.pipeline, shuffle)
		default:
			return false
		}
	}
	return true
}

// wholeRowChunks says whether each chunk spans whole rows, so that a chunk
// holds rows one after another as memory does.
func (s *h5Source) wholeRowChunks() bool {
	for i := 1; i < int(s.in.ndims); i++ {
		if s.in.cdims[i] != s.in.dims[i] {
			return false
		}
	}
	return true
}

func (s *h5Source) Close() error {
	h5lock()
	if !s.closed {
		s.closed = true
		C.ddh5_close(&s.in)
	}
	h5lib.Unlock()
	if s.f != nil {
		return s.f.Close()
	}
	return nil
}

func (s *h5Source) ReadRows(start, count int64, dst []byte) error {
	if err := checkRead(s.name, s.rows, s.rowBytes, start, count, dst); err != nil {
		return err
	}
	if count == 0 {
		return nil
	}
	if s.direct == viaLibrary {
		return s.readLibrary(start, count, dst)
	}
	return s.readDirect(start, count, dst)
}

// readLibrary reads rows with H5Dread, under the library's lock.
func (s *h5Source) readLibrary(start, count int64, dst []byte) error {
	msg := make([]C.char, errBufSize)
	h5lock()
	defer h5lib.Unlock()
	if s.closed {
		return base.Errorf(base.ErrClosed, "source %s is closed", s.name)
	}
	if C.ddh5_read(&s.in, C.hsize_t(start), C.hsize_t(count), unsafe.Pointer(unsafe.SliceData(dst)), &msg[0], errBufSize) != 0 {
		return base.Errorf(base.ErrArgument, "source %s: reading rows [%d, %d): %s", s.name, start, start+count, cString(msg))
	}
	return nil
}

// readDirect reads rows with preads: one for a contiguous dataset; for a
// chunked one, one per run of unfiltered chunks that lie one after another
// in the file, and one per filtered chunk, inflated here (in parallel with
// other readers, unlike H5Dread). Chunks the library must read (fill
// values) go through it.
func (s *h5Source) readDirect(start, count int64, dst []byte) error {
	if s.direct == contiguous {
		return s.pread(dst, s.off+start*s.rowBytes)
	}
	cr, rb := s.chunkRows, s.rowBytes
	end := start + count
	k0, k1 := start/cr, (end-1)/cr
	locs := s.chunkLocs(k0, k1)
	for k := k0; k <= k1; {
		l := locs[k-k0]
		j := k
		for l.addr >= 0 && l.filters == 0 && j < k1 {
			n := locs[j+1-k0]
			if n.filters != 0 || n.addr != locs[j-k0].addr+cr*rb {
				break
			}
			j++
		}
		lo, hi := max(start, k*cr), min(end, (j+1)*cr)
		part := dst[(lo-start)*rb : (hi-start)*rb]
		var err error
		switch {
		case l.addr < 0:
			err = s.readLibrary(lo, hi-lo, part)
		case l.filters == 0:
			err = s.pread(part, s.off+l.addr+(lo-k*cr)*rb)
		default:
			err = s.readFiltered(k, l, lo-k*cr, hi-lo, part)
		}
		if err != nil {
			return err
		}
		k = j + 1
	}
	return nil
}

// readFiltered reads n rows from row first of chunk k, stored filtered.
func (s *h5Source) readFiltered(k int64, l chunkLoc, first, n int64, dst []byte) error {
	full := s.chunkRows * s.rowBytes
	comp := s.buf(l.size)
	defer s.bufs.Put(comp)
	if err := s.pread(*comp, s.off+l.addr); err != nil {
		return err
	}
	data := *comp
	if l.filters&deflate != 0 {
		out := dst // inflate straight into dst when it takes the whole chunk
		if l.filters&shuffle != 0 || first != 0 || n != s.chunkRows {
			tmp := s.buf(full)
			defer s.bufs.Put(tmp)
			out = *tmp
		}
		got := C.ddh5_inflate(unsafe.Pointer(unsafe.SliceData(out)), C.size_t(full), unsafe.Pointer(unsafe.SliceData(data)), C.size_t(len(data)))
		if int64(got) != full {
			return base.Errorf(base.ErrArgument, "source %s: chunk %d (rows [%d, %d)) does not inflate to its %d bytes: the file is damaged",
				s.name, k, k*s.chunkRows, (k+1)*s.chunkRows, full)
		}
		if &out[0] == &dst[0] {
			return nil
		}
		data = out[:full]
	}
	if int64(len(data)) != full {
		return base.Errorf(base.ErrArgument, "source %s: chunk %d holds %d bytes, want %d: the file is damaged", s.name, k, len(data), full)
	}
	if l.filters&shuffle != 0 && s.itemSize > 1 {
		e0, ne := first*s.rowBytes/s.itemSize, n*s.rowBytes/s.itemSize
		C.ddh5_unshuffle((*C.uchar)(unsafe.Pointer(unsafe.SliceData(dst))), (*C.uchar)(unsafe.Pointer(unsafe.SliceData(data))),
			C.size_t(s.itemSize), C.size_t(full/s.itemSize), C.size_t(e0), C.size_t(ne))
		return nil
	}
	copy(dst, data[first*s.rowBytes:])
	return nil
}

// buf returns a pooled buffer of n bytes.
func (s *h5Source) buf(n int64) *[]byte {
	if b, ok := s.bufs.Get().(*[]byte); ok && int64(cap(*b)) >= n {
		*b = (*b)[:n]
		return b
	}
	b := make([]byte, n, max(n, s.chunkRows*s.rowBytes))
	return &b
}

func (s *h5Source) pread(dst []byte, off int64) error {
	if _, err := s.f.ReadAt(dst, off); err != nil {
		if errors.Is(err, io.EOF) {
			return base.Errorf(base.ErrArgument, "source %s: %d bytes at offset %d run past the end of the file (truncated?)", s.name, len(dst), off)
		}
		return naming.FileError(s.name, err)
	}
	return nil
}

// chunkLocs returns where chunks k0..k1 lie, looking up those not yet
// known.
func (s *h5Source) chunkLocs(k0, k1 int64) []chunkLoc {
	out := make([]chunkLoc, k1-k0+1)
	h5lock()
	defer h5lib.Unlock()
	for k := k0; k <= k1; k++ {
		if s.locs[k].addr == -2 && !s.closed {
			s.locs[k] = s.lookup(k)
		}
		out[k-k0] = s.locs[k]
	}
	return out
}

// lookup asks the library where chunk k lies (h5lib held).
func (s *h5Source) lookup(k int64) chunkLoc {
	var addr, size C.int64_t
	var mask C.unsigned
	if C.ddh5_chunk(&s.in, C.hsize_t(k*s.chunkRows), &addr, &size, &mask) != 0 || addr < 0 {
		return chunkLoc{addr: -1}
	}
	l := chunkLoc{addr: int64(addr), size: int64(size)}
	for i, f := range s.pipeline {
		if mask&(1<<i) == 0 { // bit i set: filter i was skipped for this chunk
			l.filters |= f
		}
	}
	if uint(mask)>>len(s.pipeline) != 0 || (l.filters == 0 && l.size != s.chunkRows*s.rowBytes) {
		return chunkLoc{addr: -1}
	}
	return l
}

// datasetList names the datasets of a file, for errors: " (datasets
// there: /a, /b)".
func datasetList(file string) string {
	const most = 20
	buf := make([]C.char, 4096)
	cfile := C.CString(file)
	defer C.free(unsafe.Pointer(cfile))
	h5lock()
	n := C.ddh5_datasets(cfile, &buf[0], C.size_t(len(buf)), most)
	h5lib.Unlock()
	if n < 0 {
		return ""
	}
	if n == 0 {
		return " (it holds no datasets)"
	}
	names := strings.Fields(cString(buf))
	if int(n) >= most {
		names = append(names, "...")
	}
	return " (datasets there: " + strings.Join(names, ", ") + ")"
}

// noDataset is the error for an HDF5 file named without a dataset.
func noDataset(file string) error {
	if _, err := os.Stat(file); err != nil {
		return naming.FileError(file, err)
	}
	return base.Errorf(base.ErrArgument, "source %s: name the dataset as FILE:DATASET%s", file, datasetList(file))
}

package shm

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"testing/quick"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/ddstore-go/ddstore/internal/base"
)

// useTempDir points Dir at a fresh temporary directory for one test.
func useTempDir(t *testing.T) string {
	t.Helper()
	old := Dir
	Dir = t.TempDir()
	t.Cleanup(func() { Dir = old })
	return Dir
}

// shmPath is a unique path on the real /dev/shm, removed after the test.
func shmPath(t *testing.T) string {
	t.Helper()
	if st, err := os.Stat("/dev/shm"); err != nil || !st.IsDir() {
		t.Skip("no /dev/shm")
	}
	p := fmt.Sprintf("/dev/shm/ddstore-test.%d.%s", os.Getpid(), Escape(t.Name()))
	os.Remove(p)
	t.Cleanup(func() { os.Remove(p) })
	return p
}

// unescape inverts Escape (for the property test).
func unescape(s string) (string, error) {
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] != '%' {
			b.WriteByte(s[i])
			continue
		}
		if i+2 >= len(s) {
			return "", fmt.Errorf("short escape at %d in %q", i, s)
		}
		v, err := strconv.ParseUint(s[i+1:i+3], 16, 8)
		if err != nil {
			return "", err
		}
		b.WriteByte(byte(v))
		i += 2
	}
	return b.String(), nil
}

func isKept(c byte) bool {
	return c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-' || c == '_'
}

func TestEscapeTable(t *testing.T) {
	for _, c := range []struct{ in, want string }{
		{"", ""},
		{"abcxyzABCXYZ0189-_", "abcxyzABCXYZ0189-_"},
		{"/", "%2F"},
		{".", "%2E"},
		{"..", "%2E%2E"},
		{"%", "%25"},
		{"%2F", "%252F"},
		{" ", "%20"},
		{"a/b.c d", "a%2Fb%2Ec%20d"},
		{"é", "%C3%A9"},
		{"日", "%E6%97%A5"},
		{"\x00\xff", "%00%FF"},
		{"x+y=z~", "x%2By%3Dz%7E"},
	} {
		if got := Escape(c.in); got != c.want {
			t.Errorf("Escape(%q) = %q, want %q", c.in, got, c.want)
		}
	}
	// Every byte: kept ones as they are, every other one as %XX (upper case).
	for i := range 256 {
		c := byte(i)
		got := Escape(string([]byte{c}))
		want := fmt.Sprintf("%%%02X", c)
		if isKept(c) {
			want = string([]byte{c})
		}
		if got != want {
			t.Errorf("Escape(%#x) = %q, want %q", c, got, want)
		}
	}
}

func TestEscapeInjective(t *testing.T) {
	check := func(s string) bool {
		e := Escape(s)
		for i := 0; i < len(e); i++ {
			if !isKept(e[i]) && e[i] != '%' {
				return false
			}
		}
		u, err := unescape(e)
		return err == nil && u == s
	}
	if err := quick.Check(check, &quick.Config{MaxCount: 2000}); err != nil {
		t.Errorf("Escape does not round trip: %v", err)
	}
	checkBytes := func(b []byte) bool { return check(string(b)) }
	if err := quick.Check(checkBytes, &quick.Config{MaxCount: 2000}); err != nil {
		t.Errorf("Escape does not round trip on bytes: %v", err)
	}
	// Pairs: distinct inputs, distinct outputs.
	distinct := func(a, b []byte) bool {
		return bytes.Equal(a, b) == (Escape(string(a)) == Escape(string(b)))
	}
	if err := quick.Check(distinct, &quick.Config{MaxCount: 2000}); err != nil {
		t.Errorf("Escape maps distinct names to one output: %v", err)
	}
	// A sample of near-collisions.
	seen := map[string]string{}
	for _, s := range []string{"a", "a.", "a%2E", "a%2e", "a_2E", "a-", "a/", "a%", "a%25", "A", "a ", "a\x00", "%41", "a.b", "a/b", "a%2Fb", "a%2Eb"} {
		e := Escape(s)
		if prev, ok := seen[e]; ok {
			t.Errorf("Escape(%q) = Escape(%q) = %q", s, prev, e)
		}
		seen[e] = s
	}
}

func TestSegmentPath(t *testing.T) {
	dir := useTempDir(t)
	p := SegmentPath("ns.1", "node/a", "x.y z", 3, "")
	want := dir + "/ddstore.ns%2E1.node%2Fa.x%2Ey%20z.r3"
	if p != want {
		t.Fatalf("SegmentPath = %q, want %q", p, want)
	}
	if pre := SegmentPrefix("ns.1", "node/a"); !strings.HasPrefix(p, pre) {
		t.Fatalf("SegmentPath %q does not start with SegmentPrefix %q", p, pre)
	}
	if filepath.Dir(p) != dir {
		t.Fatalf("SegmentPath %q is not directly in %q", p, dir)
	}
	// A namespace that would look like another's prefix does not match it.
	if strings.HasPrefix(SegmentPath("ns", "n.x", "v", 0, ""), SegmentPrefix("ns.n", "x")) {
		t.Fatal("segments of node \"n.x\" look like those of namespace \"ns.n\", node \"x\"")
	}
	if SegmentPath("a", "b", "c", 1, "") == SegmentPath("a", "b", "c", 11, "") {
		t.Fatal("ranks 1 and 11 share a path")
	}
	// With a nonce, between the variable and the rank: one of its own for
	// every call of NewNonce.
	n1, n2 := NewNonce(), NewNonce()
	if n1 == n2 || !isNonce(n1) {
		t.Fatalf("NewNonce gave %q, then %q", n1, n2)
	}
	p = SegmentPath("ns.1", "node/a", "x.y z", 3, n1)
	if want := dir + "/ddstore.ns%2E1.node%2Fa.x%2Ey%20z." + n1 + ".r3"; p != want {
		t.Fatalf("SegmentPath with a nonce = %q, want %q", p, want)
	}
	if pre := SegmentPrefix("ns.1", "node/a"); !strings.HasPrefix(p, pre) {
		t.Fatalf("SegmentPath %q does not start with SegmentPrefix %q", p, pre)
	}
}

func fill(b []byte, seed byte) {
	for i := range b {
		b[i] = byte(i*13) ^ seed
	}
}

func TestCreateOpenRoundTrip(t *testing.T) {
	for _, where := range []string{"tmpdir", "devshm"} {
		t.Run(where, func(t *testing.T) {
			var path string
			if where == "devshm" {
				path = shmPath(t)
			} else {
				path = filepath.Join(useTempDir(t), "seg")
			}
			h := Header{Rank: 3, Rows: 10, Disp: 3, ItemSize: 4}
			seg, err := Create(path, h)
			if err != nil {
				t.Fatalf("Create: %v", err)
			}
			defer seg.Close()
			if seg.Header != h || seg.Path != path {
				t.Fatalf("Create made %+v at %q", seg.Header, seg.Path)
			}
			if len(seg.Data) != 10*3*4 {
				t.Fatalf("len(Data) = %d, want %d", len(seg.Data), 10*3*4)
			}
			if !bytes.Equal(seg.Data, make([]byte, len(seg.Data))) {
				t.Fatal("a new segment is not zero-filled")
			}
			if uintptr(unsafe.Pointer(unsafe.SliceData(seg.Data)))%uintptr(os.Getpagesize()) != 0 {
				t.Error("rows do not start page-aligned")
			}
			st, err := os.Stat(path)
			if err != nil {
				t.Fatal(err)
			}
			if st.Mode().Perm() != 0o600 {
				t.Errorf("segment mode %v, want 0600", st.Mode().Perm())
			}
			if st.Size() != HeaderBytes+120 {
				t.Errorf("segment file of %d bytes, want %d", st.Size(), HeaderBytes+120)
			}
			fill(seg.Data, 1)

			ro, err := Open(path, false)
			if err != nil {
				t.Fatalf("Open read-only: %v", err)
			}
			defer ro.Close()
			rw, err := Open(path, true)
			if err != nil {
				t.Fatalf("Open writable: %v", err)
			}
			defer rw.Close()
			for _, s := range []*Segment{ro, rw} {
				if s.Header != h || s.Path != path {
					t.Fatalf("Open read %+v at %q, want %+v", s.Header, s.Path, h)
				}
				if !bytes.Equal(s.Data, seg.Data) {
					t.Fatal("Open does not see the rows written through Create's mapping")
				}
			}
			// Writes through the writable mapping show in the others.
			fill(rw.Data[24:48], 0x77)
			if !bytes.Equal(seg.Data, rw.Data) || !bytes.Equal(ro.Data, rw.Data) {
				t.Fatal("a write through one mapping is not seen through another")
			}
			// The file holds the rows after the header.
			b, err := os.ReadFile(path)
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(b[HeaderBytes:], rw.Data) {
				t.Fatal("the file does not hold the rows after its header")
			}
			if err := ro.Close(); err != nil {
				t.Errorf("Close: %v", err)
			}
			if err := ro.Close(); err != nil {
				t.Errorf("second Close: %v", err)
			}
			if ro.Data != nil {
				t.Error("Close left Data set")
			}
		})
	}
}

func TestCreateExisting(t *testing.T) {
	dir := useTempDir(t)
	path := filepath.Join(dir, "seg")
	h := Header{Rank: 0, Rows: 4, Disp: 2, ItemSize: 8}
	seg, err := Create(path, h)
	if err != nil {
		t.Fatalf("Create: %v", err)
	}
	defer seg.Close()
	fill(seg.Data, 9)
	_, err = Create(path, Header{Rank: 1, Rows: 1, Disp: 1, ItemSize: 1})
	if !errors.Is(err, base.ErrExists) {
		t.Fatalf("Create of an existing segment = %v, want ErrExists", err)
	}
	// The first segment is untouched.
	s2, err := Open(path, false)
	if err != nil {
		t.Fatalf("Open after a failed Create: %v", err)
	}
	defer s2.Close()
	if s2.Header != h || !bytes.Equal(s2.Data, seg.Data) {
		t.Fatal("a failed Create changed the existing segment")
	}
	// Also for a file that is not a segment.
	other := filepath.Join(dir, "other")
	os.WriteFile(other, []byte("x"), 0o600)
	if _, err := Create(other, h); !errors.Is(err, base.ErrExists) {
		t.Fatalf("Create over a plain file = %v, want ErrExists", err)
	}
}

func TestOpenMissing(t *testing.T) {
	dir := useTempDir(t)
	for _, writable := range []bool{false, true} {
		_, err := Open(filepath.Join(dir, "nope"), writable)
		if !errors.Is(err, base.ErrUnknown) || !errors.Is(err, os.ErrNotExist) {
			t.Fatalf("Open(missing, %v) = %v, want ErrUnknown and os.ErrNotExist", writable, err)
		}
	}
}

func TestOpenCorruptHeader(t *testing.T) {
	dir := useTempDir(t)
	path := filepath.Join(dir, "seg")
	seg, err := Create(path, Header{Rank: 2, Rows: 5, Disp: 4, ItemSize: 2})
	if err != nil {
		t.Fatalf("Create: %v", err)
	}
	seg.Close()
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	// magic, version, rank, rows, disp, itemsize, checksum
	for _, off := range []int64{0, 7, 8, 16, 24, 32, 40, 47, 48, 51} {
		one := make([]byte, 1)
		if _, err := f.ReadAt(one, off); err != nil {
			t.Fatal(err)
		}
		if _, err := f.WriteAt([]byte{one[0] ^ 0x10}, off); err != nil {
			t.Fatal(err)
		}
		for _, writable := range []bool{false, true} {
			if s, err := Open(path, writable); !errors.Is(err, base.ErrProtocol) {
				if err == nil {
					s.Close()
				}
				t.Fatalf("Open with byte %d of the header flipped = %v, want ErrProtocol", off, err)
			}
		}
		f.WriteAt(one, off)
		s, err := Open(path, false)
		if err != nil {
			t.Fatalf("Open after restoring byte %d: %v", off, err)
		}
		s.Close()
	}
}

func TestOpenWrongSize(t *testing.T) {
	dir := useTempDir(t)
	path := filepath.Join(dir, "seg")
	seg, err := Create(path, Header{Rank: 0, Rows: 5, Disp: 4, ItemSize: 2})
	if err != nil {
		t.Fatalf("Create: %v", err)
	}
	seg.Close()
	size := int64(HeaderBytes + 40)
	for _, n := range []int64{size + 1, size - 1, size + 4096, HeaderBytes, HeaderBytes - 1, 100, 0} {
		if err := os.Truncate(path, n); err != nil {
			t.Fatal(err)
		}
		if s, err := Open(path, false); !errors.Is(err, base.ErrProtocol) {
			if err == nil {
				s.Close()
			}
			t.Fatalf("Open of a %d-byte file whose header says %d = %v, want ErrProtocol", n, size, err)
		}
	}
	// A file of the right size without a header.
	if err := os.WriteFile(path, make([]byte, size), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := Open(path, false); !errors.Is(err, base.ErrProtocol) {
		t.Fatalf("Open of a file of zeros = %v, want ErrProtocol", err)
	}
}

// TestOpenOverflowingHeader: a header whose rows*disp*itemsize overflows
// int64 must not be taken for a file that has room for it.
func TestOpenOverflowingHeader(t *testing.T) {
	dir := useTempDir(t)
	path := filepath.Join(dir, "seg")
	b := make([]byte, HeaderBytes)
	copy(b, magic)
	le := binary.LittleEndian
	le.PutUint32(b[8:], version)
	le.PutUint64(b[16:], 0)
	le.PutUint64(b[24:], 1<<62) // rows
	le.PutUint64(b[32:], 4)     // disp
	le.PutUint64(b[40:], 1)     // itemsize: 2^64 bytes of rows, 0 after overflow
	le.PutUint32(b[48:], crc32.ChecksumIEEE(b[:48]))
	if err := os.WriteFile(path, b, 0o600); err != nil {
		t.Fatal(err)
	}
	s, err := Open(path, false)
	if err == nil {
		defer s.Close()
		t.Fatalf("shm.Open accepts a segment whose header says %d rows of %d bytes (the product overflows int64 to 0) "+
			"in a file of %d bytes: Header.Rows = %d but len(Data) = %d; want ErrProtocol",
			s.Header.Rows, s.Header.Disp*s.Header.ItemSize, HeaderBytes, s.Header.Rows, len(s.Data))
	}
	if !errors.Is(err, base.ErrProtocol) {
		t.Fatalf("Open = %v, want ErrProtocol", err)
	}
}

func TestZeroRowSegment(t *testing.T) {
	for _, where := range []string{"tmpdir", "devshm"} {
		t.Run(where, func(t *testing.T) {
			var path string
			if where == "devshm" {
				path = shmPath(t)
			} else {
				path = filepath.Join(useTempDir(t), "seg")
			}
			h := Header{Rank: 1, Rows: 0, Disp: 16, ItemSize: 8}
			seg, err := Create(path, h)
			if err != nil {
				t.Fatalf("Create of zero rows: %v", err)
			}
			defer seg.Close()
			if len(seg.Data) != 0 {
				t.Fatalf("len(Data) = %d, want 0", len(seg.Data))
			}
			for _, writable := range []bool{false, true} {
				s, err := Open(path, writable)
				if err != nil {
					t.Fatalf("Open of zero rows: %v", err)
				}
				if s.Header != h || len(s.Data) != 0 {
					t.Fatalf("Open read %+v with %d bytes", s.Header, len(s.Data))
				}
				s.Close()
			}
		})
	}
}

// TestCreateReserves: a segment's pages are allocated when it is created,
// so a write into it cannot find the filesystem full.
func TestCreateReserves(t *testing.T) {
	path := shmPath(t)
	const rows, disp = 1 << 11, 1024 // 2 MiB
	seg, err := Create(path, Header{Rows: rows, Disp: disp, ItemSize: 1})
	if err != nil {
		t.Fatalf("Create: %v", err)
	}
	defer seg.Close()
	var st unix.Stat_t
	if err := unix.Stat(path, &st); err != nil {
		t.Fatal(err)
	}
	if st.Size != HeaderBytes+rows*disp {
		t.Fatalf("size %d", st.Size)
	}
	if used := st.Blocks * 512; used < st.Size {
		t.Errorf("a segment of %d bytes has %d bytes of tmpfs allocated: want them all", st.Size, used)
	}
}

// smallTmpfs mounts a tmpfs of size bytes as Dir for the test (root only).
func smallTmpfs(t *testing.T, size int) string {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("mounting a small tmpfs needs root")
	}
	dir := t.TempDir()
	if err := unix.Mount("ddstore-test", dir, "tmpfs", unix.MS_NOSUID|unix.MS_NODEV, fmt.Sprintf("size=%d,mode=0700", size)); err != nil {
		t.Skipf("mount tmpfs: %v", err)
	}
	t.Cleanup(func() { unix.Unmount(dir, unix.MNT_DETACH) })
	old := Dir
	Dir = dir
	t.Cleanup(func() { Dir = old })
	return dir
}

// TestCreateNoRoom: on a full tmpfs Create fails, naming the bytes wanted
// and free, and leaves no file; a segment that fits is then made as ever.
// (Sized without reserving, the segment's first write through a mapping
// would be a SIGBUS.)
func TestCreateNoRoom(t *testing.T) {
	dir := smallTmpfs(t, 1<<20)
	if err := os.WriteFile(filepath.Join(dir, "filler"), make([]byte, 768<<10), 0o600); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(dir, "seg")
	h := Header{Rows: 512, Disp: 1024, ItemSize: 1}
	_, err := Create(path, h)
	want := strconv.Itoa(HeaderBytes + 512<<10)
	if !errors.Is(err, base.ErrArgument) || !strings.Contains(err.Error(), want+" bytes") || !strings.Contains(err.Error(), "free") {
		t.Fatalf("Create on a full tmpfs: %v; want ErrArgument naming the %s bytes wanted and those free", err, want)
	}
	var st unix.Statfs_t
	if err := unix.Statfs(dir, &st); err != nil {
		t.Fatal(err)
	}
	if free := strconv.FormatInt(int64(st.Bavail)*st.Bsize, 10); !strings.Contains(err.Error(), "has "+free+" bytes") {
		t.Errorf("error %q does not name the %s bytes free", err, free)
	}
	if _, serr := os.Stat(path); !os.IsNotExist(serr) {
		t.Fatalf("a failed Create left %s (%v)", path, serr)
	}
	seg, err := Create(path, Header{Rows: 64, Disp: 1024, ItemSize: 1})
	if err != nil {
		t.Fatalf("Create of a segment that fits: %v", err)
	}
	defer seg.Close()
	for i := range seg.Data {
		seg.Data[i] = byte(i)
	}
}

func TestRemove(t *testing.T) {
	dir := useTempDir(t)
	if err := Remove(filepath.Join(dir, "nope")); err != nil {
		t.Fatalf("Remove of a missing path = %v, want nil", err)
	}
	path := filepath.Join(dir, "seg")
	seg, err := Create(path, Header{Rows: 2, Disp: 8, ItemSize: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer seg.Close()
	if err := Remove(path); err != nil {
		t.Fatalf("Remove: %v", err)
	}
	if _, err := os.Stat(path); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("segment still there after Remove: %v", err)
	}
	// The mapping stays usable.
	fill(seg.Data, 3)
	if seg.Data[5] != byte(5*13)^3 {
		t.Fatal("mapping unusable after Remove")
	}
	if _, err := Open(path, false); !errors.Is(err, base.ErrUnknown) {
		t.Fatalf("Open after Remove = %v, want ErrUnknown", err)
	}
	if err := Remove(path); err != nil {
		t.Fatalf("second Remove = %v, want nil", err)
	}
	if err := Remove(filepath.Join(dir, "nodir", "x")); err != nil {
		t.Fatalf("Remove under a missing directory = %v, want nil (ENOENT)", err)
	}
	// Other failures are reported.
	if err := Remove(dir); err == nil {
		t.Fatal("Remove of a directory succeeded")
	}
}

func TestRegion(t *testing.T) {
	const size = 3*4096 + 100
	r, err := NewRegion("ddstore-test", size)
	if err != nil {
		t.Fatalf("NewRegion: %v", err)
	}
	defer r.Close()
	if len(r.Mem) != size {
		t.Fatalf("len(Mem) = %d, want %d", len(r.Mem), size)
	}
	if n, err := FdSize(r.Fd); err != nil || n != size {
		t.Fatalf("FdSize = %d, %v, want %d", n, err, size)
	}
	if !bytes.Equal(r.Mem, make([]byte, size)) {
		t.Fatal("a new region is not zero-filled")
	}
	m2, err := MapFd(r.Fd, size)
	if err != nil {
		t.Fatalf("MapFd: %v", err)
	}
	fill(r.Mem, 5)
	if !bytes.Equal(m2, r.Mem) {
		t.Fatal("a second mapping does not see writes through the first")
	}
	fill(m2[4000:8200], 0x99)
	if !bytes.Equal(m2, r.Mem) {
		t.Fatal("the first mapping does not see writes through the second")
	}
	// As another process would: through a descriptor of its own.
	fd2, err := unix.Dup(r.Fd)
	if err != nil {
		t.Fatal(err)
	}
	m3, err := MapFd(fd2, size)
	unix.Close(fd2) // the mapping outlives the descriptor
	if err != nil {
		t.Fatalf("MapFd of a dup: %v", err)
	}
	if !bytes.Equal(m3, r.Mem) {
		t.Fatal("a mapping through a dup'd descriptor differs")
	}
	if err := Unmap(m2); err != nil {
		t.Errorf("Unmap: %v", err)
	}
	if err := Unmap(m3); err != nil {
		t.Errorf("Unmap: %v", err)
	}
	if err := r.Close(); err != nil {
		t.Errorf("Region.Close: %v", err)
	}
	if r.Mem != nil {
		t.Error("Region.Close left Mem set")
	}
	if _, err := FdSize(r.Fd); err == nil {
		t.Error("FdSize of a closed region's descriptor succeeded")
	}
}

func TestRegionBadSize(t *testing.T) {
	for _, size := range []int{0, -1} {
		if r, err := NewRegion("ddstore-test", size); !errors.Is(err, base.ErrArgument) {
			if err == nil {
				r.Close()
			}
			t.Errorf("NewRegion(%d) = %v, want ErrArgument", size, err)
		}
	}
	r, err := NewRegion("ddstore-test", 1)
	if err != nil {
		t.Fatalf("NewRegion(1): %v", err)
	}
	defer r.Close()
	if _, err := MapFd(r.Fd, 0); err == nil {
		t.Error("MapFd of 0 bytes succeeded")
	}
	if _, err := MapFd(-1, 4096); err == nil {
		t.Error("MapFd of fd -1 succeeded")
	}
	if _, err := FdSize(-1); err == nil {
		t.Error("FdSize(-1) succeeded")
	}
}

// TestCreateBadGeometry: Create of a geometry that does not describe a
// segment (negative, or so large the byte count overflows) fails and leaves
// no file. The agent checks geometry before Create (checkShard), so this is
// Create's own robustness.
func TestCreateBadGeometry(t *testing.T) {
	var bugs []string
	for _, h := range []Header{
		{Rows: -1, Disp: 1, ItemSize: 1},      // HeaderBytes-1 bytes in all
		{Rows: -5, Disp: 1024, ItemSize: 1},   // a negative size
		{Rows: 1 << 62, Disp: 4, ItemSize: 1}, // 2^64 bytes of rows: 0 after overflow
	} {
		path := filepath.Join(useTempDir(t), "seg")
		var seg *Segment
		var err error
		panicked := func() (p any) {
			defer func() { p = recover() }()
			seg, err = Create(path, h)
			return nil
		}()
		_, statErr := os.Stat(path)
		switch {
		case panicked != nil:
			bugs = append(bugs, fmt.Sprintf("Create(%+v) panics (%v) and leaves the file behind (stat: %v)", h, panicked, statErr))
		case err == nil:
			bugs = append(bugs, fmt.Sprintf("Create(%+v) succeeds with Header.Rows %d but len(Data) %d", h, seg.Header.Rows, len(seg.Data)))
			seg.Close()
		case statErr == nil:
			t.Errorf("Create(%+v) = %v but left the file behind", h, err)
		}
	}
	if len(bugs) > 0 {
		t.Fatal("shm.Create does not validate its Header: " + strings.Join(bugs, "; "))
	}
}

func TestSegmentPathLongNames(t *testing.T) {
	long := strings.Repeat("é/", 300)
	seen := map[string]bool{}
	for _, c := range [][3]string{{"ns", "node", long}, {"ns", "node", long + "x"}, {strings.Repeat("n", 255), strings.Repeat("m", 255), "v"}, {"ns", "node", "short"}} {
		p := SegmentPath(c[0], c[1], c[2], 3, "")
		base := p[strings.LastIndexByte(p, '/')+1:]
		if len(base) > 255 {
			t.Errorf("%d-byte file name for %q", len(base), c)
		}
		if seen[p] {
			t.Errorf("two names share %s", p)
		}
		seen[p] = true
	}
}

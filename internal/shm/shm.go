// Package shm holds shards in POSIX shared memory: files under /dev/shm that
// the agent creates and every client process of the node maps, so rows are
// written in and read out without passing through a socket. It also makes
// anonymous memfd regions, which clients hand to their agent as receive
// buffers for rows fetched from other nodes.
package shm

import (
	"crypto/rand"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"hash/crc32"
	"os"
	"strconv"
	"strings"
	"sync/atomic"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/ddstore-go/ddstore/internal/base"
)

// Dir is where segments live; a variable so tests can point elsewhere.
var Dir = "/dev/shm"

// HeaderBytes is the size of the header in front of a shard's rows; a page,
// so the rows start page-aligned.
const HeaderBytes = 4096

// Header versions: 1 for a shard of fixed rows (the original header, its
// bytes unchanged), 2 for the segments of a ragged variable, whose header
// adds the kind (bytes 12-15) and the item count (bytes 48-55), its
// checksum moving to bytes 56-59.
const (
	magic       = "DDSTSHRD"
	version     = 1
	versionKind = 2
)

// droppedAt is the offset in the header page of the dropped word: 0 while
// the segment's variable is live, 1 once its agent has dropped it (the
// variable freed by every rank, or the agent stopping without Persist).
// The agent sets it before it unmaps and unlinks the segment, so a client
// still mapping the file, whose mapping keeps the old rows readable, learns
// from it that they are a freed variable's: it checks the word after
// copying rows out (no syscall, no round trip) and discards them. Outside
// the checksummed bytes and zero in every segment made before it existed,
// so headers of versions 1 and 2 are unchanged.
const droppedAt = 64

// Kind is what a segment holds.
type Kind uint32

const (
	// KindRows: Rows rows of Disp items.
	KindRows Kind = 0
	// KindRagged: a ragged shard: Rows+1 local offsets (int64, in units of
	// Disp items; offsets[0] = 0, offsets[Rows] = Items), padded to a page,
	// then the values, Items units of Disp items.
	KindRagged Kind = 1
	// KindIndex: a node's index of a ragged variable: Rows+1 job-wide
	// offsets (int64), row g being units [off[g], off[g+1]) of the
	// variable's values in rank order; Items = off[Rows].
	KindIndex Kind = 2
)

// Header describes the shard a segment holds, so that an agent restarted on
// the node can validate a segment before adopting it.
type Header struct {
	Rank     int64
	Rows     int64
	Disp     int64
	ItemSize int64
	Kind     Kind
	Items    int64 // KindRagged, KindIndex: units of Disp items
}

func (h Header) encode(b []byte) {
	copy(b, magic)
	le := binary.LittleEndian
	le.PutUint32(b[8:], version)
	le.PutUint64(b[16:], uint64(h.Rank))
	le.PutUint64(b[24:], uint64(h.Rows))
	le.PutUint64(b[32:], uint64(h.Disp))
	le.PutUint64(b[40:], uint64(h.ItemSize))
	if h.Kind == KindRows {
		le.PutUint32(b[48:], crc32.ChecksumIEEE(b[:48]))
		return
	}
	le.PutUint32(b[8:], versionKind)
	le.PutUint32(b[12:], uint32(h.Kind))
	le.PutUint64(b[48:], uint64(h.Items))
	le.PutUint32(b[56:], crc32.ChecksumIEEE(b[:56]))
}

func decodeHeader(b []byte) (Header, error) {
	le := binary.LittleEndian
	if len(b) < HeaderBytes || string(b[:8]) != magic {
		return Header{}, base.Errorf(base.ErrProtocol, "segment has no ddstore header")
	}
	v := le.Uint32(b[8:])
	crcAt := 48
	switch v {
	case version:
	case versionKind:
		crcAt = 56
	default:
		return Header{}, base.Errorf(base.ErrProtocol, "segment version %d, want %d or %d", v, version, versionKind)
	}
	if le.Uint32(b[crcAt:]) != crc32.ChecksumIEEE(b[:crcAt]) {
		return Header{}, base.Errorf(base.ErrProtocol, "segment header checksum mismatch")
	}
	h := Header{
		Rank:     int64(le.Uint64(b[16:])),
		Rows:     int64(le.Uint64(b[24:])),
		Disp:     int64(le.Uint64(b[32:])),
		ItemSize: int64(le.Uint64(b[40:])),
	}
	if v == versionKind {
		h.Kind, h.Items = Kind(le.Uint32(b[12:])), int64(le.Uint64(b[48:]))
		if h.Kind == KindRows || h.Kind > KindIndex {
			return Header{}, base.Errorf(base.ErrProtocol, "segment of version %d and kind %d", v, h.Kind)
		}
	}
	return h, nil
}

// Escape turns a namespace, node or variable name into a file-name part:
// letters, digits, '-' and '_' stay, every other byte becomes %XX, so names
// with '/' or '.' map one-to-one onto file names.
func Escape(s string) string {
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-' || c == '_' {
			b.WriteByte(c)
		} else {
			fmt.Fprintf(&b, "%%%02X", c)
		}
	}
	return b.String()
}

// SegmentPath is the file of rank's shard of a variable on a node, with
// nonce (NewNonce) between the variable and the rank: the agent draws one
// for each segment it creates, so another local user, who may create files
// in /dev/shm but cannot guess the nonce, cannot take a future segment's
// name beforehand; "" gives the name without one (what agents before the
// nonce made, still recognized). File names are limited to 255 bytes: a
// long variable name is replaced by a hash of it, and when the namespace
// and node are long too, the whole name is.
func SegmentPath(namespace, node, variable string, rank int, nonce string) string {
	n := ""
	if nonce != "" {
		n = "." + nonce
	}
	name := fmt.Sprintf("ddstore.%s.%s.%s%s.r%d", Escape(namespace), Escape(node), Escape(variable), n, rank)
	if len(name) > 250 {
		sum := sha256.Sum256([]byte(variable))
		name = fmt.Sprintf("ddstore.%s.%s.%s%s.r%d", Escape(namespace), Escape(node), "h"+hex.EncodeToString(sum[:16]), n, rank)
		if len(name) > 250 {
			sum := sha256.Sum256([]byte(namespace + "\x00" + node + "\x00" + variable))
			name = fmt.Sprintf("ddstore.h%s%s.r%d", hex.EncodeToString(sum[:20]), n, rank)
		}
	}
	return Dir + "/" + name
}

// nonceBytes is the randomness of a segment's nonce: 16 hex digits.
const nonceBytes = 8

// NewNonce draws a segment's nonce (SegmentPath), from crypto/rand.
func NewNonce() string {
	var b [nonceBytes]byte
	rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

func isNonce(s string) bool { return len(s) == 2*nonceBytes && isHex(s) }

// indexSuffix ends the file name of a node's index of a ragged variable,
// where a shard's has r<rank>.
const indexSuffix = "index"

// IndexPath is the file of a node's index of a ragged variable: the name of
// its shards' segments, with its own nonce, and "index" in place of the
// rank.
func IndexPath(namespace, node, variable, nonce string) string {
	p := SegmentPath(namespace, node, variable, 0, nonce)
	return strings.TrimSuffix(p, "r0") + indexSuffix
}

// SegmentPrefix is the common start of every segment of a namespace on a
// node, for listing and cleanup.
func SegmentPrefix(namespace, node string) string {
	return fmt.Sprintf("%s/ddstore.%s.%s.", Dir, Escape(namespace), Escape(node))
}

// Unescape reverses Escape; it fails on a name Escape cannot have made.
func Unescape(s string) (string, error) {
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case c == '%' && i+2 < len(s):
			v, err := strconv.ParseUint(s[i+1:i+3], 16, 8)
			if err != nil || Escape(string([]byte{byte(v)})) != s[i:i+3] {
				return "", base.Errorf(base.ErrArgument, "%q: bad escape %q", s, s[i:i+3])
			}
			b.WriteByte(byte(v))
			i += 2
		case c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-' || c == '_':
			b.WriteByte(c)
		default:
			return "", base.Errorf(base.ErrArgument, "%q: byte %q is not escaped", s, c)
		}
	}
	return b.String(), nil
}

// ParseSegmentName reads back the namespace and node from the file name (no
// directory) of a segment made by SegmentPath, with a nonce or without.
// ok is false for a name that is not a segment's. hashed is true (and ok
// too) for a segment whose whole name was hashed (ddstore.h<hex>.r<rank>):
// its namespace and node cannot be known.
func ParseSegmentName(name string) (namespace, node string, hashed, ok bool) {
	parts := strings.Split(name, ".")
	if len(parts) < 3 || parts[0] != "ddstore" || !isRank(parts[len(parts)-1]) {
		return "", "", false, false
	}
	if n := len(parts); (n == 4 || n == 6) && isNonce(parts[n-2]) {
		parts = append(parts[:n-2], parts[n-1]) // the nonce (SegmentPath)
	}
	switch len(parts) {
	case 3:
		h := parts[1]
		if len(h) == 41 && h[0] == 'h' && isHex(h[1:]) {
			return "", "", true, true
		}
	case 5:
		if parts[3] == "" {
			return "", "", false, false
		}
		ns, err1 := Unescape(parts[1])
		nd, err2 := Unescape(parts[2])
		if err1 == nil && err2 == nil && ns != "" && nd != "" {
			return ns, nd, false, true
		}
	}
	return "", "", false, false
}

func isRank(s string) bool {
	if s == indexSuffix {
		return true // a node's index of a ragged variable (IndexPath)
	}
	if len(s) < 2 || s[0] != 'r' {
		return false
	}
	_, err := strconv.ParseUint(s[1:], 10, 63)
	return err == nil
}

func isHex(s string) bool {
	_, err := hex.DecodeString(s)
	return err == nil && strings.ToLower(s) == s
}

// Segment is one mapped shard: a header page, then Rows rows (or, for a
// ragged shard, its offsets and values; for an index, its offsets).
type Segment struct {
	Path   string
	Header Header
	mem    []byte
	// Data is the rows, Header.Rows * rowBytes bytes; of a ragged shard,
	// its values, Items * Disp * ItemSize bytes; of an index, its offsets.
	Data []byte
	// Offsets are a ragged shard's Rows+1 local offsets, an index's Rows+1
	// job-wide ones; nil for fixed rows.
	Offsets []int64
}

// offsetsBytes is the size of a ragged shard's offsets, padded to a page
// so that its values start page-aligned.
func offsetsBytes(rows int64) int64 {
	return ((rows+1)*8 + HeaderBytes - 1) / HeaderBytes * HeaderBytes
}

// DataBytes is what a segment of header h holds past its header: the
// memory it takes.
func DataBytes(h Header) int64 {
	switch h.Kind {
	case KindRagged:
		return offsetsBytes(h.Rows) + h.Items*h.Disp*h.ItemSize
	case KindIndex:
		return (h.Rows + 1) * 8
	}
	return h.Rows * h.Disp * h.ItemSize
}

func dataBytes(h Header) int64 { return DataBytes(h) }

// checkHeader rejects a shape whose size is negative or overflows.
func checkHeader(h Header) error {
	if h.Rows < 0 || h.Disp < 1 || h.ItemSize < 1 || h.ItemSize > 64 || h.Disp > (1<<46)/h.ItemSize {
		return base.Errorf(base.ErrGeometry, "segment of %d rows of disp %d, itemsize %d", h.Rows, h.Disp, h.ItemSize)
	}
	switch h.Kind {
	case KindRows:
		if h.Rows > 0 && h.Disp*h.ItemSize > (1<<46)/h.Rows {
			return base.Errorf(base.ErrGeometry, "segment of %d rows of disp %d, itemsize %d", h.Rows, h.Disp, h.ItemSize)
		}
	case KindRagged, KindIndex:
		if h.Rows > 1<<42 || h.Items < 0 || (h.Items > 0 && h.Disp*h.ItemSize > (1<<46)/h.Items) {
			return base.Errorf(base.ErrGeometry, "%s segment of %d rows, %d units of disp %d, itemsize %d", h.Kind, h.Rows, h.Items, h.Disp, h.ItemSize)
		}
	default:
		return base.Errorf(base.ErrGeometry, "segment of kind %d", h.Kind)
	}
	return nil
}

func (k Kind) String() string {
	switch k {
	case KindRows:
		return "fixed"
	case KindRagged:
		return "ragged"
	case KindIndex:
		return "index"
	}
	return "kind" + strconv.Itoa(int(k))
}

// slices sets Data and Offsets from the mapping.
func (s *Segment) slices() {
	h := s.Header
	d := s.mem[HeaderBytes:]
	switch h.Kind {
	case KindRagged:
		s.Offsets = int64s(d[:(h.Rows+1)*8])
		d = d[offsetsBytes(h.Rows):]
		s.Data = d[:h.Items*h.Disp*h.ItemSize]
	case KindIndex:
		s.Offsets = int64s(d[:(h.Rows+1)*8])
		s.Data = d[:(h.Rows+1)*8]
	default:
		s.Data = d[:DataBytes(h)]
	}
}

// int64s views b, page-aligned mapped memory, as int64s of the host's byte
// order (little-endian on every platform ddstore builds for).
func int64s(b []byte) []int64 {
	if len(b) == 0 {
		return nil
	}
	return unsafe.Slice((*int64)(unsafe.Pointer(unsafe.SliceData(b))), len(b)/8)
}

// dropped is the segment's dropped word (droppedAt), 4-aligned in a
// page-aligned mapping: loaded and stored only atomically, being shared
// with other processes.
func (s *Segment) dropped() *uint32 {
	return (*uint32)(unsafe.Pointer(&s.mem[droppedAt]))
}

// MarkDropped tells every process mapping the segment that its variable is
// gone; the agent calls it on its writable mapping before it unmaps and
// unlinks the file (the store is sequentially consistent, so a client
// that loads the word after the drop began sees it set).
func (s *Segment) MarkDropped() {
	if s.mem != nil {
		atomic.StoreUint32(s.dropped(), 1)
	}
}

// Dropped reports whether the agent has dropped the segment: rows read out
// of it before a true answer may be a freed variable's.
func (s *Segment) Dropped() bool {
	return s.mem != nil && atomic.LoadUint32(s.dropped()) != 0
}

// Bytes is the memory the segment takes past its header.
func (s *Segment) Bytes() int64 { return DataBytes(s.Header) }

// CheckOffsets checks a ragged shard's or an index's offsets: from first,
// never decreasing, up to Items (what a client wrote into its shard before
// publishing it, checked before anyone reads by them). It names the first
// offset that is wrong.
func (s *Segment) CheckOffsets(first int64) error {
	off, h := s.Offsets, s.Header
	if int64(len(off)) != h.Rows+1 {
		return base.Errorf(base.ErrGeometry, "segment %s has %d offsets for %d rows", s.Path, len(off), h.Rows)
	}
	if off[0] != first {
		return base.Errorf(base.ErrGeometry, "offsets[0] = %d: want %d", off[0], first)
	}
	for i := 1; i < len(off); i++ {
		if off[i] < off[i-1] {
			return base.Errorf(base.ErrGeometry, "offsets[%d] = %d after offsets[%d] = %d: a row of negative length", i, off[i], i-1, off[i-1])
		}
	}
	if last := off[len(off)-1]; last != first+h.Items {
		return base.Errorf(base.ErrGeometry, "offsets[%d] = %d: want %d, the %d units the values hold", h.Rows, last, first+h.Items, h.Items)
	}
	return nil
}

// Create makes a new, zero-filled segment, its pages reserved (Reserve), so
// that nothing mapping it faults for want of room. It fails with ErrExists
// if the file is there, and with ErrArgument naming the bytes wanted and
// free when the filesystem has no room for it; either way no file is left.
func Create(path string, h Header) (*Segment, error) {
	if err := checkHeader(h); err != nil {
		return nil, err
	}
	fd, err := unix.Open(path, unix.O_RDWR|unix.O_CREAT|unix.O_EXCL|unix.O_CLOEXEC, 0o600)
	if err == unix.EEXIST {
		// Never adopted, whoever made it; say so when it is another
		// user's (in /dev/shm anyone can make a file of that name).
		var st unix.Stat_t
		if unix.Lstat(path, &st) == nil && int(st.Uid) != os.Geteuid() {
			return nil, base.Errorf(base.ErrExists, "segment %s already exists and belongs to uid %d, not %d: another user's file, which ddstore does not adopt (remove it, or use another namespace)",
				path, st.Uid, os.Geteuid())
		}
		return nil, base.Errorf(base.ErrExists, "segment %s already exists", path)
	}
	if err != nil {
		return nil, fmt.Errorf("ddstore: create segment %s: %w", path, err)
	}
	defer unix.Close(fd)
	size := HeaderBytes + dataBytes(h)
	if err := unix.Ftruncate(fd, size); err != nil {
		unix.Unlink(path)
		return nil, fmt.Errorf("ddstore: size segment %s to %d bytes: %w", path, size, err)
	}
	if err := Reserve(fd, size); err != nil {
		unix.Unlink(path)
		return nil, fmt.Errorf("segment %s: %w", path, err)
	}
	mem, err := unix.Mmap(fd, 0, int(size), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		unix.Unlink(path)
		return nil, fmt.Errorf("ddstore: map segment %s: %w", path, err)
	}
	h.encode(mem[:HeaderBytes])
	seg := &Segment{Path: path, Header: h, mem: mem}
	seg.slices()
	return seg, nil
}

// Reserve allocates the first size bytes of the file behind fd: on tmpfs
// (/dev/shm) a file's pages are otherwise taken only when first written,
// and a write through a mapping that finds the filesystem full is a SIGBUS
// that kills the writer, whether the agent writing a header or a client
// copying its rows in. With the pages reserved, writes into the file
// cannot fault for want of room; without room, Reserve fails with
// ErrArgument naming the bytes wanted and those free. A filesystem without
// fallocate (not tmpfs, which has it since Linux 3.5) gets a check of its
// free space instead, which another writer may overtake.
func Reserve(fd int, size int64) error {
	var err error
	for {
		if err = unix.Fallocate(fd, 0, 0, size); err != unix.EINTR {
			break
		}
	}
	switch err {
	case nil:
		return nil
	case unix.EOPNOTSUPP, unix.ENOSYS:
		if free, total, ok := freeBytes(fd); ok && size > free {
			return noRoom(size, free, total, err)
		}
		return nil
	case unix.ENOSPC, unix.ENOMEM, unix.EFBIG:
		free, total, _ := freeBytes(fd)
		return noRoom(size, free, total, err)
	}
	return fmt.Errorf("ddstore: reserve %d bytes of shared memory: %w", size, err)
}

// freeBytes is what the filesystem of fd has free for this user, and its
// size.
func freeBytes(fd int) (free, total int64, ok bool) {
	var st unix.Statfs_t
	if unix.Fstatfs(fd, &st) != nil {
		return 0, 0, false
	}
	return int64(st.Bavail) * st.Bsize, int64(st.Blocks) * st.Bsize, true
}

func noRoom(want, free, total int64, err error) error {
	mib := func(n int64) float64 { return float64(n) / (1 << 20) }
	return base.Errorf(base.ErrArgument, "%d bytes (%.1f MiB) wanted in %s, which has %d bytes (%.1f MiB) free of %.1f MiB (%v): no room for the segment; free shared memory there, or enlarge it",
		want, mib(want), Dir, free, mib(free), mib(total), err)
}

// Open maps an existing segment, read-only unless writable, after checking
// that it is a regular file (not a link) of this user that no other user
// may read or write, and that its header is sound: a segment of another
// user is never adopted.
func Open(path string, writable bool) (*Segment, error) {
	flags, prot := unix.O_RDONLY, unix.PROT_READ
	if writable {
		flags, prot = unix.O_RDWR, unix.PROT_READ|unix.PROT_WRITE
	}
	fd, err := unix.Open(path, flags|unix.O_NOFOLLOW|unix.O_NONBLOCK|unix.O_CLOEXEC, 0)
	if err != nil {
		if err == unix.ENOENT {
			return nil, fmt.Errorf("%w: segment %s: %w", base.ErrUnknown, path, os.ErrNotExist)
		}
		return nil, fmt.Errorf("ddstore: open segment %s: %w", path, err)
	}
	defer unix.Close(fd)
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return nil, fmt.Errorf("ddstore: stat segment %s: %w", path, err)
	}
	if int(st.Uid) != os.Geteuid() {
		return nil, base.Errorf(base.ErrArgument, "segment %s belongs to uid %d, not %d: another user's file, which ddstore does not adopt", path, st.Uid, os.Geteuid())
	}
	if st.Mode&unix.S_IFMT != unix.S_IFREG {
		return nil, base.Errorf(base.ErrArgument, "segment %s is not a regular file", path)
	}
	if st.Mode&0o077 != 0 {
		return nil, base.Errorf(base.ErrArgument, "segment %s has mode %o: want 0600 (other users may have read or written it)", path, st.Mode&0o777)
	}
	if st.Size < HeaderBytes {
		return nil, base.Errorf(base.ErrProtocol, "segment %s has %d bytes, less than its header", path, st.Size)
	}
	mem, err := unix.Mmap(fd, 0, int(st.Size), prot, unix.MAP_SHARED)
	if err != nil {
		return nil, fmt.Errorf("ddstore: map segment %s: %w", path, err)
	}
	h, err := decodeHeader(mem)
	if err == nil && checkHeader(h) != nil {
		err = base.Errorf(base.ErrProtocol, "segment %s: header of %d rows of disp %d, itemsize %d", path, h.Rows, h.Disp, h.ItemSize)
	}
	if err == nil && HeaderBytes+dataBytes(h) != st.Size {
		err = base.Errorf(base.ErrProtocol, "segment %s: header says %d rows of %d bytes (%s, %d units), file has %d bytes", path, h.Rows, h.Disp*h.ItemSize, h.Kind, h.Items, st.Size-HeaderBytes)
	}
	if err != nil {
		unix.Munmap(mem)
		return nil, fmt.Errorf("%w (%s)", err, path)
	}
	seg := &Segment{Path: path, Header: h, mem: mem}
	seg.slices()
	return seg, nil
}

// Close unmaps the segment; the file stays.
func (s *Segment) Close() error {
	if s.mem == nil {
		return nil
	}
	err := unix.Munmap(s.mem)
	s.mem, s.Data, s.Offsets = nil, nil, nil
	return err
}

// Remove unlinks the file; processes that have it mapped keep their mapping.
func Remove(path string) error {
	err := unix.Unlink(path)
	if err == unix.ENOENT {
		return nil
	}
	return err
}

// Discard removes a segment some earlier agent left, marking it dropped
// first when it opens as one, for a client that may still map it.
func Discard(path string) error {
	if seg, err := Open(path, true); err == nil {
		seg.MarkDropped()
		seg.Close()
	}
	return Remove(path)
}

// Region is an anonymous shared-memory region (memfd) that can be mapped by
// another process through its descriptor.
type Region struct {
	Fd  int
	Mem []byte
}

// NewRegion makes a region of size bytes, mapped here.
func NewRegion(name string, size int) (*Region, error) {
	if size <= 0 {
		return nil, base.Errorf(base.ErrArgument, "region size %d: want > 0", size)
	}
	fd, err := unix.MemfdCreate(name, unix.MFD_CLOEXEC|unix.MFD_ALLOW_SEALING)
	if err != nil {
		return nil, fmt.Errorf("ddstore: memfd_create: %w", err)
	}
	if err := unix.Ftruncate(fd, int64(size)); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("ddstore: size region to %d bytes: %w", size, err)
	}
	// Sealed at this size: the agent maps it and writes into it, which a
	// later shrink would turn into a fault in the agent (CheckSealed).
	if _, err := unix.FcntlInt(uintptr(fd), unix.F_ADD_SEALS, unix.F_SEAL_SHRINK|unix.F_SEAL_GROW); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("ddstore: seal region: %w", err)
	}
	mem, err := MapFd(fd, size)
	if err != nil {
		unix.Close(fd)
		return nil, err
	}
	return &Region{Fd: fd, Mem: mem}, nil
}

// CheckSealed refuses a descriptor whose size can still change: mapped by
// the agent, a shrunk file would fault the agent on its next write.
func CheckSealed(fd int) error {
	seals, err := unix.FcntlInt(uintptr(fd), unix.F_GET_SEALS, 0)
	if err != nil || seals&unix.F_SEAL_SHRINK == 0 {
		return base.Errorf(base.ErrArgument, "receive region not sealed against shrinking (memfd_create with MFD_ALLOW_SEALING, then F_ADD_SEALS F_SEAL_SHRINK)")
	}
	return nil
}

// MapFd maps size bytes of a shared-memory descriptor read-write.
func MapFd(fd, size int) ([]byte, error) {
	mem, err := unix.Mmap(fd, 0, size, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		return nil, fmt.Errorf("ddstore: map region of %d bytes: %w", size, err)
	}
	return mem, nil
}

// FdSize is the size of the file behind fd.
func FdSize(fd int) (int64, error) {
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return 0, err
	}
	return st.Size, nil
}

// Unmap releases a mapping made by MapFd.
func Unmap(mem []byte) error { return unix.Munmap(mem) }

// Close unmaps the region and closes its descriptor.
func (r *Region) Close() error {
	err := unix.Munmap(r.Mem)
	if cerr := unix.Close(r.Fd); err == nil {
		err = cerr
	}
	r.Mem = nil
	return err
}

package transport

import (
	"io"
	"syscall"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/ddstore-go/ddstore/internal/wire"
)

// maxIov is the kernel's IOV_MAX.
const maxIov = 1024

// readvFull fills every buffer of iovs from a connection with scatter reads,
// so rows land in their destinations without a staging copy. It consumes
// iovs (the slice, not the buffers it points to).
func readvFull(rc syscall.RawConn, iovs [][]byte) error {
	return newVecReader(rc).full(iovs)
}

// vecReader makes scatter reads from one connection with nothing
// allocated per read: its iovec array is kept, and its callback for
// RawConn.Read bound once (x/sys's Readv makes an iovec array per call,
// one more allocation per owner of a batch, growing with the rows).
type vecReader struct {
	raw  syscall.RawConn
	iov  []unix.Iovec
	rest [][]byte // what full has left to fill
	n    int
	err  error
	fn   func(uintptr) bool
}

func newVecReader(rc syscall.RawConn) *vecReader {
	v := &vecReader{raw: rc}
	v.fn = v.step
	return v
}

// readv is one readv(2) into the first maxIov buffers of bufs (empty ones
// skipped), retried on EINTR.
func (v *vecReader) readv(fd uintptr, bufs [][]byte) (int, error) {
	v.iov = v.iov[:0]
	for _, b := range bufs {
		if len(v.iov) == maxIov {
			break
		}
		if len(b) > 0 {
			var e unix.Iovec
			e.Base = &b[0]
			e.SetLen(len(b))
			v.iov = append(v.iov, e)
		}
	}
	if len(v.iov) == 0 {
		return 0, nil
	}
	for {
		n, _, e := unix.Syscall(unix.SYS_READV, fd, uintptr(unsafe.Pointer(&v.iov[0])), uintptr(len(v.iov)))
		if e == unix.EINTR {
			continue
		}
		clear(v.iov) // keep no destination alive
		if e != 0 {
			return 0, e
		}
		return int(n), nil
	}
}

// full fills every buffer of iovs; it consumes iovs (the slice, not the
// buffers).
func (v *vecReader) full(iovs [][]byte) error {
	for len(iovs) > 0 && len(iovs[0]) == 0 {
		iovs = iovs[1:]
	}
	for len(iovs) > 0 {
		v.rest, v.n, v.err = iovs, 0, nil
		rerr := v.raw.Read(v.fn)
		v.rest = nil
		if rerr != nil {
			return rerr
		}
		if v.err != nil {
			return v.err
		}
		if v.n == 0 {
			return io.ErrUnexpectedEOF
		}
		iovs = Advance(iovs, v.n)
	}
	return nil
}

func (v *vecReader) step(fd uintptr) bool {
	v.n, v.err = v.readv(fd, v.rest)
	return v.err != unix.EAGAIN
}

// Advance drops the first n bytes of iovs, as a readv or writev of n bytes
// consumed them, and returns what is left (no empty vector at its head).
func Advance(iovs [][]byte, n int) [][]byte {
	for n > 0 {
		if n >= len(iovs[0]) {
			n -= len(iovs[0])
			iovs = iovs[1:]
		} else {
			iovs[0] = iovs[0][n:]
			n = 0
		}
	}
	for len(iovs) > 0 && len(iovs[0]) == 0 {
		iovs = iovs[1:]
	}
	return iovs
}

// replyReader reads the replies of one connection of a pool: its read
// loop's only, so nothing of it is locked. It reads through carry first:
// bytes read ahead of the frame they belong to (readAhead read more than
// a reply that was not the one it readied for), then the socket.
type replyReader struct {
	vecReader
	c     *conn
	hdr   [wire.HeaderSize]byte
	carry []byte   // unread bytes, read before the socket's
	store []byte   // carry's backing array, kept
	vec   [][]byte // iovs' backing array, kept
	iovs  [][]byte // readAhead's buffers still to fill

	// One readAhead: the reply id it reads, the call readied for it (nil:
	// none waiting, the header alone is read), the bytes read so far, the
	// error; step is bound once, so that a read allocates nothing.
	expect uint64
	cl     *call
	n      int
	err    error
	stepFn func(uintptr) bool
}

func newReplyReader(c *conn) *replyReader {
	r := &replyReader{c: c}
	r.raw = c.raw
	r.vecReader.fn = r.vecReader.step
	r.stepFn = r.ahead
	return r
}

// readAhead reads the header of the next reply, whose id is expect on a
// connection whose replies come in request order. When the call it
// answers is waiting, the reply's header and rows are read with the same
// readv, the rows straight into the call's destinations (the call is then
// the read loop's: readAhead returns it, with got row bytes already in
// its dst), saving a system call per reply; else the header alone is read
// and the call found by id, as on any connection. A reply that turns out
// not to be the one readied for (another id, an error status, a body, a
// payload of another size) has the bytes read past its header put back
// in front of the stream (carry), so that it is taken apart as any other.
func (r *replyReader) readAhead(expect uint64) (cl *call, got int, err error) {
	r.expect, r.cl, r.n, r.err = expect, nil, 0, nil
	rerr := r.c.raw.Read(r.stepFn)
	clear(r.vec) // keep no destination alive
	r.iovs = nil
	cl, r.cl = r.cl, nil
	if rerr == nil {
		rerr = r.err
	}
	if rerr != nil && cl != nil && r.n == 0 {
		// Nothing of its reply read: it fails with the connection's other
		// calls, the same way.
		r.c.unclaim(cl)
		cl = nil
	}
	if cl != nil {
		got = max(r.n-wire.HeaderSize, 0)
	}
	return cl, got, rerr
}

// ahead is readAhead's read: it returns false to wait for the socket.
func (r *replyReader) ahead(fd uintptr) bool {
	for r.n < wire.HeaderSize {
		if r.n == 0 && r.cl == nil {
			// Nothing of this reply read yet: ready the call it answers,
			// if that one is waiting (not yet sent, or given up on: nil).
			r.cl = r.c.claim(r.expect)
			if r.cl != nil {
				r.vec = append(append(r.vec[:0], r.hdr[:]), r.cl.dst...)
				r.iovs = r.vec
			}
		}
		var n int
		var err error
		if r.cl == nil {
			n, err = unix.Read(int(fd), r.hdr[r.n:])
		} else {
			n, err = r.readv(fd, r.iovs)
		}
		if err == unix.EINTR {
			continue
		}
		if err == unix.EAGAIN {
			if r.n == 0 && r.cl != nil {
				// Not here yet: the call goes back to waiting, so that it
				// can still give up without costing the connection.
				r.c.unclaim(r.cl)
				r.cl = nil
			}
			return false
		}
		if err != nil {
			r.err = err
			return true
		}
		if n == 0 {
			r.err = io.ErrUnexpectedEOF
			if r.n == 0 {
				r.err = io.EOF
			}
			return true
		}
		r.n += n
		if r.cl != nil {
			r.iovs = Advance(r.iovs, n)
		}
	}
	return true
}

// unread puts the first n bytes of dst (in order, across its buffers) in
// front of the stream: bytes read ahead into a call's rows that were not
// its rows. (Only readAhead reads ahead, and only with carry empty.)
func (r *replyReader) unread(dst [][]byte, n int) {
	b := r.store[:0]
	for _, d := range dst {
		if n == 0 {
			break
		}
		k := min(n, len(d))
		b = append(b, d[:k]...)
		n -= k
	}
	r.store = b
	r.carry = b
}

// Read implements io.Reader: carry first, then the socket.
func (r *replyReader) Read(p []byte) (int, error) {
	if len(r.carry) > 0 {
		n := copy(p, r.carry)
		r.carry = r.carry[n:]
		return n, nil
	}
	return r.c.nc.Read(p)
}

// rows fills every buffer of iovs, carry first, then with scatter reads
// from the socket; it consumes iovs (the slice, not the buffers).
func (r *replyReader) rows(iovs [][]byte) error {
	for len(iovs) > 0 && len(r.carry) > 0 {
		n := copy(iovs[0], r.carry)
		r.carry = r.carry[n:]
		iovs = Advance(iovs, n)
	}
	return r.full(iovs)
}

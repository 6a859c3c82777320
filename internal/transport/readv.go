package transport

import (
	"io"
	"syscall"

	"golang.org/x/sys/unix"
)

// maxIov is the kernel's IOV_MAX.
const maxIov = 1024

// readvFull fills every buffer of iovs from a connection with scatter reads,
// so rows land in their destinations without a staging copy. It consumes
// iovs (the slice, not the buffers it points to).
func readvFull(rc syscall.RawConn, iovs [][]byte) error {
	for len(iovs) > 0 && len(iovs[0]) == 0 {
		iovs = iovs[1:]
	}
	for len(iovs) > 0 {
		var n int
		var err error
		rerr := rc.Read(func(fd uintptr) bool {
			batch := iovs
			if len(batch) > maxIov {
				batch = batch[:maxIov]
			}
			n, err = unix.Readv(int(fd), batch)
			return err != unix.EAGAIN
		})
		if rerr != nil {
			return rerr
		}
		if err != nil {
			return err
		}
		if n == 0 {
			return io.ErrUnexpectedEOF
		}
		iovs = Advance(iovs, n)
	}
	return nil
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

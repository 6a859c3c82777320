//go:build hdf5 && cgo

package source

import (
	"fmt"
	"os"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

func TestZZExp2(t *testing.T) {
	src, err := Open("/tmp/zzbench.h5:contig", Options{})
	if err != nil {
		t.Fatal(err)
	}
	h := src.(*h5Source)
	n := src.Rows() * RowBytes(src)
	in, _ := os.Open("/tmp/zzbench.h5")
	for rep := 0; rep < 3; rep++ {
		for _, w := range []int{1, 2, 4} {
			// copy_file_range into a fresh shm file
			p := fmt.Sprintf("/dev/shm/zz-%d", time.Now().UnixNano())
			fd, _ := unix.Open(p, unix.O_RDWR|unix.O_CREAT, 0o600)
			unix.Ftruncate(fd, n)
			t0 := time.Now()
			var wg sync.WaitGroup
			for i := range w {
				wg.Go(func() {
					lo, hi := int64(i)*n/int64(w), int64(i+1)*n/int64(w)
					for lo < hi {
						roff, woff := h.off+lo, lo
						c, err := unix.CopyFileRange(int(in.Fd()), &roff, fd, &woff, int(min(hi-lo, 64<<20)), 0)
						if err != nil || c == 0 {
							t.Error(err)
							return
						}
						lo += int64(c)
					}
				})
			}
			wg.Wait()
			r1 := float64(n) / time.Since(t0).Seconds() / 1e9
			unix.Close(fd)
			unix.Unlink(p)
			// pread into a small buffer + pwrite into shm
			fd, _ = unix.Open(p, unix.O_RDWR|unix.O_CREAT, 0o600)
			unix.Ftruncate(fd, n)
			t0 = time.Now()
			for i := range w {
				wg.Go(func() {
					buf := make([]byte, 1<<20)
					lo, hi := int64(i)*n/int64(w), int64(i+1)*n/int64(w)
					for lo < hi {
						b := buf[:min(int64(len(buf)), hi-lo)]
						in.ReadAt(b, h.off+lo)
						unix.Pwrite(fd, b, lo)
						lo += int64(len(b))
					}
				})
			}
			wg.Wait()
			r2 := float64(n) / time.Since(t0).Seconds() / 1e9
			unix.Close(fd)
			unix.Unlink(p)
			t.Logf("workers %d: copy_file_range %.2f GB/s, pread+pwrite %.2f GB/s", w, r1, r2)
		}
	}
}

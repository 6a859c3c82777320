//go:build hdf5 && cgo

package source

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

func TestZZExp(t *testing.T) {
	file := "/tmp/zzbench.h5"
	if _, err := os.Stat(file); err != nil {
		out, err := exec.Command(python, "-c", `
import numpy as np, h5py
rng = np.random.default_rng(0)
with h5py.File('/tmp/zzbench.h5', 'w') as f:
    f.create_dataset('plain', data=rng.standard_normal((65536, 1024), dtype=np.float32), chunks=(256, 1024))
    f.create_dataset('contig', data=rng.standard_normal((65536, 1024), dtype=np.float32))
`).CombinedOutput()
		if err != nil {
			t.Fatal(err, string(out))
		}
	}
	for _, ds := range []string{"plain", "contig"} {
		src, err := Open(file+":"+ds, Options{})
		if err != nil {
			t.Fatal(err)
		}
		n := src.Rows() * RowBytes(src)
		reused := make([]byte, n)
		Read(context.Background(), src, 0, src.Rows(), reused, ReadOptions{})
		fresh := func(populate, falloc bool) []byte {
			p := fmt.Sprintf("/dev/shm/zz-%d", time.Now().UnixNano())
			fd, _ := unix.Open(p, unix.O_RDWR|unix.O_CREAT, 0o600)
			unix.Ftruncate(fd, n)
			if falloc {
				unix.Fallocate(fd, 0, 0, n)
			}
			mem, err := unix.Mmap(fd, 0, int(n), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
			if err != nil {
				t.Fatal(err)
			}
			unix.Close(fd)
			unix.Unlink(p)
			if populate {
				var wg sync.WaitGroup
				k := 2
				for i := range k {
					wg.Go(func() {
						part := mem[int64(i)*n/int64(k) : int64(i+1)*n/int64(k)]
						unix.Madvise(part, 23) // MADV_POPULATE_WRITE
					})
				}
				wg.Wait()
			}
			return mem
		}
		for _, w := range []int{1, 2, 4, 8} {
			for _, pb := range []int64{4 << 20, 16 << 20, 64 << 20} {
				o := ReadOptions{Workers: w, PieceBytes: pb}
				t0 := time.Now()
				Read(context.Background(), src, 0, src.Rows(), reused, o)
				r1 := float64(n) / time.Since(t0).Seconds() / 1e9
				m := fresh(false, false)
				t0 = time.Now()
				Read(context.Background(), src, 0, src.Rows(), m, o)
				r2 := float64(n) / time.Since(t0).Seconds() / 1e9
				unix.Munmap(m)
				t0 = time.Now()
				m = fresh(true, false)
				Read(context.Background(), src, 0, src.Rows(), m, o)
				r3 := float64(n) / time.Since(t0).Seconds() / 1e9
				unix.Munmap(m)
				t0 = time.Now()
				m = fresh(false, true)
				Read(context.Background(), src, 0, src.Rows(), m, o)
				r4 := float64(n) / time.Since(t0).Seconds() / 1e9
				unix.Munmap(m)
				t.Logf("%s workers %d piece %dM: reused %.2f fresh %.2f populate+read %.2f fallocate+read %.2f GB/s", ds, w, pb>>20, r1, r2, r3, r4)
			}
		}
		src.Close()
	}
}

package shm

import (
	"fmt"
	"os"
	"testing"

	"golang.org/x/sys/unix"
)

// BenchmarkCreate: what reserving a segment's pages (Create's fallocate)
// costs against sizing it only (ftruncate, pages taken on first write, as
// segments were made before), for a 64 MiB shard on /dev/shm, created
// alone (Init) and then filled (Add).
func BenchmarkCreate(b *testing.B) {
	if st, err := os.Stat("/dev/shm"); err != nil || !st.IsDir() {
		b.Skip("no /dev/shm")
	}
	const rows, disp = 1 << 16, 1024 // 64 MiB
	h := Header{Rows: rows, Disp: disp, ItemSize: 1}
	path := fmt.Sprintf("/dev/shm/ddstore-bench.%d", os.Getpid())
	sparse := func(b *testing.B) []byte {
		fd, err := unix.Open(path, unix.O_RDWR|unix.O_CREAT|unix.O_EXCL|unix.O_CLOEXEC, 0o600)
		if err != nil {
			b.Fatal(err)
		}
		defer unix.Close(fd)
		size := HeaderBytes + DataBytes(h)
		if err := unix.Ftruncate(fd, size); err != nil {
			b.Fatal(err)
		}
		mem, err := unix.Mmap(fd, 0, int(size), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
		if err != nil {
			b.Fatal(err)
		}
		h.encode(mem[:HeaderBytes])
		return mem
	}
	for _, fill := range []bool{false, true} {
		for _, reserve := range []bool{true, false} {
			name := map[bool]string{true: "reserved", false: "sparse"}[reserve] + map[bool]string{false: "/create", true: "/create+fill"}[fill]
			b.Run(name, func(b *testing.B) {
				b.SetBytes(rows * disp)
				for b.Loop() {
					var data, mem []byte
					var seg *Segment
					if reserve {
						var err error
						if seg, err = Create(path, h); err != nil {
							b.Fatal(err)
						}
						data = seg.Data
					} else {
						mem = sparse(b)
						data = mem[HeaderBytes:]
					}
					if fill {
						for i := 0; i < len(data); i += 4096 {
							data[i] = 1
						}
					}
					if seg != nil {
						seg.Close()
					} else {
						unix.Munmap(mem)
					}
					os.Remove(path)
				}
			})
		}
	}
}

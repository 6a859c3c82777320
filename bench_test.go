package ddstore_test

import (
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/ddstore-go/ddstore"
)

// benchJob is a 2-node job with one rank per node and a variable of 64 MiB
// per rank; rank 0 reads.
func benchJob(b *testing.B, rowBytes int) (*cluster, int64) {
	c := startCluster(b, []int{1, 1}, viaRendezvous)
	n := int64(64<<20) / int64(rowBytes)
	rows := make([]byte, n*int64(rowBytes))
	for i := range rows {
		rows[i] = byte(i)
	}
	c.mustEach(b, func(r int, s *ddstore.Store) error {
		return s.Add("v", rows, int64(rowBytes), 1)
	})
	return c, n
}

func benchGetBatch(b *testing.B, rowBytes int, remote, recv bool) {
	c, n := benchJob(b, rowBytes)
	s := c.stores[0]
	const batch = 256
	dst := make([]byte, batch*rowBytes)
	if recv {
		var err error
		if dst, err = s.AllocRecv(batch * rowBytes); err != nil {
			b.Fatal(err)
		}
	}
	lo := int64(0)
	if remote {
		lo = n
	}
	rng := rand.New(rand.NewPCG(1, 2))
	idx := make([][]int64, 64)
	for i := range idx {
		idx[i] = make([]int64, batch)
		for k := range idx[i] {
			idx[i][k] = lo + rng.Int64N(n)
		}
	}
	b.SetBytes(int64(batch * rowBytes))
	b.ResetTimer()
	for i := 0; b.Loop(); i++ {
		if err := s.GetBatch("v", dst, idx[i%len(idx)]); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkGetBatch(b *testing.B) {
	for _, rb := range []int{64, 4 << 10, 64 << 10} {
		b.Run(fmt.Sprintf("local/%d", rb), func(b *testing.B) { benchGetBatch(b, rb, false, false) })
		b.Run(fmt.Sprintf("remote/%d", rb), func(b *testing.B) { benchGetBatch(b, rb, true, true) })
		b.Run(fmt.Sprintf("remote-copy/%d", rb), func(b *testing.B) { benchGetBatch(b, rb, true, false) })
	}
}

func BenchmarkGet(b *testing.B) {
	for _, remote := range []bool{false, true} {
		b.Run(fmt.Sprintf("remote=%v", remote), func(b *testing.B) {
			c, n := benchJob(b, 64)
			s := c.stores[0]
			dst := make([]byte, 64)
			lo := int64(0)
			if remote {
				lo = n
			}
			for i := 0; b.Loop(); i++ {
				if err := s.Get("v", dst, lo+int64(i*7919)%n); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

package transport

import (
	"context"
	"fmt"
	"io"
	"net"
	"sync"
	"testing"
	"time"
)

// BenchmarkFanout: a batch of 256 rows of 4 KiB spread over n owners, one
// Fetch per owner, as an agent's read makes them: all at once (a goroutine
// each) or through w workers. ns/op is a batch; ns/owner the per-owner
// cost. Beside it, BenchmarkRoundTrip is the limit: a bare loopback TCP
// request and reply of the same size.
func BenchmarkFanout(b *testing.B) {
	for _, n := range []int{1, 8, 32, 111} {
		for _, w := range []int{0, 8} {
			b.Run(fmt.Sprintf("owners=%d/workers=%d", n, w), func(b *testing.B) { benchFanout(b, n, w) })
		}
	}
}

func benchFanout(b *testing.B, n, workers int) {
	const batch, rb = 256, 4 << 10
	h := newFakeHandler()
	h.addVar("v", 64, rb, false)
	var addrs []string
	for range n {
		ln := &countingListener{Listener: listenB(b)}
		s := NewServer(ln, h, discardLog(), 5*time.Second, nil)
		b.Cleanup(func() { s.Close() })
		addrs = append(addrs, s.Addr())
	}
	p := NewPool(Options{Timeout: 10 * time.Second})
	b.Cleanup(func() { p.Close() })
	// Owner i's rows of the batch and where they go.
	globals := make([][]int64, n)
	dst := make([][][]byte, n)
	buf := make([]byte, batch*rb)
	for r := range batch {
		o := r % n
		globals[o] = append(globals[o], int64(r%64))
		dst[o] = append(dst[o], buf[r*rb:(r+1)*rb])
	}
	ctx := context.Background()
	one := func(o int) {
		if err := p.Fetch(ctx, addrs[o], "v", 0, globals[o], dst[o]); err != nil {
			b.Error(err)
		}
	}
	for o := range n { // dial
		one(o)
	}
	b.ResetTimer()
	for range b.N {
		var wg sync.WaitGroup
		if workers == 0 {
			for o := 1; o < n; o++ {
				wg.Go(func() { one(o) })
			}
			one(0)
		} else {
			next := make(chan int, n)
			for o := range n {
				next <- o
			}
			close(next)
			for range min(workers, n) {
				wg.Go(func() {
					for o := range next {
						one(o)
					}
				})
			}
		}
		wg.Wait()
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/float64(n), "ns/owner")
	b.SetBytes(batch * rb)
}

// BenchmarkRoundTrip: a request of 64 bytes and a reply of size bytes over
// one loopback TCP connection, one at a time: the floor of a fetch.
func BenchmarkRoundTrip(b *testing.B) {
	for _, size := range []int{8 << 10, 32 << 10} {
		b.Run(fmt.Sprint(size), func(b *testing.B) {
			ln := listenB(b)
			defer ln.Close()
			done := make(chan struct{})
			go func() {
				defer close(done)
				c, err := ln.Accept()
				if err != nil {
					return
				}
				defer c.Close()
				req, rep := make([]byte, 64), make([]byte, size)
				for {
					if _, err := io.ReadFull(c, req); err != nil {
						return
					}
					if _, err := c.Write(rep); err != nil {
						return
					}
				}
			}()
			c, err := net.Dial("tcp", ln.Addr().String())
			if err != nil {
				b.Fatal(err)
			}
			req, rep := make([]byte, 64), make([]byte, size)
			b.ResetTimer()
			for range b.N {
				if _, err := c.Write(req); err != nil {
					b.Fatal(err)
				}
				if _, err := io.ReadFull(c, rep); err != nil {
					b.Fatal(err)
				}
			}
			b.StopTimer()
			c.Close()
			<-done
		})
	}
}

func listenB(b *testing.B) net.Listener {
	b.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	return ln
}

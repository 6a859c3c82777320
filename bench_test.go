package ddstore_test

import (
	"fmt"
	"math/rand/v2"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

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

// BenchmarkGetBatchInFlight: GetBatch of 256 rows of the other node with
// k batches in flight at once (k goroutines of one store, each into its
// own AllocRecv buffer, reading without pause), straight to the owner
// (direct) or through this node's agent (NoDirect, the path of batches
// spanning several owners), in-process agents. ns/op is per batch.
func BenchmarkGetBatchInFlight(b *testing.B) {
	for _, direct := range []bool{true, false} {
		for _, rb := range []int{64, 4 << 10, 64 << 10} {
			for _, k := range []int{1, 2} {
				b.Run(fmt.Sprintf("%s/%d/k=%d", map[bool]string{true: "direct", false: "agent"}[direct], rb, k), func(b *testing.B) {
					var opts []any
					if !direct {
						opts = append(opts, func(c *ddstore.Config) { c.NoDirect = true })
					}
					c := startCluster(b, []int{1, 1}, viaRendezvous, opts...)
					n := int64(32<<20) / int64(rb)
					rows := make([]byte, n*int64(rb))
					c.mustEach(b, func(r int, s *ddstore.Store) error { return s.Add("v", rows, int64(rb), 1) })
					s := c.stores[0]
					const batch = 256
					bufs := make([][]byte, k)
					for i := range bufs {
						var err error
						if bufs[i], err = s.AllocRecv(batch * rb); err != nil {
							b.Fatal(err)
						}
					}
					rng := rand.New(rand.NewPCG(1, 2))
					idx := make([][]int64, 64)
					for i := range idx {
						idx[i] = make([]int64, batch)
						for j := range idx[i] {
							idx[i][j] = n + rng.Int64N(n)
						}
					}
					b.SetBytes(int64(batch * rb))
					var left atomic.Int64
					left.Store(int64(b.N))
					b.ResetTimer()
					var wg sync.WaitGroup
					for g := range k {
						wg.Go(func() {
							for i := g; left.Add(-1) >= 0; i++ {
								if err := s.GetBatch("v", bufs[g], idx[i%len(idx)]); err != nil {
									b.Error(err)
									return
								}
							}
						})
					}
					wg.Wait()
				})
			}
		}
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

// raggedBench is a 2-node job (one rank per node) holding the same rows
// three ways: a ragged variable "r" (rows of 1 to 2×mean units of 12
// bytes, positions [n_i, 3] of float32), a fixed-row variable "f" of
// mean-unit rows (the same bytes per batch), and the ragged rows flattened
// into a uint8 variable "b" read a row at a time by byte range (the
// per-sample pattern DDStore's users write by hand).
type raggedBench struct {
	c              *cluster
	rows           int64 // rows per rank
	mean           int64 // units per row on average, and per fixed row
	first, lengths []int64
	values         []byte // rank 0's rows, packed, in this process's memory
	fixed          []byte // as many rows of the mean size, in this process's memory
}

func newRaggedBench(b *testing.B, mean int64) *raggedBench {
	const ub = 12
	rows := int64(32<<20) / (mean * ub)
	rb := &raggedBench{c: startCluster(b, []int{1, 1}, viaRendezvous), rows: rows, mean: mean}
	rng := rand.New(rand.NewPCG(5, 6))
	var values [2][]byte
	var lengths [2][]int64
	for r := range 2 {
		for range rows {
			n := 1 + rng.Int64N(2*mean-1)
			lengths[r] = append(lengths[r], n)
			rb.first = append(rb.first, int64(len(values[0])+len(values[1])))
			row := make([]byte, n*ub)
			for i := range row {
				row[i] = byte(i)
			}
			values[r] = append(values[r], row...)
		}
		rb.lengths = append(rb.lengths, lengths[r]...)
	}
	rb.values = values[0]
	fixed := make([]byte, rows*mean*ub)
	rb.fixed = fixed
	rb.c.mustEach(b, func(r int, s *ddstore.Store) error {
		if err := s.AddRagged("r", values[r], lengths[r], ddstore.Float32, 3); err != nil {
			return err
		}
		if err := s.Add("f", fixed, mean*ub, 1); err != nil {
			return err
		}
		return s.Add("b", values[r], 1, 1)
	})
	return rb
}

// batches are random batches of 64 rows of one node (or the other).
func (rb *raggedBench) batches(remote bool) [][]int64 {
	lo := int64(0)
	if remote {
		lo = rb.rows
	}
	rng := rand.New(rand.NewPCG(1, 2))
	out := make([][]int64, 64)
	for i := range out {
		out[i] = make([]int64, 64)
		for k := range out[i] {
			out[i][k] = lo + rng.Int64N(rb.rows)
		}
	}
	return out
}

// BenchmarkRagged: a batch of 64 ragged rows (GetRagged) against GetBatch
// of fixed rows of the same bytes, against a Get per row of the same bytes
// (per-sample), node-local and of the other node, into a receive buffer;
// node-local, against the limits (copy: the rows' bytes copied from this
// process's memory, their extents known; copy-fixed: the same for the
// fixed rows).
func BenchmarkRagged(b *testing.B) {
	for _, mean := range []int64{100, 1000} {
		for _, remote := range []bool{false, true} {
			where := "local"
			if remote {
				where = "remote"
			}
			b.Run(fmt.Sprintf("%s/%dB", where, mean*12), func(b *testing.B) {
				rb := newRaggedBench(b, mean)
				s := rb.c.stores[0]
				idx := rb.batches(remote)
				dst, err := s.AllocRecv(int(64 * 2 * mean * 12))
				if err != nil {
					b.Fatal(err)
				}
				b.Run("ragged", func(b *testing.B) {
					var bytes int64
					for i := 0; b.Loop(); i++ {
						n, err := s.GetRagged("r", dst, idx[i%len(idx)], nil)
						if err != nil {
							b.Fatal(err)
						}
						bytes += n
					}
					b.ReportMetric(float64(bytes)/b.Elapsed().Seconds()/1e9, "GB/s")
				})
				b.Run("fixed", func(b *testing.B) {
					n := 64 * mean * 12
					for i := 0; b.Loop(); i++ {
						if err := s.GetBatch("f", dst[:n], idx[i%len(idx)]); err != nil {
							b.Fatal(err)
						}
					}
					b.ReportMetric(float64(n)*float64(b.N)/b.Elapsed().Seconds()/1e9, "GB/s")
				})
				// Both in turns, a ragged batch then a fixed one of the
				// same rows, timed apart: their ratio from one loop sees
				// the machine in the same state for both (figures of the
				// two sub-benchmarks above, run one after the other, move
				// with this machine's modes).
				b.Run("turns", func(b *testing.B) {
					n := 64 * mean * 12
					var bytes int64
					var inRagged, inFixed time.Duration
					for i := 0; b.Loop(); i++ {
						batch := idx[i%len(idx)]
						t0 := time.Now()
						got, err := s.GetRagged("r", dst, batch, nil)
						t1 := time.Now()
						if err == nil {
							err = s.GetBatch("f", dst[:n], batch)
						}
						if err != nil {
							b.Fatal(err)
						}
						inRagged, inFixed = inRagged+t1.Sub(t0), inFixed+time.Since(t1)
						bytes += got
					}
					rg := float64(bytes) / inRagged.Seconds() / 1e9
					fx := float64(n) * float64(b.N) / inFixed.Seconds() / 1e9
					b.ReportMetric(rg, "ragged-GB/s")
					b.ReportMetric(fx, "fixed-GB/s")
					b.ReportMetric(rg/fx, "ragged/fixed")
				})
				if !remote {
					// The limit: the same rows' bytes copied one after
					// another, their extents known, no store.
					b.Run("copy", func(b *testing.B) {
						var bytes int64
						for i := 0; b.Loop(); i++ {
							var pos int64
							for _, g := range idx[i%len(idx)] {
								n := rb.lengths[g] * 12
								copy(dst[pos:pos+n], rb.values[rb.first[g]:rb.first[g]+n])
								pos += n
							}
							bytes += pos
						}
						b.ReportMetric(float64(bytes)/b.Elapsed().Seconds()/1e9, "GB/s")
					})
					// The fixed rows' limit: as many bytes as rows of one
					// size (the mean), copied the same way.
					b.Run("copy-fixed", func(b *testing.B) {
						n := mean * 12
						for i := 0; b.Loop(); i++ {
							for k, g := range idx[i%len(idx)] {
								copy(dst[int64(k)*n:int64(k+1)*n], rb.fixed[g*n:(g+1)*n])
							}
						}
						b.ReportMetric(float64(64*mean*12)*float64(b.N)/b.Elapsed().Seconds()/1e9, "GB/s")
					})
				}
				b.Run("per-sample", func(b *testing.B) {
					var bytes int64
					for i := 0; b.Loop(); i++ {
						var pos int64
						for _, g := range idx[i%len(idx)] {
							n := rb.lengths[g] * 12
							if err := s.Get("b", dst[pos:pos+n], rb.first[g]); err != nil {
								b.Fatal(err)
							}
							pos += n
						}
						bytes += pos
					}
					b.ReportMetric(float64(bytes)/b.Elapsed().Seconds()/1e9, "GB/s")
				})
			})
		}
	}
}

// BenchmarkRaggedBacked: a batch of 64 random ragged rows (GetRagged) of
// a variable held in memory, of this node and of the other, against the
// same rows of a variable whose rows all lie in its backing file (a .npy
// pair, in the page cache: the file's reads, not the disk's), read on
// demand and announced one batch ahead (Prefetch), into a receive buffer.
// The file's batches are an epoch's, each row once (a row read again
// within a second is not read ahead: the tier takes it for a late
// announcement), each run on a variable of its own: run it with
// -benchtime of at most 80x.
func BenchmarkRaggedBacked(b *testing.B) {
	for _, mean := range []int64{100, 1000} {
		b.Run(fmt.Sprintf("%dB", mean*12), func(b *testing.B) {
			rb := newRaggedBench(b, mean)
			s := rb.c.stores[0]
			dir := b.TempDir()
			total := 2 * rb.rows
			off := make([]int64, total+1)
			for g, n := range rb.lengths {
				off[g+1] = off[g] + n
			}
			values := make([]byte, off[total]*12)
			for g := range total {
				for i := range (off[g+1] - off[g]) * 12 {
					values[off[g]*12+i] = byte(i)
				}
			}
			vf, of := filepath.Join(dir, "values.npy"), filepath.Join(dir, "offsets.npy")
			writeNPYArray(b, vf, "<f4", []int64{off[total], 3}, values)
			writeNPYArray(b, of, "<i8", []int64{total + 1}, offsetsBytes(off))
			dst, err := s.AllocRecv(int(64 * 2 * mean * 12))
			if err != nil {
				b.Fatal(err)
			}
			rng := rand.New(rand.NewPCG(3, 4))
			perm := rng.Perm(int(total))
			var epoch [][]int64
			for lo := 0; lo+64 <= len(perm); lo += 64 {
				batch := make([]int64, 64)
				for i, g := range perm[lo : lo+64] {
					batch[i] = int64(g)
				}
				epoch = append(epoch, batch)
			}
			vars := 0
			run := func(name string, idx [][]int64, backed, prefetch bool) {
				b.Run(name, func(b *testing.B) {
					v := "r"
					if backed {
						vars++
						v = fmt.Sprintf("file%d", vars)
						rb.c.mustEach(b, func(r int, s *ddstore.Store) error {
							return s.AddRaggedBacked(v, nil, nil, ddstore.Float32, ddstore.Backing{File: vf, Offsets: of, Rows: total}, 3)
						})
						defer rb.c.mustEach(b, func(r int, s *ddstore.Store) error { return s.Free(v) })
					}
					before := rb.c.counters(b, 0)
					var bytes int64
					for i := 0; b.Loop(); i++ {
						if prefetch {
							if err := s.Prefetch(v, idx[(i+1)%len(idx)]); err != nil {
								b.Fatal(err)
							}
						}
						n, err := s.GetRagged(v, dst, idx[i%len(idx)], nil)
						if err != nil {
							b.Fatal(err)
						}
						bytes += n
					}
					b.ReportMetric(float64(bytes)/b.Elapsed().Seconds()/1e9, "GB/s")
					if backed {
						// What share of the rows came from staging, read ahead.
						after := rb.c.counters(b, 0)
						b.ReportMetric(float64(after["staged_rows"]-before["staged_rows"])/float64(64*b.N), "staged/row")
					}
				})
			}
			run("memory-local", rb.batches(false), false, false)
			run("memory-remote", rb.batches(true), false, false)
			run("file", epoch, true, false)
			run("file-prefetch", epoch, true, true)
		})
	}
}

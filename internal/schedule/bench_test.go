package schedule

import (
	"fmt"
	"testing"
)

// BenchmarkBuild plans and simulates a whole job of the issue's size — N =
// 10^6 samples, P = 1024 ranks (8 per node), B = 32, E = 100 epochs, memory
// for half the dataset — and reports its hit rate. One op is one job:
//
//	GOMAXPROCS=1 go test ./internal/schedule/ -run '^$' -bench Build -benchtime 1x
func BenchmarkBuild(b *testing.B) {
	for _, p := range Policies {
		b.Run(string(p), func(b *testing.B) {
			c := Config{Seed: 1, Epochs: 100, N: 1_000_000, Ranks: 1024, RanksPerNode: 8, Batch: 32,
				Capacity: 500_000, Policy: p}
			var sum Summary
			for b.Loop() {
				s, err := New(c)
				if err != nil {
					b.Fatal(err)
				}
				sum = s.Summarize()
			}
			b.ReportMetric(sum.HitRate, "hit-rate")
			b.ReportMetric(float64(sum.StorageReadsSpread), "reads-spread")
		})
	}
}

// BenchmarkPermutation is one epoch's order of 10^6 samples.
func BenchmarkPermutation(b *testing.B) {
	var p permuter
	var dst []int32
	e := 0
	for b.Loop() {
		dst = p.permute(1, e, 1_000_000, dst)
		e++
	}
}

func ExampleSchedule_Summarize() {
	s, err := New(Config{Seed: 7, Epochs: 10, N: 2048, Ranks: 4, RanksPerNode: 2, Batch: 16, Capacity: 1024, Policy: Locality})
	if err != nil {
		panic(err)
	}
	sum := s.Summarize()
	fmt.Printf("hit rate %.3f (bound C/N %.3f), storage reads per rank per step %d..%d\n",
		sum.HitRate, sum.Bound, sum.StorageReadsMin, sum.StorageReadsMax)
	// Output: hit rate 0.500 (bound C/N 0.500), storage reads per rank per step 5..11
}

func ExampleSchedule_Steps() {
	s, err := New(Config{Seed: 7, Epochs: 2, N: 64, Ranks: 2, RanksPerNode: 1, Batch: 4, Capacity: 32})
	if err != nil {
		panic(err)
	}
	const rank = 1
	for st := range s.Steps(1) {
		if st.Epoch.Index == 1 && st.Index < 2 {
			fmt.Println("step", st.Index, "read", st.Samples(rank), "hits", st.Hits(rank), "prefetch", st.Prefetch(rank))
		}
	}
	// Output:
	// step 0 read [28 38 50 33] hits [true false false false] prefetch [51 57]
	// step 1 read [29 30 51 57] hits [true true false false] prefetch [48]
}

// BenchmarkEmitEpoch is what `ddstore schedule --emit-rank R --epoch 99`
// plans: epoch 99 of the issue's job (N = 10^6, P = 1024, 8 per node, B = 32,
// E = 100, memory for half the dataset). One op is one epoch: locality
// alone; random without hits (EpochSamples) alone, with them (Epoch) after
// replaying its buffers through epochs 0..98; and locality under a byte
// budget (M = S/2 of atomistic structures, BenchmarkBuildBytes's).
//
//	go test ./internal/schedule/ -run '^$' -bench EmitEpoch -benchtime 3x
func BenchmarkEmitEpoch(b *testing.B) {
	for _, bc := range []struct {
		name   string
		policy Policy
		hits   bool
	}{{"locality", Locality, true}, {"random", Random, false}, {"random-hits", Random, true}, {"locality-bytes", Locality, true}} {
		b.Run(bc.name, func(b *testing.B) {
			c := Config{Seed: 1, Epochs: 100, N: 1_000_000, Ranks: 1024, RanksPerNode: 8, Batch: 32,
				Capacity: 500_000, Policy: bc.policy}
			if bc.name == "locality-bytes" {
				c.Capacity, c.Sizes = 0, atomisticSizes(1, c.N)
				c.CapacityBytes = sumSizes(c.Sizes) / 2
			}
			s, err := New(c)
			if err != nil {
				b.Fatal(err)
			}
			var e *Epoch
			for b.Loop() {
				if bc.hits {
					e = s.Epoch(99)
				} else {
					e = s.EpochSamples(99)
				}
			}
			if e.Index != 99 {
				b.Fatal("wrong epoch")
			}
		})
	}
}

// BenchmarkBuildBytes is the cost of the byte path: the job of
// BenchmarkBuild (N = 10^6, P = 1024 with 8 per node, B = 32) over 10
// epochs, memory for half the dataset counted in samples (C = N/2) and in
// bytes (M = S/2 of atomistic structures of 8-256 atoms), side by side. It
// reports the hit rates, in bytes the byte hit rate and the storage bytes
// imbalance. One op is one job:
//
//	GOMAXPROCS=1 go test ./internal/schedule/ -run '^$' -bench BuildBytes -benchtime 1x -count 3
func BenchmarkBuildBytes(b *testing.B) {
	const n = 1_000_000
	sizes := atomisticSizes(1, n)
	for _, p := range Policies {
		for _, bytes := range []bool{false, true} {
			name := string(p) + "/samples"
			c := Config{Seed: 1, Epochs: 10, N: n, Ranks: 1024, RanksPerNode: 8, Batch: 32, Capacity: n / 2, Policy: p}
			if bytes {
				name = string(p) + "/bytes"
				c.Capacity, c.Sizes, c.CapacityBytes = 0, sizes, sumSizes(sizes)/2
			}
			b.Run(name, func(b *testing.B) {
				var sum Summary
				for b.Loop() {
					s, err := New(c)
					if err != nil {
						b.Fatal(err)
					}
					sum = s.Summarize()
				}
				b.ReportMetric(sum.HitRate, "hit-rate")
				if bytes {
					b.ReportMetric(sum.ByteHitRate, "byte-hit-rate")
					b.ReportMetric(sum.StorageBytesImbalance, "bytes-imbalance")
				}
			})
		}
	}
}

// BenchmarkBytesBalance measures, rather than times, the balance of storage
// bytes over the ranks of a step under locality with a byte budget: N =
// 10^5 samples, P = 64 with 8 per node, B = 32, 3 epochs, M = S/4 and S/2,
// atomistic structures and token lengths. It reports the imbalance (Σ max /
// Σ mean over the steps) of the sample-count deal (±1 reads a rank, in the
// permutation's order) and of the byte deal, and the floor no deal goes
// under (a step's largest read):
//
//	go test ./internal/schedule/ -run '^$' -bench BytesBalance -benchtime 1x
func BenchmarkBytesBalance(b *testing.B) {
	const n = 100_000
	for _, dist := range []struct {
		name  string
		sizes []int64
	}{{"atomistic", atomisticSizes(1, n)}, {"tokens", tokenSizes(1, n)}} {
		for _, frac := range []int64{4, 2} {
			for _, pin := range []Pin{PinBytes, PinSamples} {
				b.Run(fmt.Sprintf("%s/%s/pin=%s", dist.name, map[int64]string{4: "quarter", 2: "half"}[frac], pin), func(b *testing.B) {
					c := Config{Seed: 1, Epochs: 3, N: n, Ranks: 64, RanksPerNode: 8, Batch: 32, Sizes: dist.sizes,
						CapacityBytes: sumSizes(dist.sizes) / frac, Pin: pin}
					var counted, mean, dealt, floor float64
					for b.Loop() {
						s, err := New(c)
						if err != nil {
							b.Fatal(err)
						}
						counted, mean, dealt, floor = 0, 0, 0, 0
						for i := range c.Epochs {
							st := countDealEpoch(s, i).Stats
							counted += st.StepMaxBytes
							mean += st.StepMeanBytes
							st = s.Epoch(i).Stats
							dealt += st.StepMaxBytes
							floor += st.StepFloorBytes
						}
					}
					b.ReportMetric(counted/mean, "count-deal-imbalance")
					b.ReportMetric(dealt/mean, "byte-deal-imbalance")
					b.ReportMetric(floor/mean, "floor")
				})
			}
		}
	}
}

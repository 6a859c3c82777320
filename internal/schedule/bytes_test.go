package schedule

import (
	"errors"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"

	"github.com/ddstore-go/ddstore/internal/base"
)

func byteConfig(sizes []int64, frac float64) Config {
	return Config{Seed: 5, Epochs: 4, N: len(sizes), Ranks: 8, RanksPerNode: 2, Batch: 16,
		Sizes: sizes, CapacityBytes: int64(frac * float64(sumSizes(sizes)))}
}

func TestBytesValidate(t *testing.T) {
	sizes := []int64{10, 20, 30, 40, 50, 60, 70, 80}
	ok := Config{Seed: 1, Epochs: 2, N: 8, Ranks: 2, RanksPerNode: 1, Batch: 2, Sizes: sizes, CapacityBytes: 100}
	for _, tc := range []struct {
		name string
		edit func(*Config)
		want string
	}{
		{"ok", func(c *Config) {}, ""},
		{"whole dataset", func(c *Config) { c.CapacityBytes = 360 }, ""},
		{"pin samples", func(c *Config) { c.Pin = PinSamples }, ""},
		{"zero-byte samples", func(c *Config) { c.Sizes = []int64{0, 0, 0, 0, 0, 0, 0, 1}; c.CapacityBytes = 1 }, ""},
		{"random", func(c *Config) { c.Policy = Random }, ""},
		{"sizes short", func(c *Config) { c.Sizes = sizes[:7] }, "sizes of 7 samples, n 8"},
		{"negative size", func(c *Config) { c.Sizes = []int64{10, 20, -3, 40, 50, 60, 70, 80} }, "size -3 of sample 2"},
		{"no bytes", func(c *Config) { c.Sizes = make([]int64, 8) }, "sizes of 8 samples add up to 0 bytes"},
		{"capacity too", func(c *Config) { c.Capacity = 4 }, "capacity 4 with sizes"},
		{"zero budget", func(c *Config) { c.CapacityBytes = 0 }, "capacity bytes 0: want a positive number"},
		{"budget above dataset", func(c *Config) { c.CapacityBytes = 361 }, "capacity bytes 361 above the dataset's 360"},
		{"budget without sizes", func(c *Config) { c.Sizes, c.Capacity = nil, 4 }, "capacity bytes 100 without sizes"},
		{"pin without sizes", func(c *Config) { c.Sizes, c.CapacityBytes, c.Capacity, c.Pin = nil, 0, 4, PinSamples }, `pin "samples" without sizes`},
		{"unknown pin", func(c *Config) { c.Pin = "knapsack" }, `pin "knapsack": want "bytes" or "samples"`},
		{"random buffer under a byte", func(c *Config) { c.Policy, c.CapacityBytes = Random, 1 }, "capacity bytes 1 below ranks 2"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := ok
			tc.edit(&c)
			err := c.Validate()
			if tc.want == "" {
				if err != nil {
					t.Fatal(err)
				}
				return
			}
			if err == nil || !errors.Is(err, base.ErrArgument) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error %v, want ErrArgument with %q", err, tc.want)
			}
		})
	}
}

// TestBytesPinWithinBudget: every node pins at most its share of the
// budget; PinBytes fills it within the largest sample per node, PinSamples
// pins within one sample per node of k(M), the most that fit at all.
func TestBytesPinWithinBudget(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 8))
	for i := range 300 {
		n := 1 + rng.IntN(400)
		var sizes []int64
		switch i % 3 {
		case 0:
			sizes = atomisticSizes(rng.Uint64(), n)
		case 1:
			sizes = tokenSizes(rng.Uint64(), n)
		default:
			sizes = make([]int64, n)
			for k := range sizes {
				sizes[k] = rng.Int64N(1 + rng.Int64N(1000))
			}
		}
		total := sumSizes(sizes)
		if total == 0 {
			continue
		}
		capa := 1 + rng.Int64N(total)
		nodes := 1 + rng.IntN(8)
		fit, _ := byteBounds(sizes, capa)
		for _, pin := range []Pin{PinBytes, PinSamples} {
			node, count, bytes := pinBytes(sizes, capa, nodes, pin)
			used := make([]int64, nodes)
			gotCount := 0
			for x, k := range node {
				if k >= 0 {
					used[k] += sizes[x]
					gotCount++
				}
			}
			share := nodeShares(capa, nodes)
			for k := range used {
				if used[k] > share[k] {
					t.Fatalf("%s: node %d pins %d bytes, its share of %d is %d", pin, k, used[k], capa, share[k])
				}
			}
			if gotCount != count || sumSizes(used) != bytes || bytes > capa {
				t.Fatalf("%s: reports %d samples of %d bytes, pins %d of %d, budget %d", pin, count, bytes, gotCount, sumSizes(used), capa)
			}
			if count > fit {
				t.Fatalf("%s: %d samples pinned, above k(M) = %d", pin, count, fit)
			}
			switch pin {
			case PinBytes:
				// Each node one range of indices, in node order, less the
				// samples larger than a share.
				last := int32(-1)
				for x, k := range node {
					if k < 0 && sizes[x] <= share[0] && last >= 0 && slices.Contains(node[x:], last) {
						t.Fatalf("bytes: sample %d of %d bytes left out inside node %d's range", x, sizes[x], last)
					}
					if k >= 0 {
						if k < last {
							t.Fatalf("bytes: sample %d on node %d after node %d's", x, k, last)
						}
						last = k
					}
				}
				if count < n && capa-bytes >= int64(nodes)*slices.Max(sizes) {
					t.Fatalf("bytes: %d of %d bytes pinned over %d nodes, largest sample %d", bytes, capa, nodes, slices.Max(sizes))
				}
			case PinSamples:
				if count < fit-nodes {
					t.Fatalf("samples: %d pinned, k(M) = %d over %d nodes", count, fit, nodes)
				}
			}
		}
	}
}

// TestFIFOBytes: a rank's buffer never holds more than its budget, holds
// exactly the bytes of its queue, and a sample larger than the budget is
// not kept.
func TestFIFOBytes(t *testing.T) {
	rng := rand.New(rand.NewPCG(9, 10))
	sizes := tokenSizes(1, 500)
	const ranks = 3
	budget := sumSizes(sizes) / 40
	f := newByteFIFO(sizes, ranks, budget)
	for range 20000 {
		r, x := rng.IntN(ranks), int32(rng.IntN(len(sizes)))
		hit := f.read(r, x)
		if !hit && f.holder(x) != r && sizes[x] <= budget {
			t.Fatalf("sample %d of %d bytes read by rank %d and not kept", x, sizes[x], r)
		}
		if sizes[x] > budget && f.holder(x) == r && !hit {
			t.Fatalf("sample %d of %d bytes kept in a buffer of %d", x, sizes[x], budget)
		}
		var held int64
		for _, e := range f.queue[r][f.head[r]:] {
			held += sizes[e.x]
		}
		if held != f.used[r] || f.used[r] > budget {
			t.Fatalf("rank %d: queue of %d bytes, counted %d, budget %d", r, held, f.used[r], budget)
		}
	}
}

// TestBytesLocalityDeal: under a byte budget every rank reads exactly B a
// step, the hits are the pinned samples, and as many of them node-local as
// the ranks' numbers of hits allow: a node's ranks read min(its pinned
// samples in the batch, their hits) of its own.
func TestBytesLocalityDeal(t *testing.T) {
	for _, c := range configs() {
		if c.Policy != Locality || !c.Bytes() {
			continue
		}
		s := mustNew(t, c)
		nodes := c.Ranks / c.RanksPerNode
		for e := range s.Epochs() {
			for step := range e.Steps() {
				onNode := make([]int, nodes)
				quota := make([]int, nodes) // hits of the node's ranks
				localHits := 0
				for r := range c.Ranks {
					got := e.Samples(step, r)
					if len(got) != c.Batch {
						t.Fatalf("%v: rank %d reads %d samples, want B = %d", c, r, len(got), c.Batch)
					}
					for i, x := range got {
						node := int(s.pinNode[x])
						if e.Hits(step, r)[i] != (node >= 0) || e.NodeLocal(step, r)[i] != (node == r/c.RanksPerNode) {
							t.Fatalf("%v: sample %d pinned on node %d read by rank %d: hit %v, node-local %v", c, x, node, r,
								e.Hits(step, r)[i], e.NodeLocal(step, r)[i])
						}
						if node >= 0 {
							onNode[node]++
							quota[r/c.RanksPerNode]++
							if node == r/c.RanksPerNode {
								localHits++
							}
						}
					}
				}
				best := 0
				for k := range onNode {
					best += min(onNode[k], quota[k])
				}
				if localHits != best {
					t.Fatalf("%v: step %d: %d node-local hits, the most possible is %d", c, step, localHits, best)
				}
			}
		}
	}
}

// TestBytesLocalityBounds: on atomistic structures and token lengths,
// locality's hit rates stay under both bounds (sample k(M)/N, byte M/S);
// PinBytes reaches the byte bound within the largest sample per node, and
// PinSamples the sample bound within one sample per node. Every epoch hits
// exactly the pinned set.
func TestBytesLocalityBounds(t *testing.T) {
	for _, dist := range []struct {
		name  string
		sizes []int64
	}{{"atomistic", atomisticSizes(1, 4096)}, {"tokens", tokenSizes(1, 4096)}} {
		for _, frac := range []float64{0.1, 0.25, 0.5} {
			for _, pin := range []Pin{PinBytes, PinSamples} {
				c := byteConfig(dist.sizes, frac)
				c.Pin = pin
				s := mustNew(t, c)
				sum := s.Summarize()
				t.Logf("%s M/S=%.2f pin %s: sample hit rate %.4f (bound %.4f), byte hit rate %.4f (bound %.4f), storage bytes imbalance %.3f",
					dist.name, frac, pin, sum.HitRate, sum.Bound, sum.ByteHitRate, sum.ByteBound, sum.StorageBytesImbalance)
				const eps = 1e-9
				if sum.HitRate > sum.Bound+eps || sum.ByteHitRate > sum.ByteBound+eps {
					t.Errorf("%s %v %s: hit rates %.4f, %.4f above the bounds %.4f, %.4f", dist.name, frac, pin,
						sum.HitRate, sum.ByteHitRate, sum.Bound, sum.ByteBound)
				}
				for i, st := range sum.PerEpoch {
					if st.Hits != sum.PinnedSamples || st.HitBytes != sum.PinnedBytes {
						t.Errorf("epoch %d hits %d samples of %d bytes, %d of %d pinned", i, st.Hits, st.HitBytes, sum.PinnedSamples, sum.PinnedBytes)
					}
				}
				nodes := int64(c.Ranks / c.RanksPerNode)
				switch pin {
				case PinBytes:
					if slack := float64(nodes*slices.Max(c.Sizes)) / float64(sum.TotalBytes); sum.ByteHitRate < sum.ByteBound-slack {
						t.Errorf("%s %v: byte hit rate %.4f, bound %.4f less %.4f", dist.name, frac, sum.ByteHitRate, sum.ByteBound, slack)
					}
				case PinSamples:
					if slack := float64(nodes) / float64(c.N); sum.HitRate < sum.Bound-slack {
						t.Errorf("%s %v: sample hit rate %.4f, bound %.4f less %.4f", dist.name, frac, sum.HitRate, sum.Bound, slack)
					}
				}
			}
		}
	}
}

// countDealEpoch is epoch i of s dealt as under a budget in samples: the
// same pinned set, storage reads within ±1 per rank, filled in the
// permutation's order — what the byte deal replaces.
func countDealEpoch(s *Schedule, i int) *Epoch {
	m := newLocalitySim(s)
	m.dealer = nil
	e := &Epoch{}
	e.reset(i, s.order[i], s.geoOf(i), s.cfg.Sizes)
	m.epoch(e)
	e.finish()
	return e
}

// TestBytesBalance: dealing storage reads by bytes never leaves a step's
// busiest rank with more than the sample-count deal (±1 reads a rank, in
// the permutation's order) would, brings the imbalance (Σ max / Σ mean
// over steps) down, and keeps each step's busiest rank within the step's
// largest read of the mean.
func TestBytesBalance(t *testing.T) {
	for _, dist := range []struct {
		name  string
		sizes []int64
	}{{"atomistic", atomisticSizes(2, 8192)}, {"tokens", tokenSizes(2, 8192)}} {
		for _, frac := range []float64{0.25, 0.5} {
			c := byteConfig(dist.sizes, frac)
			s := mustNew(t, c)
			var beforeMax, afterMax, mean float64
			for e := range s.Epochs() {
				counted := countDealEpoch(s, e.Index)
				for step := range e.Steps() {
					before := make([]int64, c.Ranks)
					after := make([]int64, c.Ranks)
					var largest int64
					for r := range c.Ranks {
						before[r] = counted.StorageBytes(step, r)
						after[r] = e.StorageBytes(step, r)
						for _, x := range e.StorageReads(nil, step, r) {
							largest = max(largest, c.Sizes[x])
						}
					}
					if sumSizes(before) != sumSizes(after) {
						t.Fatalf("step %d: %d bytes from storage, the sample-count deal reads %d", step, sumSizes(after), sumSizes(before))
					}
					m := float64(sumSizes(after)) / float64(c.Ranks)
					if hi := slices.Max(after); hi > slices.Max(before) || float64(hi) > m+float64(largest) {
						t.Fatalf("%s %v epoch %d step %d: busiest rank %d bytes (by count %d), mean %.0f, largest read %d",
							dist.name, frac, e.Index, step, hi, slices.Max(before), m, largest)
					}
					beforeMax += float64(slices.Max(before))
					afterMax += float64(slices.Max(after))
					mean += m
				}
			}
			t.Logf("%s M/S=%.2f: storage bytes imbalance %.3f dealt by count, %.3f by bytes", dist.name, frac, beforeMax/mean, afterMax/mean)
			if afterMax >= beforeMax {
				t.Errorf("%s %v: imbalance %.3f, not below the count deal's %.3f", dist.name, frac, afterMax/mean, beforeMax/mean)
			}
			if sum := s.Summarize(); sum.StorageBytesImbalance > 1.1 {
				t.Errorf("%s %v: storage bytes imbalance %.3f", dist.name, frac, sum.StorageBytesImbalance)
			}
		}
	}
}

// TestSolarByteCosts: the bit-plane cost matrix is the bytes of each
// epoch's head of M bytes missing from the other's tail, over P.
func TestSolarByteCosts(t *testing.T) {
	sizes := tokenSizes(3, 700)
	sizes[5] = 0
	c := Config{Seed: 3, Epochs: 5, N: len(sizes), Ranks: 3, RanksPerNode: 1, Batch: 4, Sizes: sizes,
		CapacityBytes: sumSizes(sizes) / 3, Policy: Solar}
	cost := solarCosts(c.withDefaults())
	part := func(perm []int32) map[int32]bool {
		m := map[int32]bool{}
		var sum int64
		for _, x := range perm {
			if sum+sizes[x] > c.CapacityBytes {
				break
			}
			sum += sizes[x]
			m[x] = true
		}
		return m
	}
	for i := range c.Epochs {
		pi := Permutation(c.Seed, i, c.N)
		rev := slices.Clone(pi)
		slices.Reverse(rev)
		tail := part(rev)
		for j := range c.Epochs {
			if i == j {
				continue
			}
			var miss int64
			for x := range part(Permutation(c.Seed, j, c.N)) {
				if !tail[x] {
					miss += sizes[x]
				}
			}
			if want := miss / int64(c.Ranks); cost[i][j] != want {
				t.Fatalf("cost[%d][%d] = %d, want %d", i, j, cost[i][j], want)
			}
		}
	}
}

package schedule

import (
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"testing"
)

func mustNew(t testing.TB, c Config) *Schedule {
	t.Helper()
	s, err := New(c)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// configs are small schedules of every policy over awkward geometries: N
// not a multiple of the ranks or of the global batch, drop_last both ways,
// one rank per node and all ranks on one node.
func configs() []Config {
	var out []Config
	rng := rand.New(rand.NewPCG(1, 2))
	for _, p := range Policies {
		for i := range 12 {
			ranks := []int{1, 2, 4, 6}[i%4]
			perNode := []int{1, ranks, 2}[i%3]
			if ranks%perNode != 0 {
				perNode = 1
			}
			batch := 1 + rng.IntN(5)
			n := batch*ranks + rng.IntN(60)
			out = append(out, Config{
				Seed: rng.Uint64(), Epochs: 1 + rng.IntN(4), N: n, Ranks: ranks, RanksPerNode: perNode,
				Batch: batch, Capacity: max(ranks, rng.IntN(n+1)), Policy: p, DropLast: i%2 == 1,
				SwarmIterations: 50,
			})
		}
	}
	return append(out, byteConfigs()...)
}

// byteConfigs are small schedules of every policy under a byte budget:
// sizes of atomistic structures, of tokenized documents, and uniform ones
// from 0 bytes up, with a sample now and then larger than a node's or a
// rank's share of the budget; both pins.
func byteConfigs() []Config {
	var out []Config
	rng := rand.New(rand.NewPCG(3, 4))
	for _, p := range Policies {
		for i := range 12 {
			ranks := []int{1, 2, 4, 6}[i%4]
			perNode := []int{1, ranks, 2}[i%3]
			if ranks%perNode != 0 {
				perNode = 1
			}
			batch := 1 + rng.IntN(5)
			n := batch*ranks + rng.IntN(60)
			var sizes []int64
			switch i % 3 {
			case 0:
				sizes = atomisticSizes(rng.Uint64(), n)
			case 1:
				sizes = tokenSizes(rng.Uint64(), n)
			default:
				sizes = make([]int64, n)
				for k := range sizes {
					sizes[k] = rng.Int64N(100)
				}
				sizes[rng.IntN(n)] = 5000
			}
			total := sumSizes(sizes)
			out = append(out, Config{
				Seed: rng.Uint64(), Epochs: 1 + rng.IntN(4), N: n, Ranks: ranks, RanksPerNode: perNode,
				Batch: batch, Sizes: sizes, CapacityBytes: max(int64(ranks), rng.Int64N(total+1)),
				Pin: []Pin{PinBytes, PinSamples}[i/6], Policy: p, DropLast: i%2 == 1, SwarmIterations: 50,
			})
		}
	}
	return out
}

// positionalBatch returns the samples of step s's global batch before any
// re-dealing: positions [s·B·P, ...) of the padded permutation.
func positionalBatch(s *Schedule, perm []int32, step int) []int32 {
	g := s.geo
	var lo, hi int
	if s.cfg.Policy == Locality {
		lo, hi = step*g.batch*g.ranks, (step+1)*g.batch*g.ranks
	} else {
		a, b := g.rankSteps(step)
		lo, hi = a*g.ranks, b*g.ranks
	}
	out := make([]int32, 0, hi-lo)
	for k := lo; k < hi; k++ {
		out = append(out, g.at(perm, k))
	}
	return out
}

func sorted(x []int32) []int32 {
	y := slices.Clone(x)
	slices.Sort(y)
	return y
}

func TestGlobalBatchSetsKept(t *testing.T) {
	for _, c := range configs() {
		s := mustNew(t, c)
		for e := range s.Epochs() {
			perm := Permutation(c.Seed, e.Perm, c.N)
			for step := range e.Steps() {
				if got, want := sorted(e.Global(step)), sorted(positionalBatch(s, perm, step)); !slices.Equal(got, want) {
					t.Fatalf("%v: epoch %d step %d: global batch %v, want the samples %v", c, e.Index, step, got, want)
				}
			}
		}
	}
}

func TestEverySampleOncePerEpoch(t *testing.T) {
	for _, c := range configs() {
		s := mustNew(t, c)
		for e := range s.Epochs() {
			count := make([]int, c.N)
			for step := range e.Steps() {
				for _, x := range e.Global(step) {
					count[x]++
				}
			}
			// Padding repeats the head of the permutation; drop_last cuts
			// its tail.
			perm := Permutation(c.Seed, e.Perm, c.N)
			total := e.Stats.Accesses
			for i, x := range perm {
				want := 1
				switch {
				case c.DropLast && i >= total:
					want = 0
				case !c.DropLast && total > c.N:
					want = (total - i + c.N - 1) / c.N
				}
				if count[x] != want {
					t.Fatalf("%v: epoch %d: sample %d (position %d of %d read) read %d times, want %d", c, e.Index, x, i, total, count[x], want)
				}
			}
			if !c.DropLast && total < c.N {
				t.Fatalf("%v: epoch %d reads %d of %d samples without drop_last", c, e.Index, total, c.N)
			}
		}
	}
}

func TestLocalityExactBatches(t *testing.T) {
	for _, c := range configs() {
		if c.Policy != Locality || c.Bytes() { // under a byte budget: TestBytesLocalityDeal
			continue
		}
		if c.Policy != Locality {
			continue
		}
		s := mustNew(t, c)
		nodes := c.Ranks / c.RanksPerNode
		for e := range s.Epochs() {
			for step := range e.Steps() {
				reads := make([]int, c.Ranks)
				onNode := make([]int, nodes) // pinned samples of the batch per node
				localHits, hits := 0, 0
				for r := range c.Ranks {
					got := e.Samples(step, r)
					if len(got) != c.Batch {
						t.Fatalf("%v: epoch %d step %d rank %d reads %d samples, want B = %d", c, e.Index, step, r, len(got), c.Batch)
					}
					for i, x := range got {
						pinned := int(x) < c.Capacity
						node := int(int64(x) * int64(nodes) / int64(c.Capacity))
						if e.Hits(step, r)[i] != pinned {
							t.Fatalf("%v: sample %d hit %v, want %v (pinned are 0..C-1)", c, x, !pinned, pinned)
						}
						if e.NodeLocal(step, r)[i] != (pinned && node == r/c.RanksPerNode) {
							t.Fatalf("%v: sample %d on node %d read by rank %d: node-local %v", c, x, node, r, !pinned)
						}
						if pinned {
							hits++
							onNode[node]++
							if node == r/c.RanksPerNode {
								localHits++
							}
						} else {
							reads[r]++
						}
					}
				}
				if lo, hi := slices.Min(reads), slices.Max(reads); hi-lo > 1 {
					t.Fatalf("%v: epoch %d step %d: storage reads per rank %v, want within ±1", c, e.Index, step, reads)
				}
				// The most node-local reads ±1 shares allow: every node
				// reads up to R·⌊H/P⌋ of its own, plus one for each of the
				// H mod P extra shares it can use.
				each, extra, useful := hits/c.Ranks, hits%c.Ranks, 0
				best := 0
				for _, h := range onNode {
					best += min(h, c.RanksPerNode*each)
					useful += min(c.RanksPerNode, max(0, h-c.RanksPerNode*each))
				}
				best += min(extra, useful)
				if localHits != best {
					t.Fatalf("%v: epoch %d step %d: %d node-local hits of %d (per node %v), the most possible is %d",
						c, e.Index, step, localHits, hits, onNode, best)
				}
			}
		}
	}
}

// naiveRandom is the Random policy written out plainly: each rank's
// DistributedSampler list, batches of B, a FIFO queue per rank.
func naiveRandom(c Config) [][][][]int32 { // epoch, step, rank, samples (negative: hit, -x-1)
	per := int(math.Ceil(float64(c.N) / float64(c.Ranks)))
	if c.DropLast && c.N%c.Ranks != 0 {
		per = int(math.Ceil(float64(c.N-c.Ranks) / float64(c.Ranks)))
	}
	total := per * c.Ranks
	queues := make([][]int32, c.Ranks)
	held := make([]int64, c.Ranks) // bytes of each queue, under a byte budget
	// Under a byte budget, the rank that stored each sample last: a rank
	// holds x while a copy is in its queue and no other rank stored x
	// since (the fifo's newest-copy rule).
	last := map[int32]int{}
	var out [][][][]int32
	for e := range c.Epochs {
		indices := Permutation(c.Seed, e, c.N)
		if c.DropLast {
			indices = indices[:total]
		} else {
			for len(indices) < total {
				indices = append(indices, indices[:min(len(indices), total-len(indices))]...)
			}
		}
		var lists [][]int32
		for r := range c.Ranks {
			var l []int32
			for k := r; k < total; k += c.Ranks {
				l = append(l, indices[k])
			}
			lists = append(lists, l)
		}
		var steps [][][]int32
		for lo := 0; lo < per; lo += c.Batch {
			hi := min(lo+c.Batch, per)
			if c.DropLast && hi-lo < c.Batch {
				break
			}
			var ranks [][]int32
			for r := range c.Ranks {
				var got []int32
				for _, x := range lists[r][lo:hi] {
					if slices.Contains(queues[r], x) && (!c.Bytes() || last[x] == r) {
						got = append(got, -x-1)
						continue
					}
					got = append(got, x)
					if c.Bytes() {
						budget := c.CapacityBytes / int64(c.Ranks)
						if c.Sizes[x] > budget {
							continue // larger than the whole buffer: not kept
						}
						last[x] = r
						queues[r] = append(queues[r], x)
						for held[r] += c.Sizes[x]; held[r] > budget; queues[r] = queues[r][1:] {
							held[r] -= c.Sizes[queues[r][0]]
						}
						continue
					}
					queues[r] = append(queues[r], x)
					if len(queues[r]) > c.Capacity/c.Ranks {
						queues[r] = queues[r][1:]
					}
				}
				ranks = append(ranks, got)
			}
			steps = append(steps, ranks)
		}
		out = append(out, steps)
	}
	return out
}

func encode(e *Epoch) [][][]int32 {
	var steps [][][]int32
	for step := range e.Steps() {
		var ranks [][]int32
		for r := range e.ranks {
			var got []int32
			for i, x := range e.Samples(step, r) {
				if e.Hits(step, r)[i] {
					x = -x - 1
				}
				got = append(got, x)
			}
			ranks = append(ranks, got)
		}
		steps = append(steps, ranks)
	}
	return steps
}

func TestRandomIsDistributedSampler(t *testing.T) {
	for _, c := range configs() {
		if c.Policy != Random {
			continue
		}
		want := naiveRandom(c)
		i := 0
		for e := range mustNew(t, c).Epochs() {
			if got := encode(e); fmt.Sprint(got) != fmt.Sprint(want[i]) {
				t.Fatalf("%v: epoch %d:\n got %v\nwant %v", c, i, got, want[i])
			}
			i++
		}
	}
}

func TestDeterministic(t *testing.T) {
	for _, c := range configs() {
		var a, b []string
		for e := range mustNew(t, c).Epochs() {
			a = append(a, fmt.Sprint(e.Perm, encode(e)))
		}
		for e := range mustNew(t, c).Epochs() {
			b = append(b, fmt.Sprint(e.Perm, encode(e)))
		}
		if !slices.Equal(a, b) {
			t.Fatalf("%v: two builds differ", c)
		}
		c.Seed++
		var d []string
		for e := range mustNew(t, c).Epochs() {
			d = append(d, fmt.Sprint(e.Perm, encode(e)))
		}
		if c.N > 8 && slices.Equal(a, d) {
			t.Fatalf("%v: another seed gives the same schedule", c)
		}
	}
}

// The summary reads the same epochs as Epochs, reusing one buffer.
func TestSummaryMatchesEpochs(t *testing.T) {
	for _, c := range configs() {
		s := mustNew(t, c)
		var rates []float64
		for e := range s.Epochs() {
			rates = append(rates, e.Stats.HitRate())
		}
		if sum := s.Summarize(); !slices.Equal(sum.HitRatePerEpoch, rates) {
			t.Fatalf("%v: summary %v, epochs %v", c, sum.HitRatePerEpoch, rates)
		}
	}
}

func TestSolarRedealing(t *testing.T) {
	c := Config{Seed: 3, Epochs: 5, N: 2048, Ranks: 4, RanksPerNode: 2, Batch: 16, Capacity: 1024, Policy: Solar}
	s := mustNew(t, c)
	redealt := c.Capacity / (c.Batch * c.Ranks)
	for e := range s.Epochs() {
		for step := range e.Steps() {
			reads := make([]int, c.Ranks)
			sizes := make([]int, c.Ranks)
			for r := range c.Ranks {
				reads[r] = len(e.StorageReads(nil, step, r))
				sizes[r] = len(e.Samples(step, r))
			}
			spread := slices.Max(reads) - slices.Min(reads)
			switch {
			case e.Index > 0 && step < redealt:
				if spread > 1 {
					t.Fatalf("epoch %d re-dealt step %d: storage reads per rank %v, want within ±1", e.Index, step, reads)
				}
			default:
				if slices.Min(sizes) != c.Batch || slices.Max(sizes) != c.Batch {
					t.Fatalf("epoch %d step %d: local batches %v, want B everywhere outside the re-dealt steps", e.Index, step, sizes)
				}
			}
		}
	}
}

func TestSolarReproducesArtifact(t *testing.T) {
	for _, tc := range []struct {
		n, ranks, capacity int
		want               float64
	}{
		{2048, 4, 1024, 0.274},
		{2048, 4, 512, 0.075},
		{4096, 8, 2048, 0.264},
	} {
		for seed := range uint64(3) {
			c := Config{Seed: seed, Epochs: 10, N: tc.n, Ranks: tc.ranks, RanksPerNode: 1, Batch: 16, Capacity: tc.capacity, Policy: Solar}
			sum := mustNew(t, c).Summarize()
			t.Logf("N=%d P=%d C=%d seed %d: hit rate %.4f (artifact %.3f), path cost %d, in order %d",
				tc.n, tc.ranks, tc.capacity, seed, sum.HitRate, tc.want, sum.PathCost, sum.IdentityCost)
			if math.Abs(sum.HitRate-tc.want) > 0.02 {
				t.Errorf("N=%d P=%d C=%d seed %d: hit rate %.4f, want %.3f ± 0.02", tc.n, tc.ranks, tc.capacity, seed, sum.HitRate, tc.want)
			}
			if sum.PathCost > sum.IdentityCost {
				t.Errorf("path cost %d above the identity order's %d", sum.PathCost, sum.IdentityCost)
			}
		}
	}
}

func TestLocalityReachesBound(t *testing.T) {
	for _, frac := range []float64{0.25, 0.5, 0.75} {
		for _, drop := range []bool{false, true} {
			// 2000 is not a multiple of G = 64: padding or dropping moves
			// the rate off C/N a little.
			for _, n := range []int{2048, 2000} {
				c := Config{Seed: 11, Epochs: 10, N: n, Ranks: 4, RanksPerNode: 2, Batch: 16,
					Capacity: int(frac * float64(n)), DropLast: drop}
				sum := mustNew(t, c).Summarize()
				if math.Abs(sum.HitRate-sum.Bound) > 0.005 {
					t.Errorf("%v: hit rate %.4f, want C/N = %.4f ± 0.005", c, sum.HitRate, sum.Bound)
				}
				if sum.StorageReadsSpread > 1 {
					t.Errorf("%v: storage reads per step differ by %d between ranks", c, sum.StorageReadsSpread)
				}
				if sum.HitRatePerEpoch[0] < sum.Bound-0.005 {
					t.Errorf("%v: first epoch hit rate %.4f: pinned memory is warm from the start", c, sum.HitRatePerEpoch[0])
				}
			}
		}
	}
}

func TestStepsPrefetch(t *testing.T) {
	c := Config{Seed: 2, Epochs: 3, N: 200, Ranks: 4, RanksPerNode: 2, Batch: 8, Capacity: 100}
	s := mustNew(t, c)
	var epochs []*Epoch
	for e := range s.Epochs() {
		epochs = append(epochs, e)
	}
	type at struct{ e, s int }
	var all []at
	for _, e := range epochs {
		for step := range e.Steps() {
			all = append(all, at{e.Index, step})
		}
	}
	const ahead = 3
	i := 0
	for st := range s.Steps(ahead) {
		if st.Epoch.Index != all[i].e || st.Index != all[i].s {
			t.Fatalf("step %d is (%d, %d), want %v", i, st.Epoch.Index, st.Index, all[i])
		}
		for r := range c.Ranks {
			if !slices.Equal(st.Samples(r), epochs[st.Epoch.Index].Samples(st.Index, r)) {
				t.Fatalf("step %v rank %d: samples differ from the epoch's", all[i], r)
			}
			var want []int32
			for k := i + 1; k <= i+ahead && k < len(all) && all[k].e <= all[i].e+1; k++ {
				want = epochs[all[k].e].StorageReads(want, all[k].s, r)
			}
			if got := st.Prefetch(r); !slices.Equal(got, want) {
				t.Fatalf("step %v rank %d: prefetch %v, want %v", all[i], r, got, want)
			}
			if got := st.StorageReads(r); len(got) == 0 && len(st.Samples(r)) == 0 {
				t.Fatal("empty step")
			}
		}
		i++
	}
	if i != len(all) {
		t.Fatalf("Steps yielded %d steps, want %d", i, len(all))
	}
	// Stopping early stops the simulation.
	n := 0
	for range s.Steps(1) {
		if n++; n == 2 {
			break
		}
	}
}

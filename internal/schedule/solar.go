package schedule

// SOLAR (arXiv 2211.00224) as its public artifact runs it, with buffers held
// to their capacity:
//
//  1. E permutations of the samples (ours: Permutation(seed, e, n)).
//  2. cost[i][j] = ⌊|head_C(L[j]) \ tail_C(L[i])| / P⌋: the misses per rank
//     among the first C reads of epoch j when it follows epoch i, whose
//     last C reads the buffers hold.
//  3. The epoch order: an open path through all epochs of least total cost
//     (an asymmetric travelling salesman), found by a discrete particle
//     swarm (swarm.go).
//  4. In each epoch after the first, the global batches of its first ⌊C/G⌋
//     steps are re-dealt: a sample some rank buffers goes to that rank while
//     the rank has a free slot (B of them), the rest are read from storage,
//     split over the ranks round-robin (storage reads within ±1), each
//     reader taking what it read into its batch. The set of every global
//     batch is unchanged; local batch sizes differ between ranks.
//  5. Later steps, and the first epoch, read DistributedSampler's positions,
//     each rank through its own FIFO buffer of C/P samples.
//
// Where we differ: the artifact keeps what a rank reads for others in the
// re-dealt steps in a second buffer that it never empties, so its memory
// grows without bound. Held to the capacity, those reads are staged for
// their step and not kept: the FIFO buffers only take the reads of the
// positional steps, as the artifact's cache does. Nothing is evicted during
// the re-dealt steps, so every planned hit is a hit. The artifact sends a
// sample to the rank that read it in the previous epoch's last C positions;
// we send it to the rank whose buffer holds it, which is the same rank for
// C ≤ N/2 and, above that, also uses the older samples the buffers still
// hold. This reading gives the hit rates computed from the artifact's
// algorithm (in parentheses): 0.28 (0.274) at N=2048, P=4, B=16, C=1024,
// E=10; 0.074 (0.075) at C=512; 0.267 (0.264) at N=4096, P=8, C=2048 — over
// epochs ≥ 1, buffers at capacity (TestSolarReproducesArtifact).

import (
	"math/bits"
	"math/rand/v2"
	"slices"
)

// solarCosts returns SOLAR's epoch-to-epoch cost matrix. |head ∩ tail| is
// counted on bitsets, E² popcounts of n/64 words, where the artifact's
// Python loops take O(E²·C) dictionary operations.
//
// Under a byte budget head and tail are the longest head and tail of at
// most M bytes, and the cost is bytes: the bytes of head_M(L[j]) that
// tail_M(L[i]) does not hold, over P. The bytes of head ∩ tail are summed
// over bit planes: Σ_b 2^b · |head ∩ tail ∩ {x : bit b of size(x) set}|,
// one popcount per plane and word, exact.
func solarCosts(c Config) [][]int64 {
	if c.Bytes() {
		return solarByteCosts(c)
	}
	e, n, capa := c.Epochs, c.N, c.Capacity
	words := (n + 63) / 64
	head := make([]uint64, e*words)
	tail := make([]uint64, e*words)
	var p permuter
	var perm []int32
	for i := range e {
		perm = p.permute(c.Seed, i, n, perm)
		h, t := head[i*words:(i+1)*words], tail[i*words:(i+1)*words]
		for _, x := range perm[:capa] {
			h[x>>6] |= 1 << (x & 63)
		}
		for _, x := range perm[n-capa:] {
			t[x>>6] |= 1 << (x & 63)
		}
	}
	cost := make([][]int64, e)
	for i := range e {
		cost[i] = make([]int64, e)
		t := tail[i*words : (i+1)*words]
		for j := range e {
			if i == j {
				continue
			}
			h := head[j*words : (j+1)*words]
			both := 0
			for k, w := range t {
				both += bits.OnesCount64(w & h[k])
			}
			cost[i][j] = int64(capa-both) / int64(c.Ranks)
		}
	}
	return cost
}

func solarByteCosts(c Config) [][]int64 {
	e, n, capa, sizes := c.Epochs, c.N, c.CapacityBytes, c.Sizes
	words := (n + 63) / 64
	planes := bits.Len64(uint64(slices.Max(sizes)))
	plane := make([]uint64, words*planes) // word k of plane b at k*planes+b
	for x, sz := range sizes {
		for b := range planes {
			if sz&(1<<b) != 0 {
				plane[(x>>6)*planes+b] |= 1 << (x & 63)
			}
		}
	}
	head := make([]uint64, e*words)
	tail := make([]uint64, e*words)
	headBytes := make([]int64, e)
	var p permuter
	var perm []int32
	for i := range e {
		perm = p.permute(c.Seed, i, n, perm)
		h, t := head[i*words:(i+1)*words], tail[i*words:(i+1)*words]
		var sum int64
		for _, x := range perm {
			if sum+sizes[x] > capa {
				break
			}
			sum += sizes[x]
			h[x>>6] |= 1 << (x & 63)
		}
		headBytes[i] = sum
		sum = 0
		for k := n - 1; k >= 0; k-- {
			x := perm[k]
			if sum+sizes[x] > capa {
				break
			}
			sum += sizes[x]
			t[x>>6] |= 1 << (x & 63)
		}
	}
	cost := make([][]int64, e)
	for i := range e {
		cost[i] = make([]int64, e)
		t := tail[i*words : (i+1)*words]
		for j := range e {
			if i == j {
				continue
			}
			h := head[j*words : (j+1)*words]
			var both int64
			for k, w := range t {
				w &= h[k]
				if w == 0 {
					continue
				}
				for b, pw := range plane[k*planes : (k+1)*planes] {
					both += int64(bits.OnesCount64(w&pw)) << b
				}
			}
			cost[i][j] = (headBytes[j] - both) / int64(c.Ranks)
		}
	}
	return cost
}

// pathCost is the cost of running epochs in the order path.
func pathCost(cost [][]int64, path []int) int64 {
	var sum int64
	for k := 1; k < len(path); k++ {
		sum += cost[path[k-1]][path[k]]
	}
	return sum
}

// solarOrder returns the epoch order of the particle swarm, its cost and
// the cost of the identity order. Should the swarm end above the identity
// order (its start is drawn at random and never moves), the identity order
// is used: a schedule is never worse than running epochs as numbered.
func solarOrder(c Config, cost [][]int64) (order []int, cst, identity int64) {
	ident := make([]int, c.Epochs)
	for i := range ident {
		ident[i] = i
	}
	identity = pathCost(cost, ident)
	if c.Epochs < 2 {
		return ident, identity, identity
	}
	rng := rand.New(rand.NewPCG(c.Seed, swarmStream))
	order, cst = swarmPath(cost, c.SwarmPopulation, c.SwarmIterations, c.SwarmPBest, c.SwarmGBest, rng)
	if identity < cst {
		return ident, identity, identity
	}
	return order, cst, identity
}

// swarmStream separates the swarm's random numbers from anything else seeded
// with the same seed ("solar").
const swarmStream = 0x736f6c6172

type solarSim struct {
	s       *Schedule
	p       permuter
	perm    []int32
	buf     *fifo
	redealt int       // steps re-dealt at the start of each epoch after the first
	held    [][]int32 // per rank, the samples of the step it buffers
	load    []int32   // the step's storage reads
	// Under a byte budget: the storage reads of a re-dealt step dealt by
	// bytes, and the rank of each.
	dealer *byteDealer
	pos    []int32
	rankOf []int32
	give   [][]int32 // per rank, its storage reads
}

func newSolarSim(s *Schedule) *solarSim {
	c := s.cfg
	m := &solarSim{s: s, buf: newBuffers(c), held: make([][]int32, c.Ranks)}
	if c.Bytes() {
		m.dealer = newByteDealer(c.Ranks)
	} else {
		m.redealt = min(c.Capacity/(c.Batch*c.Ranks), s.geo.steps)
	}
	return m
}

// redealtSteps returns how many steps are re-dealt at the start of an epoch
// after the first: ⌊C/G⌋, or under a byte budget the leading steps whose
// global batches add up to at most M bytes.
func (m *solarSim) redealtSteps() int {
	c, g := m.s.cfg, m.s.geo
	if !c.Bytes() {
		return m.redealt
	}
	var sum int64
	for s := range g.steps {
		lo, hi := g.rankSteps(s)
		for k := lo * g.ranks; k < hi*g.ranks; k++ {
			if sum += c.Sizes[g.at(m.perm, k)]; sum > c.CapacityBytes {
				return s
			}
		}
	}
	return g.steps
}

func (m *solarSim) epoch(e *Epoch) {
	g := e.geo
	m.perm = m.p.permute(m.s.cfg.Seed, e.Perm, g.n, m.perm)
	from := 0
	if e.Index > m.s.cfg.ResumeEpoch { // the run's first epoch meets empty buffers
		from = m.redealtSteps()
		for s := range from {
			m.redeal(e, s)
		}
	}
	positional(e, g, m.perm, m.buf, from)
}

// skip replays epoch index through the buffers: the re-dealt steps only
// look the buffers up, so only the positional steps read through them.
func (m *solarSim) skip(index, perm int) {
	g := m.s.geoOf(index)
	m.perm = m.p.permute(m.s.cfg.Seed, perm, g.n, m.perm)
	from := 0
	if index > m.s.cfg.ResumeEpoch {
		from = m.redealtSteps()
	}
	positionalReads(g, m.perm, m.buf, from)
}

// redeal fills step s by SOLAR's re-dealing of its global batch.
func (m *solarSim) redeal(e *Epoch, s int) {
	g := e.geo
	lo, hi := g.rankSteps(s)
	slots := hi - lo // each rank's share of the global batch
	for r := range m.held {
		m.held[r] = m.held[r][:0]
	}
	m.load = m.load[:0]
	for k := lo * g.ranks; k < hi*g.ranks; k++ {
		x := g.at(m.perm, k)
		if r := m.buf.holder(x); r >= 0 && len(m.held[r]) < slots {
			m.held[r] = append(m.held[r], x)
			continue
		}
		m.load = append(m.load, x)
	}
	if m.dealer != nil {
		m.redealBytes(e)
		return
	}
	for r := range g.ranks {
		for _, x := range m.held[r] {
			e.add(x, true, true)
		}
		for i := r; i < len(m.load); i += g.ranks {
			e.add(m.load[i], false, false)
		}
		e.endRank()
	}
}

// redealBytes fills a re-dealt step with the storage reads dealt by bytes
// (bytes.go), each rank's in the permutation's order.
func (m *solarSim) redealBytes(e *Epoch) {
	sizes := m.s.cfg.Sizes
	m.pos = m.pos[:0]
	for i := range m.load {
		m.pos = append(m.pos, int32(i))
	}
	if cap(m.rankOf) < len(m.load) {
		m.rankOf = make([]int32, len(m.load))
	}
	m.rankOf = m.rankOf[:len(m.load)]
	m.dealer.deal(m.pos, func(i int32) int64 { return sizes[m.load[i]] }, nil, m.rankOf)
	if m.give == nil {
		m.give = make([][]int32, len(m.held))
	}
	for r := range m.give {
		m.give[r] = m.give[r][:0]
	}
	for i, x := range m.load {
		m.give[m.rankOf[i]] = append(m.give[m.rankOf[i]], x)
	}
	for r := range m.held {
		for _, x := range m.held[r] {
			e.add(x, true, true)
		}
		for _, x := range m.give[r] {
			e.add(x, false, false)
		}
		e.endRank()
	}
}

package schedule

// geometry is how an epoch's permutation becomes steps.
//
// Random and Solar follow PyTorch's DistributedSampler and DataLoader:
// without DropLast the permutation is padded to a multiple of the ranks by
// repeating its head; with DropLast its tail is cut to a multiple of the
// ranks. Rank r takes positions r, r+P, r+2P, ... (indices[r:total:P]) and
// its step s is its samples [s·B, (s+1)·B); the last step may be short, or is
// dropped with DropLast. So step s covers the positions [s·B·P, (s+1)·B·P) of
// the padded list: the global batch.
//
// Locality gives every rank exactly B samples: the permutation is cut into
// global batches of G = B·P, the last one padded with the permutation's head
// (or dropped with DropLast).
//
// The epoch a resumed run starts in (Config.ResumePosition X > 0) is the
// same with the positions X.. of the padded list in place of 0..: the M =
// n - X positions left are what the rules above deal (padding from the
// permutation's head, past n), over this run's ranks.
type geometry struct {
	n, ranks, batch int
	start           int // the position of the padded list the epoch starts at
	perRank         int // samples per rank per epoch (DistributedSampler's num_samples)
	steps           int
}

func newGeometry(c Config) geometry { return geometryFrom(c, 0) }

// geometryFrom is the geometry of an epoch dealing positions start.. of the
// padded list.
func geometryFrom(c Config, start int) geometry {
	g := geometry{n: c.N, ranks: c.Ranks, batch: c.Batch, start: start}
	m := c.N - start
	if c.Policy == Locality {
		gb := c.Batch * c.Ranks
		g.steps = ceilDiv(m, gb)
		if c.DropLast {
			g.steps = m / gb
		}
		g.perRank = g.steps * c.Batch
		return g
	}
	// DistributedSampler: num_samples = ceil((n - P) / P) with drop_last and
	// n % P != 0, that is floor(n / P); ceil(n / P) otherwise.
	g.perRank = ceilDiv(m, c.Ranks)
	if c.DropLast {
		g.perRank = m / c.Ranks
	}
	// DataLoader: batches of B, the short last one kept unless drop_last.
	g.steps = ceilDiv(g.perRank, c.Batch)
	if c.DropLast {
		g.steps = g.perRank / c.Batch
	}
	return g
}

// position returns the position of the padded list reached after the
// first steps steps: n once the epoch is done (its padding delivered, or
// its tail dropped).
func (g geometry) position(steps int) int {
	if steps >= g.steps {
		return g.n
	}
	return min(g.start+min(steps*g.batch, g.perRank)*g.ranks, g.n)
}

func ceilDiv(a, b int) int { return (a + b - 1) / b }

// at returns the sample at position k of the epoch (position start+k of
// the padded list of perm).
func (g geometry) at(perm []int32, k int) int32 {
	if k += g.start; k >= g.n {
		k %= g.n // padding repeats the head, as many times as it takes
	}
	return perm[k]
}

// rankSteps returns the range of rank-local indices [lo, hi) of step s under
// DistributedSampler; position of local index j of rank r is j·P + r.
func (g geometry) rankSteps(s int) (lo, hi int) {
	return s * g.batch, min((s+1)*g.batch, g.perRank)
}

// fifo is one FIFO buffer of c samples per rank: a read that misses stores
// the sample in the reading rank's buffer, evicting that buffer's oldest; a
// hit changes nothing.
//
// slot[x] is the slot of the newest copy of sample x, -1 if none; an older
// copy in another rank's buffer (possible when one rank reads a sample that
// another still buffers) is not seen. A copy is only ever made by a read of
// the sample, and every sample is read once an epoch, so this ignores a copy
// that no policy here would look for.
//
// Under a byte budget (newByteFIFO) each rank's buffer holds at most budget
// bytes instead: a store evicts the rank's oldest samples until the new one
// fits, and a sample larger than the whole buffer is not stored. There the
// newest copy of x is the store numbered seq[x] (0: none), by rank who[x].
type fifo struct {
	c    int
	ring []int32 // rank r's buffer is ring[r*c : (r+1)*c]
	next []int   // per rank, the slot the next store overwrites (its oldest)
	slot []int32

	sizes  []int64 // nil unless the buffers count bytes
	budget int64
	used   []int64     // per rank, bytes held
	queue  [][]fifoEnt // per rank, oldest first from head[r]
	head   []int
	seq    []int64
	who    []int32
	stores int64
}

type fifoEnt struct {
	x   int32
	seq int64
}

func newByteFIFO(sizes []int64, ranks int, budget int64) *fifo {
	return &fifo{sizes: sizes, budget: budget, used: make([]int64, ranks), queue: make([][]fifoEnt, ranks),
		head: make([]int, ranks), seq: make([]int64, len(sizes)), who: make([]int32, len(sizes))}
}

// newBuffers returns the buffers of Random and Solar: Capacity/Ranks
// samples per rank, or CapacityBytes/Ranks bytes.
func newBuffers(c Config) *fifo {
	if c.Bytes() {
		return newByteFIFO(c.Sizes, c.Ranks, c.CapacityBytes/int64(c.Ranks))
	}
	return newFIFO(c.N, c.Ranks, c.Capacity/c.Ranks)
}

func newFIFO(n, ranks, c int) *fifo {
	f := &fifo{c: c, ring: make([]int32, ranks*c), next: make([]int, ranks), slot: make([]int32, n)}
	for i := range f.ring {
		f.ring[i] = -1
	}
	for i := range f.slot {
		f.slot[i] = -1
	}
	return f
}

// holder returns the rank whose buffer holds x, or -1.
func (f *fifo) holder(x int32) int {
	if f.sizes != nil {
		if f.seq[x] == 0 {
			return -1
		}
		return int(f.who[x])
	}
	s := f.slot[x]
	if s < 0 {
		return -1
	}
	return int(s) / f.c
}

// store puts x in rank r's buffer, evicting its oldest sample.
func (f *fifo) store(r int, x int32) {
	if f.sizes != nil {
		f.storeBytes(r, x)
		return
	}
	k := r*f.c + f.next[r]
	if old := f.ring[k]; old >= 0 && f.slot[old] == int32(k) {
		f.slot[old] = -1
	}
	f.ring[k], f.slot[x] = x, int32(k)
	if f.next[r]++; f.next[r] == f.c {
		f.next[r] = 0
	}
}

func (f *fifo) storeBytes(r int, x int32) {
	s := f.sizes[x]
	if s > f.budget {
		return // read, not kept: it would evict the whole buffer and still not fit
	}
	q, h := f.queue[r], f.head[r]
	for f.used[r]+s > f.budget {
		old := q[h]
		h++
		f.used[r] -= f.sizes[old.x]
		if f.seq[old.x] == old.seq {
			f.seq[old.x] = 0
		}
	}
	if h > 64 && 2*h > len(q) {
		q = q[:copy(q, q[h:])]
		h = 0
	}
	f.stores++
	q = append(q, fifoEnt{x, f.stores})
	f.queue[r], f.head[r] = q, h
	f.seq[x], f.who[x] = f.stores, int32(r)
	f.used[r] += s
}

// read is a read of x by rank r through its buffer: a hit, or a storage
// read that stores x.
func (f *fifo) read(r int, x int32) bool {
	if f.holder(x) == r {
		return true
	}
	f.store(r, x)
	return false
}

// randomSim is the baseline: DistributedSampler's order with our
// permutation in place of torch.randperm (seeded by (seed, epoch) instead of
// torch.Generator().manual_seed(seed + epoch)), every rank reading through
// its own FIFO buffer of Capacity/Ranks samples. A read hits only in the
// reading rank's own buffer, as in SOLAR's artifact, whose buffers are
// private to each process.
type randomSim struct {
	s    *Schedule
	p    permuter
	perm []int32
	buf  *fifo
}

func newRandomSim(s *Schedule) *randomSim {
	return &randomSim{s: s, buf: newBuffers(s.cfg)}
}

func (m *randomSim) epoch(e *Epoch) {
	m.perm = m.p.permute(m.s.cfg.Seed, e.Perm, m.s.cfg.N, m.perm)
	positional(e, e.geo, m.perm, m.buf, 0)
}

func (m *randomSim) skip(index, perm int) {
	m.perm = m.p.permute(m.s.cfg.Seed, perm, m.s.cfg.N, m.perm)
	positionalReads(m.s.geoOf(index), m.perm, m.buf, 0)
}

// positional fills steps from..end of e the DistributedSampler way, every
// rank reading its own positions through its own buffer; with no buffer
// (nil), only the samples (e planned without hits).
func positional(e *Epoch, g geometry, perm []int32, buf *fifo, from int) {
	for s := from; s < g.steps; s++ {
		lo, hi := g.rankSteps(s)
		for r := range g.ranks {
			for j := lo; j < hi; j++ {
				x := g.at(perm, j*g.ranks+r)
				h := buf != nil && buf.read(r, x)
				e.add(x, h, h)
			}
			e.endRank()
		}
	}
}

// positionalReads is positional without an Epoch: the same reads through
// buf, in the same order, for epochs only replayed.
func positionalReads(g geometry, perm []int32, buf *fifo, from int) {
	for s := from; s < g.steps; s++ {
		lo, hi := g.rankSteps(s)
		for r := range g.ranks {
			for j := lo; j < hi; j++ {
				buf.read(r, g.at(perm, j*g.ranks+r))
			}
		}
	}
}

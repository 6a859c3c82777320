package schedule

// localitySim pins a fixed subset of Capacity samples in the job's memory,
// spread evenly over the nodes, and deals every global batch so that
//
//   - every rank gets exactly B samples (DDP's gradient average stays exact);
//   - every rank reads the same number of samples from storage, within ±1;
//   - as many memory hits as those two allow are read on the node whose
//     memory holds them.
//
// The pinned samples are 0..C-1, node k holding [⌊kC/K⌋, ⌊(k+1)C/K⌋) of K
// nodes: the store's layout, contiguous shards in rank order. Every sample
// is read once an epoch, so the hit rate is C/N in every epoch, the first
// one included (memory is filled before training).
//
// No policy does better while every epoch reads every sample once: a hit in
// epoch e+1 is a sample memory has held since its read in epoch e, so it was
// in memory at the boundary between the two epochs, where memory holds at
// most C samples. So epoch e+1 has at most C hits (padding aside), whatever
// the order of the epochs, the eviction, or what is known of the future.
// (Belady's MIN, knowing the whole schedule, reaches exactly C an epoch: it
// ends up holding the next epoch's first C samples at every boundary.) Only
// orders that are not a permutation per epoch could beat it.
//
// The deal of one global batch: with H pinned samples in it, every rank is
// to read ⌊H/P⌋ or ⌈H/P⌉ of them (so B minus that from storage). A node
// whose memory holds more of the batch than its ranks' ⌊H/P⌋ shares takes
// the ⌈H/P⌉ shares first; each node's ranks read its own pinned samples up
// to their shares; what is left over goes to the ranks of other nodes with
// room (a read from another node's memory); then storage reads fill every
// rank to B. Within a rank, memory hits come first, each group in the
// order of the permutation.
//
// Under a byte budget (Config.Sizes) the pinned set is the node table of
// pinBytes, and the storage reads are dealt first, by bytes, each rank's
// hits being what fills it to B (bytes.go).
type localitySim struct {
	s       *Schedule
	p       permuter
	perm    []int32
	nodes   int
	perNode int

	pinnedOn []int   // per node, pinned samples of the batch
	share    []int   // per node, hits its ranks read in all
	quota    []int   // per rank, hits it reads
	took     []int   // per rank, hits dealt so far
	cursor   []int   // per node, the first of its ranks that may have room
	over     []int32 // pinned samples left over by their node
	batch    []int32 // the global batch being dealt
	nodeAt   []int32 // the node holding each of batch, or -1
	slot     []int32 // the deal: rank r's samples are slot[r*B:(r+1)*B]
	slotHit  []bool
	slotNode []bool

	// Under a byte budget: the node pinning each sample (-1: none), and
	// the deal of storage reads by bytes.
	pinNode []int32
	dealer  *byteDealer
	reads   []int32 // positions in batch of the step's storage reads
	room    []int   // per rank, storage reads it takes
	rankOf  []int32 // per position in batch, the rank reading it from storage
}

func newLocalitySim(s *Schedule) *localitySim {
	c := s.cfg
	k := c.Ranks / c.RanksPerNode
	m := &localitySim{
		s: s, nodes: k, perNode: c.RanksPerNode,
		pinnedOn: make([]int, k), share: make([]int, k), cursor: make([]int, k),
		quota: make([]int, c.Ranks), took: make([]int, c.Ranks),
		batch: make([]int32, c.Ranks*c.Batch), nodeAt: make([]int32, c.Ranks*c.Batch),
		slot: make([]int32, c.Ranks*c.Batch), slotHit: make([]bool, c.Ranks*c.Batch), slotNode: make([]bool, c.Ranks*c.Batch),
		pinNode: s.pinNode,
	}
	if c.Bytes() {
		m.dealer = newByteDealer(c.Ranks)
		m.room = make([]int, c.Ranks)
		m.rankOf = make([]int32, c.Ranks*c.Batch)
	}
	return m
}

// nodeOf returns the node whose memory holds x, or -1 if none does.
func (m *localitySim) nodeOf(x int32) int {
	if m.pinNode != nil {
		return int(m.pinNode[x])
	}
	c := m.s.cfg.Capacity
	if int(x) >= c {
		return -1
	}
	return int(int64(x) * int64(m.nodes) / int64(c))
}

func (m *localitySim) epoch(e *Epoch) {
	c := m.s.cfg
	m.perm = m.p.permute(c.Seed, e.Perm, c.N, m.perm)
	gb := c.Batch * c.Ranks
	for s := range e.geo.steps {
		m.deal(e.geo, s*gb)
		for r := range c.Ranks {
			lo, hi := r*c.Batch, (r+1)*c.Batch
			e.addAll(m.slot[lo:hi], m.slotHit[lo:hi], m.slotNode[lo:hi])
			e.endRank()
		}
	}
}

// skip does nothing: the pinned set never changes, so an epoch carries
// nothing to the next.
func (m *localitySim) skip(int, int) {}

// deal deals the global batch at position first of the epoch of geometry g
// into m.slot.
func (m *localitySim) deal(g geometry, first int) {
	c := m.s.cfg
	p, b, r := c.Ranks, c.Batch, m.perNode
	gb := b * p
	clear(m.pinnedOn)
	hits := 0
	for i := range gb {
		x := g.at(m.perm, first+i)
		n := m.nodeOf(x)
		m.batch[i], m.nodeAt[i] = x, int32(n)
		if n >= 0 {
			m.pinnedOn[n]++
			hits++
		}
	}
	if m.dealer != nil {
		m.bytesQuotas()
	} else {
		m.countQuotas(hits)
	}
	for n := range m.nodes {
		m.cursor[n] = n * r
	}
	clear(m.took)
	m.over = m.over[:0]
	// Pinned samples to their own node's ranks, up to the node's share.
	for i, x := range m.batch {
		n := int(m.nodeAt[i])
		if n < 0 {
			continue
		}
		rk := m.cursor[n]
		for rk < (n+1)*r && m.took[rk] == m.quota[rk] {
			rk++
		}
		m.cursor[n] = rk
		if rk == (n+1)*r {
			m.over = append(m.over, x)
			continue
		}
		m.put(rk, m.took[rk], x, true, true)
		m.took[rk]++
	}
	// The rest of the pinned samples to ranks of other nodes with room.
	rk := 0
	for _, x := range m.over {
		for m.took[rk] == m.quota[rk] {
			rk++
		}
		m.put(rk, m.took[rk], x, true, false)
		m.took[rk]++
	}
	if m.dealer != nil {
		m.placeBytes()
		return
	}
	// Storage reads fill every rank to B.
	rk = 0
	for i, x := range m.batch {
		if m.nodeAt[i] >= 0 {
			continue
		}
		for m.took[rk] == b {
			rk++
		}
		m.put(rk, m.took[rk], x, false, false)
		m.took[rk]++
	}
}

// countQuotas sets each rank's memory hits for a batch of hits pinned
// samples: ⌊H/P⌋ or ⌈H/P⌉, so that storage reads are within ±1.
func (m *localitySim) countQuotas(hits int) {
	p, r := m.s.cfg.Ranks, m.perNode
	// Shares: ⌊H/P⌋ per rank, the H mod P extra ones first to nodes that
	// hold more than their ranks' ⌊H/P⌋ (each such extra is one more read
	// from a node's own memory), the rest to any node with a rank left.
	each, extra := hits/p, hits%p
	for n := range m.nodes {
		m.share[n] = r * each
		if want := min(r, max(0, m.pinnedOn[n]-r*each), extra); want > 0 {
			m.share[n] += want
			extra -= want
		}
	}
	for n := 0; extra > 0; n++ {
		give := min(r-(m.share[n]-r*each), extra)
		m.share[n] += give
		extra -= give
	}
	for n := range m.nodes {
		plus := m.share[n] - r*each
		for i := range r {
			m.quota[n*r+i] = each
			if i < plus {
				m.quota[n*r+i]++
			}
		}
	}
}

// bytesQuotas deals the batch's storage reads by bytes first (bytes.go):
// the largest first, each to the rank with the fewest bytes so far that
// has room under B; each rank's memory hits are then what fills it to B.
func (m *localitySim) bytesQuotas() {
	b, sizes := m.s.cfg.Batch, m.s.cfg.Sizes
	m.reads = m.reads[:0]
	for i := range m.batch {
		if m.nodeAt[i] < 0 {
			m.reads = append(m.reads, int32(i))
		}
	}
	for r := range m.room {
		m.room[r] = b
	}
	m.dealer.deal(m.reads, func(i int32) int64 { return sizes[m.batch[i]] }, m.room, m.rankOf)
	copy(m.quota, m.room)
}

// placeBytes puts the storage reads bytesQuotas dealt after each rank's
// hits, in the permutation's order.
func (m *localitySim) placeBytes() {
	for _, i := range m.reads {
		rk := int(m.rankOf[i])
		m.put(rk, m.took[rk], m.batch[i], false, false)
		m.took[rk]++
	}
}

func (m *localitySim) put(rank, i int, x int32, hit, local bool) {
	k := rank*m.s.cfg.Batch + i
	m.slot[k], m.slotHit[k], m.slotNode[k] = x, hit, local
}

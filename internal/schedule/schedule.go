package schedule

import (
	"fmt"
	"iter"
)

// Schedule is the plan of a whole job: which samples each rank reads at each
// step of each epoch, which of them memory holds and which come from
// storage. It is built from a Config alone; epochs are simulated on demand,
// one at a time, so a schedule of 100 epochs of 10^6 samples never holds
// more than two epochs.
type Schedule struct {
	cfg   Config
	order []int
	geo   geometry
	// The geometry of the epoch a resumed run starts in (its positions
	// Config.ResumePosition..); geo when the run starts an epoch whole.
	resumed geometry
	// Solar's epoch-to-epoch costs and the cost of its path through them
	// and of running epochs in their natural order; nil and 0 otherwise.
	cost         [][]int64
	pathCost     int64
	identityCost int64
	// Under a byte budget: the bytes of the dataset, k(M) (the most samples
	// that fit in M bytes), and Locality's pinned set (bytes.go).
	totalBytes  int64
	fitSamples  int
	pinNode     []int32
	pinnedCount int
	pinnedBytes int64
}

// New validates cfg and plans the order of epochs (for Solar, the cost
// matrix and the particle swarm: the expensive part); epochs themselves are
// simulated when iterated.
func New(cfg Config) (*Schedule, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg = cfg.withDefaults()
	s := &Schedule{cfg: cfg, geo: newGeometry(cfg), resumed: geometryFrom(cfg, cfg.ResumePosition)}
	if cfg.Bytes() {
		s.fitSamples, s.totalBytes = byteBounds(cfg.Sizes, cfg.CapacityBytes)
		if cfg.Policy == Locality {
			s.pinNode, s.pinnedCount, s.pinnedBytes = pinBytes(cfg.Sizes, cfg.CapacityBytes,
				cfg.Ranks/cfg.RanksPerNode, cfg.Pin)
		}
	}
	if cfg.Policy == Solar {
		oc := cfg
		if cfg.OrderRanks > 0 {
			oc.Ranks = cfg.OrderRanks
		}
		s.cost = solarCosts(oc)
		s.order, s.pathCost, s.identityCost = solarOrder(oc, s.cost)
	} else {
		s.order = make([]int, cfg.Epochs)
		for i := range s.order {
			s.order[i] = i
		}
	}
	return s, nil
}

// Config returns the configuration, defaults filled in.
func (s *Schedule) Config() Config { return s.cfg }

// Order returns, for each position in the run, the epoch whose permutation
// it draws: the identity except under Solar, which reorders epochs.
func (s *Schedule) Order() []int { return append([]int(nil), s.order...) }

// StepsPerEpoch returns how many steps every whole epoch has (all but the
// first of a resumed run, whose steps deal only the positions left).
func (s *Schedule) StepsPerEpoch() int { return s.geo.steps }

// First returns the position in the job of the run's first epoch:
// Config.ResumeEpoch, 0 for a run from the start.
func (s *Schedule) First() int { return s.cfg.ResumeEpoch }

// geoOf returns the geometry of the epoch at position i of the job.
func (s *Schedule) geoOf(i int) geometry {
	if i == s.cfg.ResumeEpoch {
		return s.resumed
	}
	return s.geo
}

// Epochs simulates the run and yields its epochs in the order they run,
// from First() (a resumed run's first epoch deals only the positions
// left). Each Epoch is the caller's to keep.
func (s *Schedule) Epochs() iter.Seq[*Epoch] {
	return func(yield func(*Epoch) bool) { s.run(false, yield) }
}

// run simulates the epochs in order; with reuse, it fills the same Epoch
// every time (the caller must be done with it before the next).
func (s *Schedule) run(reuse bool, yield func(*Epoch) bool) {
	sim := newSimulator(s)
	var e *Epoch
	for i := s.cfg.ResumeEpoch; i < len(s.order); i++ {
		if e == nil || !reuse {
			e = &Epoch{}
		}
		e.reset(i, s.order[i], s.geoOf(i), s.cfg.Sizes)
		sim.epoch(e)
		e.finish()
		if !yield(e) {
			return
		}
	}
}

// Epoch returns the epoch at position i of the job (First() ≤ i < Epochs),
// the same as the one of that Index that Epochs yields. Locality carries
// nothing from one epoch to the next, so there it costs one epoch. Random
// and Solar carry their buffers over, so it replays the buffers through
// the run's epochs before i (a permutation and a buffer lookup per sample
// each, no Epoch built) before filling epoch i. It panics if i is out of
// range.
func (s *Schedule) Epoch(i int) *Epoch {
	s.checkPosition(i)
	sim := newSimulator(s)
	for k := s.cfg.ResumeEpoch; k < i; k++ {
		sim.skip(k, s.order[k])
	}
	e := &Epoch{}
	e.reset(i, s.order[i], s.geoOf(i), s.cfg.Sizes)
	sim.epoch(e)
	e.finish()
	return e
}

// EpochSamples returns the epoch at position i with its samples exactly as
// Epoch(i) has them, but its memory hits only where they come free. Under
// Random the samples are DistributedSampler's positions of the epoch's
// permutation alone, so it costs one epoch, while the hits depend on the
// buffers' whole history: the epoch it returns has no hits (HasHits is
// false; Hits and NodeLocal return nil, Stats counts Accesses only).
// Under Locality it is Epoch(i), one epoch; under Solar, whose samples
// depend on the buffers (its re-dealt steps), it is Epoch(i), replayed.
// It panics if i is out of range.
func (s *Schedule) EpochSamples(i int) *Epoch {
	if s.cfg.Policy != Random {
		return s.Epoch(i)
	}
	s.checkPosition(i)
	e := &Epoch{}
	e.reset(i, s.order[i], s.geoOf(i), s.cfg.Sizes)
	e.noHits = true
	var p permuter
	perm := p.permute(s.cfg.Seed, e.Perm, s.cfg.N, nil)
	positional(e, e.geo, perm, nil, 0)
	e.finish()
	return e
}

func (s *Schedule) checkPosition(i int) {
	if i < s.cfg.ResumeEpoch || i >= len(s.order) {
		panic(fmt.Sprintf("schedule: epoch %d not in [%d, %d)", i, s.cfg.ResumeEpoch, len(s.order)))
	}
}

// simulator fills one epoch after another, carrying memory from each epoch
// to the next.
type simulator interface {
	epoch(e *Epoch)
	// skip runs epoch index of the run (drawing permutation perm) through
	// the memory the simulator carries, as epoch would, without filling an
	// Epoch.
	skip(index, perm int)
}

func newSimulator(s *Schedule) simulator {
	switch s.cfg.Policy {
	case Random:
		return newRandomSim(s)
	case Solar:
		return newSolarSim(s)
	default:
		return newLocalitySim(s)
	}
}

// Step is one step of the run, seen by every rank, with what to prefetch.
type Step struct {
	Epoch *Epoch // the epoch it belongs to
	Index int    // the step within the epoch
	next  *Epoch // the epoch after, nil for the last
	ahead int
}

// Samples returns what rank reads at this step.
func (st Step) Samples(rank int) []int32 { return st.Epoch.Samples(st.Index, rank) }

// Hits returns, for each of Samples(rank), whether memory holds it.
func (st Step) Hits(rank int) []bool { return st.Epoch.Hits(st.Index, rank) }

// StorageReads returns the samples rank reads from storage at this step.
func (st Step) StorageReads(rank int) []int32 { return st.Epoch.StorageReads(nil, st.Index, rank) }

// Prefetch returns the storage reads of rank in the next steps (as many as
// Steps was asked to look ahead), crossing into the next epoch: what a
// loader starts reading while this step trains.
func (st Step) Prefetch(rank int) []int32 {
	var out []int32
	e, i := st.Epoch, st.Index
	for range st.ahead {
		if i++; i == e.Steps() {
			if e != st.Epoch || st.next == nil {
				break
			}
			e, i = st.next, 0
		}
		out = e.StorageReads(out, i, rank)
	}
	return out
}

// Steps yields every step of the run in order; each Step's Prefetch looks
// ahead steps ahead (at most one epoch).
func (s *Schedule) Steps(ahead int) iter.Seq[Step] {
	ahead = max(0, min(ahead, s.geo.steps))
	return func(yield func(Step) bool) {
		var cur *Epoch
		emit := func(next *Epoch) bool {
			for i := range cur.Steps() {
				if !yield(Step{Epoch: cur, Index: i, next: next, ahead: ahead}) {
					return false
				}
			}
			return true
		}
		for e := range s.Epochs() {
			if cur != nil && !emit(e) {
				return
			}
			cur = e
		}
		if cur != nil {
			emit(nil)
		}
	}
}

// Epoch is one simulated epoch: each rank's samples at each step, whether
// memory held each one, and counts.
type Epoch struct {
	Index int // position in the job, from 0
	Perm  int // the epoch whose permutation it draws (Permutation(seed, Perm, n))
	Stats EpochStats

	ranks, steps int
	geo          geometry
	// The samples of rank r at step s are samples[bounds[s*ranks+r]:bounds[s*ranks+r+1]].
	bounds  []int32
	samples []int32
	hit     []bool  // memory held the sample
	local   []bool  // memory on the reading rank's node held it
	noHits  bool    // planned without memory (EpochSamples): hit and local are empty
	sizes   []int64 // bytes of every sample, nil unless the schedule counts bytes
}

// EpochStats counts what an epoch read.
type EpochStats struct {
	Accesses  int // samples read, padding included
	Hits      int // of them, served from memory
	LocalHits int // of the hits, served from the memory of the reader's node
	// Storage reads of one rank at one step: the least and the most over
	// the epoch's steps and ranks, and the largest difference between the
	// ranks of one step.
	ReadsMin, ReadsMax, ReadsSpread int
	// Under a byte budget (zero otherwise): bytes read, padding included,
	// and of them from memory; bytes one rank reads from storage at one
	// step, least and most over the steps and ranks; and over the steps,
	// the sums of the most and of the mean storage bytes of a rank (their
	// ratio is the imbalance: how much longer bandwidth-bound steps take
	// than if every rank read the step's mean), and the largest max/mean
	// of one step. StepFloorBytes sums, over the steps, the least any deal
	// of the step's storage reads can leave its busiest rank: the larger of
	// the mean and the largest read.
	StepFloorBytes                   float64
	Bytes, HitBytes                  int64
	StorageBytesMin, StorageBytesMax int64
	StepMaxBytes, StepMeanBytes      float64
	WorstStepImbalance               float64
}

// ByteHitRate returns HitBytes / Bytes (0 unless the schedule counts bytes).
func (s EpochStats) ByteHitRate() float64 {
	if s.Bytes == 0 {
		return 0
	}
	return float64(s.HitBytes) / float64(s.Bytes)
}

// Imbalance returns StepMaxBytes / StepMeanBytes: 1 when every rank of
// every step reads as many bytes from storage (0 without storage reads).
func (s EpochStats) Imbalance() float64 {
	if s.StepMeanBytes == 0 {
		return 0
	}
	return s.StepMaxBytes / s.StepMeanBytes
}

// HitRate returns Hits / Accesses.
func (s EpochStats) HitRate() float64 {
	if s.Accesses == 0 {
		return 0
	}
	return float64(s.Hits) / float64(s.Accesses)
}

// Steps returns the number of steps.
func (e *Epoch) Steps() int { return e.steps }

// Position returns how many positions of the epoch's global order (its
// permutation, padded) the first step steps deliver together, counted from
// the epoch's start (0, or Config.ResumePosition in the epoch a run
// resumes): Position(0) is where the epoch starts, Position(Steps()) is n
// (the epoch done: its padding delivered or its tail dropped; also when it
// has no step).
// A job stopped after step k of this epoch and resumed on any number of
// ranks with ResumePosition = Position(k) delivers exactly the positions
// it did not. It panics unless 0 ≤ step ≤ Steps().
func (e *Epoch) Position(step int) int {
	if step < 0 || step > e.steps {
		panic(fmt.Sprintf("schedule: step %d not in [0, %d]", step, e.steps))
	}
	return e.geo.position(step)
}

func (e *Epoch) span(step, rank int) (int32, int32) {
	k := step*e.ranks + rank
	return e.bounds[k], e.bounds[k+1]
}

// Samples returns the samples rank reads at step, in order.
func (e *Epoch) Samples(step, rank int) []int32 {
	lo, hi := e.span(step, rank)
	return e.samples[lo:hi:hi]
}

// HasHits tells whether the epoch knows which reads memory serves: false
// only for an epoch of EpochSamples under Random.
func (e *Epoch) HasHits() bool { return !e.noHits }

// Hits returns, for each of Samples(step, rank), whether memory holds it;
// nil unless HasHits.
func (e *Epoch) Hits(step, rank int) []bool {
	if e.noHits {
		return nil
	}
	lo, hi := e.span(step, rank)
	return e.hit[lo:hi:hi]
}

// NodeLocal returns, for each of Samples(step, rank), whether the memory
// of rank's own node holds it; nil unless HasHits.
func (e *Epoch) NodeLocal(step, rank int) []bool {
	if e.noHits {
		return nil
	}
	lo, hi := e.span(step, rank)
	return e.local[lo:hi:hi]
}

// Bytes returns the bytes rank reads at step (0 unless the schedule counts
// bytes).
func (e *Epoch) Bytes(step, rank int) int64 {
	var n int64
	if e.sizes == nil {
		return 0
	}
	for _, x := range e.Samples(step, rank) {
		n += e.sizes[x]
	}
	return n
}

// StorageBytes returns the bytes rank reads from storage at step (0 unless
// the schedule counts bytes). It panics unless HasHits.
func (e *Epoch) StorageBytes(step, rank int) int64 {
	if e.noHits {
		panic("schedule: storage bytes of an epoch planned without its hits (EpochSamples)")
	}
	if e.sizes == nil {
		return 0
	}
	lo, hi := e.span(step, rank)
	var n int64
	for k := lo; k < hi; k++ {
		if !e.hit[k] {
			n += e.sizes[e.samples[k]]
		}
	}
	return n
}

// StorageReads appends to dst the samples rank reads from storage at step.
// It panics unless HasHits.
func (e *Epoch) StorageReads(dst []int32, step, rank int) []int32 {
	if e.noHits {
		panic("schedule: storage reads of an epoch planned without its hits (EpochSamples)")
	}
	lo, hi := e.span(step, rank)
	for k := lo; k < hi; k++ {
		if !e.hit[k] {
			dst = append(dst, e.samples[k])
		}
	}
	return dst
}

// Global returns the samples of every rank at step, rank after rank: the
// global batch.
func (e *Epoch) Global(step int) []int32 {
	lo, _ := e.span(step, 0)
	_, hi := e.span(step, e.ranks-1)
	return e.samples[lo:hi:hi]
}

func (e *Epoch) reset(index, perm int, g geometry, sizes []int64) {
	e.Index, e.Perm, e.Stats, e.noHits, e.sizes = index, perm, EpochStats{}, false, sizes
	e.ranks, e.steps, e.geo = g.ranks, g.steps, g
	e.bounds = append(e.bounds[:0], 0)
	e.samples, e.hit, e.local = e.samples[:0], e.hit[:0], e.local[:0]
}

// add appends a sample to the rank being filled; endRank closes it. Ranks
// are filled in order, rank 0 of step 0 first.
func (e *Epoch) add(x int32, hit, local bool) {
	e.samples = append(e.samples, x)
	if e.noHits {
		return
	}
	e.hit = append(e.hit, hit)
	e.local = append(e.local, local)
}

func (e *Epoch) addAll(xs []int32, hit, local []bool) {
	e.samples = append(e.samples, xs...)
	e.hit = append(e.hit, hit...)
	e.local = append(e.local, local...)
}

func (e *Epoch) endRank() { e.bounds = append(e.bounds, int32(len(e.samples))) }

// finish counts the epoch once it is filled.
func (e *Epoch) finish() {
	if len(e.bounds) != e.steps*e.ranks+1 {
		panic("schedule: epoch filled with the wrong number of (step, rank) batches")
	}
	if e.noHits {
		e.Stats = EpochStats{Accesses: len(e.samples)}
		if e.sizes != nil {
			for _, x := range e.samples {
				e.Stats.Bytes += e.sizes[x]
			}
		}
		return
	}
	st := EpochStats{Accesses: len(e.samples), ReadsMin: -1}
	for k, h := range e.hit {
		if h {
			st.Hits++
			if e.local[k] {
				st.LocalHits++
			}
		}
	}
	for s := range e.steps {
		lo, hi := -1, -1
		for r := range e.ranks {
			a, b := e.span(s, r)
			n := 0
			for k := a; k < b; k++ {
				if !e.hit[k] {
					n++
				}
			}
			if lo < 0 || n < lo {
				lo = n
			}
			hi = max(hi, n)
		}
		if st.ReadsMin < 0 || lo < st.ReadsMin {
			st.ReadsMin = lo
		}
		st.ReadsMax = max(st.ReadsMax, hi)
		st.ReadsSpread = max(st.ReadsSpread, hi-lo)
	}
	st.ReadsMin = max(st.ReadsMin, 0)
	if e.sizes != nil {
		e.byteStats(&st)
	}
	e.Stats = st
}

// byteStats counts the bytes of a filled epoch.
func (e *Epoch) byteStats(st *EpochStats) {
	for k, x := range e.samples {
		st.Bytes += e.sizes[x]
		if e.hit[k] {
			st.HitBytes += e.sizes[x]
		}
	}
	st.StorageBytesMin = -1
	for s := range e.steps {
		var sum, hi, largest int64
		for r := range e.ranks {
			lo, end := e.span(s, r)
			for k := lo; k < end; k++ {
				if !e.hit[k] {
					largest = max(largest, e.sizes[e.samples[k]])
				}
			}
			n := e.StorageBytes(s, r)
			sum += n
			hi = max(hi, n)
			if st.StorageBytesMin < 0 || n < st.StorageBytesMin {
				st.StorageBytesMin = n
			}
		}
		st.StorageBytesMax = max(st.StorageBytesMax, hi)
		mean := float64(sum) / float64(e.ranks)
		st.StepMaxBytes += float64(hi)
		st.StepMeanBytes += mean
		st.StepFloorBytes += max(mean, float64(largest))
		if mean > 0 {
			st.WorstStepImbalance = max(st.WorstStepImbalance, float64(hi)/mean)
		}
	}
	st.StorageBytesMin = max(st.StorageBytesMin, 0)
}

// Summary is what a whole run reads.
type Summary struct {
	Config          Config
	Order           []int     // the epoch each position of the run draws
	StepsPerEpoch   int       //
	HitRatePerEpoch []float64 // in run order
	PerEpoch        []EpochStats
	// HitRate is the mean of HitRatePerEpoch over the run's epochs after
	// its first (the warm ones: epochs ≥ 1, or after ResumeEpoch; the first
	// alone when there is one). PerEpoch and the per-epoch slices start at
	// the run's first epoch, Config.ResumeEpoch. Bound is C/N, the best a
	// fixed subset of memory does when every epoch is uniformly random.
	HitRate, Bound float64
	// Storage reads of one rank at one step over epochs ≥ 1: least, most,
	// and the largest difference between the ranks of a step.
	StorageReadsMin, StorageReadsMax, StorageReadsSpread int
	// NodeLocal is the fraction of memory hits (epochs ≥ 1) read on the
	// node whose memory holds the sample.
	NodeLocal float64
	// Solar: the cost (SOLAR's estimated misses per rank, in bytes under
	// a byte budget) of the path its particle swarm chose and of running
	// epochs in order.
	PathCost, IdentityCost int64
	// Under a byte budget (zero otherwise; Bound is then k(M)/N, the
	// sample hit rate's bound, k(M) the most samples that fit in M bytes):
	// the dataset's bytes; ByteHitRate, the mean over the warm epochs of
	// the fraction of bytes read from memory, and its bound M/S; the
	// samples and bytes Locality pins; bytes one rank reads from storage at
	// one step (warm epochs), least and most; the imbalance of storage
	// bytes over the ranks of a step (Σ max / Σ mean over the warm steps)
	// and the worst step's max/mean.
	TotalBytes                       int64
	ByteHitRatePerEpoch              []float64
	ByteHitRate, ByteBound           float64
	FitSamples                       int
	PinnedSamples                    int
	PinnedBytes                      int64
	StorageBytesMin, StorageBytesMax int64
	StorageBytesImbalance            float64
	WorstStepImbalance               float64
	// ImbalanceFloor is the least StorageBytesImbalance any deal of the
	// same storage reads could have: Σ max(mean, largest read) / Σ mean.
	ImbalanceFloor float64
}

// Summarize simulates the whole run and returns its figures, holding one
// epoch at a time.
func (s *Schedule) Summarize() Summary {
	sum := Summary{
		Config: s.cfg, Order: s.Order(), StepsPerEpoch: s.geo.steps,
		Bound:    float64(s.cfg.Capacity) / float64(s.cfg.N),
		PathCost: s.pathCost, IdentityCost: s.identityCost,
		StorageReadsMin: -1,
	}
	bytes := s.cfg.Bytes()
	if bytes {
		sum.Bound = float64(s.fitSamples) / float64(s.cfg.N)
		sum.ByteBound = float64(s.cfg.CapacityBytes) / float64(s.totalBytes)
		sum.TotalBytes, sum.FitSamples = s.totalBytes, s.fitSamples
		sum.PinnedSamples, sum.PinnedBytes = s.pinnedCount, s.pinnedBytes
		sum.StorageBytesMin = -1
	}
	var hits, local int64
	var stepMax, stepMean, stepFloor float64
	warm := 0
	s.run(true, func(e *Epoch) bool {
		st := e.Stats
		sum.HitRatePerEpoch = append(sum.HitRatePerEpoch, st.HitRate())
		sum.PerEpoch = append(sum.PerEpoch, st)
		if bytes {
			sum.ByteHitRatePerEpoch = append(sum.ByteHitRatePerEpoch, st.ByteHitRate())
		}
		if e.Index == s.cfg.ResumeEpoch && len(s.order)-s.cfg.ResumeEpoch > 1 {
			return true
		}
		warm++
		if bytes {
			sum.ByteHitRate += st.ByteHitRate()
			if sum.StorageBytesMin < 0 || st.StorageBytesMin < sum.StorageBytesMin {
				sum.StorageBytesMin = st.StorageBytesMin
			}
			sum.StorageBytesMax = max(sum.StorageBytesMax, st.StorageBytesMax)
			stepMax += st.StepMaxBytes
			stepMean += st.StepMeanBytes
			stepFloor += st.StepFloorBytes
			sum.WorstStepImbalance = max(sum.WorstStepImbalance, st.WorstStepImbalance)
		}
		sum.HitRate += st.HitRate()
		hits += int64(st.Hits)
		local += int64(st.LocalHits)
		if sum.StorageReadsMin < 0 || st.ReadsMin < sum.StorageReadsMin {
			sum.StorageReadsMin = st.ReadsMin
		}
		sum.StorageReadsMax = max(sum.StorageReadsMax, st.ReadsMax)
		sum.StorageReadsSpread = max(sum.StorageReadsSpread, st.ReadsSpread)
		return true
	})
	sum.HitRate /= float64(warm)
	if bytes {
		sum.ByteHitRate /= float64(warm)
		sum.StorageBytesMin = max(sum.StorageBytesMin, 0)
		if stepMean > 0 {
			sum.StorageBytesImbalance = stepMax / stepMean
			sum.ImbalanceFloor = stepFloor / stepMean
		}
	}
	if hits > 0 {
		sum.NodeLocal = float64(local) / float64(hits)
	}
	return sum
}

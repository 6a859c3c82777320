package schedule

import (
	"fmt"
	"math"

	"github.com/ddstore-go/ddstore/internal/base"
)

// Policy names how a schedule places samples and what memory holds.
type Policy string

const (
	// Random is PyTorch's DistributedSampler with a FIFO buffer of
	// Capacity/Ranks samples per rank: the baseline.
	Random Policy = "random"
	// Solar is SOLAR's artifact: epochs reordered by a particle swarm,
	// re-dealing at the start of each epoch, a FIFO buffer per rank.
	Solar Policy = "solar"
	// Locality pins Capacity samples across the job's nodes and gives every
	// rank exactly Batch samples a step, those in memory on its own node
	// wherever it can. The default.
	Locality Policy = "locality"
)

// Policies lists the policies in the order the command line shows them.
var Policies = []Policy{Random, Solar, Locality}

// Defaults of the particle swarm, those of SOLAR's artifact.
const (
	DefaultSwarmIterations = 1000
	DefaultSwarmPBest      = 0.9 // α: probability of each swap towards a particle's own best
	DefaultSwarmGBest      = 1.0 // β: probability of each swap towards the swarm's best
)

// Config is everything a schedule is a function of.
type Config struct {
	Seed         uint64 // seeds every epoch's permutation and the particle swarm
	Epochs       int    // E
	N            int    // samples in the dataset
	Ranks        int    // P, the job's world size
	RanksPerNode int    // ranks sharing a node's memory; divides Ranks
	Batch        int    // B, samples per rank per step (the local batch)
	Capacity     int    // C, samples the whole job holds in memory
	Policy       Policy // "" means Locality
	// DropLast drops what does not fill whole batches (DistributedSampler
	// and DataLoader drop_last=True) instead of padding with the epoch's
	// first samples.
	DropLast bool
	// The particle swarm of Solar: population (0: Epochs), iterations (0:
	// 1000), and the probabilities α (0: 0.9) and β (0: 1) of applying each
	// swap towards a particle's own best and the swarm's best.
	SwarmPopulation int
	SwarmIterations int
	SwarmPBest      float64
	SwarmGBest      float64
	// Sizes, when set, are the bytes of every sample (N of them, each ≥ 0):
	// rows differ in size, and memory is a byte budget, CapacityBytes,
	// instead of Capacity samples (which must then be 0). Schedules
	// without Sizes are those of the sample count, unchanged.
	Sizes         []int64 `json:",omitempty"`
	CapacityBytes int64   `json:",omitempty"` // M, bytes the whole job holds in memory
	// Pin is what Locality's pinned set maximises under a byte budget:
	// PinBytes (the default) or PinSamples. Only with Sizes.
	Pin Pin `json:",omitempty"`
	// A run that resumes a job (on this or another number of ranks) starts
	// at ResumeEpoch, the epoch of the job it resumes, of which the first
	// ResumePosition positions of the global order (the epoch's
	// permutation, padded: Epoch.Positions) were delivered before: that
	// epoch deals positions ResumePosition.. over this run's ranks, later
	// epochs are whole. Epochs before ResumeEpoch are not part of the run,
	// and the buffers of Random and Solar start empty at ResumeEpoch (a
	// restarted process holds nothing). 0 and 0: a run from the start.
	ResumeEpoch    int `json:",omitempty"`
	ResumePosition int `json:",omitempty"`
	// OrderRanks is the world size whose cost matrix orders Solar's
	// epochs (0: Ranks): the job's first run, so that a job resumed on
	// another number of ranks keeps the order of epochs it started with.
	OrderRanks int `json:",omitempty"`
}

// Pin names what the pinned set of Locality maximises under a byte budget.
type Pin string

const (
	// PinBytes fills the budget (samples in index order, then any that
	// still fit): the byte hit rate, the fraction of bytes read from
	// memory, reaches M/S less what the largest samples leave unfilled.
	// Storage traffic is bytes, so this is the default.
	PinBytes Pin = "bytes"
	// PinSamples pins the smallest samples first: the sample hit rate
	// reaches its bound, the number of smallest samples that fit in M over
	// N, and the byte hit rate falls below M/S by as much as the pinned
	// samples are smaller than the mean.
	PinSamples Pin = "samples"
)

// Bytes tells whether the schedule counts memory in bytes (Sizes set).
func (c Config) Bytes() bool { return c.Sizes != nil }

// withDefaults fills the zero values that stand for a default.
func (c Config) withDefaults() Config {
	if c.Policy == "" {
		c.Policy = Locality
	}
	if c.SwarmPopulation == 0 {
		c.SwarmPopulation = c.Epochs
	}
	if c.SwarmIterations == 0 {
		c.SwarmIterations = DefaultSwarmIterations
	}
	if c.SwarmPBest == 0 {
		c.SwarmPBest = DefaultSwarmPBest
	}
	if c.SwarmGBest == 0 {
		c.SwarmGBest = DefaultSwarmGBest
	}
	if c.Sizes != nil && c.Pin == "" {
		c.Pin = PinBytes
	}
	return c
}

func argErr(format string, args ...any) error {
	return base.Errorf(base.ErrArgument, "schedule: "+format, args...)
}

// Validate reports the first value a schedule cannot be built from, as an
// error wrapping base.ErrArgument that names it.
func (c Config) Validate() error {
	c = c.withDefaults()
	ints := []struct {
		name string
		v    int
	}{{"epochs", c.Epochs}, {"n", c.N}, {"ranks", c.Ranks}, {"ranks per node", c.RanksPerNode},
		{"batch", c.Batch}, {"capacity", c.Capacity}}
	if c.Bytes() {
		ints = ints[:len(ints)-1] // the budget is CapacityBytes
	}
	for _, v := range ints {
		if v.v <= 0 {
			return argErr("%s %d: want a positive number", v.name, v.v)
		}
	}
	switch {
	case c.N > MaxSamples:
		return argErr("n %d above %d", c.N, MaxSamples)
	case c.Ranks%c.RanksPerNode != 0:
		return argErr("ranks per node %d does not divide ranks %d", c.RanksPerNode, c.Ranks)
	case c.Capacity > c.N:
		return argErr("capacity %d above n %d: memory holds at most the whole dataset", c.Capacity, c.N)
	case int64(c.Batch)*int64(c.Ranks) > int64(c.N):
		return argErr("batch %d × ranks %d = %d above n %d: not one global batch", c.Batch, c.Ranks,
			int64(c.Batch)*int64(c.Ranks), c.N)
	}
	if err := c.validateBytes(); err != nil {
		return err
	}
	switch {
	case c.ResumeEpoch < 0 || c.ResumeEpoch >= c.Epochs:
		return argErr("resume epoch %d not in [0, %d): epochs %d", c.ResumeEpoch, c.Epochs, c.Epochs)
	case c.ResumePosition < 0 || c.ResumePosition > c.N:
		return argErr("resume position %d not in [0, %d]: positions of an epoch of n %d", c.ResumePosition, c.N, c.N)
	case c.OrderRanks < 0:
		return argErr("order ranks %d: want a positive number (0: ranks)", c.OrderRanks)
	case c.OrderRanks != 0 && c.Policy != Solar:
		return argErr("order ranks %d with policy %s: only solar orders epochs", c.OrderRanks, c.Policy)
	}
	switch c.Policy {
	case Random, Solar:
		if c.Bytes() && c.CapacityBytes < int64(c.Ranks) {
			return argErr("capacity bytes %d below ranks %d: policy %s gives each rank a buffer of capacity bytes/ranks",
				c.CapacityBytes, c.Ranks, c.Policy)
		}
		if !c.Bytes() && c.Capacity < c.Ranks {
			return argErr("capacity %d below ranks %d: policy %s gives each rank a buffer of capacity/ranks samples",
				c.Capacity, c.Ranks, c.Policy)
		}
	case Locality:
	default:
		return argErr("policy %q: want one of %q, %q, %q", c.Policy, Random, Solar, Locality)
	}
	if c.Policy == Solar {
		switch {
		case c.SwarmPopulation < 0:
			return argErr("swarm population %d: want a positive number (0: epochs)", c.SwarmPopulation)
		case c.SwarmIterations < 0:
			return argErr("swarm iterations %d: want a positive number (0: %d)", c.SwarmIterations, DefaultSwarmIterations)
		case !(c.SwarmPBest > 0 && c.SwarmPBest <= 1):
			return argErr("swarm α %v: want a probability in (0, 1]", c.SwarmPBest)
		case !(c.SwarmGBest > 0 && c.SwarmGBest <= 1):
			return argErr("swarm β %v: want a probability in (0, 1]", c.SwarmGBest)
		case int64(c.Epochs)*int64(c.N) > maxSolarBits:
			return argErr("epochs %d × n %d: solar's cost matrix needs two bitsets of n bits per epoch, "+
				"over %d GiB", c.Epochs, c.N, maxSolarBits>>32)
		}
	}
	return nil
}

// validateBytes checks the byte budget and the sizes it is counted in.
func (c Config) validateBytes() error {
	if !c.Bytes() {
		switch {
		case c.CapacityBytes != 0:
			return argErr("capacity bytes %d without sizes: a byte budget needs every sample's size", c.CapacityBytes)
		case c.Pin != "":
			return argErr("pin %q without sizes: it chooses under a byte budget", c.Pin)
		}
		return nil
	}
	if len(c.Sizes) != c.N {
		return argErr("sizes of %d samples, n %d: want one size per sample", len(c.Sizes), c.N)
	}
	var total int64
	for i, s := range c.Sizes {
		if s < 0 {
			return argErr("size %d of sample %d: want a size in bytes, ≥ 0", s, i)
		}
		if total += s; total < 0 {
			return argErr("sizes add up to more than %d bytes", int64(math.MaxInt64))
		}
	}
	switch {
	case c.Capacity != 0:
		return argErr("capacity %d with sizes: the budget is capacity bytes; leave capacity 0", c.Capacity)
	case total == 0:
		return argErr("sizes of %d samples add up to 0 bytes", c.N)
	case c.CapacityBytes <= 0:
		return argErr("capacity bytes %d: want a positive number", c.CapacityBytes)
	case c.CapacityBytes > total:
		return argErr("capacity bytes %d above the dataset's %d: memory holds at most the whole dataset", c.CapacityBytes, total)
	case c.Pin != PinBytes && c.Pin != PinSamples:
		return argErr("pin %q: want %q or %q", c.Pin, PinBytes, PinSamples)
	}
	return nil
}

// maxSolarBits bounds epochs × n for Solar, whose cost matrix holds two
// n-bit sets per epoch: 2^35 bits each is 8 GiB in all.
const maxSolarBits = 1 << 35

func (c Config) String() string {
	if c.Bytes() {
		return fmt.Sprintf("policy %s, n %d, ranks %d (%d per node), batch %d, epochs %d, capacity %d bytes (pin %s), seed %d",
			c.Policy, c.N, c.Ranks, c.RanksPerNode, c.Batch, c.Epochs, c.CapacityBytes, c.Pin, c.Seed)
	}
	return fmt.Sprintf("policy %s, n %d, ranks %d (%d per node), batch %d, epochs %d, capacity %d, seed %d",
		c.Policy, c.N, c.Ranks, c.RanksPerNode, c.Batch, c.Epochs, c.Capacity, c.Seed)
}

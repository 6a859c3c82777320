package schedule

import (
	"fmt"

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
}

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
	return c
}

func argErr(format string, args ...any) error {
	return base.Errorf(base.ErrArgument, "schedule: "+format, args...)
}

// Validate reports the first value a schedule cannot be built from, as an
// error wrapping base.ErrArgument that names it.
func (c Config) Validate() error {
	c = c.withDefaults()
	for _, v := range []struct {
		name string
		v    int
	}{{"epochs", c.Epochs}, {"n", c.N}, {"ranks", c.Ranks}, {"ranks per node", c.RanksPerNode},
		{"batch", c.Batch}, {"capacity", c.Capacity}} {
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
	switch c.Policy {
	case Random, Solar:
		if c.Capacity < c.Ranks {
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

// maxSolarBits bounds epochs × n for Solar, whose cost matrix holds two
// n-bit sets per epoch: 2^35 bits each is 8 GiB in all.
const maxSolarBits = 1 << 35

func (c Config) String() string {
	return fmt.Sprintf("policy %s, n %d, ranks %d (%d per node), batch %d, epochs %d, capacity %d, seed %d",
		c.Policy, c.N, c.Ranks, c.RanksPerNode, c.Batch, c.Epochs, c.Capacity, c.Seed)
}

package schedule

import (
	"errors"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"

	"github.com/ddstore-go/ddstore/internal/base"
)

// resumedConfig is c resumed at epoch e, position pos, on ranks ranks of
// perNode per node with local batches of batch (capacity kept within what
// the policy needs).
func resumedConfig(c Config, e, pos, ranks, perNode, batch int) Config {
	r := c
	r.Ranks, r.RanksPerNode, r.Batch = ranks, perNode, batch
	r.ResumeEpoch, r.ResumePosition = e, pos
	if c.Policy == Solar {
		r.OrderRanks = c.Ranks
	}
	if !c.Bytes() {
		r.Capacity = max(c.Capacity, ranks)
	} else {
		r.CapacityBytes = max(c.CapacityBytes, int64(ranks))
	}
	return r
}

// paddedAt is position k of epoch perm's padded global order.
func paddedAt(perm []int32, k int) int32 { return perm[k%len(perm)] }

// TestResumeOnAnotherWorldSize stops every policy's run after k steps of an
// epoch and resumes it on another number of ranks, nodes and local batch
// at Position(k): the two runs together deliver the epoch's padded global
// order, each position once (every sample once in the first n), every
// global batch of the resumed run is the next positions, and the epochs
// after are those of a job of the new geometry from the start.
func TestResumeOnAnotherWorldSize(t *testing.T) {
	rng := rand.New(rand.NewPCG(5, 6))
	for _, c := range configs() {
		s := mustNew(t, c)
		e := rng.IntN(c.Epochs)
		ep := s.Epoch(e)
		k := rng.IntN(ep.Steps() + 1)
		pos := ep.Position(k)
		var ranks, batch int
		for {
			ranks = []int{1, 2, 3, 4, 6}[rng.IntN(5)]
			batch = 1 + rng.IntN(5)
			if batch*ranks <= c.N {
				break
			}
		}
		perNode := []int{1, ranks}[rng.IntN(2)]
		rc := resumedConfig(c, e, pos, ranks, perNode, batch)
		r := mustNew(t, rc)
		re := r.Epoch(e)
		perm := Permutation(c.Seed, ep.Perm, c.N)
		// The first run's k steps are positions [0, pos).
		var first []int32
		for st := range k {
			first = append(first, ep.Global(st)...)
		}
		if k < ep.Steps() {
			want := make([]int32, pos)
			for i := range want {
				want[i] = paddedAt(perm, i)
			}
			if !slices.Equal(sorted(first), sorted(want)) {
				t.Fatalf("%v: epoch %d, %d steps: delivered %v, want positions [0, %d)", c, e, k, first, pos)
			}
		}
		// The resumed run's steps are the next positions, in order of steps.
		at := pos
		var second []int32
		for st := range re.Steps() {
			g := re.Global(st)
			want := make([]int32, len(g))
			for i := range want {
				want[i] = paddedAt(perm, at+i)
			}
			if !slices.Equal(sorted(g), sorted(want)) {
				t.Fatalf("%v resumed as %v: step %d: global batch %v, want positions from %d: %v", c, rc, st, g, at, want)
			}
			if rc.Policy == Locality {
				for rk := range ranks {
					if len(re.Samples(st, rk)) != batch {
						t.Fatalf("%v: step %d rank %d reads %d, want %d", rc, st, rk, len(re.Samples(st, rk)), batch)
					}
				}
			}
			at += len(g)
			second = append(second, g...)
			if st+1 < re.Steps() && re.Position(st+1) != at {
				t.Fatalf("%v: Position(%d) = %d after %d positions", rc, st+1, re.Position(st+1), at)
			}
		}
		if (re.Steps() > 0 && re.Position(0) != pos) || re.Position(re.Steps()) != c.N {
			t.Fatalf("%v: positions %d..%d, want %d..%d", rc, re.Position(0), re.Position(re.Steps()), pos, c.N)
		}
		if k < ep.Steps() && !c.DropLast {
			// Every sample once, and once more for each padding position
			// (past n) that repeats it.
			count := make([]int, c.N)
			for _, x := range first {
				count[x]++
			}
			for _, x := range second {
				count[x]++
			}
			want := make([]int, c.N)
			for i := range len(first) + len(second) {
				want[paddedAt(perm, i)]++
			}
			for _, x := range perm {
				if count[x] != want[x] || want[x] < 1 {
					t.Fatalf("%v then %v: epoch %d: sample %d delivered %d times, want %d", c, rc, e, x, count[x], want[x])
				}
			}
		}
		// Later epochs: a job of the new geometry's, from the start (solar
		// keeps the first run's epoch order; its re-dealt steps follow the
		// buffers, which a restarted job's history made).
		if e+1 < c.Epochs && rc.Policy != Solar {
			fresh := rc
			fresh.ResumeEpoch, fresh.ResumePosition, fresh.OrderRanks = 0, 0, 0
			a, b := r.EpochSamples(e+1), mustNew(t, fresh).EpochSamples(e+1)
			if !slices.Equal(a.samples, b.samples) || !slices.Equal(a.bounds, b.bounds) {
				t.Fatalf("%v: epoch %d after the resumed one differs from a job of that geometry's", rc, e+1)
			}
		}
		if rc.Policy == Solar && !slices.Equal(r.Order(), s.Order()) {
			t.Fatalf("%v resumed as %v: epoch order %v, the job's was %v", c, rc, r.Order(), s.Order())
		}
	}
}

// TestResumeSameGeometry: resumed on the same ranks and batch, locality and
// random deal the steps the uninterrupted run had from step k on.
func TestResumeSameGeometry(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 8))
	for _, c := range configs() {
		if c.Policy == Solar {
			continue
		}
		s := mustNew(t, c)
		e := rng.IntN(c.Epochs)
		ep := s.EpochSamples(e)
		k := rng.IntN(ep.Steps() + 1)
		rc := c
		rc.ResumeEpoch, rc.ResumePosition = e, ep.Position(k)
		re := mustNew(t, rc).EpochSamples(e)
		if re.Steps() != ep.Steps()-k {
			t.Fatalf("%v at step %d: %d steps left, want %d", c, k, re.Steps(), ep.Steps()-k)
		}
		for st := range re.Steps() {
			for rk := range c.Ranks {
				if !slices.Equal(re.Samples(st, rk), ep.Samples(k+st, rk)) {
					t.Fatalf("%v at step %d: step %d rank %d reads %v, the uninterrupted run %v", c, k, k+st, rk,
						re.Samples(st, rk), ep.Samples(k+st, rk))
				}
			}
		}
	}
}

// TestResumeLocalityBound: a locality job resumed on another node count
// pins C samples over its nodes and reads C/N from memory in every whole
// epoch after the restart.
func TestResumeLocalityBound(t *testing.T) {
	c := Config{Seed: 3, Epochs: 4, N: 480, Ranks: 4, RanksPerNode: 2, Batch: 5, Capacity: 240}
	s := mustNew(t, c)
	pos := s.Epoch(1).Position(7)
	for _, g := range [][2]int{{2, 1}, {3, 3}, {6, 2}} {
		rc := resumedConfig(c, 1, pos, g[0], g[1], 8)
		sum := mustNew(t, rc).Summarize()
		if len(sum.PerEpoch) != 3 {
			t.Fatalf("%v: %d epochs in the run, want 3", rc, len(sum.PerEpoch))
		}
		for i, st := range sum.PerEpoch[1:] { // n is a multiple of every global batch: no padding
			if 2*st.Hits != st.Accesses {
				t.Fatalf("%v: epoch %d reads %d of %d from memory, want C/N = 1/2", rc, i+2, st.Hits, st.Accesses)
			}
		}
		if sum.HitRate != 0.5 {
			t.Fatalf("%v: warm hit rate %.4f, want C/N = 0.5", rc, sum.HitRate)
		}
	}
}

func TestResumeValidate(t *testing.T) {
	c := Config{Seed: 3, Epochs: 4, N: 48, Ranks: 4, RanksPerNode: 2, Batch: 2, Capacity: 24}
	for _, tc := range []struct {
		set  func(*Config)
		want string
	}{
		{func(c *Config) { c.ResumeEpoch = 4 }, "resume epoch 4 not in [0, 4)"},
		{func(c *Config) { c.ResumeEpoch = -1 }, "resume epoch -1"},
		{func(c *Config) { c.ResumePosition = 49 }, "resume position 49 not in [0, 48]"},
		{func(c *Config) { c.OrderRanks = 2 }, "order ranks 2 with policy locality"},
		{func(c *Config) { c.Policy, c.OrderRanks = Solar, -1 }, "order ranks -1"},
	} {
		cc := c
		tc.set(&cc)
		_, err := New(cc)
		if !errors.Is(err, base.ErrArgument) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%+v: %v, want an argument error with %q", cc, err, tc.want)
		}
	}
	// The last position: nothing left in the epoch, the next ones whole.
	cc := c
	cc.ResumeEpoch, cc.ResumePosition = 1, 48
	s := mustNew(t, cc)
	if e := s.Epoch(1); e.Steps() != 0 || e.Position(0) != 48 {
		t.Fatalf("resumed at the end of epoch 1: %d steps from %d", e.Steps(), e.Position(0))
	}
	if e := s.Epoch(2); e.Steps() != 6 {
		t.Fatalf("epoch 2 after: %d steps, want 6", e.Steps())
	}
	func() {
		defer func() {
			if recover() == nil {
				t.Fatal("Epoch(0) of a run resumed at epoch 1 did not panic")
			}
		}()
		s.Epoch(0)
	}()
}

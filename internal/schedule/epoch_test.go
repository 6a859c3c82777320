package schedule

import (
	"reflect"
	"slices"
	"testing"
)

// epochConfigs are configs() and, for every policy, longer runs with padding
// (N a multiple neither of the ranks nor of the global batch) and without
// (drop_last), where buffers carry over several epochs.
func epochConfigs() []Config {
	out := configs()
	for _, p := range Policies {
		for _, drop := range []bool{false, true} {
			out = append(out,
				Config{Seed: 3, Epochs: 6, N: 1000, Ranks: 6, RanksPerNode: 3, Batch: 7, Capacity: 300, Policy: p, DropLast: drop, SwarmIterations: 50},
				Config{Seed: 9, Epochs: 5, N: 517, Ranks: 8, RanksPerNode: 4, Batch: 5, Capacity: 400, Policy: p, DropLast: drop, SwarmIterations: 50},
				Config{Seed: 11, Epochs: 4, N: 64, Ranks: 4, RanksPerNode: 2, Batch: 16, Capacity: 8, Policy: p, DropLast: drop, SwarmIterations: 50},
				// Memory for most of the samples and few ranks: much of what
				// a rank buffers survives into the next epochs and hits.
				Config{Seed: 13, Epochs: 6, N: 101, Ranks: 1, RanksPerNode: 1, Batch: 4, Capacity: 90, Policy: p, DropLast: drop, SwarmIterations: 50},
				Config{Seed: 17, Epochs: 6, N: 99, Ranks: 2, RanksPerNode: 2, Batch: 5, Capacity: 98, Policy: p, DropLast: drop, SwarmIterations: 50},
			)
		}
	}
	return out
}

// TestEpochIsReplayed: the epoch planned directly (Schedule.Epoch, and
// Schedule.EpochSamples for the samples) is the one the replay of the whole
// run yields at its position, for every policy, position and config.
func TestEpochIsReplayed(t *testing.T) {
	for _, c := range epochConfigs() {
		s := mustNew(t, c)
		for want := range s.Epochs() {
			got := s.Epoch(want.Index)
			if !reflect.DeepEqual(got, want) {
				t.Fatalf("%v: Epoch(%d) differs from the replayed epoch:\n got %v\nwant %v", c, want.Index, encode(got), encode(want))
			}
			smp := s.EpochSamples(want.Index)
			if smp.Index != want.Index || smp.Perm != want.Perm || smp.Steps() != want.Steps() ||
				!slices.Equal(smp.bounds, want.bounds) || !slices.Equal(smp.samples, want.samples) {
				t.Fatalf("%v: EpochSamples(%d) has other samples than the replayed epoch", c, want.Index)
			}
			if c.Policy != Random {
				if !smp.HasHits() || !reflect.DeepEqual(smp, want) {
					t.Fatalf("%v: EpochSamples(%d) differs from the replayed epoch", c, want.Index)
				}
				continue
			}
			if smp.HasHits() || smp.Hits(0, 0) != nil || smp.NodeLocal(0, 0) != nil ||
				smp.Stats != (EpochStats{Accesses: want.Stats.Accesses, Bytes: want.Stats.Bytes}) {
				t.Fatalf("%v: EpochSamples(%d) under random claims hits: %+v", c, want.Index, smp.Stats)
			}
			for st := range smp.Steps() {
				for r := range c.Ranks {
					if !slices.Equal(smp.Samples(st, r), want.Samples(st, r)) {
						t.Fatalf("%v: EpochSamples(%d) step %d rank %d differs", c, want.Index, st, r)
					}
				}
			}
		}
	}
}

func TestEpochOutOfRange(t *testing.T) {
	s := mustNew(t, Config{Seed: 1, Epochs: 2, N: 64, Ranks: 2, RanksPerNode: 1, Batch: 4, Capacity: 32, Policy: Random})
	for _, i := range []int{-1, 2} {
		for name, f := range map[string]func(int) *Epoch{"Epoch": s.Epoch, "EpochSamples": s.EpochSamples} {
			func() {
				defer func() {
					if recover() == nil {
						t.Errorf("%s(%d) did not panic", name, i)
					}
				}()
				f(i)
			}()
		}
	}
	defer func() {
		if recover() == nil {
			t.Error("StorageReads of an epoch without hits did not panic")
		}
	}()
	s.EpochSamples(0).StorageReads(nil, 0, 0)
}

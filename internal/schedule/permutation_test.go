package schedule

import (
	"math"
	"slices"
	"sort"
	"testing"
	"testing/quick"
)

// naivePermutation is the definition: indices sorted by (key, index).
func naivePermutation(seed uint64, epoch, n int) []int32 {
	state := epochState(seed, epoch)
	keys := make([]uint64, n)
	out := make([]int32, n)
	for i := range keys {
		keys[i], out[i] = sortKey(state, i), int32(i)
	}
	sort.SliceStable(out, func(a, b int) bool { return keys[out[a]] < keys[out[b]] })
	return out
}

func isPermutation(p []int32) bool {
	seen := make([]bool, len(p))
	for _, x := range p {
		if x < 0 || int(x) >= len(p) || seen[x] {
			return false
		}
		seen[x] = true
	}
	return true
}

func TestPermutationMatchesDefinition(t *testing.T) {
	f := func(seed uint64, epoch uint16, n uint16) bool {
		got := Permutation(seed, int(epoch), int(n%3000))
		return isPermutation(got) && slices.Equal(got, naivePermutation(seed, int(epoch), int(n%3000)))
	}
	if err := quick.Check(f, &quick.Config{MaxCount: 200}); err != nil {
		t.Fatal(err)
	}
	for _, n := range []int{0, 1, 2, 3, 63, 64, 65, 1<<16 + 1} {
		for _, seed := range []uint64{0, math.MaxUint64} {
			if got := Permutation(seed, 3, n); !slices.Equal(got, naivePermutation(seed, 3, n)) {
				t.Fatalf("seed %d, n %d: differs from the definition", seed, n)
			}
		}
	}
}

func TestPermutationReusedBuffers(t *testing.T) {
	var p permuter
	var dst []int32
	for _, n := range []int{1000, 10, 5000, 1} {
		dst = p.permute(9, n, n, dst)
		if !slices.Equal(dst, Permutation(9, n, n)) {
			t.Fatalf("n %d: a permuter reused after a larger n gives another order", n)
		}
	}
}

func TestPermutationDiffers(t *testing.T) {
	a, b, c := Permutation(1, 0, 1000), Permutation(1, 1, 1000), Permutation(2, 0, 1000)
	if slices.Equal(a, b) || slices.Equal(a, c) {
		t.Fatal("another epoch or seed gives the same order")
	}
	// Each position takes each sample about equally often.
	const n, trials = 8, 8000
	var count [n][n]int
	for e := range trials {
		for pos, x := range Permutation(5, e, n) {
			count[pos][x]++
		}
	}
	for pos := range n {
		for x := range n {
			if c := count[pos][x]; c < trials/n*8/10 || c > trials/n*12/10 {
				t.Errorf("sample %d at position %d %d times in %d epochs, want about %d", x, pos, c, trials, trials/n)
			}
		}
	}
}

func TestPermutationPanics(t *testing.T) {
	for _, tc := range []struct{ epoch, n int }{{-1, 10}, {0, -1}, {0, MaxSamples + 1}} {
		func() {
			defer func() {
				if recover() == nil {
					t.Errorf("Permutation(0, %d, %d) did not panic", tc.epoch, tc.n)
				}
			}()
			Permutation(0, tc.epoch, tc.n)
		}()
	}
}

package schedule

// The order of every epoch is fixed by (seed, epoch, n) alone, so that any
// rank, any process and the Python client (ddstore/schedule.py) compute it
// without talking to each other, and a restarted job sees the same order.
//
// Each sample i gets a 64-bit key, the (i+1)-th output of SplitMix64 started
// from a state derived from (seed, epoch); the permutation is the indices
// sorted by (key, i). Keys are a few multiplies and shifts on uint64, which
// numpy evaluates on whole arrays, and np.argsort(keys, kind="stable") breaks
// ties by index exactly as the Go sort does.

import (
	"fmt"
	"math"
	"math/bits"
)

// golden is SplitMix64's increment, 2^64 divided by the golden ratio.
const golden = 0x9e3779b97f4a7c15

// mix64 is SplitMix64's output function (Steele, Lea and Flood, 2014).
func mix64(z uint64) uint64 {
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9
	z = (z ^ (z >> 27)) * 0x94d049bb133111eb
	return z ^ (z >> 31)
}

// epochState is the SplitMix64 state the keys of an epoch start from.
func epochState(seed uint64, epoch int) uint64 {
	return mix64(mix64(seed) + uint64(epoch)*golden)
}

// sortKey is the key of sample i in the epoch whose state is state.
func sortKey(state uint64, i int) uint64 {
	return mix64(state + uint64(i+1)*golden)
}

// MaxSamples is the largest dataset a schedule orders: sample indices are
// int32.
const MaxSamples = math.MaxInt32

// Permutation returns the order in which epoch epoch visits the samples
// 0..n-1 under seed: a function of (seed, epoch, n) alone, the same in every
// process and in the Python client (ddstore.schedule.permutation). It panics
// if epoch is negative or n is outside [0, MaxSamples].
func Permutation(seed uint64, epoch, n int) []int32 {
	var p permuter
	return p.permute(seed, epoch, n, nil)
}

// SortKeys returns the keys Permutation sorts: key i is the (i+1)-th output
// of SplitMix64 started from the state of (seed, epoch). For test vectors.
func SortKeys(seed uint64, epoch, n int) []uint64 {
	state := epochState(seed, epoch)
	keys := make([]uint64, n)
	for i := range keys {
		keys[i] = sortKey(state, i)
	}
	return keys
}

// permuter computes permutations into reused buffers: a schedule draws one
// per epoch, and N = 10^6 would otherwise allocate 12 MB each time.
type permuter struct {
	keys   []uint64 // sorted keys
	count  []int32  // bucket boundaries
	unkeys []uint64 // keys in index order
}

// permute writes the permutation of (seed, epoch, n) into dst (grown if
// short) and returns it. The sort is a counting pass on the keys' top bits,
// about one key per bucket, then one insertion pass on whole keys: O(n)
// expected, 10-20 ms for n = 10^6 where a comparison sort takes 100 ms.
func (p *permuter) permute(seed uint64, epoch, n int, dst []int32) []int32 {
	if epoch < 0 {
		panic(fmt.Sprintf("schedule: epoch %d is negative", epoch))
	}
	if n < 0 || n > MaxSamples {
		panic(fmt.Sprintf("schedule: n %d not in [0, %d]", n, MaxSamples))
	}
	if cap(dst) < n || dst == nil {
		dst = make([]int32, n)
	}
	dst = dst[:n]
	if n == 0 {
		return dst
	}
	b := min(max(bits.Len(uint(n)), 1), 24)
	shift := 64 - b
	if cap(p.count) < 1<<b+1 {
		p.count = make([]int32, 1<<b+1)
	}
	count := p.count[:1<<b+1]
	clear(count)
	if cap(p.unkeys) < n {
		p.unkeys = make([]uint64, n)
		p.keys = make([]uint64, n)
	}
	unkeys, keys := p.unkeys[:n], p.keys[:n]
	state := epochState(seed, epoch)
	for i := range unkeys {
		k := sortKey(state, i)
		unkeys[i] = k
		count[k>>shift+1]++
	}
	for i := 1; i < len(count); i++ {
		count[i] += count[i-1]
	}
	// Scatter in index order, so equal keys stay in index order.
	for i, k := range unkeys {
		j := count[k>>shift]
		count[k>>shift]++
		keys[j], dst[j] = k, int32(i)
	}
	// Keys are now ordered by their top bits; order them fully. An element
	// only moves inside its bucket, and the strict comparison keeps equal
	// keys in index order.
	for j := 1; j < n; j++ {
		k, v := keys[j], dst[j]
		i := j - 1
		for i >= 0 && keys[i] > k {
			keys[i+1], dst[i+1] = keys[i], dst[i]
			i--
		}
		keys[i+1], dst[i+1] = k, v
	}
	return dst
}

package bench

import (
	"math"
	"slices"
	"time"
)

// Median returns the median of xs, averaging the two middle values when the
// length is even. It returns 0 for an empty slice so that callers printing a
// report for a run that collected nothing do not have to special-case it.
// xs is not modified: callers usually still need the samples in time order.
func Median(xs []float64) float64 {
	n := len(xs)
	if n == 0 {
		return 0
	}
	s := sortedCopy(xs)
	if n%2 == 1 {
		return s[n/2]
	}
	return (s[n/2-1] + s[n/2]) / 2
}

// Percentile returns the p-th percentile of xs by the nearest-rank method.
// Nearest rank always returns one of the observed samples, which keeps tail
// latencies honest: an interpolated p99 can report a value that never
// happened. p is clamped to [0, 100]; p == 0 yields the minimum. An empty
// slice yields 0, and xs is not modified.
func Percentile(xs []float64, p float64) float64 {
	n := len(xs)
	if n == 0 {
		return 0
	}
	if math.IsNaN(p) || p < 0 {
		p = 0
	}
	if p > 100 {
		p = 100
	}
	s := sortedCopy(xs)
	rank := int(math.Ceil(p / 100 * float64(n)))
	if rank < 1 {
		rank = 1
	}
	if rank > n {
		rank = n
	}
	return s[rank-1]
}

// DurationsToMicros converts durations to float microseconds, the unit the
// bench report uses for latencies, so they can be fed to Median and
// Percentile.
func DurationsToMicros(ds []time.Duration) []float64 {
	out := make([]float64, len(ds))
	for i, d := range ds {
		out[i] = float64(d) / float64(time.Microsecond)
	}
	return out
}

func sortedCopy(xs []float64) []float64 {
	s := slices.Clone(xs)
	slices.Sort(s)
	return s
}

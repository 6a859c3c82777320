package bench

import (
	"math"
	"math/rand/v2"
	"os"
	"time"
)

// Rate is a throughput measurement.
type Rate struct {
	// GBps is the median over Samples, in 1e9 bytes per second.
	GBps float64
	// RowsPerSec is GBps expressed in rows; zero when the measurement has no
	// notion of rows (TCPLimit).
	RowsPerSec float64
	// Samples are the per-sample rates in GB/s, in the order measured, kept
	// so callers can report spread and not only the median.
	Samples []float64
}

const (
	// indexBatches is how many batches of random indices are generated up
	// front. Generating indices inside the timed loop would measure the RNG
	// as much as the memory system. Rows recur only once per 64 batches, so
	// with realistic batch sizes they have left the cache before they recur.
	indexBatches = 64
	// minGatherSample keeps each timed sample well above timer resolution
	// and scheduling jitter, so small batches still give meaningful rates.
	minGatherSample = 200 * time.Microsecond
	minBatches      = 3
	// maxGroup only guards against a clock that never advances.
	maxGroup = 1 << 20
)

// gatherer holds everything the timed gather loop touches, so that the test
// benchmarks and GatherLimit measure exactly the same code.
type gatherer struct {
	rowBytes int
	batch    int
	src      []byte
	dst      []byte
	// offs holds byte offsets rather than row numbers so the hot loop does
	// no multiplication the store's own gather would not do either.
	offs []int
	next int
}

// newGatherer returns nil when the arguments cannot describe a gather (no
// whole row fits, or sizes overflow int), leaving callers to decide whether
// that is an error.
func newGatherer(rowBytes, batch int, bufBytes int64, seed uint64) *gatherer {
	if rowBytes <= 0 || batch <= 0 || bufBytes < int64(rowBytes) || bufBytes > math.MaxInt {
		return nil
	}
	rows := int(bufBytes / int64(rowBytes))
	if batch > math.MaxInt/rowBytes || batch > math.MaxInt/indexBatches {
		return nil
	}
	src := make([]byte, rows*rowBytes)
	// Fresh allocations of this size come straight from the OS as untouched
	// zero pages; writing one byte per page faults them in now so the first
	// timed batches do not pay page-fault cost the steady state never sees.
	page := os.Getpagesize()
	for i := 0; i < len(src); i += page {
		src[i] = 1
	}
	dst := make([]byte, batch*rowBytes)
	for i := 0; i < len(dst); i += page {
		dst[i] = 1
	}
	// The second PCG word is a fixed constant so a single user-facing seed
	// selects the whole stream.
	rng := rand.New(rand.NewPCG(seed, 0x9e3779b97f4a7c15))
	offs := make([]int, indexBatches*batch)
	for i := range offs {
		offs[i] = rng.IntN(rows) * rowBytes
	}
	return &gatherer{rowBytes: rowBytes, batch: batch, src: src, dst: dst, offs: offs}
}

// run gathers one batch into dst, cycling through the precomputed indices.
func (g *gatherer) run() {
	offs := g.offs[g.next*g.batch : (g.next+1)*g.batch]
	g.next++
	if g.next == indexBatches {
		g.next = 0
	}
	rb := g.rowBytes
	dst := g.dst
	for i, off := range offs {
		copy(dst[i*rb:(i+1)*rb], g.src[off:off+rb])
	}
}

func (g *gatherer) batchBytes() int { return g.batch * g.rowBytes }

// GatherLimit measures how fast one goroutine can gather batch uniformly
// random rows of rowBytes each from an in-memory buffer of bufBytes (rounded
// down to whole rows) into a contiguous destination. It is the ceiling a
// single store reader could reach if the store added no overhead at all.
//
// The measurement runs for about dur and at least three batches. Batches are
// timed in groups long enough (about 200µs) for the clock to be trustworthy;
// each group is one sample, and the result is the median over samples.
// The same seed always selects the same rows, so runs are comparable.
//
// Arguments that admit no whole row return a zero Rate: the bench report
// treats that as "not measured" and has no use for an error here.
func GatherLimit(rowBytes, batch int, bufBytes int64, dur time.Duration, seed uint64) Rate {
	g := newGatherer(rowBytes, batch, bufBytes, seed)
	if g == nil {
		return Rate{}
	}
	r, _ := Throughput(dur, g.batchBytes(), rowBytes, func() error { g.run(); return nil })
	return r
}

// Throughput runs op (which moves bytesPerOp bytes) repeatedly for about
// dur and at least three times, timing groups of calls long enough (about
// 200µs) for the clock to be trustworthy; each group is one sample and the
// rate is their median. The first error of op ends the measurement.
func Throughput(dur time.Duration, bytesPerOp, rowBytes int, op func() error) (Rate, error) {
	// A first untimed call warms the destination and the code path, and
	// calibrates the group size; doubling avoids trusting one tiny reading.
	if err := op(); err != nil {
		return Rate{}, err
	}
	group := 1
	for {
		t0 := time.Now()
		for range group {
			if err := op(); err != nil {
				return Rate{}, err
			}
		}
		if time.Since(t0) >= minGatherSample || group >= maxGroup {
			break
		}
		group *= 2
	}

	var samples []float64
	start := time.Now()
	for done := 0; done < minBatches || len(samples) == 0 || time.Since(start) < dur; done += group {
		t0 := time.Now()
		for range group {
			if err := op(); err != nil {
				return Rate{}, err
			}
		}
		el := time.Since(t0)
		// Calibration runs cold, so steady-state groups can come out
		// shorter than it predicted; such a sample is dropped and the
		// group grown rather than letting timer jitter into the median.
		if el < minGatherSample && group < maxGroup {
			group *= 2
			continue
		}
		samples = append(samples, float64(group)*float64(bytesPerOp)/el.Seconds()/1e9)
	}
	gbps := Median(samples)
	return Rate{
		GBps:       gbps,
		RowsPerSec: gbps * 1e9 / float64(rowBytes),
		Samples:    samples,
	}, nil
}

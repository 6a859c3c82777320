package bench

import (
	"encoding/binary"
	"fmt"
	"io"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ddstore-go/ddstore"
)

// LoadLatency is the latency of small cross-node Gets alone and while
// another client of the same node streams large batches of the other node
// from the same agents. The JSON names are stable for scripts.
type LoadLatency struct {
	SmallRowBytes int `json:"small_row_bytes"`
	LoadRowBytes  int `json:"load_row_bytes"`
	LoadBatch     int `json:"load_batch"`
	// Alone: single-row Gets with nothing else running; Loaded: the same
	// while the stream runs, whose rate is LoadGBps.
	AloneP50us  float64 `json:"alone_p50_us"`
	AloneP99us  float64 `json:"alone_p99_us"`
	LoadedP50us float64 `json:"loaded_p50_us"`
	LoadedP99us float64 `json:"loaded_p99_us"`
	LoadGBps    float64 `json:"load_gbps"`
	// LoadedP99VsAloneP50 is LoadedP99us / AloneP50us.
	LoadedP99VsAloneP50 float64 `json:"loaded_p99_vs_alone_p50"`
	// The limit: raw loopback TCP round trips of the same bytes between
	// two processes, one taken after each Get (alone, then under the same
	// stream), so that both see the machine in the same state.
	RawAloneP50us  float64 `json:"raw_alone_p50_us"`
	RawAloneP99us  float64 `json:"raw_alone_p99_us"`
	RawLoadedP50us float64 `json:"raw_loaded_p50_us"`
	RawLoadedP99us float64 `json:"raw_loaded_p99_us"`
	// RawLoadedP99VsAloneP50 is RawLoadedP99us / RawAloneP50us: the
	// figure LoadedP99VsAloneP50 is for a bare round trip.
	RawLoadedP99VsAloneP50 float64 `json:"raw_loaded_p99_vs_alone_p50"`
}

// Rows of the stream: batches of loadBatch rows of loadRowBytes, 32 MiB
// each (the agents cut such a batch into pieces of several MiB).
const (
	smallRowBytes = 64
	loadRowBytes  = 1 << 20
	loadBatch     = 32
)

// underLoad measures LoadLatency: rank 0 Gets single rows of node B alone,
// then while a reader store on node A (another client of the same agent)
// streams batches of large rows of node B into a receive buffer; each Get
// is followed by a raw round trip with a process of its own (bin, or a
// goroutine when bin is empty), the limit.
func (j *job) underLoad(opts Options, src []byte, bin string, progress io.Writer) (LoadLatency, error) {
	res := LoadLatency{SmallRowBytes: smallRowBytes, LoadRowBytes: loadRowBytes, LoadBatch: loadBatch}
	if progress == nil {
		progress = io.Discard
	}
	nSmall := int64(len(src) / smallRowBytes)
	nLoad := int64(len(src) / loadRowBytes)
	if nLoad < 1 {
		return res, fmt.Errorf("a shard of %d bytes holds no row of %d bytes", len(src), loadRowBytes)
	}
	vars := []struct {
		name string
		rb   int
		n    int64
	}{{"bench-small", smallRowBytes, nSmall}, {"bench-load", loadRowBytes, nLoad}}
	for _, v := range vars {
		if err := j.both(func(rank int, s *ddstore.Store) error {
			shard := src[:v.n*int64(v.rb)]
			if rank == 1 {
				shard = make([]byte, len(shard))
			}
			for i := range v.n {
				binary.LittleEndian.PutUint64(shard[i*int64(v.rb):], uint64(int64(rank)*v.n+i))
			}
			return s.Add(v.name, shard, int64(v.rb), 1)
		}); err != nil {
			return res, err
		}
		defer j.both(func(_ int, s *ddstore.Store) error { return s.Free(v.name) })
	}
	s := j.stores[0]
	loader, err := ddstore.Open(ddstore.Config{Namespace: j.ns, Rank: 0, Size: 1, Node: "bench-a", Socket: s.Socket(),
		NoSpawn: true, Reader: true})
	if err != nil {
		return res, err
	}
	defer loader.Close()
	recv, err := loader.AllocRecv(loadBatch * loadRowBytes)
	if err != nil {
		return res, err
	}
	defer loader.FreeRecv(recv)

	iters := max(opts.Latency/4, 500)
	one := make([]byte, smallRowBytes)
	lat := func(seed uint64) (gets, raw []float64, err error) {
		p, err := NewPinger("tcp", smallRowBytes, iters, bin)
		if err != nil {
			return nil, nil, err
		}
		defer func() {
			if cerr := p.Close(); err == nil {
				err = cerr
			}
		}()
		rng := rand.New(rand.NewPCG(seed, 5))
		ds, rs := make([]time.Duration, iters), make([]time.Duration, iters)
		for i := range ds {
			g := nSmall + rng.Int64N(nSmall)
			t0 := time.Now()
			if err := s.Get("bench-small", one, g); err != nil {
				return nil, nil, err
			}
			ds[i] = time.Since(t0)
			if got := int64(binary.LittleEndian.Uint64(one)); got != g {
				return nil, nil, fmt.Errorf("row %d read as row %d", g, got)
			}
			if rs[i], err = p.Once(); err != nil {
				return nil, nil, err
			}
		}
		return DurationsToMicros(ds), DurationsToMicros(rs), nil
	}
	fmt.Fprint(progress, "alone ")
	alone, rawAlone, err := lat(1)
	if err != nil {
		return res, err
	}

	fmt.Fprint(progress, "loaded ")
	var stop atomic.Bool
	var moved atomic.Int64
	var streamErr error
	var wg sync.WaitGroup
	started := make(chan struct{})
	wg.Add(1)
	go func() {
		defer wg.Done()
		rng := rand.New(rand.NewPCG(2, 9))
		idx := make([]int64, loadBatch)
		for k := 0; !stop.Load(); k++ {
			for i := range idx {
				idx[i] = nLoad + rng.Int64N(nLoad)
			}
			if err := loader.GetBatch("bench-load", recv, idx); err != nil {
				streamErr = err
				break
			}
			moved.Add(int64(len(recv)))
			if k == 0 {
				close(started)
			}
		}
		if moved.Load() == 0 {
			close(started)
		}
	}()
	<-started
	t0 := time.Now()
	loaded, rawLoaded, err := lat(3)
	el := time.Since(t0)
	stop.Store(true)
	wg.Wait()
	if err != nil {
		return res, err
	}
	if streamErr != nil {
		return res, fmt.Errorf("the stream of large rows: %w", streamErr)
	}
	res.AloneP50us, res.AloneP99us = Percentile(alone, 50), Percentile(alone, 99)
	res.LoadedP50us, res.LoadedP99us = Percentile(loaded, 50), Percentile(loaded, 99)
	res.LoadGBps = float64(moved.Load()) / el.Seconds() / 1e9
	res.RawAloneP50us, res.RawAloneP99us = Percentile(rawAlone, 50), Percentile(rawAlone, 99)
	res.RawLoadedP50us, res.RawLoadedP99us = Percentile(rawLoaded, 50), Percentile(rawLoaded, 99)
	if res.AloneP50us > 0 {
		res.LoadedP99VsAloneP50 = res.LoadedP99us / res.AloneP50us
	}
	if res.RawAloneP50us > 0 {
		res.RawLoadedP99VsAloneP50 = res.RawLoadedP99us / res.RawAloneP50us
	}
	return res, nil
}

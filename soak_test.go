package ddstore_test

// Soak: two simulated nodes, one rank process per node,
// 32 goroutines per rank issuing random batches for DDSTORE_SOAK (CI: 3 s;
// `make soak`: 60 s), every row of every read checked.

import (
	"bufio"
	"encoding/json"
	"fmt"
	"math/bits"
	"math/rand/v2"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ddstore-go/ddstore"
	"github.com/ddstore-go/ddstore/internal/testutil"
)

// soakArgs is what a soak rank is told.
type soakArgs struct {
	NS, Node, RunDir string
	Rank, Size       int
	PerRank          int64 // rows per rank
	RowBytes         int64
	Threads          int
	Duration         time.Duration
	Seed             uint64
}

// soakResult is what a soak rank reports, as one JSON line on stdout.
type soakResult struct {
	Rank                  int
	Calls, Rows, Bytes    int64
	LocalRows, RemoteRows int64
	Errors                int64
	FirstErrors           []string
	Elapsed               time.Duration
	Latency               latencyHist
}

// latencyHist counts call latencies in buckets 1/16 of a power of two
// wide (6 % of the value): millions of calls in a fixed 8 KiB.
type latencyHist [64 * 16]int64

func latencyBucket(d time.Duration) int {
	v := uint64(max(d, 0))
	if v < 16 {
		return int(v)
	}
	e := bits.Len64(v) - 1
	return e*16 + int(v>>(e-4)&15)
}

// upper is the largest latency bucket i holds.
func (h *latencyHist) upper(i int) time.Duration {
	if i < 16 {
		return time.Duration(i)
	}
	e, m := i/16, i%16
	return time.Duration((uint64(16+m+1) << (e - 4)) - 1)
}

func (h *latencyHist) add(o *latencyHist) {
	for i := range h {
		h[i] += o[i]
	}
}

// quantile is the bucket bound below which a fraction q of the calls fall.
func (h *latencyHist) quantile(q float64) time.Duration {
	var n int64
	for _, c := range h {
		n += c
	}
	want := int64(q*float64(n) + 0.5)
	var seen int64
	for i, c := range h {
		seen += c
		if c > 0 && seen >= max(want, 1) {
			return h.upper(i)
		}
	}
	return 0
}

var _ = testutil.Helper("soakrank", soakRank)

func soakRank(a soakArgs) int {
	s, err := ddstore.Open(ddstore.Config{Namespace: a.NS, Rank: a.Rank, Size: a.Size, LocalRank: 0, LocalSize: 1,
		Node: a.Node, RunDir: a.RunDir, NoSpawn: true, AgentWait: 20 * time.Second, Timeout: 30 * time.Second,
		PublishTimeout: time.Minute})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 3
	}
	defer s.Close()
	rb, total := a.RowBytes, a.PerRank*int64(a.Size)
	first := a.PerRank * int64(a.Rank)
	rows := make([]byte, a.PerRank*rb)
	for i := range a.PerRank {
		pattern(rows[i*rb:(i+1)*rb], first+i)
	}
	if err := s.Add("soak", rows, rb, 1); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 3
	}

	const maxBatch = 1024
	res := make([]soakResult, a.Threads)
	var wg sync.WaitGroup
	t0 := time.Now()
	deadline := t0.Add(a.Duration)
	for th := range a.Threads {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r := &res[th]
			rng := rand.New(rand.NewPCG(a.Seed, uint64(a.Rank<<16|th)))
			fail := func(err error) {
				r.Errors++
				if len(r.FirstErrors) < 3 {
					r.FirstErrors = append(r.FirstErrors, err.Error())
				}
			}
			recv, err := s.AllocRecv(maxBatch * int(rb))
			if err != nil {
				fail(err)
				return
			}
			plain := make([]byte, maxBatch*rb)
			idx := make([]int64, maxBatch)
			for time.Now().Before(deadline) {
				// Mostly batches of up to 256 random rows, some of up to
				// 1,024 (a node's rows then go in two pieces), some ranges
				// that may cross the shard boundary; into a plain buffer
				// (through a lane's staging region) or a receive buffer.
				k := rng.IntN(10)
				n := 1 + rng.Int64N(256)
				if k == 9 {
					n = 257 + rng.Int64N(maxBatch-256)
				}
				dst := plain[:n*rb]
				if rng.IntN(2) == 0 {
					dst = recv[:n*rb]
				}
				var start int64 = -1
				if k >= 7 && k < 9 {
					start = rng.Int64N(total - n + 1)
					for i := range n {
						idx[i] = start + i
					}
				} else {
					for i := range n {
						idx[i] = rng.Int64N(total)
					}
				}
				c0 := time.Now()
				if start >= 0 {
					err = s.Get("soak", dst, start)
				} else {
					err = s.GetBatch("soak", dst, idx[:n])
				}
				r.Latency[latencyBucket(time.Since(c0))]++
				r.Calls++
				if err != nil {
					fail(err)
					continue
				}
				for i, g := range idx[:n] {
					if !rowOK(dst[int64(i)*rb:int64(i+1)*rb], g) {
						fail(fmt.Errorf("rank %d: row %d wrong (call %d of goroutine %d)", a.Rank, g, r.Calls, th))
						break
					}
					if g >= first && g < first+a.PerRank {
						r.LocalRows++
					} else {
						r.RemoteRows++
					}
				}
				r.Rows += n
				r.Bytes += n * rb
			}
		}()
	}
	wg.Wait()
	out := soakResult{Rank: a.Rank, Elapsed: time.Since(t0)}
	for _, r := range res {
		out.Calls += r.Calls
		out.Rows += r.Rows
		out.Bytes += r.Bytes
		out.LocalRows += r.LocalRows
		out.RemoteRows += r.RemoteRows
		out.Errors += r.Errors
		out.FirstErrors = append(out.FirstErrors, r.FirstErrors...)
		out.Latency.add(&r.Latency)
	}
	if err := s.Free("soak"); err != nil {
		out.Errors++
		out.FirstErrors = append(out.FirstErrors, "Free: "+err.Error())
	}
	if len(out.FirstErrors) > 10 {
		out.FirstErrors = out.FirstErrors[:10]
	}
	j, _ := json.Marshal(out)
	fmt.Printf("%s\n", j)
	return 0
}

// soakDuration is DDSTORE_SOAK, default 3 s.
func soakDuration(t *testing.T) time.Duration {
	v := os.Getenv("DDSTORE_SOAK")
	if v == "" {
		return 3 * time.Second
	}
	d, err := time.ParseDuration(v)
	if err != nil || d <= 0 {
		t.Fatalf("DDSTORE_SOAK=%q: want a duration such as 60s", v)
	}
	return d
}

// TestSoak runs two agent processes (two simulated nodes) and one rank
// process per node; each rank adds 16 Ki rows of 1 KiB whose content is a
// function of the global index, then 32 goroutines of each rank share its
// Store (default lanes) and read random batches and ranges of rows of both
// nodes for DDSTORE_SOAK (default 3 s; `make soak` runs 60 s without -race).
// Every byte read is checked; any error fails the test. It reports rows/s,
// GB/s and the latency of a call (p50, p99, max) per rank and in all.
func TestSoak(t *testing.T) {
	if testing.Short() {
		t.Skip("a load test")
	}
	dur := soakDuration(t)
	nodes := []string{"n0", "n1"}
	ns, runDir, agents := startAgentProcs(t, "soak", nodes...)
	const threads, perRank, rb = 32, 16 << 10, 1024
	seed := uint64(time.Now().UnixNano())
	t.Logf("seed %d, %v, %d goroutines per rank", seed, dur, threads)

	results := make([]soakResult, len(nodes))
	errs := make([]error, len(nodes))
	var wg sync.WaitGroup
	for r, node := range nodes {
		cmd := testutil.HelperCmd(t, "soakrank", soakArgs{NS: ns, Node: node, RunDir: runDir, Rank: r, Size: len(nodes),
			PerRank: perRank, RowBytes: rb, Threads: threads, Duration: dur, Seed: seed})
		out, err := cmd.StdoutPipe()
		if err != nil {
			t.Fatal(err)
		}
		var stderr testutil.Buffer
		cmd.Stderr = &stderr
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			// A rank that hangs is killed (and fails the test) well after
			// its time.
			timer := time.AfterFunc(dur+2*time.Minute, func() { cmd.Process.Kill() })
			defer timer.Stop()
			var line string
			sc := bufio.NewScanner(out)
			sc.Buffer(nil, 1<<20)
			for sc.Scan() {
				line = sc.Text()
			}
			if err := cmd.Wait(); err != nil {
				errs[r] = fmt.Errorf("rank %d: %v\n%s", r, err, stderr.String())
				return
			}
			if err := json.Unmarshal([]byte(line), &results[r]); err != nil {
				errs[r] = fmt.Errorf("rank %d: result %q: %v\n%s", r, line, err, stderr.String())
			}
		}()
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}

	var all soakResult
	line := func(who string, r *soakResult) string {
		sec := r.Elapsed.Seconds()
		ms := func(q float64) float64 { return r.Latency.quantile(q).Seconds() * 1e3 }
		return fmt.Sprintf("%-5s %9d calls %11d rows (%4.1f%% remote) %9.0f rows/s %5.2f GB/s  p50 %7.3f ms  p99 %7.3f ms  max %7.1f ms  errors %d",
			who, r.Calls, r.Rows, 100*float64(r.RemoteRows)/float64(max(r.Rows, 1)), float64(r.Rows)/sec, float64(r.Bytes)/sec/1e9,
			ms(0.5), ms(0.99), ms(1), r.Errors)
	}
	var report []string
	for r := range results {
		res := &results[r]
		report = append(report, line(fmt.Sprintf("rank%d", r), res))
		all.Calls += res.Calls
		all.Rows += res.Rows
		all.Bytes += res.Bytes
		all.RemoteRows += res.RemoteRows
		all.Errors += res.Errors
		all.Elapsed = max(all.Elapsed, res.Elapsed)
		all.Latency.add(&res.Latency)
		all.FirstErrors = append(all.FirstErrors, res.FirstErrors...)
	}
	report = append(report, line("all", &all))
	t.Logf("soak, 2 nodes x %d goroutines, %d rows of %d B per rank, %v (latency: bucket bounds, +6%%):\n%s",
		threads, perRank, rb, dur, strings.Join(report, "\n"))

	for r, res := range results {
		if res.Calls == 0 || res.RemoteRows == 0 || res.LocalRows == 0 {
			t.Errorf("rank %d read too little: %+v", r, res)
		}
	}
	if all.Errors > 0 {
		t.Errorf("%d errors; first: %s", all.Errors, strings.Join(all.FirstErrors, "\n"))
	}
	for _, ag := range agents {
		in, err := ddstore.QueryAgent(ag.socket, ns, ag.node)
		if err != nil {
			t.Fatal(err)
		}
		if in.Counters["errors"] != 0 || in.Counters["bad_frames"] != 0 {
			t.Errorf("agent %s counted errors: %v", ag.node, in.Counters)
		}
	}
}

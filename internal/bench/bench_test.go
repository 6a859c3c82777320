package bench

import (
	"errors"
	"fmt"
	"math"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/ddstore-go/ddstore/internal/testutil"
)

func TestMedian(t *testing.T) {
	tests := []struct {
		name string
		in   []float64
		want float64
	}{
		{"empty", nil, 0},
		{"one", []float64{7}, 7},
		{"odd unsorted", []float64{5, 1, 3}, 3},
		{"even averages middles", []float64{4, 1, 3, 2}, 2.5},
		{"duplicates", []float64{2, 2, 9, 2}, 2},
		{"negative", []float64{-3, -1, -2}, -2},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			in := slices.Clone(tt.in)
			if got := Median(in); got != tt.want {
				t.Errorf("Median(%v) = %v, want %v", tt.in, got, tt.want)
			}
			if !slices.Equal(in, tt.in) {
				t.Errorf("Median modified input: %v, was %v", in, tt.in)
			}
		})
	}
}

func TestPercentile(t *testing.T) {
	// The odd-length case is the usual nearest-rank worked example.
	odd := []float64{35, 20, 15, 50, 40}
	even := []float64{10, 9, 8, 7, 6, 5, 4, 3, 2, 1}
	tests := []struct {
		name string
		in   []float64
		p    float64
		want float64
	}{
		{"empty", nil, 50, 0},
		{"single", []float64{4}, 99, 4},
		{"odd p0 is min", odd, 0, 15},
		{"odd p5", odd, 5, 15},
		{"odd p30", odd, 30, 20},
		{"odd p40", odd, 40, 20},
		{"odd p50", odd, 50, 35},
		{"odd p100 is max", odd, 100, 50},
		{"even p50", even, 50, 5},
		{"even p90", even, 90, 9},
		{"even p91 rounds up", even, 91, 10},
		{"even p99", even, 99, 10},
		{"below range clamps", even, -5, 1},
		{"above range clamps", even, 150, 10},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			in := slices.Clone(tt.in)
			if got := Percentile(in, tt.p); got != tt.want {
				t.Errorf("Percentile(%v, %v) = %v, want %v", tt.in, tt.p, got, tt.want)
			}
			if !slices.Equal(in, tt.in) {
				t.Errorf("Percentile modified input: %v, was %v", in, tt.in)
			}
		})
	}
}

func TestDurationsToMicros(t *testing.T) {
	got := DurationsToMicros([]time.Duration{0, 1500 * time.Nanosecond, 2 * time.Millisecond})
	want := []float64{0, 1.5, 2000}
	if !slices.Equal(got, want) {
		t.Errorf("DurationsToMicros = %v, want %v", got, want)
	}
	if got := DurationsToMicros(nil); len(got) != 0 {
		t.Errorf("DurationsToMicros(nil) = %v, want empty", got)
	}
}

func TestTable(t *testing.T) {
	tb := NewTable("path", "GB/s", "p99 µs", "vs limit", "note")
	tb.Row("gather 4K", "12.50", "310", "100%", "single thread")
	tb.Row("store", "3.1", "1204.5", "25%")
	tb.Row("tcp", "", "-", "0.9x", "loopback")
	var sb strings.Builder
	if err := tb.Write(&sb); err != nil {
		t.Fatal(err)
	}
	// "p99 µs" mixes a number column with a "-" cell, so it stays
	// left-aligned; an empty cell does not stop GB/s being numeric.
	want := "" +
		"path        GB/s  p99 µs  vs limit  note\n" +
		"---------  -----  ------  --------  -------------\n" +
		"gather 4K  12.50  310         100%  single thread\n" +
		"store        3.1  1204.5       25%\n" +
		"tcp               -           0.9x  loopback\n"
	if got := sb.String(); got != want {
		t.Errorf("table mismatch\ngot:\n%s\nwant:\n%s", got, want)
	}
}

func TestTableEmpty(t *testing.T) {
	var sb strings.Builder
	if err := NewTable().Write(&sb); err != nil || sb.Len() != 0 {
		t.Errorf("empty table wrote %q, err %v", sb.String(), err)
	}
}

func checkRate(t *testing.T, r Rate) {
	t.Helper()
	if !(r.GBps > 0) || math.IsInf(r.GBps, 0) {
		t.Errorf("GBps = %v, want positive and finite", r.GBps)
	}
	if len(r.Samples) == 0 {
		t.Fatal("no samples")
	}
	for i, s := range r.Samples {
		if !(s > 0) || math.IsInf(s, 0) {
			t.Errorf("sample %d = %v, want positive and finite", i, s)
		}
	}
}

func TestGatherLimitSmoke(t *testing.T) {
	r := GatherLimit(4096, 64, 8<<20, 50*time.Millisecond, 1)
	checkRate(t, r)
	if !(r.RowsPerSec > 0) || math.IsInf(r.RowsPerSec, 0) {
		t.Errorf("RowsPerSec = %v, want positive and finite", r.RowsPerSec)
	}
}

func TestGatherLimitInvalid(t *testing.T) {
	for _, c := range []struct {
		rowBytes, batch int
		buf             int64
	}{
		{0, 1, 1 << 20},
		{4096, 0, 1 << 20},
		{4096, 1, 100},
	} {
		if r := GatherLimit(c.rowBytes, c.batch, c.buf, time.Millisecond, 1); r.GBps != 0 || r.Samples != nil {
			t.Errorf("GatherLimit(%d, %d, %d) = %+v, want zero Rate", c.rowBytes, c.batch, c.buf, r)
		}
	}
}

func TestGatherIndicesRepeatable(t *testing.T) {
	a := newGatherer(100, 8, 1000, 42)
	b := newGatherer(100, 8, 1000, 42)
	if !slices.Equal(a.offs, b.offs) {
		t.Error("same seed gave different indices")
	}
	for _, off := range a.offs {
		if off%100 != 0 || off < 0 || off+100 > len(a.src) {
			t.Fatalf("offset %d not a whole row inside %d-byte buffer", off, len(a.src))
		}
	}
}

func TestTCPLimitSmoke(t *testing.T) {
	before := runtime.NumGoroutine()
	r, err := TCPLimit(50 * time.Millisecond)
	if err != nil {
		t.Fatal(err)
	}
	checkRate(t, r)
	// The runtime may take a moment to retire the exited writer goroutine.
	for deadline := time.Now().Add(time.Second); runtime.NumGoroutine() > before; {
		if time.Now().After(deadline) {
			t.Errorf("goroutines: %d before, %d after", before, runtime.NumGoroutine())
			break
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// TestPingerTurns: round trips one at a time, no more than the other end
// was started for; closed early, the answering goroutine ends too.
func TestPingerTurns(t *testing.T) {
	before := runtime.NumGoroutine()
	p, err := NewPinger("tcp", 64, 3, "")
	if err != nil {
		t.Fatal(err)
	}
	for i := range 3 {
		if d, err := p.Once(); err != nil || d <= 0 {
			t.Fatalf("round trip %d: %v, %v: want > 0, nil", i, d, err)
		}
	}
	if _, err := p.Once(); err == nil {
		t.Fatal("a fourth round trip of 3: want an error")
	}
	if err := p.Close(); err != nil {
		t.Fatal(err)
	}
	q, err := NewPinger("unix", 64, 5, "")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := q.Once(); err != nil {
		t.Fatal(err)
	}
	if err := q.Close(); err != nil {
		t.Fatalf("closed after 1 of 5: %v, want nil", err)
	}
	goroutinesBack(t, before)
}

// goroutinesBack waits until no more goroutines run than before did.
func goroutinesBack(t *testing.T, before int) {
	t.Helper()
	testutil.WaitFor(t, 5*time.Second, func() error {
		if n := runtime.NumGoroutine(); n > before {
			return fmt.Errorf("goroutines: %d before, %d after", before, n)
		}
		return nil
	})
}

// TestPingPongSmoke: a round trip per sample on TCP and on a Unix socket,
// each positive, with the answering goroutine gone afterwards.
func TestPingPongSmoke(t *testing.T) {
	before := runtime.NumGoroutine()
	for _, network := range []string{"tcp", "unix"} {
		us, err := PingPong(network, 64, 50, "")
		if err != nil {
			t.Fatal(err)
		}
		if len(us) != 50 || Percentile(us, 0) <= 0 {
			t.Fatalf("%s: %d samples, the least %v µs: want 50, all > 0", network, len(us), Percentile(us, 0))
		}
	}
	goroutinesBack(t, before)
}

func benchmarkGather(b *testing.B, rowBytes int) {
	const batch = 256
	// 256 MiB is far past any last-level cache, so rows come from DRAM as
	// they would for a real shard.
	g := newGatherer(rowBytes, batch, 256<<20, 1)
	if g == nil {
		b.Fatal("invalid gather parameters")
	}
	b.SetBytes(int64(g.batchBytes()))
	for b.Loop() {
		g.run()
	}
}

func BenchmarkGather4K(b *testing.B)  { benchmarkGather(b, 4<<10) }
func BenchmarkGather64K(b *testing.B) { benchmarkGather(b, 64<<10) }

// TestUnderLoadSmoke: the latency of small cross-node Gets alone and under
// a stream of large batches, measured on two in-process agents: every
// figure is there, the raw round trips' (answered by a goroutine) too, and
// each Get read the row it asked for (underLoad checks each).
func TestUnderLoadSmoke(t *testing.T) {
	if testing.Short() {
		t.Skip("starts two agents")
	}
	j, err := startJob(true, "tcp")
	if err != nil {
		t.Fatal(err)
	}
	defer j.close()
	l, err := j.underLoad(Options{Latency: 400}, make([]byte, 2*loadRowBytes), "", nil)
	if err != nil {
		t.Fatal(err)
	}
	if l.AloneP50us <= 0 || l.LoadedP99us < l.LoadedP50us || l.LoadGBps <= 0 || l.LoadedP99VsAloneP50 <= 0 ||
		l.RawAloneP50us <= 0 || l.RawLoadedP99us < l.RawLoadedP50us || l.RawLoadedP99VsAloneP50 <= 0 {
		t.Fatalf("figures missing: %+v", l)
	}
}

// TestRemoteTurns: ours and the TCP stream taken turnsOfRates times each,
// slices of half the duration (not under 50 ms), the medians and the
// turns' ratios reported; an error of ours ends it with that error.
func TestRemoteTurns(t *testing.T) {
	var took []time.Duration
	r, err := remoteTurns(20*time.Millisecond, func(d time.Duration) (Rate, error) {
		took = append(took, d)
		return Rate{GBps: float64(len(took))}, nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(took) != turnsOfRates {
		t.Fatalf("ours taken %d times, want %d", len(took), turnsOfRates)
	}
	for _, d := range took {
		if d != 50*time.Millisecond {
			t.Errorf("a slice of %v, want 50ms (half of 20ms is below the least)", d)
		}
	}
	if want := Median([]float64{1, 2, 3, 4, 5, 6}); r.ours != want || r.limit <= 0 || r.ratio <= 0 {
		t.Errorf("ours %v, limit %v, ratio %v: want ours %v and both others > 0", r.ours, r.limit, r.ratio, want)
	}
	bad := errors.New("read failed")
	if _, err := remoteTurns(time.Millisecond, func(time.Duration) (Rate, error) { return Rate{}, bad }); !errors.Is(err, bad) {
		t.Errorf("err %v, want %v", err, bad)
	}
}

package agent

import (
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"testing"

	"github.com/ddstore-go/ddstore/internal/base"
	"github.com/ddstore-go/ddstore/internal/shm"
	"github.com/ddstore-go/ddstore/internal/testutil"
	"github.com/ddstore-go/ddstore/internal/wire"
)

// metricsClient keeps no idle connection (whose goroutines would count as
// left over by the agent).
var metricsClient = &http.Client{Transport: &http.Transport{DisableKeepAlives: true}, Timeout: ioWait}

// scrape GETs the agent's /metrics and returns each sample line's value by
// series ("name{label="value",...}" as written, labels sorted by name).
func scrape(t *testing.T, a *Agent) map[string]float64 {
	t.Helper()
	resp, err := metricsClient.Get("http://" + a.MetricsAddr() + "/metrics")
	if err != nil {
		t.Fatalf("GET /metrics: %v", err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != http.StatusOK || !strings.HasPrefix(resp.Header.Get("Content-Type"), "text/plain; version=0.0.4") {
		t.Fatalf("GET /metrics: %s, Content-Type %q:\n%s", resp.Status, resp.Header.Get("Content-Type"), body)
	}
	m := make(map[string]float64)
	for line := range strings.Lines(string(body)) {
		line = strings.TrimSpace(line)
		if line == "" || line[0] == '#' {
			continue
		}
		i := strings.LastIndexByte(line, ' ')
		v, err := strconv.ParseFloat(line[i+1:], 64)
		if i < 0 || err != nil {
			t.Fatalf("bad sample line %q", line)
		}
		m[line[:i]] = v
	}
	return m
}

// series names a sample of the agent a, as the text format writes it: its
// constant labels, then the extra ones (source, a histogram's le).
func series(a *Agent, name string, extra ...string) string {
	labels := []string{fmt.Sprintf("namespace=%q", a.cfg.Namespace), fmt.Sprintf("node=%q", a.cfg.Node)}
	for i := 0; i < len(extra); i += 2 {
		labels = append(labels, fmt.Sprintf("%s=%q", extra[i], extra[i+1]))
	}
	return "ddstore_agent_" + name + "{" + strings.Join(labels, ",") + "}"
}

// kindSeries is the series of client errors of one kind: the text format
// writes the label kind first, before the agent's constant labels.
func kindSeries(a *Agent, kind string) string {
	return fmt.Sprintf("ddstore_agent_client_errors_total{kind=%q,namespace=%q,node=%q}", kind, a.cfg.Namespace, a.cfg.Node)
}

// metricValue scrapes one series, failing if the agent does not export it.
func metricValue(t *testing.T, a *Agent, name string, extra ...string) float64 {
	t.Helper()
	s := series(a, name, extra...)
	v, ok := scrape(t, a)[s]
	if !ok {
		t.Fatalf("/metrics has no %s", s)
	}
	return v
}

// waitMetric polls until a series has the value want.
func waitMetric(t *testing.T, a *Agent, want float64, name string, extra ...string) {
	t.Helper()
	testutil.WaitFor(t, ioWait, func() error {
		if v := metricValue(t, a, name, extra...); v != want {
			return fmt.Errorf("%s = %v, want %v", series(a, name, extra...), v, want)
		}
		return nil
	})
}

func TestAgentMetrics(t *testing.T) {
	const budget = 1 << 20
	a := startAgent(t, Config{MetricsAddr: "127.0.0.1:0", MemoryBytes: budget})
	if host, port, err := net.SplitHostPort(a.MetricsAddr()); err != nil || host != "127.0.0.1" || port == "0" {
		t.Fatalf("MetricsAddr() = %q, %v: want the bound 127.0.0.1 port", a.MetricsAddr(), err)
	}
	m := scrape(t, a)
	for _, name := range []string{"client_requests_total", "read_rows_total", "served_rows_total", "served_bytes_total",
		"fetches_total", "errors_total", "clients", "recv_regions", "memory_bytes", "variables", "read_duration_seconds_count"} {
		if v, ok := m[series(a, name)]; !ok || v != 0 {
			t.Errorf("before any client: %s = %v (exported: %v), want 0", series(a, name), v, ok)
		}
	}
	if v := m[series(a, "memory_budget_bytes")]; v != budget {
		t.Errorf("memory_budget_bytes = %v, want %d", v, budget)
	}
	if v := m[series(a, "coordinator")]; v != 1 {
		t.Errorf("coordinator = %v, want 1 (a single-node job)", v)
	}
	for _, src := range []string{"client", "peer"} {
		if v, ok := m[series(a, "bad_frames_total", "source", src)]; !ok || v != 0 {
			t.Errorf("bad_frames_total from %s = %v (exported: %v), want 0", src, v, ok)
		}
	}
	if _, ok := m["go_goroutines"]; !ok {
		t.Errorf("no go_goroutines: the Go runtime collector is not registered")
	}

	// A client: hello, one variable of 6 rows of 8 bytes, a region, two
	// reads (one fails).
	r := dialRaw(t, a)
	r.hello(a, 0, 1)
	waitMetric(t, a, 1, "clients")
	const rows, rb, regionSize = 6, 8, 64
	sh := wire.Shard{Name: "m", Rank: 0, Size: 1, Rows: rows, Disp: 2, ItemSize: 4, TimeoutMs: 5000, Attempt: 1}
	p, err := wire.DecodePath(r.must(wire.OpCreate, sh.Encode))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { shm.Remove(p.Path) })
	tab, err := wire.DecodeTable(r.must(wire.OpPublish, sh.Encode))
	if err != nil {
		t.Fatal(err)
	}
	reg, err := shm.NewRegion("agent-metrics-test", regionSize)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { reg.Close() })
	rm, err := wire.DecodeRegion(r.must(wire.OpRegister, (&wire.Region{Size: regionSize}).Encode, reg.Fd))
	if err != nil {
		t.Fatal(err)
	}
	r.must(wire.OpRead, (&wire.Read{Name: sh.Name, Region: rm.ID, ID: tab.ID, Globals: []int64{0, 5, 2}, Offsets: []int64{0, 8, 16}}).Encode)
	if _, err := r.call(wire.OpRead, (&wire.Read{Name: sh.Name, Region: rm.ID, ID: tab.ID, Globals: []int64{rows}, Offsets: []int64{0}}).Encode); !errors.Is(err, base.ErrIndex) {
		t.Fatalf("read past the last row: %v, want ErrIndex", err)
	}
	// A client that sends garbage is dropped and counted.
	bad := dialRaw(t, a)
	bad.write([]byte("this is not a frame at all, not even close"))
	bad.expectClosed()

	waitMetric(t, a, 1, "bad_frames_total", "source", "client")
	waitMetric(t, a, 1, "clients")
	m = scrape(t, a)
	want := map[string]float64{
		series(a, "client_requests_total"):                      6, // hello, create, publish, register, 2 reads
		series(a, "read_rows_total"):                            3,
		series(a, "errors_total"):                               1,
		kindSeries(a, "index"):                                  1, // the read past the last row
		kindSeries(a, "geometry"):                               0,
		series(a, "served_rows_total"):                          0, // no other node
		series(a, "fetches_total"):                              0,
		series(a, "bad_frames_total", "source", "peer"):         0,
		series(a, "recv_regions"):                               1,
		series(a, "memory_bytes"):                               rows*rb + regionSize,
		series(a, "memory_budget_bytes"):                        budget,
		series(a, "variables"):                                  1,
		series(a, "read_duration_seconds_count"):                2,
		series(a, "read_duration_seconds_bucket", "le", "+Inf"): 2,
	}
	for s, w := range want {
		if v, ok := m[s]; !ok || v != w {
			t.Errorf("%s = %v (exported: %v), want %v", s, v, ok, w)
		}
	}
	if v := m[series(a, "read_duration_seconds_sum")]; v <= 0 || v > 2*ioWait.Seconds() {
		t.Errorf("read_duration_seconds_sum = %v, want the time of two reads", v)
	}
	// The counters are those `ddstore info` shows (which counts its own
	// request).
	in := r.info()
	if c := in.Counters; float64(c["client_requests"]) != m[series(a, "client_requests_total")]+1 ||
		float64(c["read_rows"]) != m[series(a, "read_rows_total")] || float64(c["errors"]) != m[series(a, "errors_total")] {
		t.Errorf("info counters %v disagree with /metrics", c)
	}
	if float64(in.MemoryBytes) != m[series(a, "memory_bytes")] {
		t.Errorf("info memory_bytes %d, /metrics %v", in.MemoryBytes, m[series(a, "memory_bytes")])
	}

	// Only /metrics is served.
	resp, err := metricsClient.Get("http://" + a.MetricsAddr() + "/")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusNotFound {
		t.Errorf("GET /: %s, want 404", resp.Status)
	}
}

// Several agents in one process each export their own metrics (a shared
// registry would refuse the second agent's collectors).
func TestAgentMetricsSeveralAgents(t *testing.T) {
	a := startAgent(t, Config{MetricsAddr: "127.0.0.1:0", Node: "n1"})
	b := startAgent(t, Config{MetricsAddr: "127.0.0.1:0", Node: "n2"})
	ra := dialRaw(t, a)
	ra.hello(a, -1, 0)
	ra.info()
	if got := metricValue(t, a, "client_requests_total"); got != 2 {
		t.Errorf("agent n1: client_requests_total = %v, want 2", got)
	}
	mb := scrape(t, b)
	if got, ok := mb[series(b, "client_requests_total")]; !ok || got != 0 {
		t.Errorf("agent n2: client_requests_total = %v (exported: %v), want 0", got, ok)
	}
	for s := range mb {
		if strings.Contains(s, `node="n1"`) {
			t.Errorf("agent n2 exports %s", s)
		}
	}
}

// Close stops the metrics server and every goroutine it started.
func TestAgentMetricsClose(t *testing.T) {
	before := runtime.NumGoroutine()
	a, err := Start(Config{Namespace: testNamespace(), Node: "n1", Socket: filepath.Join(privateTempDir(t), "s.sock"), MetricsAddr: "127.0.0.1:0"})
	if err != nil {
		t.Fatal(err)
	}
	addr := a.MetricsAddr()
	scrape(t, a)
	// A scraper holding an idle keep-alive connection does not keep the
	// server from stopping.
	keep := &http.Client{Transport: &http.Transport{}, Timeout: ioWait}
	resp, err := keep.Get("http://" + addr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	a.Close()
	keep.CloseIdleConnections()
	if resp, err := metricsClient.Get("http://" + addr + "/metrics"); err == nil {
		resp.Body.Close()
		t.Fatalf("GET /metrics after Close: %s, want a refused connection", resp.Status)
	}
	checkNoLeak(t, before)
}

func TestAgentMetricsListenError(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	taken := ln.Addr().String()
	before := runtime.NumGoroutine()
	cfg := Config{Namespace: testNamespace(), Node: "n1", Socket: filepath.Join(privateTempDir(t), "s.sock"), MetricsAddr: taken}
	a, err := Start(cfg)
	if err == nil {
		a.Close()
		t.Fatalf("Start with metrics address %s in use: no error", taken)
	}
	if !strings.Contains(err.Error(), "metrics") || !strings.Contains(err.Error(), taken) {
		t.Errorf("Start with metrics address %s in use: %q, want an error naming the metrics address", taken, err)
	}
	checkNoLeak(t, before)
	// The failed start left nothing behind: the same agent starts without
	// the metrics address, and then serves none.
	cfg.MetricsAddr = ""
	a, err = Start(cfg)
	if err != nil {
		t.Fatalf("Start after a failed start: %v", err)
	}
	defer a.Close()
	if a.MetricsAddr() != "" {
		t.Errorf("MetricsAddr() = %q without Config.MetricsAddr", a.MetricsAddr())
	}
}

package agent

import (
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// metrics is what the agent exports in the Prometheus text format. The
// counters are the agent's own atomics (a.stats, the peer server's
// BadFrames), read at scrape time; only the latency of client reads is kept
// here. Each agent has its own registry, so that several agents in one
// process (tests, Go programs) do not collide.
type metrics struct {
	reg         *prometheus.Registry
	readSeconds prometheus.Histogram
	ln          net.Listener // nil without Config.MetricsAddr
	srv         *http.Server
}

// readBuckets span a read of local rows (microseconds) to one bounded by
// the timeout of a read from another node (30 s by default).
var readBuckets = prometheus.ExponentialBuckets(5e-6, 4, 12) // 5 µs .. 21 s

func newMetrics(a *Agent) *metrics {
	m := &metrics{reg: prometheus.NewRegistry()}
	labels := prometheus.Labels{"namespace": a.cfg.Namespace, "node": a.cfg.Node}
	opts := func(name, help string) prometheus.Opts {
		return prometheus.Opts{Namespace: "ddstore", Subsystem: "agent", Name: name, Help: help, ConstLabels: labels}
	}
	with := func(o prometheus.Opts, k, v string) prometheus.Opts {
		l := prometheus.Labels{k: v}
		for k, v := range o.ConstLabels {
			l[k] = v
		}
		o.ConstLabels = l
		return o
	}
	counter := func(o prometheus.Opts, f func() int64) prometheus.Collector {
		return prometheus.NewCounterFunc(prometheus.CounterOpts(o), func() float64 { return float64(f()) })
	}
	gauge := func(o prometheus.Opts, f func() int64) prometheus.Collector {
		return prometheus.NewGaugeFunc(prometheus.GaugeOpts(o), func() float64 { return float64(f()) })
	}
	s := &a.stats
	badFrames := opts("bad_frames_total", "Connections dropped for a malformed frame or request, by who sent it.")
	refused := opts("refused_connections_total", "Connections refused for not proving the job's key (or, for clients, of another user), by who made them.")
	m.readSeconds = prometheus.NewHistogram(prometheus.HistogramOpts{
		Namespace: "ddstore", Subsystem: "agent", Name: "read_duration_seconds", ConstLabels: labels, Buckets: readBuckets,
		Help: "Time to serve a client's Read request, from its decoding to its answer (failed reads included).",
	})
	coordMsgs := opts("coordinator_messages_total", "Messages the coordinator received from other agents (in) and sent them (out: replies and its own requests); 0 on other agents.")
	coordBytes := opts("coordinator_bytes_total", "Bytes of the coordinator's messages, frame headers included, by direction.")
	peerConns := opts("peer_connections", "TCP connections to other agents (out: dialed by this one) and from them (in).")
	byKind := opts("client_errors_total", "Client requests answered with an error, by kind (the error's sentinel: index, geometry, unknown, timeout, peer, ...).")
	s.errorKinds.each(func(kind string, n func() int64) { m.reg.MustRegister(counter(with(byKind, "kind", kind), n)) })
	m.reg.MustRegister(
		counter(opts("client_requests_total", "Requests received from this node's clients."), s.clientRequests.Load),
		counter(opts("read_rows_total", "Rows read for this node's clients (local and fetched from other nodes)."), s.readRows.Load),
		counter(opts("served_rows_total", "Rows served to other nodes' agents."), s.servedRows.Load),
		counter(opts("served_bytes_total", "Bytes of rows served to other nodes' agents."), s.servedBytes.Load),
		counter(opts("fetches_total", "Fetch requests sent to other nodes' agents."), s.fetches.Load),
		counter(opts("errors_total", "Client requests answered with an error."), s.errors.Load),
		counter(opts("storage_rows_total", "Rows read from backing files (on demand and ahead of use)."), s.tier.Rows.Load),
		counter(opts("storage_reads_total", "Reads of backing files (each covers several rows once coalesced)."), s.tier.Reads.Load),
		counter(opts("storage_bytes_total", "Bytes read from backing files, the gaps between wanted rows included."), s.tier.Bytes.Load),
		counter(opts("storage_errors_total", "Reads of backing files that failed."), s.tier.Errors.Load),
		counter(opts("staged_rows_total", "Rows served from staging memory, read ahead of use."), s.tier.Staged.Load),
		counter(opts("prefetch_rows_total", "Rows read ahead of use into staging memory."), s.tier.Prefetched.Load),
		counter(opts("prefetch_dropped_total", "Rows asked to be read ahead but not, for want of staging room."), s.tier.Dropped.Load),
		counter(opts("prefetch_late_total", "Rows asked to be read ahead after a client had read them (ignored)."), s.tier.Late.Load),
		counter(opts("prefetch_evicted_total", "Rows read ahead and evicted from staging before any client read them."), s.tier.Evicted.Load),
		counter(opts("peer_fallback_rows_total", "Rows read from the backing file because the node holding them could not be reached."), s.peerFallbackRows.Load),
		gauge(opts("staging_bytes", "Staging memory of the storage tiers."), a.stagingBytes.Load),
		counter(with(badFrames, "source", "client"), s.badFrames.Load),
		counter(with(refused, "source", "client"), a.auth.refusedClients.Load),
		counter(with(refused, "source", "peer"), func() int64 {
			if a.peer == nil {
				return 0
			}
			return a.peer.Refused.Load()
		}),
		counter(with(badFrames, "source", "peer"), func() int64 {
			if a.peer == nil {
				return 0
			}
			return a.peer.BadFrames.Load()
		}),
		counter(opts("peer_shed_connections_total", "Peer connections closed on arrival: too many others had not authenticated yet."), func() int64 {
			if a.peer == nil {
				return 0
			}
			return a.peer.Shed.Load()
		}),
		counter(opts("peer_throttled_total", "Times a peer connection's read loop waited for one of its requests in flight to be answered before reading more."), func() int64 {
			if a.peer == nil {
				return 0
			}
			return a.peer.Throttled.Load()
		}),
		gauge(opts("direct_connections", "Connections of other nodes' clients reading rows straight from this agent."), func() int64 {
			if a.peer == nil {
				return 0
			}
			return a.peer.Direct.Load()
		}),
		gauge(opts("clients", "Client connections open."), func() int64 {
			a.mu.Lock()
			defer a.mu.Unlock()
			return int64(len(a.mu.sessions))
		}),
		gauge(opts("recv_regions", "Receive regions registered by clients."), func() int64 { return int64(a.regions.count()) }),
		gauge(opts("memory_bytes", "Memory held: data of the shards on this node plus the clients' receive regions."), func() int64 {
			return a.shardBytes.Load() + a.regions.bytes()
		}),
		gauge(opts("memory_budget_bytes", "Cap on memory_bytes (--memory); 0: none."), func() int64 { return a.cfg.MemoryBytes }),
		gauge(opts("variables", "Variables this node holds shards or a table of."), func() int64 {
			a.mu.Lock()
			defer a.mu.Unlock()
			return int64(len(a.mu.vars))
		}),
		gauge(opts("coordinator", "1 if this agent coordinates the job."), func() int64 {
			if a.coord.Load() != nil {
				return 1
			}
			return 0
		}),
		counter(with(coordMsgs, "direction", "in"), s.coord.in.Load),
		counter(with(coordMsgs, "direction", "out"), s.coord.out.Load),
		counter(with(coordBytes, "direction", "in"), s.coord.inBytes.Load),
		counter(with(coordBytes, "direction", "out"), s.coord.outBytes.Load),
		counter(opts("manifest_writes_total", "Manifests written (saves asked for at once share one)."), a.saves.written.Load),
		gauge(with(peerConns, "direction", "out"), func() int64 {
			if a.pool == nil {
				return 0
			}
			return int64(a.pool.Conns())
		}),
		gauge(with(peerConns, "direction", "in"), func() int64 {
			if a.peer == nil {
				return 0
			}
			return int64(a.peer.Conns())
		}),
		m.readSeconds,
		collectors.NewGoCollector(),
		collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
	)
	return m
}

// observeRead records the latency of one client Read; deferred with the
// time the read began.
func (a *Agent) observeRead(start time.Time) {
	a.metrics.readSeconds.Observe(time.Since(start).Seconds())
}

// serveMetrics listens on cfg.MetricsAddr, if set, and serves /metrics
// there until shutdown (closeMetrics).
func (a *Agent) serveMetrics() error {
	addr := a.cfg.MetricsAddr
	if addr == "" {
		return nil
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return fmt.Errorf("ddstore: metrics listen on %s (--metrics-addr): %w", addr, err)
	}
	errLog := slog.NewLogLogger(a.log.Handler(), slog.LevelWarn)
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(a.metrics.reg, promhttp.HandlerOpts{
		ErrorLog: errLog, MaxRequestsInFlight: 4, Timeout: 10 * time.Second,
	}))
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second, IdleTimeout: time.Minute, ErrorLog: errLog}
	a.metrics.ln, a.metrics.srv = ln, srv
	a.go_(func() {
		if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			a.log.Error("metrics server", "addr", ln.Addr().String(), "err", err)
		}
	})
	a.log.Info("serving metrics", "addr", "http://"+ln.Addr().String()+"/metrics")
	return nil
}

// closeMetrics stops the metrics server: no new scrape, connections closed.
func (a *Agent) closeMetrics() {
	if a.metrics != nil && a.metrics.srv != nil {
		a.metrics.srv.Close()
	}
}

// MetricsAddr is the address /metrics is served on; "" without
// Config.MetricsAddr.
func (a *Agent) MetricsAddr() string {
	if a.metrics == nil || a.metrics.ln == nil {
		return ""
	}
	return a.metrics.ln.Addr().String()
}

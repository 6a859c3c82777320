package bench

import (
	crand "crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"os"
	"path/filepath"
	"runtime"
	"sync"
	"time"

	"github.com/ddstore-go/ddstore"
	"github.com/ddstore-go/ddstore/internal/agent"
	"github.com/ddstore-go/ddstore/internal/auth"
)

// Options of a store benchmark.
type Options struct {
	RowSizes   []int         // bytes per row
	Batch      int           // rows per GetBatch
	ShardBytes int64         // bytes each of the two ranks holds
	Duration   time.Duration // per throughput measurement
	Latency    int           // single-row Gets timed per latency figure
	// InProcess runs both agents inside this process; otherwise the
	// library starts them as `ddstore agent` processes, as a job would.
	InProcess bool
	// Transports are the transports whose cross-node figures are measured,
	// each in a job of its own, one after the other: "tcp", "mpi" (the
	// agents as the two ranks of an mpirun launch of this binary, which
	// must be built with -tags mpi). The first one's job also gives Rows
	// (local reads and the limits). Empty: tcp alone.
	Transports []string
	Progress   io.Writer // where to say what is being measured; nil: nowhere
}

// QuickOptions finishes in well under 30 s on two cores.
func QuickOptions() Options {
	return Options{RowSizes: []int{64, 4 << 10, 64 << 10, 1 << 20}, Batch: 256, ShardBytes: 64 << 20,
		Duration: 400 * time.Millisecond, Latency: 2000}
}

// FullOptions are the figures recorded in docs/benchmarks.md.
func FullOptions() Options {
	return Options{RowSizes: []int{64, 4 << 10, 64 << 10, 1 << 20}, Batch: 256, ShardBytes: 256 << 20,
		Duration: 2 * time.Second, Latency: 20000}
}

// Result is one row size's figures; the JSON names are stable for scripts.
type Result struct {
	RowBytes        int     `json:"row_bytes"`
	LocalGBps       float64 `json:"local_gbps"`
	RemoteGBps      float64 `json:"remote_gbps"`
	RemoteCopyGBps  float64 `json:"remote_copy_gbps"`
	GatherLimitGBps float64 `json:"gather_limit_gbps"`
	TCPLimitGBps    float64 `json:"tcp_limit_gbps"`
	LocalVsGather   float64 `json:"local_vs_gather"`
	RemoteVsTCP     float64 `json:"remote_vs_tcp"`
	// The same two figures taken in turns (remoteTurns): a slice of the
	// remote reads, then one of the TCP stream, alternating which goes
	// first, turnsOfRates times; RemoteVsTCPTurns is the median of the
	// turns' ratios, the figure that this machine's swings between its
	// idle and busy states (2x on either figure between one second and
	// the next) move least.
	RemoteTurnsGBps  float64 `json:"remote_turns_gbps,omitempty"`
	TCPTurnsGBps     float64 `json:"tcp_turns_gbps,omitempty"`
	RemoteVsTCPTurns float64 `json:"remote_vs_tcp_turns,omitempty"`
	LocalRowsPerSec  float64 `json:"local_rows_per_s"`
	RemoteRowsPerSec float64 `json:"remote_rows_per_s"`
	GetLocalP50us    float64 `json:"get_local_p50_us"`
	GetLocalP99us    float64 `json:"get_local_p99_us"`
	GetRemoteP50us   float64 `json:"get_remote_p50_us"`
	GetRemoteP99us   float64 `json:"get_remote_p99_us"`
	// Transport is the transport of the job that measured the row.
	Transport string `json:"transport"`
	// Remote2GBps is remote reads with two batches in flight at once (two
	// goroutines of the store, each into its own AllocRecv buffer), and
	// Remote2VsRemote its ratio to one batch at a time.
	Remote2GBps     float64 `json:"remote_2_in_flight_gbps"`
	Remote2VsRemote float64 `json:"remote_2_in_flight_vs_remote"`
	// The single-row Get of the other node's row next to its limits, in
	// one run: through this node's agent (Config.NoDirect, the path of
	// every read before direct reads), one raw round trip of the same
	// bytes over loopback TCP and over a Unix socket, and the ratio of
	// GetRemoteP50us (direct) to the TCP round trip.
	RemoteViaAgentGBps      float64 `json:"remote_via_agent_gbps,omitempty"`
	GetRemoteViaAgentP50us  float64 `json:"get_remote_via_agent_p50_us,omitempty"`
	TCPRoundTripP50us       float64 `json:"tcp_round_trip_p50_us,omitempty"`
	UnixRoundTripP50us      float64 `json:"unix_round_trip_p50_us,omitempty"`
	GetRemoteVsTCPRoundTrip float64 `json:"get_remote_vs_tcp_round_trip,omitempty"`
}

// Report is a whole run.
type Report struct {
	Rows       []Result `json:"rows"`
	Batch      int      `json:"batch"`
	ShardBytes int64    `json:"shard_bytes"`
	Duration   string   `json:"duration_per_figure"`
	Agents     string   `json:"agents"`
	CPUs       int      `json:"cpus"`
	Go         string   `json:"go"`
	// Transports are the cross-node figures of every transport measured
	// (Options.Transports), the first one's the same as in Rows.
	Transports []Result `json:"transports,omitempty"`
	// MPIProbe is DDStore's method 0 measured in this run (with the
	// transport mpi).
	MPIProbe []MPIProbeResult `json:"mpi_probe,omitempty"`
	// MPITrainer is a Store with Method "mpi" measured in this run: rows
	// of the other node read with MPI gets from the reading process (with
	// the transport mpi).
	MPITrainer []MPIProbeResult `json:"mpi_trainer,omitempty"`
	// UnderLoad is small cross-node Gets alone and under a concurrent
	// stream of large batches (the first transport's job, tcp).
	UnderLoad *LoadLatency `json:"under_load,omitempty"`
}

// Run measures a two-node job on loopback: rank 0 on node A reads rows of
// its own node (shared memory) and of node B (through the agents over
// TCP), next to the limits measured in the same run.
func Run(opts Options) (*Report, error) {
	if opts.Batch <= 0 || opts.ShardBytes <= 0 || len(opts.RowSizes) == 0 {
		return nil, fmt.Errorf("bench: batch %d, shard bytes %d, %d row sizes: want all > 0", opts.Batch, opts.ShardBytes, len(opts.RowSizes))
	}
	progress := opts.Progress
	if progress == nil {
		progress = io.Discard
	}
	transports := opts.Transports
	if len(transports) == 0 {
		transports = []string{"tcp"}
	}
	for _, tr := range transports {
		if err := checkTransport(tr); err != nil {
			return nil, err
		}
	}
	rep := &Report{Batch: opts.Batch, ShardBytes: opts.ShardBytes, Duration: opts.Duration.String(),
		Agents: map[bool]string{true: "in-process", false: "processes"}[opts.InProcess], CPUs: runtime.NumCPU(), Go: runtime.Version()}
	if transports[0] == "mpi" {
		rep.Agents = "mpirun"
	}
	src := make([]byte, opts.ShardBytes)
	for k, tr := range transports {
		if err := runTransport(opts, rep, tr, k == 0, src, progress); err != nil {
			return nil, err
		}
		if tr == "mpi" && rep.MPIProbe == nil {
			fmt.Fprintln(progress, "mpi probe (DDStore's method 0 pattern)")
			probe, err := runMPIProbe(opts)
			if err != nil {
				return nil, err
			}
			rep.MPIProbe = probe
			fmt.Fprintln(progress, "mpi trainer reads (Store with Method mpi)")
			if rep.MPITrainer, err = runMPITrainer(opts); err != nil {
				return nil, err
			}
		}
	}
	return rep, nil
}

// runTransport measures one transport's job: everything for the first,
// the cross-node figures for the others.
func runTransport(opts Options, rep *Report, tr string, first bool, src []byte, progress io.Writer) error {
	var j *job
	var err error
	if tr == "mpi" {
		j, err = startMPIJob()
	} else {
		j, err = startJob(opts.InProcess, tr)
	}
	if err != nil {
		return fmt.Errorf("bench: transport %s: %w", tr, err)
	}
	defer j.close()
	for _, rb := range opts.RowSizes {
		fmt.Fprintf(progress, "%s row %s: ", tr, sizeName(rb))
		r, err := j.measure(opts, rb, src, progress, !first)
		fmt.Fprintln(progress)
		if err != nil {
			return fmt.Errorf("bench: transport %s, rows of %d bytes: %w", tr, rb, err)
		}
		r.Transport = tr
		if first {
			rep.Rows = append(rep.Rows, r)
		}
		rep.Transports = append(rep.Transports, r)
	}
	if first && tr == "tcp" {
		fmt.Fprint(progress, "tcp small Gets under a stream of large batches: ")
		bin, err := pingBinary(opts)
		if err != nil {
			return fmt.Errorf("bench: transport %s, Gets under load: %w", tr, err)
		}
		l, err := j.underLoad(opts, src, bin, progress)
		fmt.Fprintln(progress)
		if err != nil {
			return fmt.Errorf("bench: transport %s, Gets under load: %w", tr, err)
		}
		rep.UnderLoad = &l
	}
	return nil
}

// pingBinary is the program that answers the raw round trips a Get is
// compared with: the agents' binary, so that they cross processes as the
// Get does, or "" (a goroutine of this process) when the agents run in
// this process.
func pingBinary(opts Options) (string, error) {
	if opts.InProcess {
		return "", nil
	}
	return ddstore.AgentBinary()
}

// job is two ranks on two nodes of one machine.
type job struct {
	ns     string
	agents []*agent.Agent
	stores [2]*ddstore.Store
	// via is a reader on rank 0's node whose reads of the other node all
	// go through its agent (NoDirect), for the figures before direct reads.
	via *ddstore.Store
	dir string
	mpi *mpiLaunch // the agents' mpirun (transport mpi)
}

func startJob(inProcess bool, tr string) (*job, error) {
	j := &job{}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	rdv := l.Addr().String()
	l.Close()
	ns := fmt.Sprintf("bench-%d-%s", os.Getpid(), tr)
	j.ns = ns
	// Agents that meet through a rendezvous address prove a shared secret
	// to each other; without one from the user, the job makes its own,
	// which the agents it starts inherit.
	if os.Getenv(auth.SecretEnv) == "" {
		os.Setenv(auth.SecretEnv, crand.Text())
	}
	runDir := ""
	if inProcess {
		if j.dir, err = os.MkdirTemp("", "ddstore-bench-"); err != nil {
			return nil, err
		}
		runDir = filepath.Join(j.dir, "run")
	}
	for rank, node := range []string{"bench-a", "bench-b"} {
		cfg := ddstore.Config{Namespace: ns, Rank: rank, Size: 2, LocalRank: 0, LocalSize: 1, Node: node,
			RunDir: runDir, AgentArgs: []string{"--rendezvous", rdv, "--transport", tr}}
		if inProcess {
			a, err := agent.Start(agent.Config{Namespace: ns, Node: node, Rendezvous: rdv,
				Socket: ddstore.SocketPath(runDir, ns, node), Transport: tr})
			if err != nil {
				j.close()
				return nil, err
			}
			j.agents = append(j.agents, a)
			cfg.NoSpawn = true
		}
		s, err := ddstore.Open(cfg)
		if err != nil {
			j.close()
			return nil, err
		}
		j.stores[rank] = s
		if rank == 0 {
			cfg.Reader, cfg.NoDirect, cfg.NoSpawn = true, true, true
			if j.via, err = ddstore.Open(cfg); err != nil {
				j.close()
				return nil, err
			}
		}
	}
	return j, nil
}

func (j *job) close() {
	if j.via != nil {
		j.via.Close()
	}
	for _, s := range j.stores {
		if s != nil {
			s.Close()
		}
	}
	for _, a := range j.agents {
		a.Close()
	}
	if j.mpi != nil {
		j.mpi.stop()
	}
	if j.dir != "" {
		os.RemoveAll(j.dir)
	}
}

// both runs f on the two ranks at once (Add and Free are collective).
func (j *job) both(f func(rank int, s *ddstore.Store) error) error {
	var wg sync.WaitGroup
	errs := make([]error, 2)
	for r, s := range j.stores {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[r] = f(r, s)
		}()
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			return err
		}
	}
	return nil
}

// measure measures rows of rb bytes; remoteOnly skips what does not
// cross nodes (local reads, the limits).
func (j *job) measure(opts Options, rb int, src []byte, progress io.Writer, remoteOnly bool) (Result, error) {
	res := Result{RowBytes: rb}
	n := int64(len(src) / rb)
	if n < 1 {
		return res, fmt.Errorf("a shard of %d bytes holds no row of %d bytes", len(src), rb)
	}
	name := fmt.Sprintf("bench-%d", rb)
	// Each row starts with its global index, so that every timed batch can
	// be checked afterwards.
	if err := j.both(func(rank int, s *ddstore.Store) error {
		shard := src[:n*int64(rb)]
		if rank == 1 {
			shard = make([]byte, len(shard))
		}
		for i := range n {
			binary.LittleEndian.PutUint64(shard[i*int64(rb):], uint64(int64(rank)*n+i))
		}
		return s.Add(name, shard, int64(rb), 1)
	}); err != nil {
		return res, err
	}
	defer j.both(func(_ int, s *ddstore.Store) error { return s.Free(name) })
	s := j.stores[0]

	batches := func(lo int64, seed uint64) [][]int64 {
		rng := rand.New(rand.NewPCG(seed, 17))
		out := make([][]int64, 64)
		for b := range out {
			out[b] = make([]int64, opts.Batch)
			for i := range out[b] {
				out[b][i] = lo + rng.Int64N(n)
			}
		}
		return out
	}
	verify := func(dst []byte, idx []int64) error {
		for i, g := range idx {
			if got := int64(binary.LittleEndian.Uint64(dst[i*rb:])); got != g {
				return fmt.Errorf("row %d read as row %d", g, got)
			}
		}
		return nil
	}
	readOn := func(s *ddstore.Store, dst []byte, idx [][]int64) (Rate, error) {
		k := 0
		r, err := Throughput(opts.Duration, opts.Batch*rb, rb, func() error {
			k = (k + 1) % len(idx)
			return s.GetBatch(name, dst, idx[k])
		})
		if err == nil {
			err = verify(dst, idx[k])
		}
		return r, err
	}
	read := func(dst []byte, idx [][]int64) (Rate, error) { return readOn(s, dst, idx) }

	dst := make([]byte, opts.Batch*rb)
	var local Rate
	if !remoteOnly {
		fmt.Fprint(progress, "local ")
		var err error
		if local, err = read(dst, batches(0, 1)); err != nil {
			return res, err
		}
	}
	fmt.Fprint(progress, "remote ")
	recv, err := s.AllocRecv(opts.Batch * rb)
	if err != nil {
		return res, err
	}
	defer s.FreeRecv(recv)
	remote, err := read(recv, batches(n, 2))
	if err != nil {
		return res, err
	}
	remoteCopy, err := read(dst, batches(n, 3))
	if err != nil {
		return res, err
	}
	fmt.Fprint(progress, "remote-2-in-flight ")
	recv2, err := s.AllocRecv(opts.Batch * rb)
	if err != nil {
		return res, err
	}
	defer s.FreeRecv(recv2)
	idx2 := [2][][]int64{batches(n, 5), batches(n, 6)}
	bufs := [2][]byte{recv, recv2}
	k2 := 0
	remote2, err := Throughput(opts.Duration, 2*opts.Batch*rb, rb, func() error {
		k2 = (k2 + 1) % len(idx2[0])
		var wg sync.WaitGroup
		var errs [2]error
		for i := range 2 {
			wg.Go(func() { errs[i] = s.GetBatch(name, bufs[i], idx2[i][k2]) })
		}
		wg.Wait()
		return errors.Join(errs[0], errs[1])
	})
	if err == nil {
		err = errors.Join(verify(recv, idx2[0][k2]), verify(recv2, idx2[1][k2]))
	}
	if err != nil {
		return res, err
	}
	res.Remote2GBps = remote2.GBps
	if remote.GBps > 0 {
		res.Remote2VsRemote = remote2.GBps / remote.GBps
	}
	fmt.Fprint(progress, "latency ")
	one := make([]byte, rb)
	// getOne times one Get of a random row of [lo, lo+n) by s, checked.
	getOne := func(s *ddstore.Store, rng *rand.Rand, lo int64) (time.Duration, error) {
		g := lo + rng.Int64N(n)
		t0 := time.Now()
		if err := s.Get(name, one, g); err != nil {
			return 0, err
		}
		d := time.Since(t0)
		if got := int64(binary.LittleEndian.Uint64(one)); got != g {
			return 0, fmt.Errorf("row %d read as row %d", g, got)
		}
		return d, nil
	}
	lat := func(lo int64, iters int) ([]float64, error) {
		rng := rand.New(rand.NewPCG(4, uint64(lo)))
		ds := make([]time.Duration, iters)
		for i := range ds {
			d, err := getOne(s, rng, lo)
			if err != nil {
				return nil, err
			}
			ds[i] = d
		}
		return DurationsToMicros(ds), nil
	}
	var rl []float64
	if j.via == nil {
		if rl, err = lat(n, max(opts.Latency/10, 100)); err != nil {
			return res, err
		}
	} else {
		fmt.Fprint(progress, "via-agent ping-pong ")
		iters := max(opts.Latency/10, 100)
		bin, err := pingBinary(opts)
		if err != nil {
			return res, err
		}
		rl, err = getsInTurns(iters, bin, rb, func(rng *rand.Rand, via bool) (time.Duration, error) {
			if via {
				return getOne(j.via, rng, n)
			}
			return getOne(s, rng, n)
		}, &res)
		if err != nil {
			return res, err
		}
		vrecv, err := j.via.AllocRecv(opts.Batch * rb)
		if err != nil {
			return res, err
		}
		defer j.via.FreeRecv(vrecv)
		vr, err := readOn(j.via, vrecv, batches(n, 2))
		if err != nil {
			return res, err
		}
		res.RemoteViaAgentGBps = vr.GBps
	}
	res.RemoteGBps, res.RemoteRowsPerSec = remote.GBps, remote.RowsPerSec
	res.RemoteCopyGBps = remoteCopy.GBps
	res.GetRemoteP50us, res.GetRemoteP99us = Percentile(rl, 50), Percentile(rl, 99)
	if remoteOnly {
		return res, nil
	}
	ll, err := lat(0, opts.Latency)
	if err != nil {
		return res, err
	}
	fmt.Fprint(progress, "gather-limit ")
	gather := GatherLimit(rb, opts.Batch, n*int64(rb), opts.Duration, 1)
	fmt.Fprint(progress, "tcp-limit")
	tcp, err := TCPLimit(opts.Duration)
	if err != nil {
		return res, err
	}
	res.LocalGBps, res.LocalRowsPerSec = local.GBps, local.RowsPerSec
	res.GatherLimitGBps, res.TCPLimitGBps = gather.GBps, tcp.GBps
	if gather.GBps > 0 {
		res.LocalVsGather = local.GBps / gather.GBps
	}
	if tcp.GBps > 0 {
		res.RemoteVsTCP = remote.GBps / tcp.GBps
	}
	fmt.Fprint(progress, " remote-tcp-in-turns")
	k := 0
	idxT := batches(n, 7)
	turns, err := remoteTurns(opts.Duration, func(d time.Duration) (Rate, error) {
		r, err := Throughput(d, opts.Batch*rb, rb, func() error {
			k = (k + 1) % len(idxT)
			return s.GetBatch(name, recv, idxT[k])
		})
		if err == nil {
			err = verify(recv, idxT[k])
		}
		return r, err
	})
	if err != nil {
		return res, err
	}
	res.RemoteTurnsGBps, res.TCPTurnsGBps, res.RemoteVsTCPTurns = turns.ours, turns.limit, turns.ratio
	res.GetLocalP50us, res.GetLocalP99us = Percentile(ll, 50), Percentile(ll, 99)
	return res, nil
}

func sizeName(b int) string {
	switch {
	case b >= 1<<20 && b%(1<<20) == 0:
		return fmt.Sprintf("%dMiB", b>>20)
	case b >= 1<<10 && b%(1<<10) == 0:
		return fmt.Sprintf("%dKiB", b>>10)
	}
	return fmt.Sprintf("%dB", b)
}

// WriteTable prints the report as one table.
func (r *Report) WriteTable(w io.Writer) error {
	fmt.Fprintf(w, "ddstore bench: 2 nodes on loopback (agents: %s), batches of %d random rows, %s per rank, %s per figure, %d CPUs, %s\n\n",
		r.Agents, r.Batch, sizeName(int(r.ShardBytes)), r.Duration, r.CPUs, r.Go)
	t := NewTable("row", "local GB/s", "gather GB/s", "local/gather", "remote GB/s", "remote copy GB/s", "remote 2 in flight", "tcp GB/s", "remote/tcp",
		"remote/tcp in turns", "local Mrows/s", "remote Mrows/s", "get local p50 µs", "p99 µs", "get remote p50 µs", "p99 µs")
	f := func(x float64) string { return fmt.Sprintf("%.2f", x) }
	for _, x := range r.Rows {
		t.Row(sizeName(x.RowBytes), f(x.LocalGBps), f(x.GatherLimitGBps), f(x.LocalVsGather), f(x.RemoteGBps), f(x.RemoteCopyGBps),
			f(x.Remote2GBps), f(x.TCPLimitGBps), f(x.RemoteVsTCP), f(x.RemoteVsTCPTurns), fmt.Sprintf("%.3f", x.LocalRowsPerSec/1e6), fmt.Sprintf("%.3f", x.RemoteRowsPerSec/1e6),
			f(x.GetLocalP50us), f(x.GetLocalP99us), f(x.GetRemoteP50us), f(x.GetRemoteP99us))
	}
	if err := t.Write(w); err != nil {
		return err
	}
	tr := "tcp"
	if len(r.Rows) > 0 && r.Rows[0].Transport != "" {
		tr = r.Rows[0].Transport
	}
	fmt.Fprintf(w, "\nlocal: GetBatch of rows of this node (shared memory); remote: of the other node (agents over %s) into an AllocRecv buffer; remote copy: into a plain buffer; remote 2 in flight: two such batches at once.\n", tr)
	fmt.Fprintln(w, "Peer to beat (DDStore C++/MPI on these machines): get_batch 3.2-4.3 GB/s at 4 KiB, 4.7-6.7 GB/s at 64 KiB.")
	if l := r.UnderLoad; l != nil {
		fmt.Fprintf(w, "\nGet of one %s row of the other node, alone: p50 %.1f µs, p99 %.1f µs; while another client streams batches of %d × %s of the other node (%.2f GB/s): p50 %.1f µs, p99 %.1f µs (p99 under load / p50 alone %.2f).\n",
			sizeName(l.SmallRowBytes), l.AloneP50us, l.AloneP99us, l.LoadBatch, sizeName(l.LoadRowBytes), l.LoadGBps, l.LoadedP50us, l.LoadedP99us, l.LoadedP99VsAloneP50)
		fmt.Fprintf(w, "The limit, a raw TCP round trip of the same bytes between two processes after each Get: alone p50 %.1f µs, p99 %.1f µs; under the stream p50 %.1f µs, p99 %.1f µs (p99 under load / p50 alone %.2f).\n",
			l.RawAloneP50us, l.RawAloneP99us, l.RawLoadedP50us, l.RawLoadedP99us, l.RawLoadedP99VsAloneP50)
	}
	if len(r.Rows) > 0 && r.Rows[0].TCPRoundTripP50us > 0 {
		fmt.Fprintln(w)
		t := NewTable("row", "get remote p50 µs", "via agent p50 µs", "tcp round trip p50 µs", "unix round trip p50 µs", "get/tcp rtt",
			"remote GB/s", "via agent GB/s")
		for _, x := range r.Rows {
			t.Row(sizeName(x.RowBytes), f(x.GetRemoteP50us), f(x.GetRemoteViaAgentP50us), f(x.TCPRoundTripP50us), f(x.UnixRoundTripP50us),
				f(x.GetRemoteVsTCPRoundTrip), f(x.RemoteGBps), f(x.RemoteViaAgentGBps))
		}
		if err := t.Write(w); err != nil {
			return err
		}
		fmt.Fprintln(w, "get remote: a Get of one row of the other node (direct to its agent when small); via agent: the same through this node's agent (NoDirect);")
		fmt.Fprintln(w, "round trips: a 64-byte request answered with 32 + row bytes on one raw connection; a Get of each kind and a round trip of each taken in turns.")
	}
	if len(r.Transports) > len(r.Rows) || tr != "tcp" {
		return r.writeTransports(w)
	}
	return nil
}

// getsInTurns times iters turns of a direct Get (get(rng, false)), a Get
// through the own agent (get(rng, true)), a raw TCP round trip and a raw
// Unix-socket one of the same bytes, one of each a turn, so that every
// figure sees the machine alike (on an idle virtual machine a process
// woken from sleep can cost tens of µs more than a busy one: measured one
// after another, the figures can land in different modes). It sets res's
// via-agent and round-trip figures and returns the direct Gets' µs.
func getsInTurns(iters int, bin string, rb int, get func(rng *rand.Rand, via bool) (time.Duration, error), res *Result) ([]float64, error) {
	tcp, err := NewPinger("tcp", rb, iters, bin)
	if err != nil {
		return nil, err
	}
	defer tcp.Close()
	unix, err := NewPinger("unix", rb, iters, bin)
	if err != nil {
		return nil, err
	}
	defer unix.Close()
	direct, via := rand.New(rand.NewPCG(4, 1)), rand.New(rand.NewPCG(4, 2))
	ds := make([][]time.Duration, 4)
	for k := range ds {
		ds[k] = make([]time.Duration, iters)
	}
	for i := range iters {
		var err error
		if ds[0][i], err = get(direct, false); err != nil {
			return nil, err
		}
		if ds[1][i], err = get(via, true); err != nil {
			return nil, err
		}
		if ds[2][i], err = tcp.Once(); err != nil {
			return nil, err
		}
		if ds[3][i], err = unix.Once(); err != nil {
			return nil, err
		}
	}
	rl := DurationsToMicros(ds[0])
	res.GetRemoteViaAgentP50us = Percentile(DurationsToMicros(ds[1]), 50)
	res.TCPRoundTripP50us = Percentile(DurationsToMicros(ds[2]), 50)
	res.UnixRoundTripP50us = Percentile(DurationsToMicros(ds[3]), 50)
	if res.TCPRoundTripP50us > 0 {
		res.GetRemoteVsTCPRoundTrip = Percentile(rl, 50) / res.TCPRoundTripP50us
	}
	return rl, nil
}

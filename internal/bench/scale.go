package bench

// The scale driver (`ddstore bench scale`): K agents as processes on
// loopback, K node helpers holding the job's R ranks as Stores, and what
// grows with K measured per job size.

import (
	"bufio"
	crand "crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/ddstore-go/ddstore/internal/auth"
	"github.com/ddstore-go/ddstore/internal/client"
	"github.com/ddstore-go/ddstore/internal/naming"
	"github.com/ddstore-go/ddstore/internal/wire"
)

// scaleChildEnv is set in the environment of every process the driver
// starts: a driver started there refuses to run.
const scaleChildEnv = "DDSTORE_SCALE_CHILD"

// ScaleOptions size a scale run.
type ScaleOptions struct {
	Nodes        []int         // the job sizes K, one job each
	RanksPerNode int           // ranks per node; R = K × RanksPerNode
	RowsPerNode  int64         // rows each node holds (a multiple of RanksPerNode)
	RowBytes     int           // bytes per row
	Batch        int           // rows per GetBatch
	Rounds       int           // Add/Free rounds timed per job
	Duration     time.Duration // per GetBatch figure
	// Restart also measures GetBatch while one node's agent is killed
	// (SIGKILL) and started again.
	Restart bool
	// Meet is how the agents find the coordinator: "rendezvous" (the
	// default: one address) or "handshake" (a handshake directory).
	Meet string
	// MaxPeers and PeerIdle are the agents' --max-peers and --peer-idle
	// (zero: their defaults). With PeerIdle, the reading node's
	// connections are counted again once that long has passed after its
	// reads.
	MaxPeers int
	PeerIdle time.Duration
	// RelayFanout is the agents' --relay-fanout (zero: their default, 8):
	// the chunks of the trees that tables, drops and round requests take.
	RelayFanout int
	// Command makes the command that runs ddstore with args and extra
	// environment: the agents (`agent ...`) and the node helpers (`bench`
	// with ScaleNodeEnv set).
	Command  func(env []string, args ...string) *exec.Cmd
	Progress io.Writer

	started func(*scaleJob) // RunScale's: the job a signal stops
}

// DefaultScaleOptions: 8 ranks per node, 2,048 rows of 4 KiB per node.
func DefaultScaleOptions() ScaleOptions {
	return ScaleOptions{Nodes: []int{2, 4, 8, 16, 32, 64, 128}, RanksPerNode: 8, RowsPerNode: 2048, RowBytes: 4096,
		Batch: 256, Rounds: 5, Duration: 2 * time.Second, Restart: true}
}

// ScalePoint is one job size's figures; the JSON names are stable for the
// plotting script (python -m ddstore_bench.scale).
type ScalePoint struct {
	Nodes int `json:"nodes"`
	Ranks int `json:"ranks"`
	// OpenSeconds: from starting the agents to every rank's Open.
	OpenSeconds float64 `json:"open_s"`
	// FirstAddSeconds: the job's first Add, in which every agent also
	// finds and joins the coordinator.
	FirstAddSeconds float64 `json:"first_add_s"`
	// AddSeconds, FreeSeconds: a collective Add (Free) of a variable, from
	// the request to every node to the last rank's return; medians.
	AddSeconds  float64   `json:"add_s"`
	FreeSeconds float64   `json:"free_s"`
	AddAll      []float64 `json:"add_all_s"`
	// CPU time per Add round, in ms: of the coordinator's agent, of the
	// other agents together, and of the node helpers (the ranks)
	// together; the same of the coordinator in the first Add and per Free.
	AddCoordCPUms      float64 `json:"add_coord_cpu_ms"`
	AddAgentsCPUms     float64 `json:"add_agents_cpu_ms"`
	AddRanksCPUms      float64 `json:"add_ranks_cpu_ms"`
	FirstAddCoordCPUms float64 `json:"first_add_coord_cpu_ms"`
	FreeCoordCPUms     float64 `json:"free_coord_cpu_ms"`
	// The coordinator's messages and bytes per Add round and per Free
	// round, in and out (agent counters coord_*).
	CoordAddMsgsIn   float64 `json:"coord_add_msgs_in"`
	CoordAddMsgsOut  float64 `json:"coord_add_msgs_out"`
	CoordAddBytesIn  float64 `json:"coord_add_bytes_in"`
	CoordAddBytesOut float64 `json:"coord_add_bytes_out"`
	CoordFreeMsgs    float64 `json:"coord_free_msgs"`
	CoordFreeBytes   float64 `json:"coord_free_bytes"`
	// Manifests the coordinator's agent wrote per Add round and per Free
	// round (manifest_writes; each holds every table of the job).
	CoordAddManifests  float64 `json:"coord_add_manifest_writes"`
	CoordFreeManifests float64 `json:"coord_free_manifest_writes"`
	// Per Add round, over every agent: the children's requests a relay of
	// the gather tree carried up and answered (gathers_relayed), and those
	// that went to the coordinator themselves (gathers_direct: their relay
	// had sent already, did not carry them, or failed).
	GathersRelayed float64 `json:"gathers_relayed_per_add"`
	GathersDirect  float64 `json:"gathers_direct_per_add"`
	// RSS of the coordinator's agent and the median of the others', after
	// the reads.
	CoordRSS int64 `json:"coord_rss_bytes"`
	AgentRSS int64 `json:"agent_rss_bytes"`
	// Goroutines and TCP connections (out + in) of the coordinator's
	// agent, of an ordinary agent (median) and of the reading node's.
	CoordGoroutines  int `json:"coord_goroutines"`
	CoordConns       int `json:"coord_conns"`
	AgentGoroutines  int `json:"agent_goroutines"`
	AgentConns       int `json:"agent_conns"`
	ReaderGoroutines int `json:"reader_goroutines"`
	ReaderConns      int `json:"reader_conns"`
	// ReaderIdleClosed: connections the reading node's agent closed idle
	// or over its --max-peers cap (MaxPeers echoes the cap, 0: the
	// default); ReaderConnsIdle: its connections out once --peer-idle has
	// passed after its reads (-1: not measured).
	MaxPeers         int `json:"max_peers,omitempty"`
	ReaderIdleClosed int `json:"reader_idle_closed"`
	ReaderConnsIdle  int `json:"reader_conns_out_idle"`
	// TableBytes is one variable's table on an ordinary node's agent.
	TableBytes int64 `json:"table_bytes"`
	// GetBatch of Batch random rows of the other nodes, by one rank.
	ReadRowsPerSec float64 `json:"read_rows_per_s"`
	ReadMBps       float64 `json:"read_mbps"`
	ReadP50us      float64 `json:"read_p50_us"`
	ReadP99us      float64 `json:"read_p99_us"`
	// CPU time per batch of the reading node's agent, of its client
	// process, and of all the other agents together (the owners, which on
	// a cluster would each use their own node's cores).
	ReadAgentCPUus  float64 `json:"read_agent_cpu_us"`
	ReadClientCPUus float64 `json:"read_client_cpu_us"`
	ReadOwnersCPUus float64 `json:"read_owners_cpu_us"`
	// The same while one node's agent is killed and started again.
	RestartRowsPerSec float64 `json:"restart_rows_per_s,omitempty"`
	RestartP99us      float64 `json:"restart_p99_us,omitempty"`
	RestartErrors     int     `json:"restart_errors,omitempty"`
	RestartBatches    int     `json:"restart_batches,omitempty"`
	RestartUpSeconds  float64 `json:"restart_up_s,omitempty"`
	// RestartFailedSeconds: from the first failed batch to the last.
	RestartFailedSeconds float64 `json:"restart_failed_s,omitempty"`
	// Load is the machine's load average when the job ended.
	Load string `json:"load"`
}

// ScaleReport is a whole run.
type ScaleReport struct {
	Points       []ScalePoint `json:"points"`
	Meet         string       `json:"meet"`
	RanksPerNode int          `json:"ranks_per_node"`
	RowsPerNode  int64        `json:"rows_per_node"`
	RowBytes     int          `json:"row_bytes"`
	Batch        int          `json:"batch"`
	Duration     string       `json:"duration_per_figure"`
	CPUs         int          `json:"cpus"`
	Go           string       `json:"go"`
	Date         string       `json:"date"`
}

// RunScale runs one job per K in opts.Nodes, one after the other.
func RunScale(opts ScaleOptions) (*ScaleReport, error) {
	if os.Getenv(scaleChildEnv) != "" {
		// A Command that runs the driver again instead of what it was
		// asked would start jobs without end.
		return nil, fmt.Errorf("bench: scale: this process is an agent or a node of a scale driver's job (%s is set): it starts no job of its own", scaleChildEnv)
	}
	if opts.RanksPerNode < 1 || opts.RowsPerNode < int64(opts.RanksPerNode) || opts.RowsPerNode%int64(opts.RanksPerNode) != 0 ||
		opts.RowBytes < 8 || opts.Batch < 1 || opts.Rounds < 1 || opts.Command == nil {
		return nil, fmt.Errorf("bench: scale: %d ranks per node, %d rows per node, rows of %d bytes, batch %d, %d rounds: want ranks ≥ 1, rows a multiple of the ranks, rows ≥ 8 bytes, batch and rounds ≥ 1",
			opts.RanksPerNode, opts.RowsPerNode, opts.RowBytes, opts.Batch, opts.Rounds)
	}
	for _, k := range opts.Nodes {
		if k < 2 {
			return nil, fmt.Errorf("bench: scale: %d nodes: want at least 2", k)
		}
	}
	if opts.Progress == nil {
		opts.Progress = io.Discard
	}
	if os.Getenv(auth.SecretEnv) == "" {
		os.Setenv(auth.SecretEnv, crand.Text())
	}
	if opts.Meet == "" {
		opts.Meet = "rendezvous"
	}
	if opts.Meet != "rendezvous" && opts.Meet != "handshake" {
		return nil, fmt.Errorf("bench: scale: agents meet by %q: want rendezvous or handshake", opts.Meet)
	}
	rep := &ScaleReport{Meet: opts.Meet, RanksPerNode: opts.RanksPerNode, RowsPerNode: opts.RowsPerNode, RowBytes: opts.RowBytes, Batch: opts.Batch,
		Duration: opts.Duration.String(), CPUs: runtime.NumCPU(), Go: runtime.Version(), Date: time.Now().UTC().Format(time.RFC3339)}
	// SIGINT or SIGTERM stops the job's processes; the job then fails and
	// cleans up as on any error (no agent or segment is left).
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGINT, syscall.SIGTERM)
	defer signal.Stop(sig)
	var cur struct {
		sync.Mutex
		j *scaleJob
	}
	stop := make(chan struct{})
	defer close(stop)
	go func() {
		select {
		case s := <-sig:
			fmt.Fprintf(opts.Progress, "\n%v: stopping the job\n", s)
			cur.Lock()
			if cur.j != nil {
				cur.j.abort()
			}
			cur.Unlock()
		case <-stop:
		}
	}()
	opts.started = func(j *scaleJob) {
		cur.Lock()
		cur.j = j
		cur.Unlock()
	}
	for _, k := range opts.Nodes {
		fmt.Fprintf(opts.Progress, "K=%d R=%d: ", k, k*opts.RanksPerNode)
		p, err := runScaleJob(opts, k)
		fmt.Fprintln(opts.Progress)
		if err != nil {
			return rep, fmt.Errorf("bench: scale, %d nodes: %w", k, err)
		}
		rep.Points = append(rep.Points, p)
	}
	return rep, nil
}

// scaleJob is one running job of the driver.
type scaleJob struct {
	// mu guards agents and nodes against abort (a signal) while the job
	// starts or restarts a process.
	mu      sync.Mutex
	aborted bool
	opts    ScaleOptions
	k       int
	ns      string
	dir     string
	runDir  string
	rdv     string
	agents  []*exec.Cmd
	nodes   []*nodeProc
}

type nodeProc struct {
	cmd *exec.Cmd
	in  io.WriteCloser
	out *bufio.Scanner
}

func (j *scaleJob) node(k int) string { return fmt.Sprintf("n%03d", k) }

func (j *scaleJob) socket(k int) string { return naming.SocketPath(j.runDir, j.ns, j.node(k)) }

func runScaleJob(opts ScaleOptions, k int) (p ScalePoint, err error) {
	j := &scaleJob{opts: opts, k: k, ns: fmt.Sprintf("scale-%d-%d", os.Getpid(), k)}
	if j.dir, err = os.MkdirTemp("", "ddstore-scale-"); err != nil {
		return p, err
	}
	j.runDir = filepath.Join(j.dir, "run")
	if err := os.Mkdir(j.runDir, 0o700); err != nil {
		return p, err
	}
	if err := os.Mkdir(filepath.Join(j.dir, "handshake"), 0o700); err != nil {
		return p, err
	}
	defer j.close()
	if opts.started != nil {
		opts.started(j)
		defer opts.started(nil)
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return p, err
	}
	j.rdv = l.Addr().String()
	l.Close()
	p.Nodes, p.Ranks = k, k*opts.RanksPerNode
	pr := opts.Progress

	t0 := time.Now()
	for i := range k {
		cmd, err := j.startAgent(i)
		if err != nil {
			return p, err
		}
		if err := j.keep(func() { j.agents = append(j.agents, cmd) }, cmd); err != nil {
			return p, err
		}
	}
	for i := range k {
		if err := j.startNode(i); err != nil {
			return p, err
		}
	}
	for i := range k {
		if _, err := j.reply(i, "open"); err != nil {
			return p, err
		}
	}
	p.OpenSeconds = time.Since(t0).Seconds()
	fmt.Fprintf(pr, "open %.2fs ", p.OpenSeconds)

	// With a handshake directory the agent of rank 0 becomes the
	// coordinator when rank 0 says hello: it is node 0's.
	coord := 0
	if j.opts.Meet != "handshake" {
		infos, err := j.infos()
		if err != nil {
			return p, err
		}
		if coord = slices.IndexFunc(infos, func(in wire.AgentInfo) bool { return in.Coordinator }); coord < 0 {
			return p, errors.New("no agent says it is the coordinator")
		}
	}
	// The reader and the node whose agent restarts: neither the
	// coordinator's node nor each other.
	reader := (coord + 1) % k
	victim := (coord + 2) % k
	if k == 2 {
		victim = -1
	}

	// The variable read from, then the timed rounds.
	t1 := time.Now()
	c0 := j.roundCPU(coord)
	if err := j.all(scaleCmd{Op: "add", Name: "data"}); err != nil {
		return p, err
	}
	p.FirstAddSeconds = time.Since(t1).Seconds()
	p.FirstAddCoordCPUms = ms(j.roundCPU(coord)[0] - c0[0])
	var addCPU [3]time.Duration
	var freeCPU time.Duration
	var adds, frees []float64
	var addDelta, freeDelta [5]int
	gathers0, err := j.gathers()
	if err != nil {
		return p, err
	}
	for r := range opts.Rounds {
		name := fmt.Sprintf("round%d", r)
		before, err := j.coordCounters(coord)
		if err != nil {
			return p, err
		}
		t := time.Now()
		c0 := j.roundCPU(coord)
		if err := j.all(scaleCmd{Op: "add", Name: name}); err != nil {
			return p, err
		}
		adds = append(adds, time.Since(t).Seconds())
		c1 := j.roundCPU(coord)
		for i := range c1 {
			addCPU[i] += c1[i] - c0[i]
		}
		mid, err := j.coordCounters(coord)
		if err != nil {
			return p, err
		}
		t = time.Now()
		if err := j.all(scaleCmd{Op: "free", Name: name}); err != nil {
			return p, err
		}
		frees = append(frees, time.Since(t).Seconds())
		freeCPU += j.roundCPU(coord)[0] - c1[0]
		after, err := j.coordCounters(coord)
		if err != nil {
			return p, err
		}
		for i := range addDelta {
			addDelta[i] += mid[i] - before[i]
			freeDelta[i] += after[i] - mid[i]
		}
	}
	n := float64(opts.Rounds)
	gathers1, err := j.gathers()
	if err != nil {
		return p, err
	}
	p.GathersRelayed, p.GathersDirect = float64(gathers1[0]-gathers0[0])/n, float64(gathers1[1]-gathers0[1])/n
	p.AddCoordCPUms, p.AddAgentsCPUms, p.AddRanksCPUms = ms(addCPU[0])/n, ms(addCPU[1])/n, ms(addCPU[2])/n
	p.FreeCoordCPUms = ms(freeCPU) / n
	p.AddAll = adds
	p.AddSeconds, p.FreeSeconds = Median(adds), Median(frees)
	p.CoordAddMsgsIn, p.CoordAddBytesIn = float64(addDelta[0])/n, float64(addDelta[1])/n
	p.CoordAddMsgsOut, p.CoordAddBytesOut = float64(addDelta[2])/n, float64(addDelta[3])/n
	p.CoordFreeMsgs = float64(freeDelta[0]+freeDelta[2]) / n
	p.CoordFreeBytes = float64(freeDelta[1]+freeDelta[3]) / n
	p.CoordAddManifests, p.CoordFreeManifests = float64(addDelta[4])/n, float64(freeDelta[4])/n
	fmt.Fprintf(pr, "first add %.3fs add %.3fs free %.3fs ", p.FirstAddSeconds, p.AddSeconds, p.FreeSeconds)

	cpu0 := j.cpu(reader)
	r, err := j.read(reader, opts.Duration, 1)
	if err != nil {
		return p, err
	}
	cpu1 := j.cpu(reader)
	if r.Batches > 0 {
		per := func(d time.Duration) float64 { return float64(d.Nanoseconds()) / 1e3 / float64(r.Batches) }
		p.ReadAgentCPUus, p.ReadClientCPUus, p.ReadOwnersCPUus = per(cpu1[0]-cpu0[0]), per(cpu1[1]-cpu0[1]), per(cpu1[2]-cpu0[2])
	}
	if r.Errors > 0 {
		return p, fmt.Errorf("node %s: %d of its batches failed: %s", j.node(reader), r.Errors, r.FirstErr)
	}
	p.ReadRowsPerSec = float64(r.Rows) / r.Seconds
	p.ReadMBps = p.ReadRowsPerSec * float64(opts.RowBytes) / 1e6
	p.ReadP50us, p.ReadP99us = Percentile(r.BatchesUs, 50), Percentile(r.BatchesUs, 99)
	fmt.Fprintf(pr, "read %.0f rows/s p99 %.0fµs ", p.ReadRowsPerSec, p.ReadP99us)

	infos, err := j.infos()
	if err != nil {
		return p, err
	}
	var rss []int64
	var gor, conns []int
	for i, in := range infos {
		c := in.Counters["peer_conns_out"] + in.Counters["peer_conns_in"]
		switch i {
		case coord:
			p.CoordRSS = procRSS(j.agents[i].Process.Pid)
			p.CoordGoroutines, p.CoordConns = in.Counters["goroutines"], c
		case reader:
			p.ReaderGoroutines, p.ReaderConns = in.Counters["goroutines"], c
			p.ReaderIdleClosed = in.Counters["peer_conns_idle_closed"]
			fallthrough
		default:
			rss = append(rss, procRSS(j.agents[i].Process.Pid))
			gor = append(gor, in.Counters["goroutines"])
			conns = append(conns, c)
		}
		if i != coord && p.TableBytes == 0 {
			for _, v := range in.Variables {
				if v.Name == "data" {
					p.TableBytes = v.TableBytes
				}
			}
		}
	}
	p.AgentRSS = medianInt(rss)
	p.AgentGoroutines, p.AgentConns = int(medianInt(toInt64(gor))), int(medianInt(toInt64(conns)))
	p.MaxPeers, p.ReaderConnsIdle = opts.MaxPeers, -1
	if opts.PeerIdle > 0 {
		// Poll until its idle connections are closed (a control connection
		// to the coordinator, used by no read, goes too), for 3 idle times.
		by := time.Now().Add(3*opts.PeerIdle + time.Second)
		for {
			in, err := client.QueryAgent(j.socket(reader), j.ns, j.node(reader))
			if err != nil {
				return p, err
			}
			p.ReaderConnsIdle = in.Counters["peer_conns_out"]
			if p.ReaderConnsIdle == 0 || time.Now().After(by) {
				break
			}
			time.Sleep(opts.PeerIdle / 4)
		}
		fmt.Fprintf(pr, "reader conns out %d after %v idle ", p.ReaderConnsIdle, opts.PeerIdle)
	}

	if opts.Restart && victim >= 0 {
		if err := j.restartRead(&p, reader, victim); err != nil {
			return p, err
		}
		fmt.Fprintf(pr, "restart: %.0f rows/s p99 %.0fµs, %d failed batches ", p.RestartRowsPerSec, p.RestartP99us, p.RestartErrors)
	}
	p.Load = loadAvg()
	return p, nil
}

// restartRead reads on the reader's node while the victim's agent is
// killed and started again.
func (j *scaleJob) restartRead(p *ScalePoint, reader, victim int) error {
	d := 3 * j.opts.Duration
	if err := j.send(reader, scaleCmd{Op: "read", Name: "data", Duration: d, Seed: 2}); err != nil {
		return err
	}
	time.Sleep(j.opts.Duration / 2) // into the reads: what is measured is reads across a restart
	old := j.agents[victim]
	old.Process.Signal(syscall.SIGKILL)
	old.Wait()
	t := time.Now()
	cmd, err := j.startAgent(victim)
	if err != nil {
		return err
	}
	if err := j.keep(func() { j.agents[victim] = cmd }, cmd); err != nil {
		return err
	}
	for {
		if _, err := client.QueryAgent(j.socket(victim), j.ns, j.node(victim)); err == nil {
			break
		}
		if time.Since(t) > time.Minute {
			return fmt.Errorf("restarted agent of node %s did not serve within a minute", j.node(victim))
		}
		time.Sleep(10 * time.Millisecond)
	}
	p.RestartUpSeconds = time.Since(t).Seconds()
	r, err := j.reply(reader, "read")
	if err != nil {
		return err
	}
	p.RestartRowsPerSec = float64(r.Rows) / r.Seconds
	p.RestartP99us = Percentile(r.BatchesUs, 99)
	p.RestartErrors, p.RestartBatches, p.RestartFailedSeconds = r.Errors, r.Batches, r.FailedSeconds
	// The reads go on after the restart: a read of every node must work
	// again.
	after, err := j.read(reader, j.opts.Duration/4, 3)
	if err != nil {
		return err
	}
	if after.Errors > 0 {
		return fmt.Errorf("after node %s's agent restarted, %d batches failed: %s", j.node(victim), after.Errors, after.FirstErr)
	}
	return nil
}

func (j *scaleJob) startAgent(i int) (*exec.Cmd, error) {
	meet := []string{"--rendezvous", j.rdv}
	if j.opts.Meet == "handshake" {
		meet = []string{"--handshake-dir", filepath.Join(j.dir, "handshake")}
	}
	args := append([]string{"agent", "--namespace", j.ns, "--node", j.node(i), "--run-dir", j.runDir,
		"--peer-listen", "127.0.0.1:0", "--timeout", "10s"}, meet...)
	if j.opts.MaxPeers > 0 {
		args = append(args, "--max-peers", strconv.Itoa(j.opts.MaxPeers))
	}
	if j.opts.PeerIdle > 0 {
		args = append(args, "--peer-idle", j.opts.PeerIdle.String())
	}
	if j.opts.RelayFanout > 0 {
		args = append(args, "--relay-fanout", strconv.Itoa(j.opts.RelayFanout))
	}
	cmd := j.opts.Command([]string{scaleChildEnv + "=1"}, args...)
	f, err := os.OpenFile(filepath.Join(j.dir, j.node(i)+".agent.log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	cmd.Stdout, cmd.Stderr = f, f
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("starting the agent of node %s: %w", j.node(i), err)
	}
	return cmd, nil
}

func (j *scaleJob) startNode(i int) error {
	a := scaleNodeArgs{Namespace: j.ns, Node: j.node(i), NodeIndex: i, Nodes: j.k, RanksPerNode: j.opts.RanksPerNode,
		RunDir: j.runDir, RowsPerNode: j.opts.RowsPerNode, RowBytes: j.opts.RowBytes, Batch: j.opts.Batch}
	b, _ := json.Marshal(a)
	cmd := j.opts.Command([]string{ScaleNodeEnv + "=" + string(b), scaleChildEnv + "=1"}, "bench")
	f, err := os.OpenFile(filepath.Join(j.dir, j.node(i)+".node.log"), os.O_CREATE|os.O_WRONLY, 0o600)
	if err != nil {
		return err
	}
	defer f.Close()
	cmd.Stderr = f
	in, err := cmd.StdinPipe()
	if err != nil {
		return err
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		return err
	}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("starting the ranks of node %s: %w", j.node(i), err)
	}
	sc := bufio.NewScanner(out)
	sc.Buffer(make([]byte, 64<<10), 64<<20)
	return j.keep(func() { j.nodes = append(j.nodes, &nodeProc{cmd: cmd, in: in, out: sc}) }, cmd)
}

// keep records a started process (add, under j.mu), unless the job was
// aborted meanwhile: then it stops it and says so.
func (j *scaleJob) keep(add func(), cmd *exec.Cmd) error {
	j.mu.Lock()
	defer j.mu.Unlock()
	add()
	if j.aborted {
		cmd.Process.Signal(syscall.SIGTERM)
		return errors.New("stopped by a signal")
	}
	return nil
}

// abort stops every process of the job (SIGTERM: agents remove their
// segments); the job's next step fails and close waits for them.
func (j *scaleJob) abort() {
	j.mu.Lock()
	defer j.mu.Unlock()
	j.aborted = true
	for _, n := range j.nodes {
		n.cmd.Process.Signal(syscall.SIGTERM)
	}
	for _, a := range j.agents {
		a.Process.Signal(syscall.SIGTERM)
	}
}

func (j *scaleJob) send(i int, c scaleCmd) error {
	b, _ := json.Marshal(c)
	if _, err := j.nodes[i].in.Write(append(b, '\n')); err != nil {
		return fmt.Errorf("node %s: %w%s", j.node(i), err, j.logTail(i))
	}
	return nil
}

func (j *scaleJob) reply(i int, op string) (scaleReply, error) {
	var r scaleReply
	if !j.nodes[i].out.Scan() {
		return r, fmt.Errorf("node %s ended before answering %s%s", j.node(i), op, j.logTail(i))
	}
	if err := json.Unmarshal(j.nodes[i].out.Bytes(), &r); err != nil {
		return r, err
	}
	if r.Op != op {
		return r, fmt.Errorf("node %s answered %s to %s", j.node(i), r.Op, op)
	}
	if r.Err != "" {
		return r, fmt.Errorf("node %s: %s: %s", j.node(i), op, r.Err)
	}
	return r, nil
}

// all sends c to every node at once and waits for every answer.
func (j *scaleJob) all(c scaleCmd) error {
	for i := range j.k {
		if err := j.send(i, c); err != nil {
			return err
		}
	}
	var errs []error
	for i := range j.k {
		if _, err := j.reply(i, c.Op); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

func (j *scaleJob) read(i int, d time.Duration, seed uint64) (scaleReply, error) {
	if err := j.send(i, scaleCmd{Op: "read", Name: "data", Duration: d, Seed: seed}); err != nil {
		return scaleReply{}, err
	}
	return j.reply(i, "read")
}

func (j *scaleJob) infos() ([]wire.AgentInfo, error) {
	out := make([]wire.AgentInfo, j.k)
	for i := range j.k {
		in, err := client.QueryAgent(j.socket(i), j.ns, j.node(i))
		if err != nil {
			return nil, fmt.Errorf("info of node %s: %w", j.node(i), err)
		}
		out[i] = in
	}
	return out, nil
}

// gathers are the gather tree's counters summed over every agent:
// gathers_relayed and gathers_direct.
func (j *scaleJob) gathers() ([2]int, error) {
	ins, err := j.infos()
	if err != nil {
		return [2]int{}, err
	}
	var g [2]int
	for _, in := range ins {
		g[0] += in.Counters["gathers_relayed"]
		g[1] += in.Counters["gathers_direct"]
	}
	return g, nil
}

// coordCounters are the coordinator's messages and bytes in and out.
func (j *scaleJob) coordCounters(coord int) ([5]int, error) {
	in, err := client.QueryAgent(j.socket(coord), j.ns, j.node(coord))
	if err != nil {
		return [5]int{}, err
	}
	c := in.Counters
	return [5]int{c["coord_messages_in"], c["coord_bytes_in"], c["coord_messages_out"], c["coord_bytes_out"], c["manifest_writes"]}, nil
}

func (j *scaleJob) logTail(i int) string {
	b, _ := os.ReadFile(filepath.Join(j.dir, j.node(i)+".node.log"))
	if len(b) > 2000 {
		b = b[len(b)-2000:]
	}
	if len(b) == 0 {
		return ""
	}
	return "; its log ends: " + string(b)
}

// close stops the node helpers, then the agents (SIGTERM: they remove
// their segments), and removes what a killed agent left.
func (j *scaleJob) close() {
	for i, n := range j.nodes {
		if err := j.send(i, scaleCmd{Op: "quit"}); err == nil {
			n.in.Close()
		}
	}
	for _, n := range j.nodes {
		waitOrKill(n.cmd, 20*time.Second)
	}
	for _, a := range j.agents {
		if a.ProcessState == nil {
			a.Process.Signal(syscall.SIGTERM)
		}
	}
	for _, a := range j.agents {
		waitOrKill(a, 20*time.Second)
	}
	if m, _ := filepath.Glob("/dev/shm/ddstore." + j.ns + ".*"); len(m) > 0 {
		for _, f := range m {
			os.Remove(f)
		}
	}
	os.RemoveAll(j.dir)
}

func waitOrKill(cmd *exec.Cmd, d time.Duration) {
	if cmd.ProcessState != nil {
		return
	}
	done := make(chan struct{})
	go func() {
		cmd.Wait()
		close(done)
	}()
	select {
	case <-done:
	case <-time.After(d):
		cmd.Process.Kill()
		<-done
	}
}

// cpu is the CPU time so far of the reader's agent, of its node helper,
// and of every other agent together.
func (j *scaleJob) cpu(reader int) [3]time.Duration {
	var c [3]time.Duration
	for i, a := range j.agents {
		if i == reader {
			c[0] = procCPU(a.Process.Pid)
		} else {
			c[2] += procCPU(a.Process.Pid)
		}
	}
	c[1] = procCPU(j.nodes[reader].cmd.Process.Pid)
	return c
}

// roundCPU is the CPU time so far of the coordinator's agent, of the
// other agents together and of the node helpers together.
func (j *scaleJob) roundCPU(coord int) [3]time.Duration {
	var c [3]time.Duration
	for i, a := range j.agents {
		if i == coord {
			c[0] = procCPU(a.Process.Pid)
		} else {
			c[1] += procCPU(a.Process.Pid)
		}
	}
	for _, n := range j.nodes {
		c[2] += procCPU(n.cmd.Process.Pid)
	}
	return c
}

func ms(d time.Duration) float64 { return float64(d.Nanoseconds()) / 1e6 }

// procCPU is a process's CPU time: the sum of its threads' run time
// (/proc/PID/task/*/schedstat, in ns), else its user and system time in
// clock ticks (/proc/PID/stat, 10 ms: coarse for a round of a few ms); 0
// if unknown.
func procCPU(pid int) time.Duration {
	tasks, _ := filepath.Glob(fmt.Sprintf("/proc/%d/task/*/schedstat", pid))
	var sum int64
	n := 0
	for _, t := range tasks {
		b, err := os.ReadFile(t)
		if err != nil {
			continue // the thread ended
		}
		f := strings.Fields(string(b))
		if len(f) == 0 {
			continue
		}
		if ns, err := strconv.ParseInt(f[0], 10, 64); err == nil {
			sum += ns
			n++
		}
	}
	if n > 0 {
		return time.Duration(sum)
	}
	return procTicks(pid)
}

// procTicks is a process's user and system time from /proc/PID/stat.
func procTicks(pid int) time.Duration {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0
	}
	// The fields after the command's name, which may hold spaces.
	i := strings.LastIndexByte(string(b), ')')
	if i < 0 {
		return 0
	}
	f := strings.Fields(string(b[i+1:]))
	if len(f) < 13 {
		return 0
	}
	ut, _ := strconv.ParseInt(f[11], 10, 64)
	st, _ := strconv.ParseInt(f[12], 10, 64)
	return time.Duration(ut+st) * time.Second / clockTicks
}

// clockTicks is USER_HZ, the unit of /proc/PID/stat's times: 100 on every
// Linux architecture Go runs on.
const clockTicks = 100

// procRSS is a process's resident memory, 0 if unknown.
func procRSS(pid int) int64 {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0
	}
	for _, line := range strings.Split(string(b), "\n") {
		if f := strings.Fields(line); len(f) >= 2 && f[0] == "VmRSS:" {
			n, _ := strconv.ParseInt(f[1], 10, 64)
			return n << 10
		}
	}
	return 0
}

func idleConns(n int) string {
	if n < 0 {
		return "-"
	}
	return fmt.Sprint(n)
}

func loadAvg() string {
	b, _ := os.ReadFile("/proc/loadavg")
	f := strings.Fields(string(b))
	if len(f) < 3 {
		return ""
	}
	return strings.Join(f[:3], " ")
}

func medianInt(xs []int64) int64 {
	if len(xs) == 0 {
		return 0
	}
	f := make([]float64, len(xs))
	for i, x := range xs {
		f[i] = float64(x)
	}
	return int64(Median(f))
}

func toInt64(xs []int) []int64 {
	out := make([]int64, len(xs))
	for i, x := range xs {
		out[i] = int64(x)
	}
	return out
}

// CoordOwnAddCPUms is the coordinator's agent's CPU per Add beyond an
// ordinary agent's (the mean of the others): what coordinating costs it,
// its own node's work taken out.
func (p *ScalePoint) CoordOwnAddCPUms() float64 {
	return p.AddCoordCPUms - p.AddAgentsCPUms/float64(max(p.Nodes-1, 1))
}

// WriteTable prints the report as one table, a row per job size.
func (r *ScaleReport) WriteTable(w io.Writer) error {
	fmt.Fprintf(w, "ddstore bench scale: agents as processes on loopback meeting by %s, %d ranks per node, %d rows of %s per node, GetBatch of %d rows of the other nodes by one rank, %s per figure, %d CPUs, %s, %s\n\n",
		r.Meet, r.RanksPerNode, r.RowsPerNode, sizeName(r.RowBytes), r.Batch, r.Duration, r.CPUs, r.Go, r.Date)
	t := NewTable("K", "R", "open s", "1st add s", "add s", "free s", "cpu ms/add coord+agents+ranks", "coord own ms/add", "coord msgs in/out per add", "coord KB out per add", "coord manifests add/free", "coord MiB", "agent MiB",
		"coord gor", "agent gor", "coord conns", "agent conns", "reader conns", "reader closed idle", "reader out idle", "table KB", "read Mrows/s", "p99 ms", "cpu µs/batch agent+client+owners", "restart Mrows/s", "p99 ms", "failed", "failing s", "load")
	for _, p := range r.Points {
		t.Row(fmt.Sprint(p.Nodes), fmt.Sprint(p.Ranks), fmt.Sprintf("%.2f", p.OpenSeconds), fmt.Sprintf("%.3f", p.FirstAddSeconds), fmt.Sprintf("%.3f", p.AddSeconds), fmt.Sprintf("%.3f", p.FreeSeconds),
			fmt.Sprintf("%.0f+%.0f+%.0f", p.AddCoordCPUms, p.AddAgentsCPUms, p.AddRanksCPUms), fmt.Sprintf("%.1f", p.CoordOwnAddCPUms()),
			fmt.Sprintf("%.0f/%.0f", p.CoordAddMsgsIn, p.CoordAddMsgsOut), fmt.Sprintf("%.1f", p.CoordAddBytesOut/1e3),
			fmt.Sprintf("%.1f/%.1f", p.CoordAddManifests, p.CoordFreeManifests),
			fmt.Sprintf("%.1f", float64(p.CoordRSS)/(1<<20)), fmt.Sprintf("%.1f", float64(p.AgentRSS)/(1<<20)),
			fmt.Sprint(p.CoordGoroutines), fmt.Sprint(p.AgentGoroutines), fmt.Sprint(p.CoordConns), fmt.Sprint(p.AgentConns), fmt.Sprint(p.ReaderConns),
			fmt.Sprint(p.ReaderIdleClosed), idleConns(p.ReaderConnsIdle),
			fmt.Sprintf("%.1f", float64(p.TableBytes)/1e3), fmt.Sprintf("%.3f", p.ReadRowsPerSec/1e6), fmt.Sprintf("%.2f", p.ReadP99us/1e3),
			fmt.Sprintf("%.0f+%.0f+%.0f", p.ReadAgentCPUus, p.ReadClientCPUus, p.ReadOwnersCPUus),
			fmt.Sprintf("%.3f", p.RestartRowsPerSec/1e6), fmt.Sprintf("%.2f", p.RestartP99us/1e3), fmt.Sprint(p.RestartErrors), fmt.Sprintf("%.2f", p.RestartFailedSeconds), p.Load)
	}
	return t.Write(w)
}

package bench

// The scale driver's method mpi (`ddstore bench scale --method mpi`):
// reads by one-sided gets as the job grows. Per job size K, mpirun -np K
// of this binary, each rank a node of its own with an agent it starts and
// a Store with Method "mpi" (the trainer measurement of trainer.go on K
// ranks); rank 0 reads batches of random rows of all the K−1 other nodes
// with MPI gets from its own process while the owners wait outside MPI.

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/ddstore-go/ddstore"
	"github.com/ddstore-go/ddstore/internal/mpirun"
	"github.com/ddstore-go/ddstore/internal/transport"
)

// ErrScaleNoMPI is RunScaleMPI's error in a binary built without MPI.
var ErrScaleNoMPI = errors.New("bench: scale --method mpi: this ddstore was built without MPI: rebuild with -tags mpi (make build-mpi)")

// scaleMPIJob sizes one job of the method mpi: the rows of each node, the
// batch, and Rounds timed rounds of reads of Duration each.
type scaleMPIJob struct {
	RowsPerNode int64
	RowBytes    int
	Batch       int
	Rounds      int
	Duration    time.Duration
}

// ScaleMPIPoint is one job size's reads by one-sided gets, by rank 0.
type ScaleMPIPoint struct {
	Nodes int `json:"nodes"`
	// OpenSeconds: rank 0's Open (its agent started, MPI initialised);
	// AddSeconds: the collective Add of the variable read (its windows).
	OpenSeconds float64 `json:"open_s"`
	AddSeconds  float64 `json:"add_s"`
	// GetBatch of Batch random rows of the other nodes: rows/s, the
	// median of the rounds (each round's in ReadRounds), and the batches'
	// p50 and p99 over every round.
	ReadRowsPerSec float64   `json:"read_rows_per_s"`
	ReadRounds     []float64 `json:"read_rounds_rows_per_s"`
	ReadMBps       float64   `json:"read_mbps"`
	ReadP50us      float64   `json:"read_p50_us"`
	ReadP99us      float64   `json:"read_p99_us"`
	// RatioTo2: ReadRowsPerSec over that of K = 2 in the same run (0
	// without K = 2).
	RatioTo2 float64 `json:"ratio_to_2"`
	// ReadCPUus: the reading process's CPU time (procCPU: every
	// thread's run time) per batch.
	ReadCPUus float64 `json:"read_cpu_us"`
	// OwnersCPUus and AgentsCPUus: the CPU time per batch, over the same
	// reads, of the other ranks together (the owners, which wait outside
	// MPI) and of the K agents together; MachineCPUus: the whole
	// machine's busy time (/proc/stat), the job's and whatever else runs.
	OwnersCPUus  float64 `json:"owners_cpu_us"`
	AgentsCPUus  float64 `json:"agents_cpu_us"`
	MachineCPUus float64 `json:"machine_cpu_us"`
	// OwnerProcs and AgentProcs: the processes those two figures are of
	// (K − 1 and K).
	OwnerProcs int `json:"owner_procs"`
	AgentProcs int `json:"agent_procs"`
	// OwnersPerBatch: the mean number of nodes a batch's rows are on.
	OwnersPerBatch float64 `json:"owners_per_batch"`
	Batches        int     `json:"batches"`
	// RemoteRows and OneSidedRows: the reader's Profile, rows of other
	// nodes read, and those read by MPI gets from its process (all).
	RemoteRows   int64 `json:"remote_rows"`
	OneSidedRows int64 `json:"one_sided_rows"`
	// LaunchSeconds: the whole mpirun, from its start to its exit.
	LaunchSeconds float64 `json:"launch_s"`
	// TeardownErr: the launch failed after rank 0 had printed these
	// figures (in the collective Free or Close that follow the reads).
	TeardownErr string `json:"teardown_error,omitempty"`
	// Load is the machine's load average when rank 0 finished reading.
	Load string `json:"load"`
}

// ScaleMPIReport is a whole run of the method mpi.
type ScaleMPIReport struct {
	Method      string          `json:"method"`
	Points      []ScaleMPIPoint `json:"points"`
	RowsPerNode int64           `json:"rows_per_node"`
	RowBytes    int             `json:"row_bytes"`
	Batch       int             `json:"batch"`
	Rounds      int             `json:"rounds"`
	Duration    string          `json:"duration_per_round"`
	Launcher    string          `json:"launcher"`
	CPUs        int             `json:"cpus"`
	Go          string          `json:"go"`
	Date        string          `json:"date"`
}

// RunScaleMPI runs one mpirun launch per K in opts.Nodes, one after the
// other; of opts it uses Nodes, RowsPerNode, RowBytes, Batch, Rounds
// (timed rounds of reads), Duration (per round) and Progress.
func RunScaleMPI(opts ScaleOptions) (*ScaleMPIReport, error) {
	if !transport.MPIBuilt {
		return nil, ErrScaleNoMPI
	}
	if os.Getenv(scaleChildEnv) != "" {
		return nil, fmt.Errorf("bench: scale: this process is an agent or a node of a scale driver's job (%s is set): it starts no job of its own", scaleChildEnv)
	}
	if opts.RowsPerNode < 1 || opts.RowBytes < 8 || opts.Batch < 1 || opts.Rounds < 1 || opts.Duration <= 0 {
		return nil, fmt.Errorf("bench: scale --method mpi: %d rows per node, rows of %d bytes, batch %d, %d rounds of %v: want rows ≥ 1, rows ≥ 8 bytes, batch and rounds ≥ 1, a duration > 0",
			opts.RowsPerNode, opts.RowBytes, opts.Batch, opts.Rounds, opts.Duration)
	}
	for _, k := range opts.Nodes {
		if k < 2 {
			return nil, fmt.Errorf("bench: scale --method mpi: %d nodes: want at least 2", k)
		}
	}
	launcher, err := mpirun.Find()
	if err != nil {
		return nil, fmt.Errorf("bench: scale --method mpi: %w", err)
	}
	pr := opts.Progress
	if pr == nil {
		pr = os.Stderr
	}
	sj := scaleMPIJob{RowsPerNode: opts.RowsPerNode, RowBytes: opts.RowBytes, Batch: opts.Batch, Rounds: opts.Rounds, Duration: opts.Duration}
	rep := &ScaleMPIReport{Method: ddstore.MethodMPI, RowsPerNode: sj.RowsPerNode, RowBytes: sj.RowBytes, Batch: sj.Batch, Rounds: sj.Rounds,
		Duration: sj.Duration.String(), Launcher: launcher.Path, CPUs: runtime.NumCPU(), Go: runtime.Version(), Date: time.Now().UTC().Format(time.RFC3339)}
	for _, k := range opts.Nodes {
		fmt.Fprintf(pr, "mpi K=%d: ", k)
		p, err := scaleMPIPoint(k, sj)
		if err != nil {
			fmt.Fprintln(pr, "failed")
			return nil, fmt.Errorf("bench: scale --method mpi, %d nodes: %w", k, err)
		}
		fmt.Fprintf(pr, "open %.1fs add %.2fs read %.0f rows/s p99 %.0fµs cpu µs/batch %.0f reader %.0f owners %.0f agents %.0f machine, owners/batch %.1f (mpirun %.1fs)\n",
			p.OpenSeconds, p.AddSeconds, p.ReadRowsPerSec, p.ReadP99us, p.ReadCPUus, p.OwnersCPUus, p.AgentsCPUus, p.MachineCPUus, p.OwnersPerBatch, p.LaunchSeconds)
		if p.TeardownErr != "" {
			line, _, _ := strings.Cut(p.TeardownErr, "\n")
			fmt.Fprintf(pr, "mpi K=%d: the launch then failed: %s\n", k, line)
		}
		rep.Points = append(rep.Points, p)
	}
	if i := slices.IndexFunc(rep.Points, func(p ScaleMPIPoint) bool { return p.Nodes == 2 }); i >= 0 && rep.Points[i].ReadRowsPerSec > 0 {
		for j := range rep.Points {
			rep.Points[j].RatioTo2 = rep.Points[j].ReadRowsPerSec / rep.Points[i].ReadRowsPerSec
		}
	}
	return rep, nil
}

// scaleMPIPoint is one launch: mpirun -np k of this binary.
func scaleMPIPoint(k int, sj scaleMPIJob) (ScaleMPIPoint, error) {
	dir, err := os.MkdirTemp("", "ddstore-bench-scale-mpi-")
	if err != nil {
		return ScaleMPIPoint{}, err
	}
	defer os.RemoveAll(dir)
	rdv, err := rendezvousAddr()
	if err != nil {
		return ScaleMPIPoint{}, err
	}
	j := trainerJob{Namespace: fmt.Sprintf("bench-%d-scale-mpi-%d", os.Getpid(), k), RunDir: filepath.Join(dir, "run"), Rendezvous: rdv, Ranks: k, Scale: &sj}
	t0 := time.Now()
	ps, err := runRanks[ScaleMPIPoint]("scale --method mpi", trainerEnv, k, j)
	if err != nil && len(ps) != 1 {
		return ScaleMPIPoint{}, err
	}
	if len(ps) != 1 {
		return ScaleMPIPoint{}, fmt.Errorf("rank 0 printed %d results, want 1", len(ps))
	}
	ps[0].LaunchSeconds = time.Since(t0).Seconds()
	if err != nil {
		// The reads are done and measured; what failed is kept with them.
		msg := err.Error()
		ps[0].TeardownErr = msg[:min(len(msg), 2000)]
	}
	return ps[0], nil
}

// scaleMPIAgents starts this rank's agent (as Open would) and waits,
// outside MPI, for every rank's to serve: each rank says so with a file
// in the run directory.
func scaleMPIAgents(exe string, j trainerJob, node string, rank int, agentArgs []string) error {
	args := append([]string{"agent", "--daemon", "--namespace", j.Namespace, "--node", node, "--run-dir", j.RunDir}, agentArgs...)
	if out, err := exec.Command(exe, args...).CombinedOutput(); err != nil {
		return fmt.Errorf("bench: starting the agent of node %s: %w: %s", node, err, out)
	}
	up := filepath.Join(j.RunDir, "agents-up")
	if err := os.MkdirAll(up, 0o700); err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(up, strconv.Itoa(rank)), nil, 0o600); err != nil {
		return err
	}
	for {
		es, err := os.ReadDir(up)
		if err != nil {
			return err
		}
		if len(es) >= j.Ranks {
			return nil
		}
		time.Sleep(trainerIdlePoll)
	}
}

// scaleMPIRank is one rank of a job of the method mpi: every rank Adds its
// shard (rows whose first word is their global row), rank 0 reads and
// checks batches of random rows of every other node, the others wait in
// trainerIdle; open is how long this rank's Open took. Rank 0 says its
// figures (say) before the collective Free.
func scaleMPIRank(s *ddstore.Store, j trainerJob, rank int, open time.Duration, say func(ScaleMPIPoint) error) error {
	p := ScaleMPIPoint{Nodes: j.Ranks, OpenSeconds: open.Seconds()}
	const name = "scale-mpi"
	t0 := time.Now()
	if err := trainerShard(s, name, rank, j.Scale.RowsPerNode, j.Scale.RowBytes); err != nil {
		return err
	}
	p.AddSeconds = time.Since(t0).Seconds()
	done := filepath.Join(j.RunDir, name+".done")
	if rank != 0 {
		return trainerIdle(s, name, done)
	}
	if err := scaleMPIRead(s, name, j, &p); err != nil {
		// The others end too, without the Free rank 0 no longer joins.
		os.WriteFile(done, []byte(err.Error()), 0o600)
		return err
	}
	if err := os.WriteFile(done, nil, 0o600); err != nil {
		return err
	}
	if err := say(p); err != nil {
		return err
	}
	return s.Free(name)
}

// scaleMPIRead is rank 0's reads of a job of the method mpi, into p.
func scaleMPIRead(s *ddstore.Store, name string, j trainerJob, p *ScaleMPIPoint) error {
	sj := *j.Scale
	// Rank 0 holds rows [0, n); the others, [n, K·n).
	n, rb := sj.RowsPerNode, sj.RowBytes
	others := int64(j.Ranks-1) * n
	rng := rand.New(rand.NewPCG(5, uint64(j.Ranks)))
	idx := make([]int64, sj.Batch)
	dst := make([]byte, sj.Batch*rb)
	seen := make([]int, j.Ranks) // the batch that last touched each node
	batch := func() error {
		for i := range idx {
			idx[i] = n + rng.Int64N(others)
		}
		return s.GetBatch(name, dst, idx)
	}
	// One untimed batch: the windows' first gets, the destination's pages.
	if err := batch(); err != nil {
		return err
	}
	var ds []time.Duration
	var owners int
	ranks, agents := jobProcs(j.Namespace)
	p.OwnerProcs, p.AgentProcs = len(ranks), len(agents)
	self := os.Getpid()
	cpu0, all0 := procCPU(self), machineCPU()
	ranks0, agents0 := procsCPU(ranks), procsCPU(agents)
	for range sj.Rounds {
		start, rows := time.Now(), 0
		for time.Since(start) < sj.Duration {
			t := time.Now()
			if err := batch(); err != nil {
				return err
			}
			ds = append(ds, time.Since(t))
			for i, g := range idx {
				if got := int64(binary.LittleEndian.Uint64(dst[i*rb:])); got != g {
					return fmt.Errorf("row %d read as row %d", g, got)
				}
				if o := int(g / n); seen[o] != len(ds) {
					seen[o] = len(ds)
					owners++
				}
			}
			rows += len(idx)
		}
		p.ReadRounds = append(p.ReadRounds, float64(rows)/time.Since(start).Seconds())
	}
	cpu, all := procCPU(self)-cpu0, machineCPU()-all0
	p.OwnersCPUus = float64((procsCPU(ranks) - ranks0).Microseconds()) / float64(len(ds))
	p.AgentsCPUus = float64((procsCPU(agents) - agents0).Microseconds()) / float64(len(ds))
	p.Load = loadAvg()
	p.Batches = len(ds)
	p.ReadRowsPerSec = Median(p.ReadRounds)
	p.ReadMBps = p.ReadRowsPerSec * float64(rb) / 1e6
	us := DurationsToMicros(ds)
	p.ReadP50us, p.ReadP99us = Percentile(us, 50), Percentile(us, 99)
	p.ReadCPUus = float64(cpu.Microseconds()) / float64(len(ds))
	p.MachineCPUus = float64(all.Microseconds()) / float64(len(ds))
	p.OwnersPerBatch = float64(owners) / float64(len(ds))
	prof, err := s.Profile(name)
	if err != nil {
		return err
	}
	p.RemoteRows, p.OneSidedRows = prof.RemoteRows, prof.OneSided
	if prof.RemoteRows == 0 || prof.OneSided != prof.RemoteRows {
		return fmt.Errorf("%d of %d remote rows read by MPI gets: want all", prof.OneSided, prof.RemoteRows)
	}
	return nil
}

// WriteTable prints the report as one table, a row per job size.
func (r *ScaleMPIReport) WriteTable(w io.Writer) error {
	fmt.Fprintf(w, "ddstore bench scale --method mpi: one rank a node (%s), %d rows of %s per node, GetBatch of %d rows of the other nodes by rank 0 with MPI gets, %d rounds of %s, %d CPUs, %s, %s\n\n",
		r.Launcher, r.RowsPerNode, sizeName(r.RowBytes), r.Batch, r.Rounds, r.Duration, r.CPUs, r.Go, r.Date)
	t := NewTable("K", "open s", "add s", "owners/batch", "read Mrows/s", "ratio to K=2", "p50 ms", "p99 ms", "cpu µs/batch reader+owners+agents", "machine cpu µs/batch", "one-sided/remote rows", "mpirun s", "load")
	for _, p := range r.Points {
		t.Row(fmt.Sprint(p.Nodes), fmt.Sprintf("%.2f", p.OpenSeconds), fmt.Sprintf("%.3f", p.AddSeconds), fmt.Sprintf("%.1f", p.OwnersPerBatch),
			fmt.Sprintf("%.3f", p.ReadRowsPerSec/1e6), fmt.Sprintf("%.2f", p.RatioTo2), fmt.Sprintf("%.2f", p.ReadP50us/1e3), fmt.Sprintf("%.2f", p.ReadP99us/1e3),
			fmt.Sprintf("%.0f+%.0f+%.0f", p.ReadCPUus, p.OwnersCPUus, p.AgentsCPUus), fmt.Sprintf("%.0f", p.MachineCPUus), fmt.Sprintf("%d/%d", p.OneSidedRows, p.RemoteRows), fmt.Sprintf("%.1f", p.LaunchSeconds), p.Load)
	}
	return t.Write(w)
}

// machineCPU is the machine's busy CPU time so far, every CPU: /proc/stat's
// first line less idle and iowait, in clock ticks.
func machineCPU() time.Duration {
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		return 0
	}
	line, _, _ := strings.Cut(string(b), "\n")
	f := strings.Fields(line)
	var busy int64
	for i, x := range f[1:min(len(f), 9)] {
		if i == 3 || i == 4 { // idle, iowait
			continue
		}
		n, _ := strconv.ParseInt(x, 10, 64)
		busy += n
	}
	return time.Duration(busy) * time.Second / clockTicks
}

// jobProcs are the processes of rank 0's job other than itself: the other
// ranks (children of the same mpirun) and the agents (the namespace's).
func jobProcs(ns string) (ranks, agents []int) {
	ds, _ := os.ReadDir("/proc")
	self, parent := os.Getpid(), os.Getppid()
	arg := "\x00--namespace\x00" + ns + "\x00"
	for _, d := range ds {
		pid, err := strconv.Atoi(d.Name())
		if err != nil || pid == self {
			continue
		}
		if b, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid)); err == nil && strings.Contains(string(b), arg) {
			agents = append(agents, pid)
			continue
		}
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
		if err != nil {
			continue
		}
		// The fields after the command's name: state, then the parent.
		if i := strings.LastIndexByte(string(b), ')'); i >= 0 {
			if f := strings.Fields(string(b[i+1:])); len(f) > 1 && f[1] == strconv.Itoa(parent) {
				ranks = append(ranks, pid)
			}
		}
	}
	return ranks, agents
}

// procsCPU is the CPU time so far of pids together.
func procsCPU(pids []int) time.Duration {
	var sum time.Duration
	for _, pid := range pids {
		sum += procCPU(pid)
	}
	return sum
}

package bench

// Cross-node reads over each transport, side by side, next to DDStore's
// figures for the same cases (its MPI method 0 measured on these machines,
// REFERENCE.md §1).

import (
	"bytes"
	crand "crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"syscall"
	"time"

	"github.com/ddstore-go/ddstore"
	"github.com/ddstore-go/ddstore/internal/auth"
	"github.com/ddstore-go/ddstore/internal/mpirun"
	"github.com/ddstore-go/ddstore/internal/transport"
)

// DDStore's method 0 (MPI one-sided gets, Open MPI 4.1.4 over shared
// memory, 2 ranks on one machine), measured on these machines: get_batch of
// 256 random rows of the other rank, GB/s (low, high), and one get() of a
// 64-byte row of the other rank, µs (low, high).
var (
	DDStoreRemoteGBps = map[int][2]float64{4 << 10: {2.9, 3.6}, 64 << 10: {5.0, 5.0}}
	DDStoreGetUs      = [2]float64{4.3, 6.2}
)

// ddstoreGetRow is the row size of DDStore's get() figure.
const ddstoreGetRow = 64

// probeEnv carries the MPI probe's options to its ranks; set, `ddstore
// bench` is a rank of the probe (mpiprobe.go).
const probeEnv = "DDSTORE_BENCH_MPI_PROBE"

var errNoProbe = errors.New("bench: MPI probe: this ddstore was built without MPI: rebuild with -tags mpi (make build-mpi)")

// MPIProbeResult is DDStore's method 0 reduced to its data path and
// measured in the same run (mpiprobe.go): GetBatch-like batches of a get
// per row and one flush, and single gets of one row.
type MPIProbeResult struct {
	RowBytes int     `json:"row_bytes"`
	GBps     float64 `json:"gbps"`
	GetP50us float64 `json:"get_p50_us"`
}

// rendezvousAddr is a free loopback address for a job's agents to meet
// at, with the job's secret set in the environment they inherit (agents
// that meet at an address refuse to start without one).
func rendezvousAddr() (string, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	defer l.Close()
	if os.Getenv(auth.SecretEnv) == "" {
		os.Setenv(auth.SecretEnv, crand.Text())
	}
	return l.Addr().String(), nil
}

// runMPIProbe runs the probe: mpirun -np 2 of this binary.
func runMPIProbe(opts Options) ([]MPIProbeResult, error) {
	o := Options{RowSizes: opts.RowSizes, Batch: opts.Batch, ShardBytes: opts.ShardBytes, Duration: opts.Duration, Latency: opts.Latency}
	return runRanks[MPIProbeResult]("MPI probe", probeEnv, 2, o)
}

// runRanks runs this binary's `bench` as the np ranks of an MPI launch,
// env key holding arg as JSON, and decodes the results rank 0 prints as
// JSON lines; when the launch fails, also those printed before.
func runRanks[T any](what, key string, np int, arg any) ([]T, error) {
	exe, err := os.Executable()
	if err != nil {
		return nil, err
	}
	launcher, err := mpirun.Find()
	if err != nil {
		return nil, err
	}
	b, err := json.Marshal(arg)
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(launcher.Path, append(launcher.Args(np), exe, "bench")...)
	cmd.Env = append(os.Environ(), key+"="+string(b))
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, runErr := cmd.Output()
	var res []T
	dec := json.NewDecoder(bytes.NewReader(out))
	for dec.More() {
		var r T
		if err := dec.Decode(&r); err != nil {
			if runErr != nil {
				break
			}
			return nil, fmt.Errorf("bench: %s: %w in %q", what, err, out)
		}
		res = append(res, r)
	}
	if runErr != nil {
		return res, fmt.Errorf("bench: %s: %w\n%s%s", what, runErr, out, stderr.Bytes())
	}
	return res, nil
}

func checkTransport(tr string) error {
	switch tr {
	case "tcp":
		return nil
	case "mpi":
		if !transport.MPIBuilt {
			return fmt.Errorf("bench: transport mpi: this ddstore was built without MPI: rebuild with -tags mpi (make build-mpi)")
		}
		if _, err := mpirun.Find(); err != nil {
			return fmt.Errorf("bench: transport mpi: %w", err)
		}
		return nil
	case "fabric":
		if !transport.FabricBuilt {
			return fmt.Errorf("bench: transport fabric: this ddstore was built without libfabric: rebuild with -tags fabric (make build-fabric)")
		}
		return nil
	}
	return fmt.Errorf("bench: transport %q: want tcp, mpi or fabric", tr)
}

// mpiLaunch is the mpirun that runs a job's two agents.
type mpiLaunch struct {
	cmd    *exec.Cmd
	exited chan error
	pids   []int
	log    *lockedBuffer
}

// stop asks every agent to stop (they end MPI together) and waits for
// mpirun.
func (m *mpiLaunch) stop() error {
	if len(m.pids) == 0 {
		m.cmd.Process.Signal(syscall.SIGTERM)
	}
	for _, p := range m.pids {
		syscall.Kill(p, syscall.SIGTERM)
	}
	select {
	case err := <-m.exited:
		return err
	case <-time.After(30 * time.Second):
		m.cmd.Process.Kill()
		<-m.exited
		return fmt.Errorf("mpirun killed 30 s after its agents were asked to stop:\n%s", m.log.String())
	}
}

// lockedBuffer collects mpirun's output.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (b *lockedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.Write(p)
}

func (b *lockedBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.String()
}

// startMPIJob runs the two agents as the ranks of one mpirun launch of
// this binary (`ddstore agent --transport mpi`), and opens a store on
// each.
func startMPIJob() (*job, error) {
	exe, err := os.Executable()
	if err != nil {
		return nil, err
	}
	launcher, err := mpirun.Find()
	if err != nil {
		return nil, err
	}
	rdv, err := rendezvousAddr()
	if err != nil {
		return nil, err
	}
	j := &job{}
	if j.dir, err = os.MkdirTemp("", "ddstore-bench-"); err != nil {
		return nil, err
	}
	runDir := filepath.Join(j.dir, "run")
	ns := fmt.Sprintf("bench-%d-mpi", os.Getpid())
	nodes := []string{"bench-a", "bench-b"}
	args := launcher.Args(0)
	for i, node := range nodes {
		if i > 0 {
			args = append(args, ":")
		}
		args = append(args, "-np", "1", exe, "agent", "--transport", "mpi", "--namespace", ns, "--node", node,
			"--run-dir", runDir, "--rendezvous", rdv, "--peer-listen", "127.0.0.1:0")
	}
	m := &mpiLaunch{cmd: exec.Command(launcher.Path, args...), exited: make(chan error, 1), log: &lockedBuffer{}}
	m.cmd.Stdout, m.cmd.Stderr = m.log, m.log
	if err := m.cmd.Start(); err != nil {
		os.RemoveAll(j.dir)
		return nil, err
	}
	go func() { m.exited <- m.cmd.Wait() }()
	j.mpi = m
	deadline := time.Now().Add(60 * time.Second)
	for _, node := range nodes {
		sock := ddstore.SocketPath(runDir, ns, node)
		for {
			in, err := ddstore.QueryAgent(sock, ns, node)
			if err == nil {
				m.pids = append(m.pids, in.Pid)
				break
			}
			select {
			case err := <-m.exited:
				m.exited <- err
				j.close()
				return nil, fmt.Errorf("mpirun ended (%v) before the agent of %s served:\n%s", err, node, m.log.String())
			case <-time.After(10 * time.Millisecond):
			}
			if time.Now().After(deadline) {
				j.close()
				return nil, fmt.Errorf("the agent of %s did not serve within 60 s:\n%s", node, m.log.String())
			}
		}
	}
	for rank, node := range nodes {
		s, err := ddstore.Open(ddstore.Config{Namespace: ns, Rank: rank, Size: 2, LocalRank: 0, LocalSize: 1, Node: node,
			Socket: ddstore.SocketPath(runDir, ns, node), NoSpawn: true})
		if err != nil {
			j.close()
			return nil, err
		}
		j.stores[rank] = s
	}
	return j, nil
}

// writeTransports prints the cross-node figures of every transport, then
// those of DDStore's cases next to them.
func (r *Report) writeTransports(w io.Writer) error {
	f := func(x float64) string { return fmt.Sprintf("%.2f", x) }
	fmt.Fprintf(w, "\nCross-node reads by transport (each in a job of its own, one after the other):\n\n")
	t := NewTable("row", "transport", "remote GB/s", "remote copy GB/s", "remote Mrows/s", "get remote p50 µs", "p99 µs")
	for _, x := range r.Transports {
		t.Row(sizeName(x.RowBytes), x.Transport, f(x.RemoteGBps), f(x.RemoteCopyGBps), fmt.Sprintf("%.3f", x.RemoteRowsPerSec/1e6),
			f(x.GetRemoteP50us), f(x.GetRemoteP99us))
	}
	if err := t.Write(w); err != nil {
		return err
	}
	fmt.Fprintf(w, "\nAgainst DDStore's method 0 (MPI one-sided gets between 2 ranks of this machine; REFERENCE.md §1). ratio: ours / DDStore's (for get(): DDStore's µs / ours), against its low-high range:\n\n")
	probe := func(rb int) *MPIProbeResult {
		for i := range r.MPIProbe {
			if r.MPIProbe[i].RowBytes == rb {
				return &r.MPIProbe[i]
			}
		}
		return nil
	}
	t = NewTable("case", "DDStore", "transport", "ours", "ratio", "DDStore's pattern now", "ratio now")
	for _, x := range r.Transports {
		if d, ok := DDStoreRemoteGBps[x.RowBytes]; ok {
			now, nowRatio := "-", "-"
			if p := probe(x.RowBytes); p != nil && p.GBps > 0 {
				now, nowRatio = f(p.GBps)+" GB/s", f(x.RemoteGBps/p.GBps)
			}
			t.Row(fmt.Sprintf("GetBatch %s rows, %d", sizeName(x.RowBytes), r.Batch), rangeText(d, "GB/s"), x.Transport, f(x.RemoteGBps)+" GB/s",
				fmt.Sprintf("%.2f-%.2f", x.RemoteGBps/d[1], x.RemoteGBps/d[0]), now, nowRatio)
		}
	}
	for _, x := range r.MPITrainer {
		if d, ok := DDStoreRemoteGBps[x.RowBytes]; ok {
			now, nowRatio := "-", "-"
			if p := probe(x.RowBytes); p != nil && p.GBps > 0 {
				now, nowRatio = f(p.GBps)+" GB/s", f(x.GBps/p.GBps)
			}
			t.Row(fmt.Sprintf("GetBatch %s rows, %d", sizeName(x.RowBytes), r.Batch), rangeText(d, "GB/s"), "mpi, trainer", f(x.GBps)+" GB/s",
				fmt.Sprintf("%.2f-%.2f", x.GBps/d[1], x.GBps/d[0]), now, nowRatio)
		}
	}
	for _, x := range r.Transports {
		if x.RowBytes == ddstoreGetRow && x.GetRemoteP50us > 0 {
			d := DDStoreGetUs
			now, nowRatio := "-", "-"
			if p := probe(x.RowBytes); p != nil && p.GetP50us > 0 {
				now, nowRatio = f(p.GetP50us)+" µs", f(p.GetP50us/x.GetRemoteP50us)
			}
			t.Row(fmt.Sprintf("Get of one %s row, p50", sizeName(x.RowBytes)), rangeText(d, "µs"), x.Transport, f(x.GetRemoteP50us)+" µs",
				fmt.Sprintf("%.2f-%.2f", d[0]/x.GetRemoteP50us, d[1]/x.GetRemoteP50us), now, nowRatio)
		}
	}
	for _, x := range r.MPITrainer {
		if x.RowBytes == ddstoreGetRow && x.GetP50us > 0 {
			d := DDStoreGetUs
			now, nowRatio := "-", "-"
			if p := probe(x.RowBytes); p != nil && p.GetP50us > 0 {
				now, nowRatio = f(p.GetP50us)+" µs", f(p.GetP50us/x.GetP50us)
			}
			t.Row(fmt.Sprintf("Get of one %s row, p50", sizeName(x.RowBytes)), rangeText(d, "µs"), "mpi, trainer", f(x.GetP50us)+" µs",
				fmt.Sprintf("%.2f-%.2f", d[0]/x.GetP50us, d[1]/x.GetP50us), now, nowRatio)
		}
	}
	if err := t.Write(w); err != nil {
		return err
	}
	if len(r.MPITrainer) > 0 {
		fmt.Fprintln(w, "\nmpi, trainer: a Store with Method \"mpi\", rows of the other node read with MPI gets from the reading process (2 ranks of mpirun, agents over tcp for the rest).")
	}
	if len(r.MPIProbe) > 0 {
		fmt.Fprintln(w, "\nDDStore's pattern now: its method 0's data path measured in this run (MPI_Win_create, a get per row, one flush per batch; 2 ranks of mpirun, the target idle).")
	}
	return nil
}

func rangeText(d [2]float64, unit string) string {
	if d[0] == d[1] {
		return fmt.Sprintf("%.1f %s", d[0], unit)
	}
	return fmt.Sprintf("%.1f-%.1f %s", d[0], d[1], unit)
}

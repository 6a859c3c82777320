package bench_test

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/ddstore-go/ddstore/internal/bench"
	"github.com/ddstore-go/ddstore/internal/cli"
	"github.com/ddstore-go/ddstore/internal/testutil"
	"github.com/ddstore-go/ddstore/internal/transport"
)

// The driver's agents and node helpers are this test binary run as the
// ddstore command.
var _ = testutil.Helper("ddstore", func(args []string) int { return cli.Main(args, os.Stdout, os.Stderr) })

func init() { testutil.RunHelper() }

// runScale runs the scale driver with opts, its agents and node helpers
// this test binary as ddstore, and fails t with the driver's progress on
// an error.
func runScale(t *testing.T, opts bench.ScaleOptions) *bench.ScaleReport {
	t.Helper()
	opts.Command = func(env []string, args ...string) *exec.Cmd {
		cmd := testutil.HelperCmd(t, "ddstore", args)
		cmd.Env = append(cmd.Env, env...)
		return cmd
	}
	var progress testutil.Buffer
	opts.Progress = &progress
	rep, err := bench.RunScale(opts)
	if err != nil {
		t.Fatalf("RunScale (nodes %v, meet %q): %v\n%s", opts.Nodes, opts.Meet, err, progress.String())
	}
	return rep
}

// TestScaleDriverGatherTree: on 4 nodes with a relay fanout of 2 the
// coordinator's 3 other nodes form chunks [a, b] and [c]: a relays b's
// round requests. Every timed Add's request of b is either carried up by
// a (gathered) or sent on to the coordinator (direct), one of the two,
// and the coordinator hears 2 requests per Add when a carried it.
func TestScaleDriverGatherTree(t *testing.T) {
	if testing.Short() {
		t.Skip("starts 4 agents and 4 node helpers")
	}
	rep := runScale(t, bench.ScaleOptions{Nodes: []int{4}, RanksPerNode: 2, RowsPerNode: 64, RowBytes: 256, Batch: 16,
		Rounds: 3, Duration: 100 * time.Millisecond, RelayFanout: 2})
	p := rep.Points[0]
	if got := p.GathersRelayed + p.GathersDirect; got != 1 {
		t.Errorf("per Add %v requests gathered and %v sent on, want one of the two (the relay's one child)", p.GathersRelayed, p.GathersDirect)
	}
	if want := 2 + p.GathersDirect; p.CoordAddMsgsIn != want {
		t.Errorf("the coordinator heard %v requests per Add, want %v (its two chunks, and each request sent on)", p.CoordAddMsgsIn, want)
	}
}

// TestScaleDriver runs the scale driver on 2 and 3 nodes and checks that
// what it measures is sane: the counts it must find exactly, the sizes
// that must grow with the job, reads that work across an agent's restart,
// and nothing left behind. No timing is checked.
func TestScaleDriver(t *testing.T) {
	opts := bench.ScaleOptions{Nodes: []int{2, 3}, RanksPerNode: 2, RowsPerNode: 64, RowBytes: 256, Batch: 32,
		Rounds: 2, Duration: 200 * time.Millisecond, Restart: true}
	rep := runScale(t, opts)
	if len(rep.Points) != 2 {
		t.Fatalf("%d points, want 2", len(rep.Points))
	}
	// The same job meeting through a handshake directory.
	hs := opts
	hs.Nodes, hs.Meet, hs.Restart = []int{3}, "handshake", false
	rep2 := runScale(t, hs)
	if rep2.Meet != "handshake" || len(rep2.Points) != 1 {
		t.Fatalf("handshake run: meet %q, %d points", rep2.Meet, len(rep2.Points))
	}
	for _, p := range append(rep.Points, rep2.Points...) {
		k, rpn := p.Nodes, opts.RanksPerNode
		if p.Ranks != k*rpn {
			t.Errorf("K=%d: %d ranks, want %d", k, p.Ranks, k*rpn)
		}
		if p.OpenSeconds <= 0 || p.FirstAddSeconds <= 0 || p.AddSeconds <= 0 || p.FreeSeconds <= 0 || len(p.AddAll) != opts.Rounds {
			t.Errorf("K=%d: open %v s, first add %v s, add %v s (%d rounds), free %v s: want all measured",
				k, p.OpenSeconds, p.FirstAddSeconds, p.AddSeconds, len(p.AddAll), p.FreeSeconds)
		}
		if p.ReadAgentCPUus <= 0 || p.ReadOwnersCPUus <= 0 {
			t.Errorf("K=%d: CPU per batch of the reading agent %v µs, of the owners %v µs: want both > 0", k, p.ReadAgentCPUus, p.ReadOwnersCPUus)
		}
		// Every node off the coordinator's sends its leading rank's shard
		// and its other ranks' in one batch or more; each is answered.
		if lo, hi := float64(k-1), float64((k-1)*rpn); p.CoordAddMsgsIn < lo || p.CoordAddMsgsIn > hi || p.CoordAddMsgsOut != p.CoordAddMsgsIn {
			t.Errorf("K=%d: coordinator messages per Add %v in, %v out; want as many out as in, %v to %v", k, p.CoordAddMsgsIn, p.CoordAddMsgsOut, lo, hi)
		}
		// No more other nodes than the relay fanout (8): each is a chunk of
		// its own, its parent the coordinator, so no request is gathered
		// nor sent on by a relay.
		if p.GathersRelayed != 0 || p.GathersDirect != 0 {
			t.Errorf("K=%d: %v requests gathered, %v sent on per Add: want none with every node a chunk of its own", k, p.GathersRelayed, p.GathersDirect)
		}
		if p.CoordAddBytesIn <= 0 || p.CoordAddBytesOut <= 0 || p.CoordFreeMsgs <= 0 || p.CoordFreeBytes <= 0 {
			t.Errorf("K=%d: coordinator bytes per Add %v in, %v out, per Free %v messages, %v bytes: want all > 0",
				k, p.CoordAddBytesIn, p.CoordAddBytesOut, p.CoordFreeMsgs, p.CoordFreeBytes)
		}
		if p.CoordRSS <= 0 || p.AgentRSS <= 0 || p.CoordGoroutines <= 0 || p.AgentGoroutines <= 0 {
			t.Errorf("K=%d: RSS %d/%d, goroutines %d/%d: want all > 0", k, p.CoordRSS, p.AgentRSS, p.CoordGoroutines, p.AgentGoroutines)
		}
		// The reader has read from every other node.
		if p.ReaderConns < k-1 {
			t.Errorf("K=%d: the reading node's agent holds %d connections, want at least %d", k, p.ReaderConns, k-1)
		}
		if p.ReadRowsPerSec <= 0 || p.ReadP99us < p.ReadP50us || p.ReadP50us <= 0 {
			t.Errorf("K=%d: read %v rows/s, p50 %v µs, p99 %v µs", k, p.ReadRowsPerSec, p.ReadP50us, p.ReadP99us)
		}
		if p.Load == "" {
			t.Errorf("K=%d: no load average", k)
		}
	}
	// Reads went on across the restart of a node's agent (on 3 nodes: on
	// 2, the only other node is the coordinator's).
	if p := rep.Points[1]; p.RestartBatches == 0 || p.RestartRowsPerSec <= 0 || p.RestartUpSeconds <= 0 {
		t.Errorf("K=3: %d batches (%v rows/s) read across the restart, agent up again in %v s", p.RestartBatches, p.RestartRowsPerSec, p.RestartUpSeconds)
	}
	if a, b := rep.Points[0].TableBytes, rep.Points[1].TableBytes; a <= 0 || b <= a {
		t.Errorf("table bytes %d at 2 nodes, %d at 3: want > 0 and growing", a, b)
	}
	// Nothing left: no agent of the driver's namespaces, no segment.
	prefix := "scale-" + strconv.Itoa(os.Getpid()) + "-"
	if m, _ := filepath.Glob("/dev/shm/ddstore." + prefix + "*"); len(m) > 0 {
		t.Errorf("segments left: %v", m)
	}
	// The agents' and node helpers' arguments travel in their environment.
	procs, _ := filepath.Glob("/proc/[0-9]*/environ")
	for _, f := range procs {
		b, _ := os.ReadFile(f)
		if strings.Contains(string(b), prefix) && f != "/proc/"+strconv.Itoa(os.Getpid())+"/environ" {
			t.Errorf("a process of the driver's job still runs: %s", f)
		}
	}
}

// helperCommand runs this test binary as the ddstore command with args,
// as testutil.HelperCmd does, from a process that has no testing.T (a
// driver in a helper role): the role and its arguments replace the ones
// this process was given.
func helperCommand(env []string, args ...string) *exec.Cmd {
	b, _ := json.Marshal(args)
	exe, _ := os.Executable()
	cmd := exec.Command(exe)
	cmd.Env = append(os.Environ(), testutil.HelperEnv+"=ddstore", testutil.HelperArgsEnv+"="+string(b), testutil.NoRaceExitPause)
	cmd.Env = append(cmd.Env, env...)
	return cmd
}

// A driver in a process of its own, whose agents and ranks are this test
// binary too.
var _ = testutil.Helper("scale-driver", func(nodes []int) int {
	opts := bench.ScaleOptions{Nodes: nodes, RanksPerNode: 2, RowsPerNode: 64, RowBytes: 256, Batch: 16,
		Rounds: 1, Duration: time.Minute, Restart: false, Command: helperCommand, Progress: os.Stderr}
	if _, err := bench.RunScale(opts); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	return 0
})

// TestScaleDriverRefusesToNest: a process the driver started (an agent,
// a node) that runs the driver again gets an error, not a job.
func TestScaleDriverRefusesToNest(t *testing.T) {
	t.Setenv("DDSTORE_SCALE_CHILD", "1")
	_, err := bench.RunScale(bench.ScaleOptions{Nodes: []int{2}, RanksPerNode: 1, RowsPerNode: 8, RowBytes: 8, Batch: 1, Rounds: 1,
		Command: func([]string, ...string) *exec.Cmd { t.Fatal("a nested driver started a process"); return nil }})
	if err == nil || !strings.Contains(err.Error(), "DDSTORE_SCALE_CHILD") {
		t.Fatalf("a nested driver: %v, want an error naming DDSTORE_SCALE_CHILD", err)
	}
}

// TestScaleDriverSignal: a driver stopped by SIGTERM in the middle of a
// job stops that job's agents and ranks and removes their segments.
func TestScaleDriverSignal(t *testing.T) {
	cmd := testutil.HelperCmd(t, "scale-driver", []int{3})
	var stderr testutil.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	stopped := false
	t.Cleanup(func() {
		if stopped {
			return
		}
		cmd.Process.Signal(syscall.SIGTERM) // the driver stops its job
		select {
		case <-done:
		case <-time.After(60 * time.Second):
			cmd.Process.Kill()
		}
	})
	// Into the reads, which would go on for a minute.
	testutil.WaitFor(t, 60*time.Second, func() error {
		if !strings.Contains(stderr.String(), "free ") {
			return fmt.Errorf("the driver has not timed its rounds yet: %q", stderr.String())
		}
		return nil
	})
	cmd.Process.Signal(syscall.SIGTERM)
	stopped = true
	select {
	case err := <-done:
		if err == nil {
			t.Errorf("the driver stopped by SIGTERM exited 0")
		}
	case <-time.After(60 * time.Second):
		cmd.Process.Kill()
		t.Fatalf("the driver did not stop within a minute of SIGTERM:\n%s", stderr.String())
	}
	if !strings.Contains(stderr.String(), "stopping the job") {
		t.Errorf("the driver did not say it stopped the job:\n%s", stderr.String())
	}
	prefix := "scale-" + strconv.Itoa(cmd.Process.Pid) + "-"
	if m, _ := filepath.Glob("/dev/shm/ddstore." + prefix + "*"); len(m) > 0 {
		t.Errorf("segments left: %v", m)
	}
	procs, _ := filepath.Glob("/proc/[0-9]*/environ")
	for _, f := range procs {
		b, _ := os.ReadFile(f)
		if strings.Contains(string(b), prefix) {
			t.Errorf("a process of the stopped job still runs: %s", f)
		}
	}
}

// TestScaleMPIRefusedWithoutMPI: the method mpi in a build without MPI is
// refused, saying how to build one.
func TestScaleMPIRefusedWithoutMPI(t *testing.T) {
	if transport.MPIBuilt {
		t.Skip("built with MPI")
	}
	opts := bench.DefaultScaleOptions()
	opts.Nodes = []int{2}
	if _, err := bench.RunScaleMPI(opts); !errors.Is(err, bench.ErrScaleNoMPI) {
		t.Fatalf("RunScaleMPI without MPI: %v, want %v", err, bench.ErrScaleNoMPI)
	}
}

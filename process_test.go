package ddstore_test

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/ddstore-go/ddstore"
	"github.com/ddstore-go/ddstore/internal/mpirun"
	"github.com/ddstore-go/ddstore/internal/naming"
	"github.com/ddstore-go/ddstore/internal/testutil"
)

// ddstoreBin is the real binary, built once for the tests that run agents
// as separate processes.
var ddstoreBin string

// reuseBinEnv hands the binary a test built to the copies of the test
// binary it starts (the ranks of an mpirun launch), which then build none.
const reuseBinEnv = "DDSTORE_TEST_REUSE_BIN"

func TestMain(m *testing.M) {
	if b := os.Getenv(reuseBinEnv); b != "" {
		ddstoreBin = b
		os.Setenv("DDSTORE_BIN", ddstoreBin)
		os.Setenv("DDSTORE_SECRET", testSecret)
		os.Exit(m.Run())
	}
	dir, err := os.MkdirTemp("", "ddstore-bin-")
	if err != nil {
		panic(err)
	}
	ddstoreBin = filepath.Join(dir, "ddstore")
	// The MPI transport's agents need a binary built with it
	// (mpicluster_test.go).
	tags := ""
	if clusterTransport == "mpi" || clusterTransport == "fabric" {
		tags = clusterTransport
	}
	// Agents launched by MPICH's Hydra (DDSTORE_MPIRUN=mpiexec.mpich) must
	// link MPICH, not the mpi-c that Open MPI provides.
	if l, err := mpirun.Find(); clusterTransport == "mpi" && err == nil && !l.OpenMPI {
		tags += " mpich"
	}
	out, err := exec.Command("go", "build", "-race", "-tags", tags, "-o", ddstoreBin, "./cmd/ddstore").CombinedOutput()
	if err != nil {
		// Without -race (no cgo on this machine) the binary still serves.
		out, err = exec.Command("go", "build", "-tags", tags, "-o", ddstoreBin, "./cmd/ddstore").CombinedOutput()
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "building ddstore: %v\n%s", err, out)
		os.Exit(1)
	}
	os.Setenv("DDSTORE_BIN", ddstoreBin)
	// The job's secret, as a job on several nodes has one: agents that meet
	// through a rendezvous address refuse to start without it. Tests of
	// what happens without one clear it (auth_test.go).
	os.Setenv("DDSTORE_SECRET", testSecret)
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

// testSecret is the DDSTORE_SECRET of the tests' jobs.
const testSecret = "ddstore-test-secret-0123456789abcdef"

func segments(ns string) []string {
	m, _ := filepath.Glob("/dev/shm/ddstore." + ns + ".*")
	return m
}

// TestAgentProcesses runs three real `ddstore agent` processes, one per node,
// meeting through a handshake directory, and checks every row from every
// rank, `ddstore info`, and that SIGTERM removes the node's segments.
func TestAgentProcesses(t *testing.T) {
	dir := t.TempDir()
	ns := fmt.Sprintf("proc%d", os.Getpid())
	runDir := filepath.Join(dir, "run")
	hs := filepath.Join(dir, "hs")
	nodes := []string{"n0", "n1", "n2"}
	var procs []*exec.Cmd
	for _, node := range nodes {
		cmd := exec.Command(ddstoreBin, "agent", "--namespace", ns, "--node", node, "--run-dir", runDir,
			"--handshake-dir", hs, "--peer-listen", "127.0.0.1:0", "--timeout", "5s")
		var log bytes.Buffer
		cmd.Stdout, cmd.Stderr = &log, &log
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		procs = append(procs, cmd)
		t.Cleanup(func() {
			cmd.Process.Kill()
			cmd.Wait()
			if t.Failed() {
				t.Logf("agent %s log:\n%s", node, log.String())
			}
		})
	}
	ranksPerNode := []int{2, 1, 1}
	c := &cluster{ns: ns}
	rank := 0
	for i, n := range ranksPerNode {
		for l := range n {
			c.stores = append(c.stores, openLocal(t, ns, nodes[i], runDir, rank, 4, l, n))
			rank++
		}
	}
	rows := []int64{40, 0, 33, 7}
	c.addPattern(t, "grid/0", rows, 16, 4)
	c.mustEach(t, func(r int, s *ddstore.Store) error {
		all := make([]byte, 80*64)
		if err := s.Get("grid/0", all, 0); err != nil {
			return err
		}
		for g := range int64(80) {
			checkRow(t, all[g*64:(g+1)*64], g)
		}
		return nil
	})

	out, err := exec.Command(ddstoreBin, "info", "--json", "--namespace", ns, "--node", "n0", "--run-dir", runDir).Output()
	if err != nil {
		t.Fatal(err)
	}
	var in ddstore.AgentInfo
	if err := json.Unmarshal(out, &in); err != nil {
		t.Fatalf("info --json: %v\n%s", err, out)
	}
	if len(in.Variables) != 1 || in.Variables[0].Name != "grid/0" || in.Variables[0].TotalRows != 80 ||
		in.Variables[0].LocalBytes != 40*64 || fmt.Sprint(in.Variables[0].LocalRanks) != "[0 1]" {
		t.Errorf("info: %+v", in.Variables)
	}
	text, err := exec.Command(ddstoreBin, "info", "--namespace", ns, "--node", "n0", "--run-dir", runDir).Output()
	if err != nil || !strings.Contains(string(text), "grid/0") || !strings.Contains(string(text), "n0 x2, n1 x1, n2 x1") {
		t.Errorf("info: %v\n%s", err, text)
	}

	if s := segments(ns); len(s) != 4 { // one per rank; rank 1's holds no rows but exists
		t.Errorf("segments: %v", s)
	}
	for i, p := range procs {
		p.Process.Signal(syscall.SIGTERM)
		if err := p.Wait(); err != nil {
			t.Errorf("agent %s after SIGTERM: %v", nodes[i], err)
		}
	}
	if s := segments(ns); len(s) != 0 {
		t.Errorf("segments left after SIGTERM: %v", s)
	}
}

// TestEmbeddedAgent opens a store with nothing running: the library starts
// `ddstore agent` itself (the embedded default), and a second rank of the
// node attaches to the same agent.
func TestEmbeddedAgent(t *testing.T) {
	runDir := filepath.Join(t.TempDir(), "run")
	ns := fmt.Sprintf("embed%d", os.Getpid())
	open := func(rank int) *ddstore.Store {
		s, err := ddstore.Open(ddstore.Config{Namespace: ns, Rank: rank, Size: 2, LocalRank: rank, LocalSize: 2,
			Node: "solo", RunDir: runDir, AgentWait: 20 * time.Second})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { s.Close() })
		return s
	}
	c := &cluster{ns: ns, stores: []*ddstore.Store{open(0), open(1)}}
	c.addPattern(t, "x", []int64{3, 5}, 2, 8)
	dst := make([]byte, 3*16)
	if err := c.stores[1].GetBatch("x", dst, []int64{7, 0, 3}); err != nil {
		t.Fatal(err)
	}
	for i, g := range []int64{7, 0, 3} {
		checkRow(t, dst[i*16:(i+1)*16], g)
	}
	in, err := ddstore.QueryAgent(c.stores[0].Socket(), ns, "solo")
	if err != nil {
		t.Fatal(err)
	}
	if in.Clients < 2 {
		t.Errorf("agent has %d clients, want both ranks", in.Clients)
	}
	p, err := os.FindProcess(in.Pid)
	if err != nil {
		t.Fatal(err)
	}
	p.Signal(syscall.SIGTERM)
	testutil.WaitFor(t, 10*time.Second, func() error {
		if err := p.Signal(syscall.Signal(0)); err == nil {
			return fmt.Errorf("agent %d still runs", in.Pid)
		}
		return nil
	})
	if s := segments(ns); len(s) != 0 {
		t.Errorf("segments left: %v", s)
	}
}

// TestDaemonExitKind: `ddstore agent --daemon` exits with the status of the
// agent it started, so the kind of the agent's failure (here a socket
// directory others may enter: a bad argument) reaches the rank that ran it
// as it does without --daemon.
func TestDaemonExitKind(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "pub")
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	const exitArgument = 64 + 12 // docs/protocol.md, "Exit statuses of the ddstore command"
	for _, daemon := range []bool{false, true} {
		args := []string{"agent", "--namespace", fmt.Sprintf("kind%d", os.Getpid()), "--node", "n0", "--socket", filepath.Join(dir, "a.sock")}
		if daemon {
			args = append(args, "--daemon")
		}
		out, err := exec.Command(ddstoreBin, args...).CombinedOutput()
		var exit *exec.ExitError
		if !errors.As(err, &exit) || exit.ExitCode() != exitArgument {
			t.Errorf("ddstore %s in a 0755 directory: %v, want exit status %d; output %s", strings.Join(args, " "), err, exitArgument, out)
		}
	}
}

// TestSpawnLosesRace: an agent started while another holds the namespace's
// lock (here the test holds it, as an agent still starting would) exits
// with naming.ExitAgentRuns, with --daemon too, and the rank that started
// it takes that as the race lost, not as a failure: it waits for the
// winner's socket. A start that fails otherwise fails Open with the
// binary's exit status.
func TestSpawnLosesRace(t *testing.T) {
	runDir := filepath.Join(t.TempDir(), "run")
	if err := os.Mkdir(runDir, 0o700); err != nil {
		t.Fatal(err)
	}
	ns := fmt.Sprintf("race%d", os.Getpid())
	sock := ddstore.SocketPath(runDir, ns, "n0")
	fd, err := naming.LockFile(sock + ".lock")
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fd)
	for _, daemon := range []bool{false, true} {
		args := []string{"agent", "--namespace", ns, "--node", "n0", "--socket", sock}
		if daemon {
			args = append(args, "--daemon")
		}
		err := exec.Command(ddstoreBin, args...).Run()
		var exit *exec.ExitError
		if !errors.As(err, &exit) || exit.ExitCode() != naming.ExitAgentRuns {
			t.Fatalf("ddstore %s while the lock is held: %v, want exit status %d", strings.Join(args, " "), err, naming.ExitAgentRuns)
		}
	}
	cfg := ddstore.Config{Namespace: ns, Rank: 0, Size: 1, LocalRank: 0, LocalSize: 1, Node: "n0", RunDir: runDir, AgentWait: 500 * time.Millisecond}
	_, err = ddstore.Open(cfg)
	var exit *exec.ExitError
	if !errors.Is(err, ddstore.ErrNoAgent) || errors.As(err, &exit) {
		t.Fatalf("Open while another agent holds the lock: %v, want ErrNoAgent from waiting for its socket, not from starting one", err)
	}
	cfg.AgentArgs = []string{"--no-such-flag"}
	_, err = ddstore.Open(cfg)
	if !errors.Is(err, ddstore.ErrNoAgent) || !errors.As(err, &exit) || exit.ExitCode() != 2 {
		t.Fatalf("Open with an agent that cannot start: %v, want ErrNoAgent with the binary's exit status 2", err)
	}
}

package ddstore_test

// The cluster tests over the MPI transport. With DDSTORE_TEST_TRANSPORT=mpi,
// startCluster starts its agents as the ranks of one mpirun launch of the
// ddstore binary (built with -tags mpi by TestMain), one rank per simulated
// node, each with --transport mpi and its own --node; the stores stay in
// this process and the test bodies are the same as over tcp. The tests
// that run again so are those named TestCluster... (cluster_test.go):
//
//	DDSTORE_TEST_TRANSPORT=mpi go test -run '^TestCluster' .
//
// (.ci/gotest.sh runs them so when mpicc is installed.)

import (
	"context"
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

	"github.com/ddstore-go/ddstore"
	"github.com/ddstore-go/ddstore/agent"
	"github.com/ddstore-go/ddstore/internal/mpirun"
	"github.com/ddstore-go/ddstore/internal/shm"
	"github.com/ddstore-go/ddstore/internal/testutil"
)

// clusterTransport is the transport of startCluster's agents.
var clusterTransport = func() string {
	if t := os.Getenv("DDSTORE_TEST_TRANSPORT"); t != "" {
		return t
	}
	return "tcp"
}()

// mpiAgent is one rank of an mpirun launch of agents.
type mpiAgent struct {
	socket, ns, node string
	pid              int
}

func (a *mpiAgent) Socket() string { return a.socket }

// Close stops the agent (SIGTERM) and returns once it has stopped serving
// and withdrawn its shards: its sockets are closed and its segments gone.
// The process itself lives on in MPI_Finalize, which is collective, until
// the launch's other agents stop too.
func (a *mpiAgent) Close() error {
	if a.pid == 0 {
		return nil
	}
	syscall.Kill(a.pid, syscall.SIGTERM)
	a.pid = 0
	prefix := shm.SegmentPrefix(a.ns, a.node)
	return testutil.Poll(30*time.Second, func() error {
		segs, _ := filepath.Glob(prefix + "*")
		if _, err := os.Stat(a.socket); !errors.Is(err, os.ErrNotExist) || len(segs) != 0 {
			return fmt.Errorf("agent of %s did not stop within 30 s: socket %v, segments %v", a.node, err, segs)
		}
		return nil
	})
}

// startMPIAgents runs `mpirun -np 1 ddstore agent --transport mpi --node
// NODE ... : -np 1 ...`, one application context per agent configuration,
// and waits until every agent serves.
func startMPIAgents(t testing.TB, cfgs []agent.Config) []testAgent {
	t.Helper()
	launcher, err := mpirun.Find()
	if err != nil {
		t.Skipf("DDSTORE_TEST_TRANSPORT=mpi: %v", err)
	}
	args := launcher.Args(0)
	for i, cfg := range cfgs {
		if i > 0 {
			args = append(args, ":")
		}
		args = append(args, "-np", "1", testAgentBin())
		args = append(args, mpiAgentArgs(cfg)...)
	}
	cmd := exec.Command(launcher.Path, args...)
	cmd.Env = append(os.Environ(), testutil.NoRaceExitPause)
	if cfgs[0].Secret != "" {
		cmd.Env = append(cmd.Env, "DDSTORE_SECRET="+cfgs[0].Secret)
	}
	log := &testutil.Buffer{}
	cmd.Stdout, cmd.Stderr = log, log
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	agents := make([]*mpiAgent, len(cfgs))
	t.Cleanup(func() {
		// Every rank is asked to stop; MPI_Finalize lets them go together.
		for _, a := range agents {
			if a != nil && a.pid != 0 {
				syscall.Kill(a.pid, syscall.SIGTERM)
			}
		}
		select {
		case err := <-exited:
			if err != nil {
				t.Errorf("mpirun: %v\n%s", err, log.String())
			}
		case <-time.After(60 * time.Second):
			cmd.Process.Kill()
			<-exited
			t.Errorf("mpirun did not end within 60 s of SIGTERM to its agents:\n%s", log.String())
		}
		if t.Failed() {
			t.Logf("mpirun log:\n%s", log.String())
		}
	})
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	for i, cfg := range cfgs {
		for {
			in, err := ddstore.QueryAgent(cfg.Socket, cfg.Namespace, cfg.Node)
			if err == nil {
				if in.Transport != "mpi" {
					t.Fatalf("agent of %s runs the %q transport, want mpi", cfg.Node, in.Transport)
				}
				agents[i] = &mpiAgent{socket: cfg.Socket, ns: cfg.Namespace, node: cfg.Node, pid: in.Pid}
				break
			}
			select {
			case err := <-exited:
				exited <- err
				t.Fatalf("mpirun ended (%v) before the agent of %s served:\n%s", err, cfg.Node, log.String())
			case <-ctx.Done():
				t.Fatalf("the agent of %s did not serve within 60 s: %v\n%s", cfg.Node, err, log.String())
			case <-time.After(10 * time.Millisecond):
			}
		}
	}
	out := make([]testAgent, len(agents))
	for i, a := range agents {
		out[i] = a
	}
	return out
}

// mpiAgentArgs are the flags of `ddstore agent` that give cfg.
func mpiAgentArgs(cfg agent.Config) []string {
	args := []string{"agent", "--transport", "mpi", "--namespace", cfg.Namespace, "--node", cfg.Node, "--socket", cfg.Socket}
	add := func(flag, v string) {
		if v != "" {
			args = append(args, flag, v)
		}
	}
	add("--rendezvous", cfg.Rendezvous)
	add("--handshake-dir", cfg.HandshakeDir)
	add("--peer-listen", cfg.PeerListen)
	add("--advertise", cfg.Advertise)
	add("--metrics-addr", cfg.MetricsAddr)
	dur := func(flag string, d time.Duration) {
		if d > 0 {
			add(flag, d.String())
		}
	}
	dur("--timeout", cfg.Timeout)
	dur("--join-timeout", cfg.JoinTimeout)
	dur("--idle-exit", cfg.IdleExit)
	num := func(flag string, n int64) {
		if n > 0 {
			add(flag, strconv.FormatInt(n, 10))
		}
	}
	num("--memory", cfg.MemoryBytes)
	num("--staging", cfg.StagingBytes)
	num("--conns-per-peer", int64(cfg.ConnsPerPeer))
	if cfg.Persist {
		args = append(args, "--persist")
	}
	return args
}

// TestClusterMPIOneSided: over the MPI transport, from 1 to 4 nodes, every
// rank reads every row, and the rows of other nodes come by one-sided
// gets: the owners' agents serve none of them (served_rows stays 0).
func TestClusterMPIOneSided(t *testing.T) {
	if clusterTransport != "mpi" {
		t.Skip("DDSTORE_TEST_TRANSPORT=mpi runs it")
	}
	// The agents link the MPI whose launcher starts them: Open MPI under
	// mpirun, MPICH under Hydra (DDSTORE_MPIRUN=mpiexec.mpich).
	launcher, err := mpirun.Find()
	if err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command(testAgentBin(), "version").Output()
	if err != nil {
		t.Fatal(err)
	}
	want := "MPI: MPICH"
	if launcher.OpenMPI {
		want = "MPI: Open MPI"
	}
	if !strings.Contains(string(out), want) {
		t.Fatalf("the agents' binary says %q, want %q (launcher %s)", out, want, launcher.Path)
	}
	t.Log(strings.TrimSpace(string(out)))
	testOneSided(t, true)
}

// testOneSided is the body of the one-sided transports' cluster tests: from
// 1 to 4 nodes, every rank reads every row (into a receive buffer with
// recv, else into Go memory), and the owners' agents serve no row over TCP.
func testOneSided(t *testing.T, recv bool) {
	for nodes := 1; nodes <= 4; nodes++ {
		t.Run(fmt.Sprintf("%d nodes", nodes), func(t *testing.T) {
			per := make([]int, nodes)
			rows := make([]int64, 0, 2*nodes)
			for i := range per {
				per[i] = 1 + i%2
				for range per[i] {
					rows = append(rows, int64(50+len(rows)*7))
				}
			}
			c := startCluster(t, per, viaRendezvous)
			const rb = 4096
			c.addPattern(t, "x", rows, rb/8, 8)
			var total int64
			for _, n := range rows {
				total += n
			}
			c.mustEach(t, func(r int, s *ddstore.Store) error {
				all := make([]byte, total*rb)
				if err := s.Get("x", all, 0); err != nil {
					return err
				}
				idx := make([]int64, 256)
				for i := range idx {
					idx[i] = (int64(i)*7919 + int64(r)) % total
				}
				dst := make([]byte, len(idx)*rb)
				if recv {
					var err error
					if dst, err = s.AllocRecv(len(idx) * rb); err != nil {
						return err
					}
					defer s.FreeRecv(dst)
				}
				if err := s.GetBatch("x", dst, idx); err != nil {
					return err
				}
				for g := range total {
					if err := rowsOK(all[g*rb:(g+1)*rb], []int64{g}, rb); err != nil {
						return err
					}
				}
				return rowsOK(dst, idx, rb)
			})
			read, served := agentRowCounters(t, c)
			if nodes > 1 && read == 0 || served != 0 {
				t.Errorf("agents read %d rows of other nodes and served %d to peers; want some and none", read, served)
			}
		})
	}
}

// agentRowCounters sums read_rows and served_rows over the cluster's agents.
func agentRowCounters(t *testing.T, c *cluster) (read, served int) {
	t.Helper()
	for i, a := range c.agents {
		in, err := ddstore.QueryAgent(a.Socket(), c.ns, fmt.Sprintf("node%d", i))
		if err != nil {
			t.Fatal(err)
		}
		if in.Transport != clusterTransport {
			t.Fatalf("agent of node%d runs the %q transport, want %q", i, in.Transport, clusterTransport)
		}
		read += in.Counters["read_rows"]
		served += in.Counters["served_rows"]
	}
	return read, served
}

// TestTransportFlag: a binary built without MPI refuses --transport mpi,
// saying how to get one.
func TestTransportFlag(t *testing.T) {
	if clusterTransport == "mpi" {
		t.Skip("the agent binary of this run has MPI")
	}
	dir := t.TempDir()
	out, err := exec.Command(ddstoreBin, "agent", "--transport", "mpi", "--namespace", "tf", "--node", "n0",
		"--socket", filepath.Join(dir, "run", "s.sock")).CombinedOutput()
	if err == nil || !strings.Contains(string(out), "rebuild with -tags mpi") {
		t.Fatalf("agent --transport mpi without MPI: %v\n%s", err, out)
	}
	out, err = exec.Command(ddstoreBin, "agent", "--transport", "udp", "--socket", filepath.Join(dir, "run", "s.sock")).CombinedOutput()
	if err == nil || !strings.Contains(string(out), `transport "udp"`) {
		t.Fatalf("agent --transport udp: %v\n%s", err, out)
	}
}

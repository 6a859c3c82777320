package cli

import (
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"runtime"
	"strings"
	"syscall"
	"time"

	"github.com/ddstore-go/ddstore"
	"github.com/ddstore-go/ddstore/internal/agent"
	"github.com/ddstore-go/ddstore/internal/base"
	"github.com/ddstore-go/ddstore/internal/naming"
)

const agentSynopsis = `
Run the node agent of a job namespace: it holds this node's shards in shared
memory (/dev/shm), serves the node's ranks on a Unix socket and other nodes'
agents over TCP. Run one per node (srun --ntasks-per-node=1, or mpirun
--map-by ppr:1:node), or let the first rank of each node start it.

On several nodes, agents meet through --rendezvous HOST:PORT (the agent that
can listen there coordinates; give every agent the same address, e.g. the
first node's) or --handshake-dir DIR on a shared filesystem.

With --transport mpi (a build with -tags mpi: make build-mpi), rows of
other nodes are read with one-sided MPI gets straight out of their agents'
memory: start the agents as the ranks of one MPI launch, one per node
(mpirun --map-by ppr:1:node ddstore agent --transport mpi ..., or srun
--mpi=pmix --ntasks-per-node=1); they still meet as above, and control
messages stay on TCP.

On SIGTERM or SIGINT the agent stops taking requests, finishes those in
flight (up to 10 s), and removes its shards — or, with --persist, keeps
them: an agent started again for the same namespace and node (after a
stop, or after the agent was killed) re-adopts the shards its predecessor
left, checking each segment's header against the variable's table, without
loading the data again; clients reconnect by themselves.`

func runAgent(args []string, stdout, stderr io.Writer) error {
	fs := newFlags("agent", agentSynopsis, stderr)
	ns := fs.String("namespace", ddstore.DefaultNamespace(), "job namespace (DDSTORE_NAMESPACE, Slurm job id, torchrun run id)")
	node := fs.String("node", ddstore.DefaultNode(), "this node's identity (DDSTORE_NODE_ID overrides the host name)")
	socket := fs.String("socket", "", "client socket (default: RUN_DIR/NAMESPACE.NODE.sock)")
	runDir := fs.String("run-dir", "", "directory for sockets (DDSTORE_RUN_DIR, default /tmp/ddstore-UID)")
	peer := fs.String("peer-listen", envOr("DDSTORE_PEER_LISTEN", ""), "TCP address for other agents (default 127.0.0.1:0 on one node, :0 on several)")
	adv := fs.String("advertise", envOr("DDSTORE_ADVERTISE", ""), "address other agents dial (default: derived)")
	rdv := fs.String("rendezvous", envOr("DDSTORE_RENDEZVOUS", ""), "HOST:PORT where agents meet (served by the agent that can listen there)")
	hs := fs.String("handshake-dir", envOr("DDSTORE_HANDSHAKE_DIR", ""), "shared directory where agents meet (the agent of rank 0 coordinates)")
	timeout := fs.Duration("timeout", 30*time.Second, "bound on a read from another node")
	joinTimeout := fs.Duration("join-timeout", 5*time.Minute, "bound on waiting for the coordinator and the other ranks")
	idle := fs.Duration("idle-exit", 0, "stop after this long without a client (0: never)")
	transportName := fs.String("transport", envOr("DDSTORE_TRANSPORT", "tcp"), "how rows of other nodes are read: tcp, mpi (one-sided gets; the agents are the ranks of one MPI launch, one per node; needs a build with -tags mpi), or fabric (libfabric RMA reads; provider from DDSTORE_FABRIC; needs a build with -tags fabric) (DDSTORE_TRANSPORT)")
	persist := fs.Bool("persist", false, "keep the shards when stopping: the next agent of this namespace on this node re-adopts them (split mode, restarts)")
	conns := fs.Int("conns-per-peer", 4, "TCP connections kept to each other agent for reads of its rows (control messages take one more), each dialed when first needed")
	peerIdle := fs.Duration("peer-idle", 5*time.Minute, "close the connections to another agent after this long unused (0: never); they are dialed again when next needed")
	maxPeers := fs.Int("max-peers", 1024, "most other agents to hold connections to: dialing one more closes those of the least recently used one with no read in flight (0: no cap)")
	fanout := fs.Int("relay-fanout", 8, "on the coordinator: how many nodes it sends a round's table to, and each of them on to (a tree over the round's nodes)")
	memory := fs.String("memory", envOr("DDSTORE_MEMORY", ""), "cap on the shards and receive regions the agent holds, e.g. 64G, 512M, 1048576 (DDSTORE_MEMORY; default or 0: none)")
	staging := fs.String("staging", envOr("DDSTORE_STAGING", ""), "memory each variable with a backing file may use for rows read ahead of use, e.g. 256M (DDSTORE_STAGING; default 256M), counted in --memory")
	metricsAddr := fs.String("metrics-addr", envOr("DDSTORE_METRICS_ADDR", ""), "HOST:PORT to serve the agent's counters on at /metrics, in the Prometheus text format (DDSTORE_METRICS_ADDR; default: not served)")
	daemon := fs.Bool("daemon", false, "start the agent in the background and return once it serves")
	verbose := fs.Bool("v", false, "log at debug level")
	if err := parse(fs, args); err != nil {
		return err
	}
	if *hs != "" {
		// Info reports it: a client asked to meet in a directory compares
		// it with its own, whatever the two processes' working directories.
		abs, err := filepath.Abs(*hs)
		if err != nil {
			return base.Errorf(base.ErrArgument, "agent: --handshake-dir %q: %v", *hs, err)
		}
		*hs = abs
	}
	if *peerIdle < 0 {
		return base.Errorf(base.ErrArgument, "agent: --peer-idle %v: want a duration of 0 (never) or more", *peerIdle)
	}
	if *maxPeers < 0 {
		return base.Errorf(base.ErrArgument, "agent: --max-peers %d: want 0 (no cap) or more", *maxPeers)
	}
	var budget int64
	if m := strings.TrimSpace(*memory); m != "" && m != "0" {
		n, err := parseBytes(m)
		if err != nil {
			return fmt.Errorf("%w (--memory)", err)
		}
		budget = n
	}
	var stagingBytes int64
	if m := strings.TrimSpace(*staging); m != "" {
		n, err := parseBytes(m)
		if err != nil {
			return fmt.Errorf("%w (--staging)", err)
		}
		stagingBytes = n
	}
	if *socket == "" {
		*socket = ddstore.SocketPath(*runDir, *ns, *node)
	}
	if *daemon {
		if *transportName == "mpi" {
			return base.Errorf(base.ErrArgument, "agent: --daemon with --transport mpi: an agent of the MPI transport is a rank of its MPI launch; run it in the foreground under mpirun or srun")
		}
		return daemonize(args, *socket)
	}
	level := slog.LevelInfo
	if *verbose {
		level = slog.LevelDebug
	}
	log := slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: level}))
	a, err := agent.Start(agent.Config{
		Namespace: *ns, Node: *node, Socket: *socket, PeerListen: *peer, Advertise: *adv,
		Rendezvous: *rdv, HandshakeDir: *hs, Timeout: *timeout, JoinTimeout: *joinTimeout,
		IdleExit: *idle, ConnsPerPeer: *conns, PeerIdle: *peerIdle, MaxPeers: *maxPeers, RelayFanout: *fanout, MemoryBytes: budget, StagingBytes: stagingBytes, Persist: *persist, MetricsAddr: *metricsAddr, Logger: log,
		Transport: *transportName,
	})
	if err != nil {
		return err
	}
	metrics := ""
	if m := a.MetricsAddr(); m != "" {
		metrics = " metrics http://" + m + "/metrics"
	}
	fmt.Fprintf(stdout, "ddstore agent: namespace %q node %q socket %s peer %s%s\n", *ns, *node, a.Socket(), a.PeerAddr(), metrics)
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGTERM, syscall.SIGINT)
	defer signal.Stop(sig)
	select {
	case s := <-sig:
		log.Info("signal; stopping", "signal", s.String())
	case <-a.Done():
	}
	return a.Close()
}

// daemonize starts the same command without --daemon in its own session,
// its output in a log file beside the socket, and waits until the socket
// answers or the agent exits.
func daemonize(args []string, socket string) error {
	exe, err := os.Executable()
	if err != nil {
		return err
	}
	var rest []string
	for _, a := range args {
		if a != "--daemon" && a != "-daemon" && !strings.HasPrefix(a, "--daemon=") && !strings.HasPrefix(a, "-daemon=") {
			rest = append(rest, a)
		}
	}
	if err := os.MkdirAll(dirOf(socket), 0o700); err != nil {
		return err
	}
	logPath := socket + ".log"
	logf, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return err
	}
	defer logf.Close()
	cmd := exec.Command(exe, append([]string{"agent"}, rest...)...)
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	// The agent runs on every CPU, not on the core of the rank that
	// started it: the fork inherits the affinity of this thread.
	runtime.LockOSThread()
	if err := unbindThread(); err != nil {
		fmt.Fprintf(logf, "ddstore agent: keeping the CPU binding inherited from the process that started it: %v\n", err)
	}
	err = cmd.Start()
	runtime.UnlockOSThread()
	if err != nil {
		return err
	}
	pid := cmd.Process.Pid
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) {
		var ws syscall.WaitStatus
		if p, _ := syscall.Wait4(pid, &ws, syscall.WNOHANG, nil); p == pid {
			tail, _ := os.ReadFile(logPath)
			err := fmt.Errorf("ddstore agent exited (%v): %s", ws, lastLines(string(tail), 5))
			if ws.Exited() && ws.ExitStatus() == naming.ExitAgentRuns {
				return agentRuns{err}
			}
			if c := ws.ExitStatus() - ExitKind; ws.Exited() && c > 0 && c < base.NumCodes {
				// This command exits with the kind the agent failed with.
				return base.FromCode(uint16(c), err.Error())
			}
			return err
		}
		if c, err := net.Dial("unix", socket); err == nil {
			c.Close()
			return nil
		}
		time.Sleep(5 * time.Millisecond)
	}
	return errors.New("ddstore agent: socket " + socket + " did not answer within 30s; see " + logPath)
}

// agentRuns is a daemonized agent that exited because another agent of
// its namespace and node runs: it matches naming.ErrAgentRuns, so that
// this command exits with the same status.
type agentRuns struct{ err error }

func (e agentRuns) Error() string   { return e.err.Error() }
func (e agentRuns) Unwrap() []error { return []error{e.err, naming.ErrAgentRuns} }

func dirOf(p string) string {
	if i := strings.LastIndexByte(p, '/'); i > 0 {
		return p[:i]
	}
	return "."
}

func lastLines(s string, n int) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

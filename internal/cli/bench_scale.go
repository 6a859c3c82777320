package cli

import (
	"io"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"time"

	"github.com/ddstore-go/ddstore/internal/base"
	"github.com/ddstore-go/ddstore/internal/bench"
)

const benchScaleSynopsis = `
Measure what grows with the job: for each number of nodes K, K agents as
processes on loopback (simulated nodes meeting at one rendezvous address)
and K helper processes holding the job's ranks as Stores (--ranks-per-node
each). Per K: the time to every rank's Open, of a collective Add and Free,
the coordinator's messages and bytes per round, the agents' memory,
goroutines and connections, a variable's table per node, GetBatch of
random rows of all the other nodes by one rank, and the same while one
node's agent is killed and started again. Every agent is stopped and its
segments removed at the end. The model to 1,024 nodes and the plots:
python -m ddstore_bench.scale on the --json output (make scale).

With --method mpi (a binary built with -tags mpi: make build-mpi), the
reads by one-sided gets instead: per K, mpirun -np K of this binary, each
rank a node with its agent and a Store with Method "mpi"; rank 0 reads
GetBatch of random rows of all the other nodes by MPI gets from its own
process, --rounds rounds of --duration each, while the others wait
outside MPI. Of the other options it takes --nodes, --rows-per-node,
--row, --batch and --json.`

func runBenchScale(args []string, stdout, stderr io.Writer) error {
	fs := newFlags("bench scale", benchScaleSynopsis, stderr)
	nodes := fs.String("nodes", "2,4,8,16,32,64,128", "the numbers of nodes, one job each")
	rpn := fs.Int("ranks-per-node", 8, "ranks per node")
	rows := fs.Int64("rows-per-node", 2048, "rows each node holds (a multiple of --ranks-per-node)")
	rowSize := fs.String("row", "4K", "bytes per row")
	batch := fs.Int("batch", 256, "rows per GetBatch")
	rounds := fs.Int("rounds", 5, "Add/Free rounds timed per job")
	dur := fs.Duration("duration", 2*time.Second, "time per GetBatch figure")
	restart := fs.Bool("restart", true, "also read while one node's agent is killed and started again")
	meet := fs.String("meet", "rendezvous", "how the agents find the coordinator: rendezvous (one address) or handshake (a handshake directory)")
	maxPeers := fs.Int("max-peers", 0, "the agents' --max-peers (0: their default)")
	peerIdle := fs.Duration("peer-idle", 0, "the agents' --peer-idle (0: their default); the reading node's connections are counted again after it")
	fanout := fs.Int("relay-fanout", 0, "the agents' --relay-fanout (0: their default, 8)")
	asJSON := fs.Bool("json", false, "print one JSON object instead of the table")
	method := fs.String("method", "agent", "how the reading rank reads the other nodes' rows: agent (through the agents, over TCP) or mpi (one-sided MPI gets from its process; with --rounds rounds of reads, not of Add/Free)")
	if err := parse(fs, args); err != nil {
		return err
	}
	if *method != "agent" && *method != "mpi" {
		return base.Errorf(base.ErrArgument, "--method %q: want agent or mpi", *method)
	}
	opts := bench.DefaultScaleOptions()
	opts.Nodes = nil
	for _, s := range strings.Split(*nodes, ",") {
		k, err := strconv.Atoi(strings.TrimSpace(s))
		if err != nil || k < 2 || k > 4096 {
			return base.Errorf(base.ErrArgument, "--nodes %q: want numbers from 2 to 4096, e.g. 2,8,32", s)
		}
		opts.Nodes = append(opts.Nodes, k)
	}
	rb, err := parseBytes(*rowSize)
	if err != nil {
		return err
	}
	opts.RanksPerNode, opts.RowsPerNode, opts.RowBytes, opts.Batch = *rpn, *rows, int(rb), *batch
	opts.Rounds, opts.Duration, opts.Restart, opts.Meet = *rounds, *dur, *restart, *meet
	if *maxPeers < 0 || *peerIdle < 0 || *fanout < 0 {
		return base.Errorf(base.ErrArgument, "--max-peers %d, --peer-idle %v, --relay-fanout %d: want 0 (the agents' default) or more", *maxPeers, *peerIdle, *fanout)
	}
	opts.MaxPeers, opts.PeerIdle, opts.RelayFanout = *maxPeers, *peerIdle, *fanout
	exe, err := os.Executable()
	if err != nil {
		return err
	}
	opts.Command = func(env []string, args ...string) *exec.Cmd {
		cmd := exec.Command(exe, args...)
		cmd.Env = append(os.Environ(), env...)
		return cmd
	}
	opts.Progress = stderr
	t0 := time.Now()
	if *method == "mpi" {
		rep, err := bench.RunScaleMPI(opts)
		if err != nil {
			return err
		}
		return writeReport(stdout, rep, *asJSON, t0)
	}
	rep, err := bench.RunScale(opts)
	if err != nil {
		return err
	}
	return writeReport(stdout, rep, *asJSON, t0)
}

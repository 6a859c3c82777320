package cli

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"math/bits"
	"os"
	"os/signal"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/ddstore-go/ddstore"
	"github.com/ddstore-go/ddstore/internal/base"
	"github.com/ddstore-go/ddstore/internal/layout"
	"github.com/ddstore-go/ddstore/internal/rendezvous"
	"github.com/ddstore-go/ddstore/internal/source"
)

const ingestSynopsis = `
ddstore ingest FILE[:DATASET] --name NAME [flags]
ddstore ingest VALUES[:DATASET] --offsets OFFSETS[:DATASET] --name NAME [flags]

Load a dataset file into the store as the variable NAME. The rows are the
file's first dimension: each node's ingest process loads its contiguous
share, rows [r*N/P, (r+1)*N/P) for node r of P, straight into its shard in
shared memory, with large reads aligned to the file's chunks, several at
once. FILE is a .npy array, an HDF5 dataset as FILE:DATASET (ddstore built
with -tags hdf5), or a raw file of fixed-size rows (--row-bytes, --dtype).
On any error, on any node, nothing is left loaded.

With --capacity below the dataset's size, the nodes hold only the file's
first rows, as many as the capacity takes (node r of P its share of them);
the variable still has every row of the file, and reads of the others go
to the file through the node's agent: on demand, coalesced by position and
chunk, or ahead of use when the reader says what comes next (Prefetch,
ddstore.torch.ScheduledSampler). The file must stay where it is, readable
from every node.

With --offsets, the rows are ragged (graphs of n_i atoms, token
sequences): FILE (.npy, or HDF5 as FILE:DATASET) holds their values, the
units of every row one after another along its first dimension, and the
offsets dataset rows + 1 integers, row g being units [off[g], off[g+1]).
The variable is a ragged variable of the values' type and trailing shape;
each node loads the rows of its share of the units, and --capacity counts
bytes of whole rows.

Run one ingest per node (srun --ntasks-per-node=1, mpirun --map-by
ppr:1:node) with --rank and --size, or let the launcher's environment say
them; alone, it is rank 0 of 1.

The variable lives in the node agents and outlasts ingest only while they
run: an agent that ingest starts stops 30 s after its last client. For a
dataset that stays, start the agents first (ddstore agent --daemon, with
the same --namespace) and read it from jobs in that namespace.`

func runIngest(args []string, stdout, stderr io.Writer) error {
	fs := newFlags("ingest", ingestSynopsis, stderr)
	name := fs.String("name", "", "the variable to create (required)")
	ns := fs.String("namespace", ddstore.DefaultNamespace(), "job namespace (DDSTORE_NAMESPACE, Slurm job id, torchrun run id)")
	node := fs.String("node", "", "this node's identity (default: DDSTORE_NODE_ID, the launcher's, or the host name)")
	rank := fs.Int("rank", -1, "this ingest's rank: the node's index among --size nodes (default: from the launcher's environment, else 0)")
	size := fs.Int("size", 0, "ingest processes, one per node (default: from the launcher's environment, else 1)")
	socket := fs.String("socket", "", "agent socket (default: RUN_DIR/NAMESPACE.NODE.sock)")
	runDir := fs.String("run-dir", "", "directory for sockets (DDSTORE_RUN_DIR, default /tmp/ddstore-UID)")
	rdv := fs.String("rendezvous", envOr("DDSTORE_RENDEZVOUS", ""), "HOST:PORT where agents started by ingest meet (several nodes)")
	hs := fs.String("handshake-dir", envOr("DDSTORE_HANDSHAKE_DIR", ""), "shared directory where agents started by ingest meet (several nodes)")
	rowBytes := fs.Int64("row-bytes", 0, "raw files: bytes per row (required); others: the rows must be this size")
	dtype := fs.String("dtype", "", "raw files: item type (default uint8); others: the items must be this type. One of "+strings.Join(layout.Dtypes(), ", "))
	capacity := fs.String("capacity", "", "memory the job gives the dataset, all nodes together, e.g. 64G (default: all of it); the rows beyond it are read from the file")
	workers := fs.Int("readers", 4, "reads at once on each node")
	readSize := fs.String("read-size", "16M", "bytes per read, rounded to whole chunks")
	timeout := fs.Duration("timeout", 5*time.Minute, "bound on waiting for the other nodes")
	offsets := fs.String("offsets", "", "ragged rows: FILE holds their values, units one after another, and this (FILE.npy or FILE.h5:DATASET) their offsets, rows + 1 integers")
	file, err := parseIngestArgs(fs, args)
	if err != nil {
		return err
	}
	if *name == "" {
		fmt.Fprintln(stderr, "ddstore ingest: --name is required (the variable to load into)")
		fs.Usage()
		return errUsage
	}
	if (*rank >= 0) != (*size > 0) {
		fmt.Fprintln(stderr, "ddstore ingest: give --rank and --size together (or neither, to take them from the environment)")
		fs.Usage()
		return errUsage
	}
	if *workers < 1 {
		return base.Errorf(base.ErrArgument, "ingest: --readers %d: want at least 1", *workers)
	}
	piece, err := parseBytes(*readSize)
	if err != nil {
		return err
	}
	var capBytes int64
	if *capacity != "" {
		if capBytes, err = parseBytes(*capacity); err != nil {
			return err
		}
	}

	cfg := ddstore.Config{Namespace: *ns, Node: *node, Socket: *socket, RunDir: *runDir, PublishTimeout: *timeout}
	if *size > 0 {
		cfg.Rank, cfg.Size, cfg.LocalRank, cfg.LocalSize = *rank, *size, 0, 1
	}
	if *rdv != "" {
		cfg.AgentArgs = append(cfg.AgentArgs, "--rendezvous", *rdv)
	}
	if *hs != "" {
		cfg.AgentArgs = append(cfg.AgentArgs, "--handshake-dir", *hs)
	}

	ro := source.ReadOptions{Workers: *workers, PieceBytes: piece}
	if *offsets != "" {
		return ingestRagged(cfg, file, *offsets, *name, source.Options{RowBytes: *rowBytes, Dtype: *dtype}, capBytes, ro, stdout)
	}
	src, err := source.Open(file, source.Options{RowBytes: *rowBytes, Dtype: *dtype})
	if err == nil {
		err = checkIngest(file, src, capBytes)
		if err != nil {
			src.Close()
		}
	}
	if err != nil {
		failRound(cfg, *name)
		return err
	}
	defer src.Close()

	s, err := ddstore.Open(cfg)
	if err != nil {
		return err
	}
	defer s.Close()
	ctx, stop := interruptible()
	defer stop()
	rb := source.RowBytes(src)
	held := heldRows(src, capBytes)
	lo, hi := share(held, s.Rank(), s.Size())
	fmt.Fprintf(stdout, "ingest %s: %d rows of shape %v %s (%s); rank %d of %d on node %s loads rows [%d, %d) into %q\n",
		file, src.Rows(), src.RowShape(), src.Dtype(), humanBytes(src.Rows()*rb), s.Rank(), s.Size(), s.Node(), lo, hi, *name)
	if held < src.Rows() {
		fmt.Fprintf(stdout, "capacity %s holds rows [0, %d) of %d: the other %d stay in the file, read from it on demand (and ahead, with Prefetch)\n",
			humanBytes(capBytes), held, src.Rows(), src.Rows()-held)
	}
	prog := startProgress(stdout, hi-lo, rb)
	t0 := time.Now()
	var backing *ddstore.Backing
	if held < src.Rows() {
		backing = &ddstore.Backing{File: file, Rows: src.Rows()}
	}
	ro.Progress = prog.add
	err = ingest(ctx, s, src, *name, held, backing, ro)
	prog.finish()
	if err != nil {
		return err
	}
	secs := time.Since(t0).Seconds()
	fmt.Fprintf(stdout, "ingested %q: rows [%d, %d) of %d, %s, in %.2f s: %.2f GB/s\n",
		*name, lo, hi, src.Rows(), humanBytes((hi-lo)*rb), secs, float64((hi-lo)*rb)/secs/1e9)
	return nil
}

// parseIngestArgs parses flags on either side of the one FILE argument.
func parseIngestArgs(fs *flag.FlagSet, args []string) (string, error) {
	var files []string
	for {
		if err := fs.Parse(args); err != nil {
			if errors.Is(err, flag.ErrHelp) {
				return "", err
			}
			return "", errUsage
		}
		if fs.NArg() == 0 {
			break
		}
		files = append(files, fs.Arg(0))
		args = fs.Args()[1:]
	}
	switch len(files) {
	case 0:
		fmt.Fprintln(fs.Output(), "ddstore ingest: name the file to load: FILE.npy, FILE.h5:DATASET or a raw FILE with --row-bytes")
		fs.Usage()
		return "", errUsage
	case 1:
		return files[0], nil
	}
	fmt.Fprintf(fs.Output(), "ddstore ingest: unexpected argument %q after the file %q\n", files[1], files[0])
	fs.Usage()
	return "", errUsage
}

// checkIngest refuses, before anything is allocated, what the store
// cannot hold as a variable.
func checkIngest(file string, src source.Source, capBytes int64) error {
	rb := source.RowBytes(src)
	if src.Rows() == 0 {
		return base.Errorf(base.ErrArgument, "ingest: %s has no rows (shape [0 ...])", file)
	}
	if src.ItemSize() > 64 {
		return base.Errorf(base.ErrGeometry, "ingest: %s has %d-byte items: the store takes items of 1 to 64 bytes", file, src.ItemSize())
	}
	if capBytes < 0 || capBytes > 0 && capBytes < rb {
		return base.Errorf(base.ErrArgument, "ingest: --capacity %d bytes holds no row of %d bytes: want at least one row, or leave --capacity out for all of them", capBytes, rb)
	}
	return nil
}

// heldRows is how many of the file's rows the job keeps in memory: all of
// them, or as many as capBytes holds; the others stay in the file.
func heldRows(src source.Source, capBytes int64) int64 {
	if capBytes <= 0 {
		return src.Rows()
	}
	return min(src.Rows(), capBytes/source.RowBytes(src))
}

// share is rank r's rows of n split over p ranks: [r*n/p, (r+1)*n/p).
func share(n int64, r, p int) (lo, hi int64) {
	at := func(r int) int64 {
		h, l := bits.Mul64(uint64(n), uint64(r))
		q, _ := bits.Div64(h, l, uint64(p)) // r <= p: the quotient fits
		return int64(q)
	}
	return at(r), at(r + 1)
}

// commitName is the variable every rank creates once its rows are loaded:
// a collective that succeeds only if all ranks loaded theirs and agree on
// the dataset's rows.
func commitName(name string) string { return ".ddstore-ingest/" + name }

// ingest loads this rank's share of src's first held rows into a new
// variable of the file's item type, with backing naming the file when it
// holds more rows than that. Every rank creates the variable (a
// collective), reads its rows into its shard, then
// takes part in a second collective that says whether every rank did; if
// not, or on any error, every rank frees the variable, so nothing
// half-loaded is left.
func ingest(ctx context.Context, s *ddstore.Store, src source.Source, name string, held int64, backing *ddstore.Backing, o source.ReadOptions) error {
	rb := source.RowBytes(src)
	lo, hi := share(held, s.Rank(), s.Size())
	disp, dtype := source.Disp(src.RowShape()), ddstore.Dtype(src.Dtype())
	var err error
	if backing != nil {
		err = s.InitBacked(name, hi-lo, disp, dtype, *backing)
	} else {
		err = s.InitAs(name, hi-lo, disp, dtype)
	}
	if err != nil {
		return err
	}
	shard, err := s.Shard(name)
	if err == nil && int64(len(shard)) != (hi-lo)*rb {
		err = fmt.Errorf("ddstore ingest: variable %q: shard of %d bytes for %d rows of %d bytes", name, len(shard), hi-lo, rb)
	}
	if err == nil {
		err = source.Read(ctx, src, lo, hi-lo, shard, o)
	}
	return commit(s, name, src.Rows(), err)
}

// commit ends an ingest of rows of a file into the variable name, which
// every rank created: err is this rank's error loading its rows. With
// several ranks, a second collective says whether every rank loaded its
// rows of a file of as many rows; if not, or on err, every rank frees the
// variable, so nothing half-loaded is left.
func commit(s *ddstore.Store, name string, rows int64, err error) error {
	if s.Size() > 1 {
		// disp carries the rows each rank counted: ranks that read files
		// of other lengths disagree on it, and the commit fails.
		disp := rows
		if err != nil {
			disp = 0 // refuses the collective: every rank fails at once
		}
		cerr := s.Init(commitName(name), 0, disp, 1)
		if cerr == nil {
			cerr = s.Free(commitName(name))
		}
		if err == nil && cerr != nil {
			err = fmt.Errorf("ddstore ingest: variable %q: another rank failed, so nothing is kept: %w", name, cerr)
		}
	}
	if err != nil {
		if ferr := s.Free(name); ferr != nil {
			return errors.Join(err, fmt.Errorf("freeing the half-loaded variable %q: %w", name, ferr))
		}
		return err
	}
	return nil
}

// failRound tells the other ranks of a job of several, which wait in the
// collective that creates the variable, that this rank cannot take part:
// they fail at once instead of at the timeout. Best effort.
func failRound(cfg ddstore.Config, name string) {
	size := cfg.Size
	if size == 0 {
		id, err := rendezvous.FromEnv(nil)
		if err != nil {
			return
		}
		size = id.Size
	}
	if size <= 1 {
		return
	}
	cfg.NoSpawn = true // no agent here: nobody waits on this node
	cfg.AgentWait = time.Second
	s, err := ddstore.Open(cfg)
	if err != nil {
		return
	}
	defer s.Close()
	s.Init(name, 0, 0, 1) // disp 0: this rank's shard cannot be made
}

// progress reports rows loaded: a bar redrawn in place on a terminal,
// a line every 10% otherwise.
type progress struct {
	w         io.Writer
	tty       bool
	total, rb int64
	done      atomic.Int64
	t0        time.Time
	every     time.Duration // how often it looks
	stop      chan struct{}
	wg        sync.WaitGroup
}

func startProgress(w io.Writer, total, rb int64) *progress {
	return startProgressEvery(w, total, rb, 200*time.Millisecond)
}

func startProgressEvery(w io.Writer, total, rb int64, every time.Duration) *progress {
	p := &progress{w: w, tty: isTerminal(w), total: total, rb: rb, t0: time.Now(), every: every, stop: make(chan struct{})}
	p.wg.Go(p.loop)
	return p
}

func (p *progress) add(rows int64) { p.done.Add(rows) }

func (p *progress) loop() {
	tick := time.NewTicker(p.every)
	defer tick.Stop()
	step := int64(0) // the last tenth reported
	for {
		select {
		case <-p.stop:
			return
		case <-tick.C:
		}
		done := p.done.Load()
		if p.tty {
			fmt.Fprintf(p.w, "\r%s", p.line(done, true))
		} else if p.total > 0 && done*10/p.total > step && done < p.total {
			step = done * 10 / p.total
			fmt.Fprintln(p.w, p.line(done, false))
		}
	}
}

// line describes the progress after done rows: the bar, rows, GB/s, ETA.
func (p *progress) line(done int64, bar bool) string {
	frac := 1.0
	if p.total > 0 {
		frac = float64(done) / float64(p.total)
	}
	secs := time.Since(p.t0).Seconds()
	rate := float64(done*p.rb) / max(secs, 1e-9) / 1e9
	eta := "?"
	if done > 0 {
		eta = time.Duration(secs * float64(p.total-done) / float64(done) * float64(time.Second)).Round(time.Second).String()
	}
	s := fmt.Sprintf("%5.1f%%  %d/%d rows  %.2f GB/s  ETA %s", 100*frac, done, p.total, rate, eta)
	if !bar {
		return "ingest: " + s
	}
	const width = 30
	n := int(frac * width)
	return "[" + strings.Repeat("=", n) + strings.Repeat(" ", width-n) + "] " + s + "   "
}

// finish stops the reporter and ends the bar's line.
func (p *progress) finish() {
	close(p.stop)
	p.wg.Wait()
	if p.tty {
		fmt.Fprintf(p.w, "\r%s\n", p.line(p.done.Load(), true))
	}
}

// isTerminal says whether w is a terminal.
func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	if !ok {
		return false
	}
	_, err := unix.IoctlGetTermios(int(f.Fd()), unix.TCGETS)
	return err == nil
}

// interruptible is the context of an ingest's reads: the first SIGINT or
// SIGTERM cancels it (the reads stop, and the variable is freed); a second
// one kills as usual. stop releases the signals.
func interruptible() (context.Context, context.CancelFunc) {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	context.AfterFunc(ctx, stop)
	return ctx, stop
}

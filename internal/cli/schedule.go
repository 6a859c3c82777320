package cli

import (
	"bufio"
	"encoding/binary"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"math"
	"os"
	"strings"
	"time"

	"github.com/ddstore-go/ddstore/internal/base"

	"github.com/ddstore-go/ddstore/internal/bench"
	"github.com/ddstore-go/ddstore/internal/schedule"
	"github.com/ddstore-go/ddstore/internal/source"
)

const scheduleSynopsis = `
Plan a job's reads when memory holds C of the dataset's N samples, and print
what the plan reads: the hit rate of every epoch (reads served from memory),
storage reads per rank per step, the fraction of memory hits read on the node
that holds them, and the time planning took. The plan is a function of the
flags alone. Policies: random (PyTorch's DistributedSampler, a FIFO buffer of
C/P per rank), solar (SOLAR's artifact: epochs reordered by a particle swarm,
re-dealing, a FIFO buffer per rank), locality (C samples pinned across the
nodes, B samples per rank per step; its C/N is the bound for random orders).

With --emit-rank R the command writes, instead of the summary, rank R's part
of one epoch: --epoch E is the E-th epoch the job runs (0 .. epochs-1; under
solar it draws the permutation epoch_order[E]). Stdout gets NumPy .npy arrays
(format 1.0), one after another, that np.load reads in turn from one open
file (ddstore.torch.ScheduledSampler reads them so):

  samples  int64, 1-d: the rank's samples, step after step
  sizes    int64, shape (steps,): how many of samples each step takes; B
           every step under locality, the last one possibly short under
           random without --drop-last, differing between ranks and steps
           under solar
  hits     bool, 1-d like samples, only with --emit-hits: memory holds the
           sample (on any node under locality)

Under locality, emitting epoch E plans that epoch alone; under random too
without --emit-hits, but its hits depend on the buffers' history, so with
--emit-hits it replays the buffers through epochs 0..E-1; under solar, whose
re-dealing and epoch order depend on history, it always replays.

With --json as well, the same as one JSON object: {"rank", "epoch", "perm",
"steps", "samples": [[...], ...] one list per step, "hits": likewise}.

Rows of different sizes (ragged variables): --sizes FILE gives every
sample's size, a 1-d .npy of integers (n of them; "-" reads it from stdin),
or --offsets FILE the n+1 offsets of a ragged variable (0, then each row's
end); both count units of --unit-bytes bytes (default 1; a ragged variable's
unit is its itemsize times its trailing shape). Memory is then a budget of
--capacity-bytes M bytes instead of --capacity samples (n defaults to the
file's). locality pins a prefix of the rows filling M (--pin bytes, the
default) or the smallest rows (--pin samples) and deals storage reads by
bytes; random and solar hold M/P bytes per rank. The summary adds the byte
hit rate (bytes read from memory) and its bound M/S (S the dataset's bytes),
the sample hit rate's bound k(M)/N (k(M): the most rows that fit in M), and
storage bytes per rank per step with their imbalance (Σ max over Σ mean of
the steps) and its floor (a step's busiest rank reads at least the mean and
at least the step's largest read). --emit-rank adds, after the arrays above:

  bytes          int64, shape (steps,): bytes the rank reads each step
  storage_bytes  int64, shape (steps,), only with --emit-hits: of them, from
                 storage

(in JSON: "bytes", "storage_bytes").

Resuming a job, on this or another number of ranks: --resume-epoch E0
--resume-position X plans the run that starts at epoch E0 of the job, of
which the first X positions of the global order (the epoch's permutation,
padded) were delivered before: epoch E0 deals positions X.. over --ranks
ranks of --batch samples, each position once, the epochs after are whole;
earlier epochs are not part of the run, and the buffers of random and solar
start empty at E0. Under solar, --order-ranks P0 (the world size the job
started with) keeps the job's order of epochs. --emit-positions adds, after
the arrays above:

  positions  int64, shape (steps+1,): the position of the epoch's global
             order before each step and, last, n (the epoch done): what a
             job stopped after step k resumes from (--resume-position)

(in JSON: "positions").`

func runSchedule(args []string, stdout, stderr io.Writer) error {
	fs := newFlags("schedule", scheduleSynopsis, stderr)
	var c schedule.Config
	fs.IntVar(&c.N, "n", 2048, "samples in the dataset")
	fs.IntVar(&c.Ranks, "ranks", 4, "ranks of the job (P)")
	fs.IntVar(&c.RanksPerNode, "ranks-per-node", 1, "ranks per node; divides --ranks")
	fs.IntVar(&c.Batch, "batch", 16, "samples per rank per step (B, the local batch)")
	fs.IntVar(&c.Epochs, "epochs", 10, "epochs (E)")
	fs.IntVar(&c.Capacity, "capacity", 1024, "samples the whole job holds in memory (C)")
	policy := fs.String("policy", string(schedule.Locality), "random, solar or locality")
	fs.Uint64Var(&c.Seed, "seed", 0, "seed of every epoch's order")
	fs.BoolVar(&c.DropLast, "drop-last", false, "drop what does not fill whole batches instead of padding")
	fs.IntVar(&c.SwarmPopulation, "population", 0, "solar: particles of the swarm (default: epochs)")
	fs.IntVar(&c.SwarmIterations, "iterations", 0, fmt.Sprintf("solar: iterations of the swarm (default %d)", schedule.DefaultSwarmIterations))
	asJSON := fs.Bool("json", false, "print one JSON object")
	emitRank := fs.Int("emit-rank", -1, "write this rank's samples of one epoch (--epoch) to stdout as .npy arrays, not the summary")
	epoch := fs.Int("epoch", 0, "with --emit-rank: the epoch, counted in the order the job runs them")
	emitHits := fs.Bool("emit-hits", false, "with --emit-rank: also write each sample's hit flag")
	sizesFile := fs.String("sizes", "", "rows of different sizes: a 1-d .npy of every sample's size (\"-\": stdin)")
	offsetsFile := fs.String("offsets", "", "rows of different sizes: a 1-d .npy of a ragged variable's n+1 offsets")
	unitBytes := fs.Int64("unit-bytes", 1, "with --sizes or --offsets: bytes of the unit they count")
	fs.Int64Var(&c.CapacityBytes, "capacity-bytes", 0, "with --sizes or --offsets: bytes the whole job holds in memory (M)")
	pin := fs.String("pin", "", "with --sizes or --offsets: what locality's pinned rows maximise, bytes (default) or samples")
	fs.IntVar(&c.ResumeEpoch, "resume-epoch", 0, "the epoch of the job this run starts in")
	fs.IntVar(&c.ResumePosition, "resume-position", 0, "positions of --resume-epoch's global order delivered before this run")
	fs.IntVar(&c.OrderRanks, "order-ranks", 0, "solar: the ranks whose costs order the epochs (default --ranks; a resumed job: its first run's)")
	emitPositions := fs.Bool("emit-positions", false, "with --emit-rank: also write the epoch's position before each step")
	if err := parse(fs, args); err != nil {
		return err
	}
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	emit := set["emit-rank"]
	if !emit && (set["epoch"] || set["emit-hits"] || set["emit-positions"]) {
		return base.Errorf(base.ErrArgument, "schedule: --epoch, --emit-hits and --emit-positions go with --emit-rank")
	}
	if err := scheduleSizes(&c, set, *sizesFile, *offsetsFile, *unitBytes); err != nil {
		return err
	}
	c.Pin = schedule.Pin(*pin)
	c.Policy = schedule.Policy(*policy)
	if emit {
		// Validate before planning: solar's swarm is the expensive part.
		if err := c.Validate(); err != nil {
			return err
		}
		switch {
		case *emitRank < 0 || *emitRank >= c.Ranks:
			return base.Errorf(base.ErrArgument, "schedule: emit-rank %d not in [0, %d): ranks %d", *emitRank, c.Ranks, c.Ranks)
		case *epoch < c.ResumeEpoch || *epoch >= c.Epochs:
			if c.ResumeEpoch > 0 {
				return base.Errorf(base.ErrArgument, "schedule: epoch %d not in [%d, %d): the run resumes at epoch %d of %d",
					*epoch, c.ResumeEpoch, c.Epochs, c.ResumeEpoch, c.Epochs)
			}
			return base.Errorf(base.ErrArgument, "schedule: epoch %d not in [0, %d): epochs %d", *epoch, c.Epochs, c.Epochs)
		}
	}
	t0 := time.Now()
	s, err := schedule.New(c)
	if err != nil {
		return err
	}
	if emit {
		return emitPlan(stdout, s, *emitRank, *epoch, *emitHits, *emitPositions, *asJSON)
	}
	sum := s.Summarize()
	secs := time.Since(t0).Seconds()
	c = s.Config()
	if *asJSON {
		out := map[string]any{
			"policy": c.Policy, "n": c.N, "ranks": c.Ranks, "ranks_per_node": c.RanksPerNode, "batch": c.Batch,
			"epochs": c.Epochs, "capacity": c.Capacity, "seed": c.Seed, "drop_last": c.DropLast,
			"hit_rate_per_epoch": sum.HitRatePerEpoch, "hit_rate": sum.HitRate, "bound": sum.Bound,
			"storage_reads_min": sum.StorageReadsMin, "storage_reads_max": sum.StorageReadsMax,
			"storage_reads_spread": sum.StorageReadsSpread, "node_local_fraction": sum.NodeLocal,
			"steps_per_epoch": sum.StepsPerEpoch, "epoch_order": sum.Order, "seconds": secs,
		}
		if c.ResumeEpoch > 0 || c.ResumePosition > 0 {
			out["resume_epoch"], out["resume_position"] = c.ResumeEpoch, c.ResumePosition
		}
		if c.OrderRanks > 0 {
			out["order_ranks"] = c.OrderRanks
		}
		if c.Policy == schedule.Solar {
			out["path_cost"], out["identity_cost"] = sum.PathCost, sum.IdentityCost
			out["swarm_population"], out["swarm_iterations"] = c.SwarmPopulation, c.SwarmIterations
		}
		if c.Bytes() {
			delete(out, "capacity")
			out["capacity_bytes"], out["total_bytes"], out["pin"] = c.CapacityBytes, sum.TotalBytes, c.Pin
			out["sample_bound"], out["fit_samples"] = sum.Bound, sum.FitSamples
			out["byte_hit_rate_per_epoch"], out["byte_hit_rate"], out["byte_bound"] = sum.ByteHitRatePerEpoch, sum.ByteHitRate, sum.ByteBound
			out["storage_bytes_min"], out["storage_bytes_max"] = sum.StorageBytesMin, sum.StorageBytesMax
			out["storage_bytes_imbalance"], out["worst_step_imbalance"] = sum.StorageBytesImbalance, sum.WorstStepImbalance
			out["imbalance_floor"] = sum.ImbalanceFloor
			if c.Policy == schedule.Locality {
				out["pinned_samples"], out["pinned_bytes"] = sum.PinnedSamples, sum.PinnedBytes
			}
		}
		return json.NewEncoder(stdout).Encode(out)
	}
	if c.Bytes() {
		return scheduleBytesTable(stdout, c, sum, secs)
	}
	fmt.Fprintf(stdout, "%s; C/N %.3f, %d steps per epoch\n\n", c, sum.Bound, sum.StepsPerEpoch)
	t := bench.NewTable("epoch", "draws", "hit rate", "reads min", "reads max", "node-local")
	for i, st := range sum.PerEpoch {
		local := "-"
		if st.Hits > 0 {
			local = fmt.Sprintf("%.3f", float64(st.LocalHits)/float64(st.Hits))
		}
		t.Row(fmt.Sprint(c.ResumeEpoch+i), fmt.Sprint(sum.Order[c.ResumeEpoch+i]), fmt.Sprintf("%.4f", st.HitRate()),
			fmt.Sprint(st.ReadsMin), fmt.Sprint(st.ReadsMax), local)
	}
	if err := t.Write(stdout); err != nil {
		return err
	}
	warm := "epochs ≥ 1"
	if c.Epochs == 1 {
		warm = "epoch 0"
	}
	fmt.Fprintf(stdout, "\nhit rate (%s): %.4f; bound C/N %.4f\n", warm, sum.HitRate, sum.Bound)
	fmt.Fprintf(stdout, "storage reads per rank per step (%s): %d..%d, at most %d apart within a step\n",
		warm, sum.StorageReadsMin, sum.StorageReadsMax, sum.StorageReadsSpread)
	fmt.Fprintf(stdout, "node-local: %.3f of memory hits read on the node that holds them\n", sum.NodeLocal)
	if c.Policy == schedule.Solar {
		fmt.Fprintf(stdout, "epoch order cost (SOLAR's misses per rank): %d, in numbered order %d\n", sum.PathCost, sum.IdentityCost)
	}
	fmt.Fprintf(stdout, "planned in %v\n", time.Duration(secs*float64(time.Second)).Round(time.Microsecond))
	return nil
}

// scheduleSizes reads the sizes of --sizes or --offsets into c (in bytes:
// units times unit), n from the file unless --n says it, and checks the
// flags that go with them.
func scheduleSizes(c *schedule.Config, set map[string]bool, sizesFile, offsetsFile string, unit int64) error {
	if sizesFile == "" && offsetsFile == "" {
		for _, f := range []string{"capacity-bytes", "unit-bytes", "pin"} {
			if set[f] {
				return base.Errorf(base.ErrArgument, "schedule: --%s goes with --sizes or --offsets", f)
			}
		}
		return nil
	}
	switch {
	case sizesFile != "" && offsetsFile != "":
		return base.Errorf(base.ErrArgument, "schedule: --sizes and --offsets: give one of them")
	case set["capacity"]:
		return base.Errorf(base.ErrArgument, "schedule: --capacity counts samples; with --sizes or --offsets the budget is --capacity-bytes")
	case !set["capacity-bytes"]:
		return base.Errorf(base.ErrArgument, "schedule: --sizes and --offsets go with --capacity-bytes, the bytes memory holds")
	case unit <= 0:
		return base.Errorf(base.ErrArgument, "schedule: unit bytes %d: want a positive number", unit)
	}
	name, flagName := sizesFile, "sizes"
	if offsetsFile != "" {
		name, flagName = offsetsFile, "offsets"
	}
	var vals []int64
	var err error
	if name == "-" {
		vals, err = source.ReadNPYInts(bufio.NewReader(scheduleStdin), "schedule: --"+flagName+" from stdin")
	} else {
		var f *os.File
		if f, err = os.Open(name); err != nil {
			return base.Errorf(base.ErrArgument, "schedule: --%s: %v", flagName, err)
		}
		defer f.Close()
		vals, err = source.ReadNPYInts(bufio.NewReader(f), "schedule: --"+flagName+" "+name)
	}
	if err != nil {
		return err
	}
	if offsetsFile != "" {
		if len(vals) == 0 || vals[0] != 0 {
			return base.Errorf(base.ErrArgument, "schedule: --offsets %s: want n+1 offsets from 0", name)
		}
		sizes := make([]int64, len(vals)-1)
		for i := range sizes {
			if sizes[i] = vals[i+1] - vals[i]; sizes[i] < 0 {
				return base.Errorf(base.ErrArgument, "schedule: --offsets %s: offset %d of row %d is below the one before, %d",
					name, vals[i+1], i, vals[i])
			}
		}
		vals = sizes
	}
	if !set["n"] {
		c.N = len(vals)
	}
	if len(vals) != c.N {
		return base.Errorf(base.ErrArgument, "schedule: --%s %s holds %d rows, --n is %d", flagName, name, len(vals), c.N)
	}
	for i, v := range vals {
		if v > 0 && v > math.MaxInt64/unit {
			return base.Errorf(base.ErrArgument, "schedule: row %d of %d units of %d bytes: above %d bytes", i, v, unit, int64(math.MaxInt64))
		}
		vals[i] = v * unit
	}
	c.Sizes, c.Capacity = vals, 0
	return nil
}

// scheduleStdin is where --sizes - reads from.
var scheduleStdin io.Reader = os.Stdin

// scheduleBytesTable prints the summary of a schedule under a byte budget.
func scheduleBytesTable(w io.Writer, c schedule.Config, sum schedule.Summary, secs float64) error {
	fmt.Fprintf(w, "%s; %d samples of %d bytes in all, M/S %.3f, %d steps per epoch\n\n", c, c.N, sum.TotalBytes,
		sum.ByteBound, sum.StepsPerEpoch)
	t := bench.NewTable("epoch", "draws", "hit rate", "byte hit rate", "storage bytes min", "max", "imbalance", "node-local")
	for i, st := range sum.PerEpoch {
		local := "-"
		if st.Hits > 0 {
			local = fmt.Sprintf("%.3f", float64(st.LocalHits)/float64(st.Hits))
		}
		t.Row(fmt.Sprint(c.ResumeEpoch+i), fmt.Sprint(sum.Order[c.ResumeEpoch+i]), fmt.Sprintf("%.4f", st.HitRate()), fmt.Sprintf("%.4f", st.ByteHitRate()),
			fmt.Sprint(st.StorageBytesMin), fmt.Sprint(st.StorageBytesMax), fmt.Sprintf("%.3f", st.Imbalance()), local)
	}
	if err := t.Write(w); err != nil {
		return err
	}
	warm := "epochs ≥ 1"
	if c.Epochs == 1 {
		warm = "epoch 0"
	}
	fmt.Fprintf(w, "\nsample hit rate (%s): %.4f; bound k(M)/N %.4f (the %d smallest samples fit in M)\n", warm, sum.HitRate, sum.Bound, sum.FitSamples)
	fmt.Fprintf(w, "byte hit rate (%s): %.4f; bound M/S %.4f\n", warm, sum.ByteHitRate, sum.ByteBound)
	if c.Policy == schedule.Locality {
		fmt.Fprintf(w, "pinned: %d samples, %d bytes of %d (pin %s)\n", sum.PinnedSamples, sum.PinnedBytes, c.CapacityBytes, c.Pin)
	}
	fmt.Fprintf(w, "storage bytes per rank per step (%s): %d..%d; imbalance (Σ max / Σ mean over steps) %.3f, "+
		"at least %.3f for any deal (a step's largest read), worst step %.3f\n",
		warm, sum.StorageBytesMin, sum.StorageBytesMax, sum.StorageBytesImbalance, sum.ImbalanceFloor, sum.WorstStepImbalance)
	fmt.Fprintf(w, "storage reads per rank per step (%s): %d..%d\n", warm, sum.StorageReadsMin, sum.StorageReadsMax)
	fmt.Fprintf(w, "node-local: %.3f of memory hits read on the node that holds them\n", sum.NodeLocal)
	if c.Policy == schedule.Solar {
		fmt.Fprintf(w, "epoch order cost (SOLAR's missed bytes per rank): %d, in numbered order %d\n", sum.PathCost, sum.IdentityCost)
	}
	fmt.Fprintf(w, "planned in %v\n", time.Duration(secs*float64(time.Second)).Round(time.Microsecond))
	return nil
}

// emitPlan writes rank's samples of the epoch-th epoch of the run (and their
// hit flags with hits) to w: .npy arrays, or one JSON object with asJSON.
// epoch was validated against the run.
func emitPlan(w io.Writer, s *schedule.Schedule, rank, epoch int, hits, positions, asJSON bool) error {
	// Locality plans the one epoch; random too without hits (its samples
	// are the permutation's positions, its hits the buffers' history, which
	// takes replaying epochs 0..epoch); solar always replays.
	var ep *schedule.Epoch
	if hits {
		ep = s.Epoch(epoch)
	} else {
		ep = s.EpochSamples(epoch)
	}
	steps := ep.Steps()
	var pos []int64
	if positions {
		pos = make([]int64, steps+1)
		for st := range pos {
			pos[st] = int64(ep.Position(st))
		}
	}
	if asJSON {
		out := map[string]any{"rank": rank, "epoch": ep.Index, "perm": ep.Perm, "steps": steps}
		if positions {
			out["positions"] = pos
		}
		samples := make([][]int32, steps)
		for st := range steps {
			samples[st] = ep.Samples(st, rank)
		}
		out["samples"] = samples
		if hits {
			h := make([][]bool, steps)
			for st := range steps {
				h[st] = ep.Hits(st, rank)
			}
			out["hits"] = h
		}
		if s.Config().Bytes() {
			b := make([]int64, steps)
			for st := range steps {
				b[st] = ep.Bytes(st, rank)
			}
			out["bytes"] = b
			if hits {
				sb := make([]int64, steps)
				for st := range steps {
					sb[st] = ep.StorageBytes(st, rank)
				}
				out["storage_bytes"] = sb
			}
		}
		return json.NewEncoder(w).Encode(out)
	}
	total := 0
	for st := range steps {
		total += len(ep.Samples(st, rank))
	}
	samples := make([]byte, 0, 8*total)
	sizes := make([]byte, 0, 8*steps)
	var flags []byte
	if hits {
		flags = make([]byte, 0, total)
	}
	for st := range steps {
		xs := ep.Samples(st, rank)
		for _, x := range xs {
			samples = binary.LittleEndian.AppendUint64(samples, uint64(int64(x)))
		}
		sizes = binary.LittleEndian.AppendUint64(sizes, uint64(len(xs)))
		if hits {
			for _, h := range ep.Hits(st, rank) {
				b := byte(0)
				if h {
					b = 1
				}
				flags = append(flags, b)
			}
		}
	}
	bw := bufio.NewWriterSize(w, 1<<20)
	npyWrite1D(bw, "<i8", total, samples)
	npyWrite1D(bw, "<i8", steps, sizes)
	if hits {
		npyWrite1D(bw, "|b1", total, flags)
	}
	if s.Config().Bytes() {
		b := make([]byte, 0, 8*steps)
		for st := range steps {
			b = binary.LittleEndian.AppendUint64(b, uint64(ep.Bytes(st, rank)))
		}
		npyWrite1D(bw, "<i8", steps, b)
		if hits {
			b = b[:0]
			for st := range steps {
				b = binary.LittleEndian.AppendUint64(b, uint64(ep.StorageBytes(st, rank)))
			}
			npyWrite1D(bw, "<i8", steps, b)
		}
	}
	if positions {
		b := make([]byte, 0, 8*len(pos))
		for _, p := range pos {
			b = binary.LittleEndian.AppendUint64(b, uint64(p))
		}
		npyWrite1D(bw, "<i8", len(pos), b)
	}
	return bw.Flush()
}

// npyWrite1D writes a 1-d array of n items as an .npy file of format 1.0, its
// header padded to a multiple of 64 bytes as numpy pads it.
func npyWrite1D(w *bufio.Writer, descr string, n int, data []byte) {
	dict := fmt.Sprintf("{'descr': '%s', 'fortran_order': False, 'shape': (%d,), }", descr, n)
	pad := 63 - (10+len(dict))%64 // spaces, then the newline, to the next multiple of 64
	dict += strings.Repeat(" ", pad) + "\n"
	w.WriteString("\x93NUMPY\x01\x00")
	var hl [2]byte
	binary.LittleEndian.PutUint16(hl[:], uint16(len(dict)))
	w.Write(hl[:])
	w.WriteString(dict)
	w.Write(data)
}

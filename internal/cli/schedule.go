package cli

import (
	"bufio"
	"encoding/binary"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/ddstore-go/ddstore/internal/base"

	"github.com/ddstore-go/ddstore/internal/bench"
	"github.com/ddstore-go/ddstore/internal/schedule"
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
"steps", "samples": [[...], ...] one list per step, "hits": likewise}.`

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
	if err := parse(fs, args); err != nil {
		return err
	}
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	emit := set["emit-rank"]
	if !emit && (set["epoch"] || set["emit-hits"]) {
		return base.Errorf(base.ErrArgument, "schedule: --epoch and --emit-hits go with --emit-rank")
	}
	c.Policy = schedule.Policy(*policy)
	if emit {
		// Validate before planning: solar's swarm is the expensive part.
		if err := c.Validate(); err != nil {
			return err
		}
		switch {
		case *emitRank < 0 || *emitRank >= c.Ranks:
			return base.Errorf(base.ErrArgument, "schedule: emit-rank %d not in [0, %d): ranks %d", *emitRank, c.Ranks, c.Ranks)
		case *epoch < 0 || *epoch >= c.Epochs:
			return base.Errorf(base.ErrArgument, "schedule: epoch %d not in [0, %d): epochs %d", *epoch, c.Epochs, c.Epochs)
		}
	}
	t0 := time.Now()
	s, err := schedule.New(c)
	if err != nil {
		return err
	}
	if emit {
		return emitPlan(stdout, s, *emitRank, *epoch, *emitHits, *asJSON)
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
		if c.Policy == schedule.Solar {
			out["path_cost"], out["identity_cost"] = sum.PathCost, sum.IdentityCost
			out["swarm_population"], out["swarm_iterations"] = c.SwarmPopulation, c.SwarmIterations
		}
		return json.NewEncoder(stdout).Encode(out)
	}
	fmt.Fprintf(stdout, "%s; C/N %.3f, %d steps per epoch\n\n", c, sum.Bound, sum.StepsPerEpoch)
	t := bench.NewTable("epoch", "draws", "hit rate", "reads min", "reads max", "node-local")
	for i, st := range sum.PerEpoch {
		local := "-"
		if st.Hits > 0 {
			local = fmt.Sprintf("%.3f", float64(st.LocalHits)/float64(st.Hits))
		}
		t.Row(fmt.Sprint(i), fmt.Sprint(sum.Order[i]), fmt.Sprintf("%.4f", st.HitRate()),
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

// emitPlan writes rank's samples of the epoch-th epoch of the run (and their
// hit flags with hits) to w: .npy arrays, or one JSON object with asJSON.
// epoch was validated against the run.
func emitPlan(w io.Writer, s *schedule.Schedule, rank, epoch int, hits, asJSON bool) error {
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
	if asJSON {
		out := map[string]any{"rank": rank, "epoch": ep.Index, "perm": ep.Perm, "steps": steps}
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

package cli

import (
	"encoding/json"
	"fmt"
	"io"
	"time"

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
nodes, B samples per rank per step; its C/N is the bound for random orders).`

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
	if err := parse(fs, args); err != nil {
		return err
	}
	c.Policy = schedule.Policy(*policy)
	t0 := time.Now()
	s, err := schedule.New(c)
	if err != nil {
		return err
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

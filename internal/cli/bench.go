package cli

import (
	"encoding/json"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/ddstore-go/ddstore/internal/base"
	"github.com/ddstore-go/ddstore/internal/bench"
)

const benchSynopsis = `
Measure ddstore on two nodes of this machine (two agents on loopback): GetBatch
of node-local and remote rows, single-row Get latency, and, in the same run,
the limits they compare with: a single-thread gather of random rows from one
buffer, and raw loopback TCP. Agents are started as processes unless
--in-process. With --transports tcp,mpi the cross-node figures are measured
over each transport (mpi: a build with -tags mpi, agents run by mpirun),
next to DDStore's figures for the same cases. "ddstore bench scale" measures
what grows with the number of nodes (ddstore bench scale --help).`

func runBench(args []string, stdout, stderr io.Writer) error {
	// `ddstore bench --transports ...,mpi` runs this binary under mpirun
	// as the ranks of its MPI probe.
	if ok, err := bench.MPIProbeRank(); ok {
		return err
	}
	// ... and as the ranks of its Store with Method "mpi".
	if ok, err := bench.MPITrainerRank(); ok {
		return err
	}
	// ... and as the answering end of its raw round trips.
	if ok, err := bench.PingRole(); ok {
		return err
	}
	// ... and as the ranks of one node of `ddstore bench scale`.
	if ok, err := bench.ScaleNodeRole(); ok {
		return err
	}
	if len(args) > 0 && args[0] == "scale" {
		return runBenchScale(args[1:], stdout, stderr)
	}
	fs := newFlags("bench", benchSynopsis, stderr)
	quick := fs.Bool("quick", false, "small shards and short figures (under 30 s)")
	asJSON := fs.Bool("json", false, "print one JSON object instead of the table")
	sizes := fs.String("sizes", "", "row sizes, e.g. 64,4K,64K,1M (default all four)")
	batch := fs.Int("batch", 0, "rows per GetBatch (default 256)")
	shard := fs.String("shard", "", "bytes per rank, e.g. 256M (default 64M quick, 256M full)")
	dur := fs.Duration("duration", 0, "time per throughput figure")
	inProc := fs.Bool("in-process", false, "run the agents inside this process")
	transports := fs.String("transports", "tcp", "transports to measure cross-node reads over, each in a job of its own: tcp, mpi, fabric or a list such as tcp,mpi,fabric (mpi: the agents are the ranks of an mpirun launch of this binary, built with -tags mpi; DDSTORE_MPIRUN names another launcher, e.g. mpiexec.mpich for a build with -tags 'mpi mpich'; fabric: a build with -tags fabric, provider from DDSTORE_FABRIC)")
	if err := parse(fs, args); err != nil {
		return err
	}
	opts := bench.FullOptions()
	if *quick {
		opts = bench.QuickOptions()
	}
	if *sizes != "" {
		opts.RowSizes = nil
		for _, s := range strings.Split(*sizes, ",") {
			n, err := parseBytes(s)
			if err != nil {
				return err
			}
			opts.RowSizes = append(opts.RowSizes, int(n))
		}
	}
	if *batch > 0 {
		opts.Batch = *batch
	}
	if *shard != "" {
		n, err := parseBytes(*shard)
		if err != nil {
			return err
		}
		opts.ShardBytes = n
	}
	if *dur > 0 {
		opts.Duration = *dur
	}
	opts.InProcess = *inProc
	opts.Transports = strings.Split(*transports, ",")
	if !*asJSON {
		opts.Progress = stderr
	}
	t0 := time.Now()
	rep, err := bench.Run(opts)
	if err != nil {
		return err
	}
	return writeReport(stdout, rep, *asJSON, t0)
}

// writeReport prints a benchmark's report: one JSON object, or its table
// and the command with the time it took since t0.
func writeReport(stdout io.Writer, rep interface{ WriteTable(io.Writer) error }, asJSON bool, t0 time.Time) error {
	if asJSON {
		return json.NewEncoder(stdout).Encode(rep)
	}
	if err := rep.WriteTable(stdout); err != nil {
		return err
	}
	fmt.Fprintf(stdout, "(%s in %.1f s)\n", strings.Join(os.Args, " "), time.Since(t0).Seconds())
	return nil
}

// parseBytes reads 64, 4K, 64KiB, 1M, 2G.
func parseBytes(s string) (int64, error) {
	t := strings.TrimSuffix(strings.TrimSuffix(strings.ToUpper(strings.TrimSpace(s)), "IB"), "B")
	mul := int64(1)
	if t != "" {
		switch t[len(t)-1] {
		case 'K':
			mul, t = 1<<10, t[:len(t)-1]
		case 'M':
			mul, t = 1<<20, t[:len(t)-1]
		case 'G':
			mul, t = 1<<30, t[:len(t)-1]
		}
	}
	n, err := strconv.ParseInt(t, 10, 64)
	if err != nil || n <= 0 || n > (1<<62)/mul {
		return 0, base.Errorf(base.ErrArgument, "size %q: want a positive number of bytes, e.g. 4096, 4K, 1M", s)
	}
	return n * mul, nil
}

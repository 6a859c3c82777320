//go:build mpi && cgo

package bench_test

import (
	"bytes"
	"context"
	"encoding/json"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/ddstore-go/ddstore/internal/bench"
	"github.com/ddstore-go/ddstore/internal/mpirun"
)

// TestScaleMPI: `ddstore bench scale --method mpi` on 3 ranks of mpirun,
// each a node of its own: rank 0 reads batches of rows of both other
// nodes, each row checked, every one read by MPI gets from its process.
func TestScaleMPI(t *testing.T) {
	if testing.Short() {
		t.Skip("starts 3 ranks of mpirun and 3 agents")
	}
	launcher, err := mpirun.Find()
	if err != nil {
		t.Skip(err)
	}
	// The ranks are a real ddstore binary built with MPI (the MPI this
	// test links: MPICH's for its launcher), their agents the same.
	bin := filepath.Join(t.TempDir(), "ddstore")
	tags := "mpi"
	if !launcher.OpenMPI {
		tags += " mpich"
	}
	if out, err := exec.Command("go", "build", "-tags", tags, "-o", bin, "../../cmd/ddstore").CombinedOutput(); err != nil {
		t.Fatalf("building ddstore with -tags %q: %v\n%s", tags, err, out)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, "bench", "scale", "--method", "mpi", "--nodes", "3", "--rows-per-node", "40",
		"--row", "64", "--batch", "16", "--rounds", "2", "--duration", "50ms", "--json")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("%s: %v\n%s%s", cmd, err, out, stderr.Bytes())
	}
	var rep bench.ScaleMPIReport
	if err := json.Unmarshal(out, &rep); err != nil {
		t.Fatalf("%v in %q", err, out)
	}
	if rep.Method != "mpi" || len(rep.Points) != 1 {
		t.Fatalf("report of method %q with %d points, want mpi and 1: %s", rep.Method, len(rep.Points), out)
	}
	p := rep.Points[0]
	if p.TeardownErr != "" {
		t.Errorf("the launch failed after the reads: %s", p.TeardownErr)
	}
	if p.Nodes != 3 || p.Batches < 2 || len(p.ReadRounds) != 2 || p.ReadRowsPerSec <= 0 {
		t.Errorf("K=%d, %d batches, %d rounds, %.0f rows/s: want K=3, at least a batch a round, 2 rounds, rows read", p.Nodes, p.Batches, len(p.ReadRounds), p.ReadRowsPerSec)
	}
	// Rows of both other nodes in a batch (16 random rows of 2 nodes),
	// and every remote row read one-sided; the batches, untimed first
	// one included, are all remote rows.
	if p.OwnersPerBatch <= 1 || p.OwnersPerBatch > 2 {
		t.Errorf("%.2f owners per batch, want more than 1, at most the 2 other nodes", p.OwnersPerBatch)
	}
	if want := int64(p.Batches+1) * 16; p.RemoteRows != want || p.OneSidedRows != p.RemoteRows {
		t.Errorf("%d remote rows, %d one-sided: want %d, all one-sided", p.RemoteRows, p.OneSidedRows, want)
	}
	if p.OwnerProcs != 2 || p.AgentProcs != 3 {
		t.Errorf("CPU of %d owner ranks and %d agents measured, want 2 and 3", p.OwnerProcs, p.AgentProcs)
	}
	if p.ReadCPUus <= 0 {
		t.Errorf("CPU per batch %.1f µs: want the reader's CPU time", p.ReadCPUus)
	}
}

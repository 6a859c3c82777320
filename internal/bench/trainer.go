package bench

import (
	"encoding/binary"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"time"

	"github.com/ddstore-go/ddstore"
	"github.com/ddstore-go/ddstore/internal/mpirun"
)

// trainerEnv carries the options of the trainer-side MPI measurement to
// its ranks; set, `ddstore bench` is one of them (MPITrainerRank).
const trainerEnv = "DDSTORE_BENCH_MPI_TRAINER"

// trainerJob is what the ranks of the trainer-side measurement share.
// With Scale set it is one job size of the scale driver's method mpi
// (scale_mpi.go): Ranks ranks, one a node.
type trainerJob struct {
	Options
	Namespace, RunDir, Rendezvous string
	Ranks                         int
	Scale                         *scaleMPIJob `json:",omitempty"`
}

// runMPITrainer measures cross-node reads of a Store with Method "mpi":
// mpirun -np 2 of this binary, each rank a node of its own with an agent
// it starts, rank 0 reading rows of rank 1's shard with MPI gets from its
// own process (DDStore's method 0 with ddstore's API), rank 1 idle.
func runMPITrainer(opts Options) ([]MPIProbeResult, error) {
	dir, err := os.MkdirTemp("", "ddstore-bench-trainer-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(dir)
	rdv, err := rendezvousAddr()
	if err != nil {
		return nil, err
	}
	j := trainerJob{Options: Options{RowSizes: opts.RowSizes, Batch: opts.Batch, ShardBytes: opts.ShardBytes, Duration: opts.Duration, Latency: opts.Latency},
		Namespace: fmt.Sprintf("bench-%d-trainer", os.Getpid()), RunDir: filepath.Join(dir, "run"), Rendezvous: rdv, Ranks: 2}
	return runRanks[MPIProbeResult]("MPI trainer reads", trainerEnv, 2, j)
}

// MPITrainerRank runs one rank of runMPITrainer when this process is one
// (the environment says so) and reports true; rank 0 prints its figures as
// JSON lines on stdout.
func MPITrainerRank() (bool, error) {
	arg := os.Getenv(trainerEnv)
	if arg == "" {
		return false, nil
	}
	var j trainerJob
	if err := json.Unmarshal([]byte(arg), &j); err != nil {
		return true, err
	}
	rank, size, ok := mpirun.Rank()
	if !ok || size != j.Ranks {
		return true, fmt.Errorf("bench: MPI trainer reads: rank %d of %d, want one of %d ranks of mpirun", rank, size, j.Ranks)
	}
	exe, err := os.Executable()
	if err != nil {
		return true, err
	}
	if err := os.MkdirAll(j.RunDir, 0o700); err != nil {
		return true, err
	}
	node := fmt.Sprintf("bench-%d", rank)
	agentArgs := []string{"--rendezvous", j.Rendezvous, "--peer-listen", "127.0.0.1:0", "--idle-exit", "5s"}
	if j.Scale != nil {
		// Every agent serves before any rank enters MPI_Init, whose
		// waiting would take the cores that many agents starting at
		// once on one machine need.
		if err := scaleMPIAgents(exe, j, node, rank, agentArgs); err != nil {
			return true, err
		}
	}
	t0 := time.Now()
	s, err := ddstore.Open(ddstore.Config{Method: ddstore.MethodMPI, Rank: rank, Size: size, LocalRank: 0, LocalSize: 1,
		Node: node, Namespace: j.Namespace, RunDir: j.RunDir, AgentBinary: exe, AgentArgs: agentArgs})
	if err != nil {
		return true, err
	}
	defer s.Close()
	enc := json.NewEncoder(os.Stdout)
	if j.Scale != nil {
		return true, scaleMPIRank(s, j, rank, time.Since(t0), func(p ScaleMPIPoint) error { return enc.Encode(p) })
	}
	for _, rb := range j.RowSizes {
		r, err := trainerRows(s, j, rank, rb)
		if err != nil {
			return true, err
		}
		if rank == 0 {
			enc.Encode(r)
		}
	}
	return true, nil
}

// trainerRows measures one row size: rank 0 reads rank 1's rows, and
// rank 1 waits in trainerIdle.
func trainerRows(s *ddstore.Store, j trainerJob, rank, rb int) (MPIProbeResult, error) {
	res := MPIProbeResult{RowBytes: rb}
	n := j.ShardBytes / int64(rb)
	name := fmt.Sprintf("trainer-%d", rb)
	if err := trainerShard(s, name, rank, n, rb); err != nil {
		return res, err
	}
	done := filepath.Join(j.RunDir, name+".done")
	if rank != 0 {
		return res, trainerIdle(s, name, done)
	}
	rng := rand.New(rand.NewPCG(3, uint64(rb)))
	batches := make([][]int64, 64)
	for b := range batches {
		batches[b] = make([]int64, j.Batch)
		for i := range batches[b] {
			batches[b][i] = n + rng.Int64N(n)
		}
	}
	dst := make([]byte, j.Batch*rb)
	k := 0
	rate, err := Throughput(j.Duration, j.Batch*rb, rb, func() error {
		k = (k + 1) % len(batches)
		return s.GetBatch(name, dst, batches[k])
	})
	if err != nil {
		return res, err
	}
	for i, g := range batches[k] {
		if rb >= 8 && int64(binary.LittleEndian.Uint64(dst[i*rb:])) != g {
			return res, fmt.Errorf("row %d read as %d", g, binary.LittleEndian.Uint64(dst[i*rb:]))
		}
	}
	res.GBps = rate.GBps
	ds := make([]time.Duration, max(j.Latency/10, 100))
	one := dst[:rb]
	for i := range ds {
		g := n + rng.Int64N(n)
		t0 := time.Now()
		if err := s.Get(name, one, g); err != nil {
			return res, err
		}
		ds[i] = time.Since(t0)
	}
	res.GetP50us = Percentile(DurationsToMicros(ds), 50)
	if p, err := s.Profile(name); err == nil && p.OneSided != p.RemoteRows {
		return res, fmt.Errorf("%d of %d remote rows read by MPI gets: want all", p.OneSided, p.RemoteRows)
	}
	if err := os.WriteFile(done, nil, 0o600); err != nil {
		return res, err
	}
	return res, s.Free(name)
}

// trainerShard Adds rank's shard of name: n rows of rb bytes, each row's
// first word its global row (rank × n + i) where a row holds one.
func trainerShard(s *ddstore.Store, name string, rank int, n int64, rb int) error {
	rows := make([]byte, n*int64(rb))
	for i := range n {
		if rb >= 8 {
			binary.LittleEndian.PutUint64(rows[i*int64(rb):], uint64(int64(rank)*n+i))
		}
	}
	return s.Add(name, rows, int64(rb), 1)
}

// trainerIdlePoll is how often a rank that only owns rows looks for the
// reader's done file: seldom, so that a job of many such ranks on one
// machine takes next to no CPU from the reader.
const trainerIdlePoll = 200 * time.Millisecond

// trainerIdle is a rank other than the reader: it waits outside MPI,
// taking no CPU, as the owner of rows read one-sided should, until the
// reader writes done, then Frees name with it (collectively); a done file
// that holds the reader's error instead ends it with that error, no Free.
func trainerIdle(s *ddstore.Store, name, done string) error {
	for {
		if b, err := os.ReadFile(done); err == nil {
			if len(b) > 0 {
				return fmt.Errorf("bench: the reading rank failed: %s", b)
			}
			return s.Free(name)
		}
		time.Sleep(trainerIdlePoll)
	}
}

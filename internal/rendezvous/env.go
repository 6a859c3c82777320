// Package rendezvous lets the trainer ranks of a job and the per-node ddstore
// agents find each other without a coordinator service of their own: each
// process learns where it stands from what its launcher already put in the
// environment (env.go), and processes exchange small records through a
// directory that every node can see (handshake.go).
package rendezvous

import (
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"

	"github.com/ddstore-go/ddstore/internal/base"
)

// Identity is where one rank stands in the job.
type Identity struct {
	Rank, Size int // global rank and world size
	// LocalRank is the rank among the ranks of its node, or -1 when the
	// launcher does not say: guessing 0 would make every rank of a crowded
	// node believe it is the one that owns node-wide duties.
	// LocalSize is how many ranks the node has, or 0 when unknown.
	LocalRank, LocalSize int
	// Node names the node. Ranks compare it to find their node's agent,
	// so it must come out the same for every process on one node.
	Node string
	// Launcher is "explicit", "torchrun", "slurm", "openmpi", "mpich" or
	// "single"; it is kept so that a wrong guess shows up in logs.
	Launcher string
}

// ErrNoIdentity is returned when the process cannot be placed at all; today
// that means no node identity could be found, since a process without any
// launcher variables is taken to be a single-process job rather than an error.
var ErrNoIdentity = base.Alias("ddstore: cannot tell rank and size from the environment", base.ErrArgument)

// ErrBadEnv is returned when launcher variables are present but malformed,
// inconsistent or incomplete. Falling back to a single process instead would
// let a misconfigured job start N independent rank-0s that never meet.
var ErrBadEnv = base.Alias("ddstore: bad environment", base.ErrArgument)

// hostname is a variable so that tests can pin the last-resort node name.
var hostname = os.Hostname

// family names the variables one launcher sets.
type family struct {
	launcher                         string
	rank, size, localRank, localSize string
}

// families are in precedence order. The explicit DDSTORE_* family wins so a
// user can always override a launcher that guesses wrong. Open MPI and PMI
// come before Slurm because mpirun/mpiexec inside a Slurm allocation leaves
// the allocation's SLURM_* variables in place, and only the MPI ones describe
// the processes that launch actually started.
var families = []family{
	{"explicit", "DDSTORE_RANK", "DDSTORE_SIZE", "DDSTORE_LOCAL_RANK", "DDSTORE_LOCAL_SIZE"},
	{"torchrun", "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE"},
	{"openmpi", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_SIZE"},
	{"mpich", "PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID", "MPI_LOCALNRANKS"},
}

// FromEnv works out the calling process's Identity from its launcher's
// environment variables, read through getenv (os.Getenv when nil) so that
// callers and tests can supply their own environment.
func FromEnv(getenv func(string) string) (Identity, error) {
	if getenv == nil {
		getenv = os.Getenv
	}
	id, err := rankFromEnv(getenv)
	if err != nil {
		return Identity{}, err
	}
	if id.Node, err = nodeFromEnv(getenv); err != nil {
		return Identity{}, err
	}
	return id, nil
}

func rankFromEnv(getenv func(string) string) (Identity, error) {
	for i, f := range families {
		present := getenv(f.rank) != "" || getenv(f.size) != ""
		// Only the explicit local variables count: LOCAL_RANK and friends
		// are exported on their own by assorted tools and would otherwise
		// turn an unrelated single-process run into an error.
		if i == 0 {
			present = present || getenv(f.localRank) != "" || getenv(f.localSize) != ""
		}
		if present {
			return f.read(getenv)
		}
	}
	// SLURM_NTASKS alone is an allocation variable: an salloc shell or a
	// batch script sees it without being one of the tasks, so only the
	// per-task SLURM_PROCID says a Slurm launch placed this process.
	if getenv("SLURM_PROCID") != "" {
		return slurmFromEnv(getenv)
	}
	return Identity{Rank: 0, Size: 1, LocalRank: 0, LocalSize: 1, Launcher: "single"}, nil
}

func (f family) read(getenv func(string) string) (Identity, error) {
	id := Identity{Launcher: f.launcher}
	var err error
	if id.Size, id.Rank, err = rankAndSize(getenv, f.rank, f.size); err != nil {
		return Identity{}, err
	}
	localSize := 0
	if s := getenv(f.localSize); s != "" {
		n, err := strconv.Atoi(s)
		if err != nil || n < 1 || n > id.Size {
			return Identity{}, badValue(f.localSize, s, fmt.Sprintf("an integer in [1, %s=%d]", f.size, id.Size))
		}
		localSize = n
	}
	return withLocal(id, getenv, f.localRank, f.size, f.localSize, localSize)
}

// rankAndSize reads and checks a rank/size pair; the size is read first so
// the rank's error can say what range it should have been in.
func rankAndSize(getenv func(string) string, rankVar, sizeVar string) (size, rank int, err error) {
	rs, ss := getenv(rankVar), getenv(sizeVar)
	if ss == "" {
		return 0, 0, missing(sizeVar, rankVar)
	}
	if rs == "" {
		return 0, 0, missing(rankVar, sizeVar)
	}
	size, err = strconv.Atoi(ss)
	if err != nil || size < 1 {
		return 0, 0, badValue(sizeVar, ss, "an integer >= 1")
	}
	rank, err = strconv.Atoi(rs)
	if err != nil || rank < 0 || rank >= size {
		return 0, 0, badValue(rankVar, rs, fmt.Sprintf("an integer in [0, %s=%d)", sizeVar, size))
	}
	return size, rank, nil
}

// withLocal fills in the local rank given an already checked local size
// (0 when unknown); localSizeVar names where that size came from.
func withLocal(id Identity, getenv func(string) string, localRankVar, sizeVar, localSizeVar string, localSize int) (Identity, error) {
	id.LocalSize = localSize
	s := getenv(localRankVar)
	switch {
	case s == "" && localSize > 0:
		return Identity{}, missing(localRankVar, localSizeVar)
	case s == "" && id.Size == 1:
		id.LocalRank, id.LocalSize = 0, 1
	case s == "":
		id.LocalRank = -1
	default:
		bound, boundVar := id.Size, sizeVar
		if localSize > 0 {
			bound, boundVar = localSize, localSizeVar
		}
		n, err := strconv.Atoi(s)
		if err != nil || n < 0 || n >= bound {
			return Identity{}, badValue(localRankVar, s, fmt.Sprintf("an integer in [0, %s=%d)", boundVar, bound))
		}
		id.LocalRank = n
		if id.Size == 1 {
			id.LocalSize = 1
		}
	}
	return id, nil
}

func slurmFromEnv(getenv func(string) string) (Identity, error) {
	id := Identity{Launcher: "slurm"}
	// srun puts the step's own task count in SLURM_STEP_NUM_TASKS; with
	// --preserve-env SLURM_NTASKS keeps the allocation's, which can differ.
	sizeVar := "SLURM_NTASKS"
	if getenv("SLURM_STEP_NUM_TASKS") != "" {
		sizeVar = "SLURM_STEP_NUM_TASKS"
	}
	var err error
	if id.Size, id.Rank, err = rankAndSize(getenv, "SLURM_PROCID", sizeVar); err != nil {
		return Identity{}, err
	}
	localSize, localSizeVar, err := slurmLocalSize(getenv)
	if err != nil {
		return Identity{}, err
	}
	// A node cannot hold more tasks than the step has; a larger figure
	// comes from an allocation-wide request (SLURM_NTASKS_PER_NODE with a
	// smaller -n), which says nothing exact about this launch.
	if localSize > id.Size {
		localSize = 0
	}
	return withLocal(id, getenv, "SLURM_LOCALID", sizeVar, localSizeVar, localSize)
}

// slurmLocalSize returns how many tasks this node runs (0 if it cannot be
// told) and the variable that said so. The per-node lists are exact when
// SLURM_NODEID can index them; SLURM_NTASKS_PER_NODE is only the requested
// maximum and can overstate a node's share, so it comes after them.
func slurmLocalSize(getenv func(string) string) (int, string, error) {
	listVar := "SLURM_STEP_TASKS_PER_NODE"
	if getenv(listVar) == "" {
		listVar = "SLURM_TASKS_PER_NODE"
	}
	list := getenv(listVar)
	var counts []slurmCount
	if list != "" {
		var err error
		if counts, err = parseTasksPerNode(list); err != nil {
			return 0, "", badValue(listVar, list, `a list like "4(x2),3"`)
		}
	}
	if s := getenv("SLURM_NODEID"); s != "" && counts != nil {
		node, err := strconv.Atoi(s)
		if err != nil || node < 0 {
			return 0, "", badValue("SLURM_NODEID", s, "an integer >= 0")
		}
		for _, c := range counts {
			if node < c.nodes {
				return c.tasks, listVar, nil
			}
			node -= c.nodes
		}
		return 0, "", fmt.Errorf("%w: %s=%q has no entry for SLURM_NODEID=%s", ErrBadEnv, listVar, list, s)
	}
	if s := getenv("SLURM_NTASKS_PER_NODE"); s != "" {
		n, err := strconv.Atoi(s)
		if err != nil || n < 1 {
			return 0, "", badValue("SLURM_NTASKS_PER_NODE", s, "an integer >= 1")
		}
		return n, "SLURM_NTASKS_PER_NODE", nil
	}
	// Without a node index only a uniform list says what this node has.
	if len(counts) == 1 {
		return counts[0].tasks, listVar, nil
	}
	return 0, "", nil
}

type slurmCount struct{ tasks, nodes int }

// parseTasksPerNode parses Slurm's compressed per-node counts, e.g.
// "4(x2),3" for four tasks on each of two nodes, then three on a third.
func parseTasksPerNode(s string) ([]slurmCount, error) {
	var out []slurmCount
	for _, item := range strings.Split(s, ",") {
		c := slurmCount{nodes: 1}
		num, rep, hasRep := strings.Cut(item, "(x")
		var err error
		if c.tasks, err = strconv.Atoi(num); err != nil || c.tasks < 0 {
			return nil, fmt.Errorf("bad count %q", item)
		}
		if hasRep {
			r, ok := strings.CutSuffix(rep, ")")
			if !ok {
				return nil, fmt.Errorf("bad count %q", item)
			}
			if c.nodes, err = strconv.Atoi(r); err != nil || c.nodes < 1 {
				return nil, fmt.Errorf("bad count %q", item)
			}
		}
		out = append(out, c)
	}
	return out, nil
}

// nodeFromEnv names the node. SLURM_NODEID and OMPI_COMM_WORLD_NODE_RANK are
// deliberately not used: they are indices relative to one launch (one srun
// step, one mpirun), so an agent and a trainer started by different launches
// on the same machine could get different numbers.
func nodeFromEnv(getenv func(string) string) (string, error) {
	if v := getenv("DDSTORE_NODE_ID"); v != "" {
		return v, nil
	}
	if v := getenv("SLURMD_NODENAME"); v != "" {
		return v, nil
	}
	h, err := hostname()
	if err == nil && h == "" {
		err = errors.New("empty hostname")
	}
	if err != nil {
		return "", fmt.Errorf("%w: no node id: DDSTORE_NODE_ID and SLURMD_NODENAME are unset and the hostname is unknown: %v", ErrNoIdentity, err)
	}
	return h, nil
}

func missing(unset, set string) error {
	return fmt.Errorf("%w: %s is set but %s is not", ErrBadEnv, set, unset)
}

func badValue(name, value, want string) error {
	return fmt.Errorf("%w: %s=%q: want %s", ErrBadEnv, name, value, want)
}

// String is meant for log lines, where an unknown local position shows as "?".
func (id Identity) String() string {
	lr, ls := strconv.Itoa(id.LocalRank), strconv.Itoa(id.LocalSize)
	if id.LocalRank < 0 {
		lr = "?"
	}
	if id.LocalSize <= 0 {
		ls = "?"
	}
	return fmt.Sprintf("rank %d/%d (local %s/%s) on node %q via %s", id.Rank, id.Size, lr, ls, id.Node, id.Launcher)
}

package rendezvous

import (
	"errors"
	"strings"
	"testing"
)

// stubHostname pins the last-resort node name for one test.
func stubHostname(t *testing.T, name string, err error) {
	t.Helper()
	old := hostname
	hostname = func() (string, error) { return name, err }
	t.Cleanup(func() { hostname = old })
}

func envFunc(m map[string]string) func(string) string {
	return func(k string) string { return m[k] }
}

func TestFromEnv(t *testing.T) {
	stubHostname(t, "host-a", nil)
	tests := []struct {
		name string
		env  map[string]string
		want Identity
	}{
		{"single", nil,
			Identity{0, 1, 0, 1, "host-a", "single"}},
		{"single ignores stray LOCAL_RANK", map[string]string{"LOCAL_RANK": "3"},
			Identity{0, 1, 0, 1, "host-a", "single"}},
		{"single ignores allocation-only Slurm variables", map[string]string{"SLURM_NTASKS": "8", "SLURM_TASKS_PER_NODE": "4(x2)", "SLURM_JOB_ID": "7"},
			Identity{0, 1, 0, 1, "host-a", "single"}},
		{"explicit", map[string]string{"DDSTORE_RANK": "5", "DDSTORE_SIZE": "8", "DDSTORE_LOCAL_RANK": "1", "DDSTORE_LOCAL_SIZE": "4"},
			Identity{5, 8, 1, 4, "host-a", "explicit"}},
		{"explicit without local", map[string]string{"DDSTORE_RANK": "5", "DDSTORE_SIZE": "8"},
			Identity{5, 8, -1, 0, "host-a", "explicit"}},
		{"explicit size 1 without local", map[string]string{"DDSTORE_RANK": "0", "DDSTORE_SIZE": "1"},
			Identity{0, 1, 0, 1, "host-a", "explicit"}},
		{"explicit local rank without local size", map[string]string{"DDSTORE_RANK": "5", "DDSTORE_SIZE": "8", "DDSTORE_LOCAL_RANK": "3"},
			Identity{5, 8, 3, 0, "host-a", "explicit"}},
		{"torchrun", map[string]string{"RANK": "3", "WORLD_SIZE": "16", "LOCAL_RANK": "3", "LOCAL_WORLD_SIZE": "8"},
			Identity{3, 16, 3, 8, "host-a", "torchrun"}},
		{"torchrun without local (one process per pod)", map[string]string{"RANK": "3", "WORLD_SIZE": "4"},
			Identity{3, 4, -1, 0, "host-a", "torchrun"}},
		{"openmpi", map[string]string{"OMPI_COMM_WORLD_RANK": "6", "OMPI_COMM_WORLD_SIZE": "8", "OMPI_COMM_WORLD_LOCAL_RANK": "2", "OMPI_COMM_WORLD_LOCAL_SIZE": "4", "OMPI_COMM_WORLD_NODE_RANK": "2"},
			Identity{6, 8, 2, 4, "host-a", "openmpi"}},
		{"mpich", map[string]string{"PMI_RANK": "1", "PMI_SIZE": "2", "MPI_LOCALRANKID": "1", "MPI_LOCALNRANKS": "2"},
			Identity{1, 2, 1, 2, "host-a", "mpich"}},
		{"mpich without local", map[string]string{"PMI_RANK": "1", "PMI_SIZE": "2"},
			Identity{1, 2, -1, 0, "host-a", "mpich"}},
		{"slurm ntasks per node", map[string]string{"SLURM_PROCID": "5", "SLURM_NTASKS": "8", "SLURM_LOCALID": "1", "SLURM_NTASKS_PER_NODE": "4", "SLURMD_NODENAME": "gpu07"},
			Identity{5, 8, 1, 4, "gpu07", "slurm"}},
		{"slurm uniform list without node id", map[string]string{"SLURM_PROCID": "5", "SLURM_NTASKS": "8", "SLURM_LOCALID": "1", "SLURM_TASKS_PER_NODE": "4(x2)"},
			Identity{5, 8, 1, 4, "host-a", "slurm"}},
		{"slurm plain list", map[string]string{"SLURM_PROCID": "2", "SLURM_NTASKS": "3", "SLURM_LOCALID": "2", "SLURM_TASKS_PER_NODE": "3"},
			Identity{2, 3, 2, 3, "host-a", "slurm"}},
		{"slurm uneven list indexed by node id", map[string]string{"SLURM_PROCID": "6", "SLURM_NTASKS": "7", "SLURM_LOCALID": "0", "SLURM_NODEID": "3", "SLURM_TASKS_PER_NODE": "2(x3),1"},
			Identity{6, 7, 0, 1, "host-a", "slurm"}},
		{"slurm uneven list first group", map[string]string{"SLURM_PROCID": "3", "SLURM_NTASKS": "7", "SLURM_LOCALID": "1", "SLURM_NODEID": "1", "SLURM_TASKS_PER_NODE": "2(x3),1"},
			Identity{3, 7, 1, 2, "host-a", "slurm"}},
		{"slurm uneven list without node id is unknown", map[string]string{"SLURM_PROCID": "6", "SLURM_NTASKS": "7", "SLURM_LOCALID": "0", "SLURM_TASKS_PER_NODE": "2(x3),1"},
			Identity{6, 7, 0, 0, "host-a", "slurm"}},
		{"slurm exact list beats requested maximum", map[string]string{"SLURM_PROCID": "2", "SLURM_NTASKS": "4", "SLURM_LOCALID": "0", "SLURM_NODEID": "2", "SLURM_NTASKS_PER_NODE": "4", "SLURM_TASKS_PER_NODE": "1(x4)"},
			Identity{2, 4, 0, 1, "host-a", "slurm"}},
		{"slurm step variables beat allocation ones", map[string]string{"SLURM_PROCID": "1", "SLURM_NTASKS": "16", "SLURM_STEP_NUM_TASKS": "2", "SLURM_LOCALID": "1", "SLURM_NODEID": "0", "SLURM_TASKS_PER_NODE": "8(x2)", "SLURM_STEP_TASKS_PER_NODE": "2"},
			Identity{1, 2, 1, 2, "host-a", "slurm"}},
		{"slurm requested maximum above task count is unknown", map[string]string{"SLURM_PROCID": "1", "SLURM_NTASKS": "2", "SLURM_LOCALID": "1", "SLURM_NTASKS_PER_NODE": "4"},
			Identity{1, 2, 1, 0, "host-a", "slurm"}},
		{"explicit beats torchrun", map[string]string{"DDSTORE_RANK": "1", "DDSTORE_SIZE": "2", "RANK": "9", "WORLD_SIZE": "10"},
			Identity{1, 2, -1, 0, "host-a", "explicit"}},
		{"torchrun beats openmpi", map[string]string{"RANK": "1", "WORLD_SIZE": "2", "OMPI_COMM_WORLD_RANK": "0", "OMPI_COMM_WORLD_SIZE": "1"},
			Identity{1, 2, -1, 0, "host-a", "torchrun"}},
		{"openmpi beats mpich", map[string]string{"OMPI_COMM_WORLD_RANK": "1", "OMPI_COMM_WORLD_SIZE": "2", "PMI_RANK": "0", "PMI_SIZE": "1"},
			Identity{1, 2, -1, 0, "host-a", "openmpi"}},
		{"openmpi inside a Slurm allocation", map[string]string{"OMPI_COMM_WORLD_RANK": "3", "OMPI_COMM_WORLD_SIZE": "4", "SLURM_PROCID": "0", "SLURM_NTASKS": "1", "SLURM_LOCALID": "0", "SLURMD_NODENAME": "gpu01"},
			Identity{3, 4, -1, 0, "gpu01", "openmpi"}},
		{"mpich inside a Slurm allocation", map[string]string{"PMI_RANK": "3", "PMI_SIZE": "4", "SLURM_PROCID": "0", "SLURM_NTASKS": "1"},
			Identity{3, 4, -1, 0, "host-a", "mpich"}},
		{"torchrun under Slurm takes SLURMD_NODENAME", map[string]string{"RANK": "0", "WORLD_SIZE": "1", "SLURMD_NODENAME": "gpu02", "SLURM_NODEID": "5"},
			Identity{0, 1, 0, 1, "gpu02", "torchrun"}},
		{"DDSTORE_NODE_ID beats everything", map[string]string{"DDSTORE_NODE_ID": "rack3-n4", "SLURMD_NODENAME": "gpu02", "SLURM_PROCID": "0", "SLURM_NTASKS": "1"},
			Identity{0, 1, 0, 1, "rack3-n4", "slurm"}},
		{"DDSTORE_NODE_ID in a single process", map[string]string{"DDSTORE_NODE_ID": "n1"},
			Identity{0, 1, 0, 1, "n1", "single"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := FromEnv(envFunc(tt.env))
			if err != nil {
				t.Fatalf("FromEnv: %v", err)
			}
			if got != tt.want {
				t.Errorf("FromEnv = %+v, want %+v", got, tt.want)
			}
		})
	}
}

func TestFromEnvBad(t *testing.T) {
	stubHostname(t, "host-a", nil)
	tests := []struct {
		name string
		env  map[string]string
		// mention must appear in the message: the variable, and its
		// value when it has a wrong one.
		mention string
	}{
		{"rank not an integer", map[string]string{"RANK": "x", "WORLD_SIZE": "4"}, `RANK="x"`},
		{"rank negative", map[string]string{"RANK": "-1", "WORLD_SIZE": "4"}, `RANK="-1": want an integer in [0, WORLD_SIZE=4)`},
		{"rank equal to size", map[string]string{"RANK": "4", "WORLD_SIZE": "4"}, `RANK="4"`},
		{"size zero", map[string]string{"RANK": "0", "WORLD_SIZE": "0"}, `WORLD_SIZE="0": want an integer >= 1`},
		{"size not an integer", map[string]string{"RANK": "0", "WORLD_SIZE": "4.0"}, `WORLD_SIZE="4.0"`},
		{"size with space", map[string]string{"RANK": "0", "WORLD_SIZE": " 4"}, `WORLD_SIZE=" 4"`},
		{"rank without size", map[string]string{"RANK": "0"}, "WORLD_SIZE is not"},
		{"size without rank", map[string]string{"WORLD_SIZE": "2"}, "RANK is not"},
		{"local rank equal to local size", map[string]string{"RANK": "0", "WORLD_SIZE": "4", "LOCAL_RANK": "2", "LOCAL_WORLD_SIZE": "2"}, `LOCAL_RANK="2": want an integer in [0, LOCAL_WORLD_SIZE=2)`},
		{"local rank beyond size when local size unknown", map[string]string{"RANK": "0", "WORLD_SIZE": "4", "LOCAL_RANK": "4"}, `LOCAL_RANK="4": want an integer in [0, WORLD_SIZE=4)`},
		{"local rank not an integer", map[string]string{"RANK": "0", "WORLD_SIZE": "4", "LOCAL_RANK": "a"}, `LOCAL_RANK="a"`},
		{"local size zero", map[string]string{"RANK": "0", "WORLD_SIZE": "4", "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "0"}, `LOCAL_WORLD_SIZE="0"`},
		{"local size above size", map[string]string{"RANK": "0", "WORLD_SIZE": "4", "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "8"}, `LOCAL_WORLD_SIZE="8": want an integer in [1, WORLD_SIZE=4]`},
		{"local size without local rank", map[string]string{"RANK": "0", "WORLD_SIZE": "4", "LOCAL_WORLD_SIZE": "2"}, "LOCAL_RANK is not"},
		{"explicit local only", map[string]string{"DDSTORE_LOCAL_RANK": "0", "RANK": "0", "WORLD_SIZE": "1"}, "DDSTORE_SIZE is not"},
		{"explicit rank bad", map[string]string{"DDSTORE_RANK": "two", "DDSTORE_SIZE": "4"}, `DDSTORE_RANK="two"`},
		{"explicit broken is not rescued by torchrun", map[string]string{"DDSTORE_RANK": "1", "RANK": "1", "WORLD_SIZE": "2"}, "DDSTORE_SIZE is not"},
		{"openmpi rank out of range", map[string]string{"OMPI_COMM_WORLD_RANK": "8", "OMPI_COMM_WORLD_SIZE": "8"}, `OMPI_COMM_WORLD_RANK="8"`},
		{"openmpi rank without size", map[string]string{"OMPI_COMM_WORLD_RANK": "0"}, "OMPI_COMM_WORLD_SIZE is not"},
		{"mpich local rank bad", map[string]string{"PMI_RANK": "0", "PMI_SIZE": "2", "MPI_LOCALRANKID": "2", "MPI_LOCALNRANKS": "2"}, `MPI_LOCALRANKID="2"`},
		{"mpich size bad", map[string]string{"PMI_RANK": "0", "PMI_SIZE": "-2"}, `PMI_SIZE="-2"`},
		{"slurm procid without ntasks", map[string]string{"SLURM_PROCID": "0"}, "SLURM_NTASKS is not"},
		{"slurm procid bad", map[string]string{"SLURM_PROCID": "x", "SLURM_NTASKS": "2"}, `SLURM_PROCID="x"`},
		{"slurm step tasks bad", map[string]string{"SLURM_PROCID": "2", "SLURM_NTASKS": "4", "SLURM_STEP_NUM_TASKS": "2"}, `SLURM_PROCID="2": want an integer in [0, SLURM_STEP_NUM_TASKS=2)`},
		{"slurm localid beyond tasks per node", map[string]string{"SLURM_PROCID": "1", "SLURM_NTASKS": "8", "SLURM_LOCALID": "4", "SLURM_NTASKS_PER_NODE": "4"}, `SLURM_LOCALID="4": want an integer in [0, SLURM_NTASKS_PER_NODE=4)`},
		{"slurm localid beyond listed tasks", map[string]string{"SLURM_PROCID": "6", "SLURM_NTASKS": "7", "SLURM_LOCALID": "1", "SLURM_NODEID": "3", "SLURM_TASKS_PER_NODE": "2(x3),1"}, `SLURM_LOCALID="1": want an integer in [0, SLURM_TASKS_PER_NODE=1)`},
		{"slurm ntasks per node bad", map[string]string{"SLURM_PROCID": "0", "SLURM_NTASKS": "2", "SLURM_LOCALID": "0", "SLURM_NTASKS_PER_NODE": "many"}, `SLURM_NTASKS_PER_NODE="many"`},
		{"slurm tasks list unterminated", map[string]string{"SLURM_PROCID": "0", "SLURM_NTASKS": "2", "SLURM_LOCALID": "0", "SLURM_TASKS_PER_NODE": "4(x2"}, `SLURM_TASKS_PER_NODE="4(x2"`},
		{"slurm tasks list garbage", map[string]string{"SLURM_PROCID": "0", "SLURM_NTASKS": "2", "SLURM_LOCALID": "0", "SLURM_TASKS_PER_NODE": "4,,2"}, `SLURM_TASKS_PER_NODE="4,,2"`},
		{"slurm tasks list zero repeat", map[string]string{"SLURM_PROCID": "0", "SLURM_NTASKS": "2", "SLURM_LOCALID": "0", "SLURM_TASKS_PER_NODE": "2(x0)"}, `SLURM_TASKS_PER_NODE="2(x0)"`},
		{"slurm step list bad", map[string]string{"SLURM_PROCID": "0", "SLURM_NTASKS": "2", "SLURM_LOCALID": "0", "SLURM_STEP_TASKS_PER_NODE": "x", "SLURM_TASKS_PER_NODE": "2"}, `SLURM_STEP_TASKS_PER_NODE="x"`},
		{"slurm node id past the list", map[string]string{"SLURM_PROCID": "0", "SLURM_NTASKS": "8", "SLURM_LOCALID": "0", "SLURM_NODEID": "2", "SLURM_TASKS_PER_NODE": "4(x2)"}, `SLURM_TASKS_PER_NODE="4(x2)" has no entry for SLURM_NODEID=2`},
		{"slurm node id bad", map[string]string{"SLURM_PROCID": "0", "SLURM_NTASKS": "8", "SLURM_LOCALID": "0", "SLURM_NODEID": "n1", "SLURM_TASKS_PER_NODE": "4(x2)"}, `SLURM_NODEID="n1"`},
		{"slurm list without localid", map[string]string{"SLURM_PROCID": "0", "SLURM_NTASKS": "8", "SLURM_TASKS_PER_NODE": "4(x2)"}, "SLURM_LOCALID is not"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			id, err := FromEnv(envFunc(tt.env))
			if err == nil {
				t.Fatalf("FromEnv = %+v, want an error", id)
			}
			if !errors.Is(err, ErrBadEnv) {
				t.Errorf("error %q does not match ErrBadEnv", err)
			}
			if !strings.HasPrefix(err.Error(), "ddstore: bad environment: ") {
				t.Errorf("error %q lacks the ddstore prefix", err)
			}
			if !strings.Contains(err.Error(), tt.mention) {
				t.Errorf("error %q does not mention %s", err, tt.mention)
			}
		})
	}
}

func TestFromEnvNoHostname(t *testing.T) {
	stubHostname(t, "", errors.New("uname broke"))
	_, err := FromEnv(envFunc(map[string]string{"RANK": "0", "WORLD_SIZE": "1"}))
	if !errors.Is(err, ErrNoIdentity) || !strings.Contains(err.Error(), "DDSTORE_NODE_ID") {
		t.Fatalf("FromEnv error = %v, want ErrNoIdentity naming DDSTORE_NODE_ID", err)
	}
	stubHostname(t, "", nil)
	if _, err := FromEnv(envFunc(nil)); !errors.Is(err, ErrNoIdentity) {
		t.Fatalf("FromEnv with an empty hostname: error = %v, want ErrNoIdentity", err)
	}
}

func TestFromEnvNilGetenv(t *testing.T) {
	// Whatever the test machine's environment says, a nil getenv must read
	// it rather than crash.
	t.Setenv("DDSTORE_RANK", "2")
	t.Setenv("DDSTORE_SIZE", "3")
	t.Setenv("DDSTORE_LOCAL_RANK", "0")
	t.Setenv("DDSTORE_LOCAL_SIZE", "1")
	t.Setenv("DDSTORE_NODE_ID", "env-node")
	got, err := FromEnv(nil)
	if err != nil {
		t.Fatal(err)
	}
	if want := (Identity{2, 3, 0, 1, "env-node", "explicit"}); got != want {
		t.Fatalf("FromEnv(nil) = %+v, want %+v", got, want)
	}
}

func TestIdentityString(t *testing.T) {
	for _, tt := range []struct {
		id   Identity
		want string
	}{
		{Identity{3, 8, 1, 4, "gpu01", "torchrun"}, `rank 3/8 (local 1/4) on node "gpu01" via torchrun`},
		{Identity{3, 8, -1, 0, "gpu01", "explicit"}, `rank 3/8 (local ?/?) on node "gpu01" via explicit`},
	} {
		if got := tt.id.String(); got != tt.want {
			t.Errorf("String() = %q, want %q", got, tt.want)
		}
	}
}

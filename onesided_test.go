package ddstore_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/ddstore-go/ddstore"
	"github.com/ddstore-go/ddstore/internal/client"
)

// TestMethodErrors: a read method that does not exist, or that this build
// or this store cannot have, is refused by Open, naming why.
func TestMethodErrors(t *testing.T) {
	cases := []struct {
		cfg  ddstore.Config
		want string
	}{
		{ddstore.Config{Method: "rdma"}, `method "rdma": want "agent" or "mpi"`},
		{ddstore.Config{Method: ddstore.MethodMPI, Reader: true}, "a reader is not in the publishing job's MPI world"},
	}
	if !mpiBuilt {
		cases = append(cases, struct {
			cfg  ddstore.Config
			want string
		}{ddstore.Config{Method: ddstore.MethodMPI}, "rebuild with -tags mpi"})
	}
	for _, c := range cases {
		c.cfg.Rank, c.cfg.Size, c.cfg.Namespace, c.cfg.RunDir = 0, 1, "method-errors", t.TempDir()
		c.cfg.AgentBinary = ddstoreBin
		s, err := ddstore.Open(c.cfg)
		if err == nil {
			s.Close()
		}
		if !errors.Is(err, ddstore.ErrArgument) || !strings.Contains(err.Error(), c.want) {
			t.Errorf("method %q (reader %v): %v, want ErrArgument saying %q", c.cfg.Method, c.cfg.Reader, err, c.want)
		}
	}
}

// TestMethodNames: the public method names are the ones the engine checks.
func TestMethodNames(t *testing.T) {
	if ddstore.MethodAgent != client.MethodAgent || ddstore.MethodMPI != client.MethodMPI {
		t.Fatalf("methods %q, %q; the engine's %q, %q", ddstore.MethodAgent, ddstore.MethodMPI, client.MethodAgent, client.MethodMPI)
	}
}

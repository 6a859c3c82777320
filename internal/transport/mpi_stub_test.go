//go:build !mpi || !cgo

package transport

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/ddstore-go/ddstore/internal/base"
)

// TestMPIStub: without the tag, asking for the MPI transport fails with
// ErrArgument, naming the tag and the make target.
func TestMPIStub(t *testing.T) {
	m, err := NewMPI(MPIOptions{})
	if m != nil || !errors.Is(err, base.ErrArgument) || !strings.Contains(err.Error(), "-tags mpi") || !strings.Contains(err.Error(), "make build-mpi") {
		t.Fatalf("NewMPI = %v, %v; want ErrArgument naming -tags mpi and make build-mpi", m, err)
	}
	if MPIBuilt {
		t.Fatal("MPIBuilt in a build without the tag")
	}
	var s *MPI
	if err := s.Fetch(context.Background(), "a", "x", 1, []int64{0}, [][]byte{make([]byte, 1)}); !errors.Is(err, base.ErrArgument) {
		t.Errorf("Fetch: %v", err)
	}
	unmapped := false
	s.Withdraw(Exposure{}, func() { unmapped = true })
	if !unmapped {
		t.Error("Withdraw of the stub did not unmap")
	}
}

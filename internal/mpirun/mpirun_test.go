package mpirun

import (
	"os"
	"path/filepath"
	"slices"
	"testing"
)

// fake writes an executable script that prints version and returns its path.
func fake(t *testing.T, version string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "launcher")
	if err := os.WriteFile(p, []byte("#!/bin/sh\necho '"+version+"'\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	return p
}

func TestFind(t *testing.T) {
	for _, c := range []struct {
		version string
		openMPI bool
	}{
		{"mpirun (Open MPI) 4.1.4", true},
		{"HYDRA build details:", false},
	} {
		p := fake(t, c.version)
		t.Setenv(Env, p)
		l, err := Find()
		if err != nil {
			t.Fatal(err)
		}
		if l.Path != p || l.OpenMPI != c.openMPI {
			t.Errorf("%q: got %+v, want OpenMPI %v", c.version, l, c.openMPI)
		}
		a := l.Args(2)
		if !slices.Equal(a[len(a)-2:], []string{"-np", "2"}) || slices.Contains(a, "--oversubscribe") != c.openMPI {
			t.Errorf("%q: Args(2) = %q", c.version, a)
		}
		if slices.Contains(l.Args(0), "-np") {
			t.Errorf("%q: Args(0) = %q has -np", c.version, l.Args(0))
		}
	}
	t.Setenv(Env, filepath.Join(t.TempDir(), "no-such-launcher"))
	if _, err := Find(); err == nil {
		t.Error("a launcher that does not exist was found")
	}
}

func TestRank(t *testing.T) {
	for _, k := range []string{"OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "PMI_RANK", "PMI_SIZE"} {
		t.Setenv(k, "")
	}
	if _, _, ok := Rank(); ok {
		t.Fatal("a rank outside a launch")
	}
	t.Setenv("PMI_RANK", "1")
	t.Setenv("PMI_SIZE", "4")
	if r, n, ok := Rank(); !ok || r != 1 || n != 4 {
		t.Fatalf("Hydra's rank 1 of 4: got %d of %d (%v)", r, n, ok)
	}
	t.Setenv("OMPI_COMM_WORLD_RANK", "2")
	t.Setenv("OMPI_COMM_WORLD_SIZE", "3")
	if r, n, ok := Rank(); !ok || r != 2 || n != 3 {
		t.Fatalf("Open MPI's rank 2 of 3: got %d of %d (%v)", r, n, ok)
	}
	t.Setenv("OMPI_COMM_WORLD_RANK", "3")
	t.Setenv("PMI_RANK", "")
	if _, _, ok := Rank(); ok {
		t.Fatal("rank 3 of 3 accepted")
	}
}

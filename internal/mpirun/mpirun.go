// Package mpirun finds the MPI launcher that ddstore's MPI tests and
// benchmarks start their ranks with, and the options each kind needs to run
// several ranks on one machine: Open MPI's mpirun wants --oversubscribe
// (more ranks than cores) and, as root, --allow-run-as-root; MPICH's Hydra
// (mpiexec.mpich) takes neither and needs none.
//
// DDSTORE_MPIRUN names the launcher (a command on PATH or a path); the
// default is mpirun. A binary built with the tags "mpi mpich" must be
// launched by MPICH's launcher: DDSTORE_MPIRUN=mpiexec.mpich.
package mpirun

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"strconv"
)

// Env names the launcher to use instead of mpirun.
const Env = "DDSTORE_MPIRUN"

// Launcher is an MPI launcher on this machine.
type Launcher struct {
	Path    string // the executable
	OpenMPI bool   // Open MPI's mpirun; else MPICH's Hydra (or compatible)
}

// Find returns the launcher DDSTORE_MPIRUN names, else mpirun on PATH,
// and which kind it is (from its --version).
func Find() (Launcher, error) {
	name := os.Getenv(Env)
	if name == "" {
		name = "mpirun"
	}
	p, err := exec.LookPath(name)
	if err != nil {
		return Launcher{}, fmt.Errorf("MPI launcher %q not found (install openmpi-bin or mpich, or set %s): %w", name, Env, err)
	}
	out, err := exec.Command(p, "--version").CombinedOutput()
	if err != nil && len(out) == 0 {
		return Launcher{}, fmt.Errorf("MPI launcher %s: %s --version: %w", p, p, err)
	}
	return Launcher{Path: p, OpenMPI: bytes.Contains(out, []byte("Open MPI")) || bytes.Contains(out, []byte("OpenRTE"))}, nil
}

// Args are the options that go first on a launch of np ranks on this
// machine (np < 1: none, for a launch of several application contexts,
// each with its own -np).
func (l Launcher) Args(np int) []string {
	var a []string
	if l.OpenMPI {
		a = append(a, "--oversubscribe")
		if os.Geteuid() == 0 {
			a = append(a, "--allow-run-as-root")
		}
	}
	if np > 0 {
		a = append(a, "-np", fmt.Sprint(np))
	}
	return a
}

// Rank is this process's rank and the launch's size, from the environment
// Open MPI's mpirun or MPICH's Hydra give their ranks; ok is false outside
// such a launch.
func Rank() (rank, size int, ok bool) {
	for _, k := range [][2]string{{"OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE"}, {"PMI_RANK", "PMI_SIZE"}} {
		r, err1 := strconv.Atoi(os.Getenv(k[0]))
		n, err2 := strconv.Atoi(os.Getenv(k[1]))
		if err1 == nil && err2 == nil && 0 <= r && r < n {
			return r, n, true
		}
	}
	return 0, 0, false
}

//go:build !mpi || !cgo

package bench

import "os"

// MPIProbeRank: a build without MPI has no probe to run.
func MPIProbeRank() (bool, error) {
	if os.Getenv(probeEnv) != "" {
		return true, errNoProbe
	}
	return false, nil
}

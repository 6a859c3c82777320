package cli

import (
	"fmt"
	"os"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// unbindThread lets the calling OS thread, and so a process it starts, run
// on every online CPU. A client that starts its node's agent may be bound
// to one core (mpirun binds its ranks to cores; srun --cpu-bind likewise);
// the agent, which serves every rank of the node, must not inherit that.
// The caller locks its goroutine to the thread. Best effort: a cpuset
// narrower than the online CPUs narrows it, and an error leaves the
// binding as it was.
func unbindThread() error {
	b, err := os.ReadFile("/sys/devices/system/cpu/online")
	if err != nil {
		return err
	}
	cpus, err := parseCPUList(strings.TrimSpace(string(b)))
	if err != nil {
		return err
	}
	var set unix.CPUSet
	for _, c := range cpus {
		set.Set(c)
	}
	return unix.SchedSetaffinity(0, &set)
}

// parseCPUList parses a kernel CPU list such as "0-3,8,10-11".
func parseCPUList(s string) ([]int, error) {
	var cpus []int
	for _, part := range strings.Split(s, ",") {
		lo, hi, isRange := strings.Cut(part, "-")
		a, err := strconv.Atoi(lo)
		if err != nil {
			return nil, fmt.Errorf("CPU list %q: %w", s, err)
		}
		z := a
		if isRange {
			if z, err = strconv.Atoi(hi); err != nil || z < a {
				return nil, fmt.Errorf("CPU list %q: bad range %q", s, part)
			}
		}
		if a < 0 || z >= 1<<16 {
			return nil, fmt.Errorf("CPU list %q: CPU out of range", s)
		}
		for c := a; c <= z; c++ {
			cpus = append(cpus, c)
		}
	}
	return cpus, nil
}

package cli

import (
	"os"
	"os/exec"
	"runtime"
	"slices"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

func TestParseCPUList(t *testing.T) {
	for _, c := range []struct {
		in   string
		want []int
	}{
		{"0", []int{0}},
		{"0-3", []int{0, 1, 2, 3}},
		{"0-1,4,6-7", []int{0, 1, 4, 6, 7}},
	} {
		got, err := parseCPUList(c.in)
		if err != nil || !slices.Equal(got, c.want) {
			t.Errorf("parseCPUList(%q) = %v, %v; want %v", c.in, got, err, c.want)
		}
	}
	for _, bad := range []string{"", "a", "3-1", "1-", "-1"} {
		if got, err := parseCPUList(bad); err == nil {
			t.Errorf("parseCPUList(%q) = %v, want an error", bad, got)
		}
	}
}

// childCPUs starts a process from this (locked) thread and returns the
// CPUs it may run on, as the kernel lists them.
func childCPUs(t *testing.T) string {
	t.Helper()
	out, err := exec.Command("grep", "Cpus_allowed_list", "/proc/self/status").Output()
	if err != nil {
		t.Fatal(err)
	}
	return strings.TrimSpace(strings.TrimPrefix(strings.TrimSpace(string(out)), "Cpus_allowed_list:"))
}

// TestUnbindThread: a process started from a thread bound to one CPU (as
// an MPI rank is) runs on that CPU only, unless the thread is unbound
// first, as daemonize does before starting an agent.
func TestUnbindThread(t *testing.T) {
	online, err := os.ReadFile("/sys/devices/system/cpu/online")
	if err != nil {
		t.Skip(err)
	}
	all := strings.TrimSpace(string(online))
	if cpus, _ := parseCPUList(all); len(cpus) < 2 {
		t.Skipf("one CPU online (%s): nothing to unbind", all)
	}
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	var before unix.CPUSet
	if err := unix.SchedGetaffinity(0, &before); err != nil {
		t.Fatal(err)
	}
	defer unix.SchedSetaffinity(0, &before)
	var one unix.CPUSet
	one.Set(0)
	if err := unix.SchedSetaffinity(0, &one); err != nil {
		t.Skipf("cannot bind this thread to CPU 0: %v", err)
	}
	if got := childCPUs(t); got != "0" {
		t.Fatalf("a child of a thread bound to CPU 0 may run on %q, want 0", got)
	}
	if err := unbindThread(); err != nil {
		t.Fatal(err)
	}
	if got := childCPUs(t); got != all {
		t.Fatalf("after unbindThread a child may run on %q, want every online CPU (%s)", got, all)
	}
}

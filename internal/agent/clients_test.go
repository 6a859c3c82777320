package agent

import (
	"os"
	"os/exec"
	"testing"
	"time"

	"github.com/ddstore-go/ddstore/internal/testutil"
)

// processStart reads a process's start from /proc: this test's process
// started before it asks, and stays put between two asks; a process
// started after another has a later start; an unknown pid is now.
func TestProcessStart(t *testing.T) {
	before := time.Now()
	self := processStart(int32(os.Getpid()))
	if !self.Before(before) || time.Since(self) > time.Hour {
		t.Fatalf("this process started at %v, asked at %v", self, before)
	}
	if d := processStart(int32(os.Getpid())).Sub(self); d < -20*time.Millisecond || d > 20*time.Millisecond {
		t.Fatalf("two asks differ by %v", d)
	}
	testutil.WaitFor(t, 5*time.Second, func() error { // a tick (10 ms) later at least
		if !time.Now().After(self.Add(50 * time.Millisecond)) {
			return os.ErrDeadlineExceeded
		}
		return nil
	})
	cmd := exec.Command("sleep", "30")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { cmd.Process.Kill(); cmd.Wait() }()
	child := processStart(int32(cmd.Process.Pid))
	if !child.After(self) || child.After(time.Now()) {
		t.Fatalf("a child started at %v, this process at %v", child, self)
	}
	if now := time.Now(); processStart(0).Before(now) {
		t.Fatal("an unknown pid's start is before now")
	}
}

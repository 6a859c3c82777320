package testutil

import (
	"testing"
	"time"
)

// pollMax caps the pause between two polls: short enough that a test
// waits little past the moment its condition holds, long enough that a
// poll of an agent's info over its socket does not load the machine.
const pollMax = 20 * time.Millisecond

// WaitFor polls f until it returns nil, and fails the test with f's last
// error once d has passed without. Tests wait on a condition this way,
// never for a fixed time: the deadline only bounds a hang, so it can be
// generous on a loaded machine at no cost when the machine is quick.
func WaitFor(t testing.TB, d time.Duration, f func() error) {
	t.Helper()
	if err := Poll(d, f); err != nil {
		t.Fatalf("after %v: %v", d, err)
	}
}

// Poll is WaitFor for a caller that reports the failure itself (from a
// goroutine that may not call t.Fatal, or with more context): it returns
// nil once f does, else f's last error when d has passed.
func Poll(d time.Duration, f func() error) error {
	deadline := time.Now().Add(d)
	pause := time.Millisecond
	for {
		err := f()
		if err == nil {
			return nil
		}
		if time.Now().After(deadline) {
			return err
		}
		time.Sleep(pause)
		pause = min(2*pause, pollMax)
	}
}

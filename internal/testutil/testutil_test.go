package testutil

import (
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

func TestPollReturnsOnceTheConditionHolds(t *testing.T) {
	var calls atomic.Int32
	err := Poll(time.Minute, func() error {
		if calls.Add(1) < 5 {
			return errors.New("not yet")
		}
		return nil
	})
	if err != nil || calls.Load() != 5 {
		t.Fatalf("Poll: %v after %d calls, want nil after 5", err, calls.Load())
	}
}

func TestPollGivesTheLastErrorAtTheDeadline(t *testing.T) {
	var calls int
	err := Poll(20*time.Millisecond, func() error {
		calls++
		return fmt.Errorf("attempt %d", calls)
	})
	if err == nil || err.Error() != fmt.Sprintf("attempt %d", calls) || calls < 2 {
		t.Fatalf("Poll: %v after %d calls, want the last attempt's error", err, calls)
	}
}

func TestBufferConcurrentWrites(t *testing.T) {
	var b Buffer
	var wg sync.WaitGroup
	for w := range 8 {
		wg.Go(func() {
			for range 100 {
				fmt.Fprintf(&b, "%d\n", w)
				_ = b.String()
			}
		})
	}
	wg.Wait()
	if n := strings.Count(b.String(), "\n"); n != 800 {
		t.Fatalf("%d lines, want 800", n)
	}
}

// echoArgs are the arguments of the "echo" helper.
type echoArgs struct {
	Text string
	Code int
}

var _ = Helper("echo", func(a echoArgs) int {
	fmt.Print(a.Text)
	return a.Code
})

func init() { RunHelper() }

func TestHelperCmd(t *testing.T) {
	out, err := HelperCmd(t, "echo", echoArgs{Text: "hello from the helper", Code: 0}).Output()
	if err != nil || string(out) != "hello from the helper" {
		t.Fatalf("helper: %q, %v", out, err)
	}
	err = HelperCmd(t, "echo", echoArgs{Code: 3}).Run()
	var exit interface{ ExitCode() int }
	if !errors.As(err, &exit) || exit.ExitCode() != 3 {
		t.Fatalf("helper's exit: %v, want status 3", err)
	}
	err = HelperCmd(t, "no such role", nil).Run()
	if !errors.As(err, &exit) || exit.ExitCode() != 2 {
		t.Fatalf("unknown role: %v, want status 2", err)
	}
}

package naming

import (
	"errors"
	"os"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/ddstore-go/ddstore/internal/base"
)

// TestProbeLock: the probe sees the lock free when no one holds it, held
// while a LockFile (what a running agent keeps) holds it, and a stale
// file of a killed holder as free. The agent's side (Start refused while
// the probe holds the lock) is tested in internal/agent.
func TestProbeLock(t *testing.T) {
	dir := t.TempDir()
	lock := LockPath(dir, "ns", "n1")
	if want := SocketPath(dir, "ns", "n1") + ".lock"; lock != want {
		t.Fatalf("LockPath = %q, want %q", lock, want)
	}
	for _, take := range []bool{false, true} {
		held, release, err := ProbeLock(lock, take)
		if held || err != nil {
			t.Fatalf("no holder, take %v: held %v, %v", take, held, err)
		}
		release(true)
	}
	if held, release, err := ProbeLock(filepath.Join(dir, "missing", "x.lock"), true); held || err != nil {
		t.Fatalf("missing directory: held %v, %v", held, err)
	} else {
		release(true)
	}

	fd, err := LockFile(lock)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := LockFile(lock); err != unix.EWOULDBLOCK {
		t.Fatalf("second LockFile: %v, want EWOULDBLOCK", err)
	}
	for _, take := range []bool{false, true} {
		if held, _, err := ProbeLock(lock, take); !held || err != nil {
			t.Fatalf("held lock, take %v: held %v, %v", take, held, err)
		}
	}
	unix.Close(fd) // the holder dies: the file stays, nobody holds it
	held, release, err := ProbeLock(lock, true)
	if held || err != nil {
		t.Fatalf("stale lock: held %v, %v", held, err)
	}
	if held, _, _ := ProbeLock(lock, false); !held {
		t.Fatal("taken lock not seen as held")
	}
	release(true)
	if _, err := os.Stat(lock); !os.IsNotExist(err) {
		t.Fatalf("lock file after release(true): %v", err)
	}
}

func TestErrAgentRuns(t *testing.T) {
	if !errors.Is(ErrAgentRuns, base.ErrExists) || base.Code(ErrAgentRuns) != base.Code(base.ErrExists) {
		t.Fatalf("ErrAgentRuns (code %d) does not cross the wire as ErrExists", base.Code(ErrAgentRuns))
	}
}

func TestStoreScoped(t *testing.T) {
	for name, want := range map[string]bool{
		"x@s0123456789ab":      true,
		"x@s0123456789ab@r4":   true,
		"a/b@sffffffffffff@r0": true,
		"@s0123456789ab":       false, // no name before the scope
		"x@s0123456789a":       false, // 11 digits
		"x@s0123456789abc":     false, // 13
		"x@s0123456789AB":      false, // upper case: not the client's
		"x@s0123456789ab@r":    false,
		"x":                    false,
		"x@r2":                 false,
		"x@s0123456789ab@rx":   false,
	} {
		if got := StoreScoped(name); got != want {
			t.Errorf("StoreScoped(%q) = %v, want %v", name, got, want)
		}
	}
}

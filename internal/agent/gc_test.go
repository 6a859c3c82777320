package agent

import (
	"errors"
	"os"
	"testing"

	"github.com/ddstore-go/ddstore/internal/naming"
)

// TestProbeLock: a running agent holds the lock naming.ProbeLock looks at,
// and removes it on Close; while a probe (gc) holds it, no agent starts.
// ProbeLock on its own is tested in internal/naming.
func TestProbeLock(t *testing.T) {
	dir := privateTempDir(t)
	ns := testNamespace()
	lock := naming.LockPath(dir, ns, "n1")
	a := startAgent(t, Config{Namespace: ns, Node: "n1", Socket: naming.SocketPath(dir, ns, "n1")})
	for _, take := range []bool{false, true} {
		if held, _, err := naming.ProbeLock(lock, take); !held || err != nil {
			t.Fatalf("running agent, take %v: held %v, %v", take, held, err)
		}
	}
	if _, err := Start(Config{Namespace: ns, Node: "n1", Socket: naming.SocketPath(dir, ns, "n1")}); !errors.Is(err, naming.ErrAgentRuns) {
		t.Fatalf("a second agent: %v, want ErrAgentRuns", err)
	}
	a.Close()
	if _, err := os.Stat(lock); !os.IsNotExist(err) {
		t.Fatalf("lock file after Close: %v", err)
	}

	// A lock file left by a killed agent: nobody holds it.
	if err := os.WriteFile(lock, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	held, release, err := naming.ProbeLock(lock, true)
	if held || err != nil {
		t.Fatalf("stale lock: held %v, %v", held, err)
	}
	// While gc holds it, no agent starts.
	if _, err := Start(Config{Namespace: ns, Node: "n1", Socket: naming.SocketPath(dir, ns, "n1")}); !errors.Is(err, naming.ErrAgentRuns) {
		t.Fatalf("an agent started while the lock was taken: %v", err)
	}
	release(true)
	if _, err := os.Stat(lock); !os.IsNotExist(err) {
		t.Fatalf("lock file after release(true): %v", err)
	}
}

package agent

import (
	"os"
	"path/filepath"
	"testing"
)

func TestProbeLock(t *testing.T) {
	dir := privateTempDir(t)
	ns := testNamespace()
	lock := LockPath(dir, ns, "n1")
	if want := SocketPath(dir, ns, "n1") + ".lock"; lock != want {
		t.Fatalf("LockPath = %q, want %q", lock, want)
	}
	for _, take := range []bool{false, true} {
		held, release, err := ProbeLock(lock, take)
		if held || err != nil {
			t.Fatalf("no agent, take %v: held %v, %v", take, held, err)
		}
		release(true)
	}
	if held, release, err := ProbeLock(filepath.Join(dir, "missing", "x.lock"), true); held || err != nil {
		t.Fatalf("missing directory: held %v, %v", held, err)
	} else {
		release(true)
	}

	a := startAgent(t, Config{Namespace: ns, Node: "n1", Socket: SocketPath(dir, ns, "n1")})
	for _, take := range []bool{false, true} {
		if held, _, err := ProbeLock(lock, take); !held || err != nil {
			t.Fatalf("running agent, take %v: held %v, %v", take, held, err)
		}
	}
	a.Close()
	if _, err := os.Stat(lock); !os.IsNotExist(err) {
		t.Fatalf("lock file after Close: %v", err)
	}

	// A lock file left by a killed agent: nobody holds it.
	if err := os.WriteFile(lock, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	held, release, err := ProbeLock(lock, true)
	if held || err != nil {
		t.Fatalf("stale lock: held %v, %v", held, err)
	}
	// While gc holds it, no agent starts and another probe sees it held.
	if _, err := Start(Config{Namespace: ns, Node: "n1", Socket: SocketPath(dir, ns, "n1")}); err == nil {
		t.Fatal("an agent started while the lock was taken")
	}
	if held, _, _ := ProbeLock(lock, false); !held {
		t.Fatal("taken lock not seen as held")
	}
	release(true)
	if _, err := os.Stat(lock); !os.IsNotExist(err) {
		t.Fatalf("lock file after release(true): %v", err)
	}
}

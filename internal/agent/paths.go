package agent

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/ddstore-go/ddstore/internal/base"
	"github.com/ddstore-go/ddstore/internal/shm"
)

// DefaultRunDir is where agents put their sockets: DDSTORE_RUN_DIR, else a
// per-user directory under /tmp (made 0700 by the agent).
func DefaultRunDir() string {
	if d := os.Getenv("DDSTORE_RUN_DIR"); d != "" {
		return d
	}
	return filepath.Join(os.TempDir(), fmt.Sprintf("ddstore-%d", os.Geteuid()))
}

// CheckName rejects a namespace or node name that cannot name files and
// sockets unambiguously: empty, longer than 255 bytes, or holding NUL.
func CheckName(what, name string) error {
	if name == "" || len(name) > 255 || strings.IndexByte(name, 0) >= 0 {
		return base.Errorf(base.ErrArgument, "%s %q: want 1 to 255 bytes without NUL", what, name)
	}
	return nil
}

// SocketPath is the client socket of the agent of a namespace on a node.
// Unix socket paths are limited to 107 bytes; a long name is hashed.
func SocketPath(runDir, namespace, node string) string {
	p := filepath.Join(runDir, shm.Escape(namespace)+"."+shm.Escape(node)+".sock")
	if len(p) > 100 {
		sum := sha256.Sum256([]byte(namespace + "\x00" + node))
		p = filepath.Join(runDir, hex.EncodeToString(sum[:12])+".sock")
	}
	return p
}

// LockPath is the file the agent of a namespace on a node keeps locked
// (flock) while it runs.
func LockPath(runDir, namespace, node string) string {
	return SocketPath(runDir, namespace, node) + ".lock"
}

// ProbeLock tells whether a running agent holds the lock file at path.
// With take false it only looks: a missing file, or one it can lock, means
// no agent (the lock is released at once). With take true, when no agent
// holds it, the caller keeps it (creating the file if need be) so that no
// agent of that namespace and node can start until release is called;
// release(true) also unlinks the file, while still holding it, as an
// exiting agent does. A missing directory counts as no agent.
func ProbeLock(path string, take bool) (held bool, release func(remove bool), err error) {
	noop := func(bool) {}
	if take {
		fd, err := lockFile(path)
		switch {
		case err == unix.EWOULDBLOCK:
			return true, nil, nil
		case err == unix.ENOENT:
			return false, noop, nil
		case err != nil:
			return false, nil, fmt.Errorf("ddstore: lock %s: %w", path, err)
		}
		return false, func(remove bool) {
			if remove {
				os.Remove(path)
			}
			unix.Close(fd)
		}, nil
	}
	fd, err := unix.Open(path, unix.O_RDONLY|unix.O_CLOEXEC|unix.O_NOFOLLOW, 0)
	if err == unix.ENOENT {
		return false, noop, nil
	}
	if err != nil {
		return false, nil, fmt.Errorf("ddstore: open lock %s: %w", path, err)
	}
	defer unix.Close(fd)
	if err := unix.Flock(fd, unix.LOCK_EX|unix.LOCK_NB); err != nil {
		if err == unix.EWOULDBLOCK {
			return true, nil, nil
		}
		return false, nil, fmt.Errorf("ddstore: lock %s: %w", path, err)
	}
	return false, noop, nil // closing the descriptor releases the lock
}

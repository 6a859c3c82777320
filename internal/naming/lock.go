package naming

// The lock that keeps one agent per namespace and node, and the exit
// status that tells a rank its agent lost the race to another.

import (
	"fmt"
	"os"

	"golang.org/x/sys/unix"

	"github.com/ddstore-go/ddstore/internal/base"
)

// ErrAgentRuns is what an agent that finds its lock held fails with: an
// agent of the same namespace and node already runs. It matches
// base.ErrExists.
var ErrAgentRuns = base.Alias("ddstore: agent exists", base.ErrExists)

// ExitAgentRuns is the exit status of `ddstore agent` (also with --daemon)
// that failed with ErrAgentRuns. A rank that started an agent and sees it
// is content: it lost the race to another rank's agent, which serves it.
const ExitAgentRuns = 3

// LockFile takes an exclusive lock on path, which exists only while an
// agent holds it: after locking, the file must still be the one named path
// (not one an exiting agent just unlinked), else it tries again. It fails
// with unix.EWOULDBLOCK while another process holds the lock.
func LockFile(path string) (int, error) {
	for {
		fd, err := unix.Open(path, unix.O_RDWR|unix.O_CREAT|unix.O_CLOEXEC, 0o600)
		if err != nil {
			return -1, err
		}
		if err := unix.Flock(fd, unix.LOCK_EX|unix.LOCK_NB); err != nil {
			unix.Close(fd)
			return -1, err
		}
		var held, named unix.Stat_t
		if unix.Fstat(fd, &held) == nil && unix.Stat(path, &named) == nil && held.Ino == named.Ino && held.Dev == named.Dev {
			return fd, nil
		}
		unix.Close(fd)
	}
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
		fd, err := LockFile(path)
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

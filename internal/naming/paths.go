// Package naming holds the rules the client and the agent both check, so
// that each is written once: where an agent of a namespace on a node puts
// its socket and lock, which namespace, node and variable names are
// allowed, how a backing file names an HDF5 dataset (FILE:DATASET), and
// how the process that started an agent learns that another one already
// serves. It reads no dataset and links no server code.
package naming

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"os"
	"path/filepath"

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

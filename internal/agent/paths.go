package agent

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"os"
	"path/filepath"
	"strings"

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

package naming

// Which namespace, node and variable names the agent and its clients
// accept.

import (
	"strings"

	"github.com/ddstore-go/ddstore/internal/base"
)

// MaxName bounds a namespace or node name.
const MaxName = 255

// CheckName rejects a namespace or node name that cannot name files and
// sockets unambiguously: empty, longer than MaxName bytes, or holding NUL
// (hashed socket paths join the two with one).
func CheckName(what, name string) error {
	if name == "" || len(name) > MaxName || strings.IndexByte(name, 0) >= 0 {
		return base.Errorf(base.ErrArgument, "%s %q: want 1 to %d bytes without NUL", what, name, MaxName)
	}
	return nil
}

// MaxVariableName bounds a variable's name: the client checks it before
// sending, the agent again on receipt (with a replica group's suffix).
const MaxVariableName = 1024

// CheckVariable bounds a variable's name: 1 to MaxVariableName bytes.
func CheckVariable(name string) error {
	if name == "" || len(name) > MaxVariableName {
		return base.Errorf(base.ErrArgument, "variable name of %d bytes: want 1 to %d", len(name), MaxVariableName)
	}
	return nil
}

package naming

import (
	"strings"

	"github.com/ddstore-go/ddstore/internal/base"
)

// CheckName rejects a namespace or node name that cannot name files and
// sockets unambiguously: empty, longer than 255 bytes, or holding NUL.
func CheckName(what, name string) error {
	if name == "" || len(name) > 255 || strings.IndexByte(name, 0) >= 0 {
		return base.Errorf(base.ErrArgument, "%s %q: want 1 to 255 bytes without NUL", what, name)
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

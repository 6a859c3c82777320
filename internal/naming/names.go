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

// A store's scope: the Python client names the variables of a store
// (pyddstore's PyDDStore, ddstore.Store with a communicator) NAME@s<12 hex
// digits>, before a replica group's @r<first rank>, so that each store's
// variables are its own. Such a variable belongs to the processes that
// created its shards: the agent frees a rank's share when that process is
// gone (internal/agent/orphans.go). Variables of the namespace's scope
// (any other name) stay until freed.
const (
	ScopeMark   = "@s"
	ScopeDigits = 12
)

// StoreScoped reports whether name carries a store's scope.
func StoreScoped(name string) bool {
	if i := strings.LastIndex(name, "@r"); i >= 0 && i+2 < len(name) && allDigits(name[i+2:]) {
		name = name[:i]
	}
	n := len(name) - ScopeDigits - len(ScopeMark)
	if n < 1 || name[n:n+len(ScopeMark)] != ScopeMark {
		return false
	}
	for _, c := range name[n+len(ScopeMark):] {
		if !('0' <= c && c <= '9' || 'a' <= c && c <= 'f') {
			return false
		}
	}
	return true
}

func allDigits(s string) bool {
	for _, c := range s {
		if c < '0' || c > '9' {
			return false
		}
	}
	return s != ""
}

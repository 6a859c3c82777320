// Package base holds what every other package of ddstore shares: the
// sentinel errors (re-exported by the public package) and their wire codes.
package base

import (
	"errors"
	"fmt"
	"strings"
)

// Sentinel errors. Every error ddstore returns wraps exactly one of these, so
// callers match with errors.Is and the Python client maps each to a fixed
// exception type.
var (
	ErrIndex    = errors.New("ddstore: index out of range")
	ErrGeometry = errors.New("ddstore: bad geometry")
	ErrUnknown  = errors.New("ddstore: unknown variable")
	ErrExists   = errors.New("ddstore: variable exists")
	ErrBuffer   = errors.New("ddstore: bad buffer")
	ErrFreed    = errors.New("ddstore: variable freed")
	ErrClosed   = errors.New("ddstore: closed")
	ErrTimeout  = errors.New("ddstore: timed out")
	ErrPeer     = errors.New("ddstore: peer failed")
	ErrProtocol = errors.New("ddstore: protocol error")
	ErrNoAgent  = errors.New("ddstore: no agent")
	ErrArgument = errors.New("ddstore: bad argument")
	ErrInternal = errors.New("ddstore: internal error")
	ErrAuth     = errors.New("ddstore: not authenticated")
	// ErrRegion is a read into a receive region its agent does not hold
	// (never registered, unregistered, or its client's session ended). It
	// is an ErrArgument too; its own code tells a client to register its
	// buffers again and read once more.
	ErrRegion = &alias{msg: "ddstore: bad argument: no receive region", of: ErrArgument}
)

// codes are the wire numbers of the sentinels; their order is part of the
// protocol, so only append.
var codes = []error{
	nil, ErrIndex, ErrGeometry, ErrUnknown, ErrExists, ErrBuffer, ErrFreed,
	ErrClosed, ErrTimeout, ErrPeer, ErrProtocol, ErrNoAgent, ErrArgument,
	ErrInternal, ErrAuth, ErrRegion,
}

// refined is the first code whose sentinel also matches an earlier one
// (ErrRegion is an ErrArgument): Code looks for those first.
const refined = 15

// NumCodes is one more than the largest code.
var NumCodes = len(codes)

// Kind names the sentinel of a code in a word ("index", "geometry", ...):
// the label of the agent's error counters; "" for 0 and unknown codes.
func Kind(code uint16) string {
	if code == 0 || int(code) >= len(codes) {
		return ""
	}
	k := strings.TrimPrefix(codes[code].Error(), "ddstore: ")
	switch k { // one word each
	case "index out of range":
		return "index"
	case "bad geometry":
		return "geometry"
	case "unknown variable":
		return "unknown"
	case "variable exists":
		return "exists"
	case "bad buffer":
		return "buffer"
	case "variable freed":
		return "freed"
	case "timed out":
		return "timeout"
	case "peer failed":
		return "peer"
	case "protocol error":
		return "protocol"
	case "no agent":
		return "no_agent"
	case "bad argument":
		return "argument"
	case "internal error":
		return "internal"
	case "not authenticated":
		return "auth"
	case "bad argument: no receive region":
		return "region"
	}
	return strings.ReplaceAll(k, " ", "_")
}

// Code returns the wire code of err: 0 for nil, the code of the sentinel it
// wraps, or the code of ErrInternal.
func Code(err error) uint16 {
	if err == nil {
		return 0
	}
	for i, s := range codes[refined:] {
		if errors.Is(err, s) {
			return uint16(refined + i)
		}
	}
	for i, s := range codes[1:refined] {
		if errors.Is(err, s) {
			return uint16(i + 1)
		}
	}
	return Code(ErrInternal)
}

// FromCode rebuilds an error that crossed the wire: its text is the remote
// error's text and it still matches its sentinel with errors.Is.
func FromCode(code uint16, msg string) error {
	if code == 0 {
		return nil
	}
	s := ErrInternal
	if int(code) < len(codes) {
		s = codes[code]
	}
	return &remoteError{sentinel: s, msg: msg}
}

type remoteError struct {
	sentinel error
	msg      string
}

func (e *remoteError) Error() string { return e.msg }
func (e *remoteError) Unwrap() error { return e.sentinel }

// IsRemote says whether err is, or wraps, an error another process
// answered with (FromCode): the request reached it. Errors of the
// transport itself (a connection that failed, no answer) are not.
func IsRemote(err error) bool {
	var r *remoteError
	return errors.As(err, &r)
}

// Errorf wraps a sentinel with a message: Errorf(ErrIndex, "global index %d
// not in [0, %d)", g, n) reads "ddstore: index out of range: global index ...".
func Errorf(sentinel error, format string, args ...any) error {
	return fmt.Errorf("%w: %s", sentinel, fmt.Sprintf(format, args...))
}

// Alias makes a package's own sentinel that reads msg but matches one of
// the shared sentinels with errors.Is, so it crosses the wire with that
// sentinel's code.
func Alias(msg string, of error) error { return &alias{msg: msg, of: of} }

type alias struct {
	msg string
	of  error
}

func (e *alias) Error() string { return e.msg }
func (e *alias) Unwrap() error { return e.of }

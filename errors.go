package ddstore

import "github.com/ddstore-go/ddstore/internal/base"

// Errors. Every error ddstore returns wraps one of these; match them with
// errors.Is. The message names the value at fault and what was valid.
var (
	ErrIndex    = base.ErrIndex    // a global index outside [0, total rows)
	ErrGeometry = base.ErrGeometry // a row shape that is invalid or differs between ranks
	ErrUnknown  = base.ErrUnknown  // no such variable
	ErrExists   = base.ErrExists   // a variable created twice
	ErrBuffer   = base.ErrBuffer   // a buffer of the wrong size or row width
	ErrFreed    = base.ErrFreed    // a variable used after Free
	ErrClosed   = base.ErrClosed   // a Store used after Close
	ErrTimeout  = base.ErrTimeout  // ranks or a peer did not answer in time
	ErrPeer     = base.ErrPeer     // another node's agent failed or went away
	ErrProtocol = base.ErrProtocol // a malformed frame
	ErrNoAgent  = base.ErrNoAgent  // no agent could be reached or started
	ErrArgument = base.ErrArgument // any other bad argument
	ErrAuth     = base.ErrAuth     // a connection that did not prove it belongs to the job (DDSTORE_SECRET, key file)
)

// Package transport moves rows between the agents of different nodes. The
// Transport interface is what the agent needs from any engine (TCP here; MPI
// and libfabric behind build tags later); Pool and Server are the TCP
// implementation, which also carries the agents' control messages.
package transport

import (
	"context"

	"github.com/ddstore-go/ddstore/internal/wire"
)

// Transport fetches rows of a variable from the agent of another node.
type Transport interface {
	// Fetch reads rows globals[i] of variable name (table id) from the agent at addr
	// into dst[i] (each exactly one row long). It returns when every row is
	// in place, or with an error; after it returns, nothing more is written
	// into dst, also on error or timeout.
	Fetch(ctx context.Context, addr, name string, id int64, globals []int64, dst [][]byte) error
	Close() error
}

// Handler is the agent side of the peer protocol.
type Handler interface {
	// Rows returns the rows asked for of variable name (whose table has
	// that id), as slices of the node's shared memory, appended to rows;
	// release is called once they are sent.
	Rows(name string, id int64, globals []int64, rows [][]byte) (out [][]byte, release func(), err error)
	// Control answers every op but Fetch. It may block (a collective waits
	// for other ranks) and runs on its own goroutine; ctx ends when the
	// server closes.
	Control(ctx context.Context, op wire.Op, body []byte) (reply func(*wire.Encoder), err error)
}

// Package transport moves rows between the agents of different nodes. An
// Engine is what the agent needs from any of them: TCP (Pool and Server,
// which also carry the agents' control messages), MPI one-sided gets
// (build tag mpi) and libfabric RMA reads (build tag fabric); Open picks
// one by name.
package transport

import (
	"context"
	"errors"

	"github.com/ddstore-go/ddstore/internal/wire"
)

// Transport fetches rows of a variable from the agent of another node.
type Transport interface {
	// Fetch reads rows globals[i] of variable name (table id) from the agent at addr
	// into dst[i] (each exactly one row long). It returns when every row is
	// in place, or with an error; after it returns, nothing more is written
	// into dst, also on error or timeout. After an error dst's contents are
	// undefined: a reply is read with its rows straight into dst, so part
	// of an error reply's body, or of rows that came short, may be there.
	Fetch(ctx context.Context, addr, name string, id int64, globals []int64, dst [][]byte) error
	Close() error
}

// Engine is how an agent moves rows between nodes. The agent exposes each
// local shard when its variable is published and withdraws it before it
// unmaps it; a one-sided engine (mpi, fabric) then reads rows straight out
// of the owner's memory, having asked the owner once where its shards lie
// (the PeerWindow request, which the owner answers with Window). Over tcp
// nothing is exposed and the owner's agent sends the rows.
type Engine interface {
	Transport
	// Kind names the engine as --transport does: tcp, mpi or fabric.
	Kind() string
	// Expose makes a shard's memory (not Go memory: a mapped segment)
	// readable by other nodes while its token holds the table id; an
	// Exposure that is not Exposed() needs no withdrawing.
	Expose(mem []byte, id int64) (Exposure, error)
	// Withdraw takes an exposed shard out of reach and calls unmap once no
	// read of another node can touch it any more (a grace period later).
	Withdraw(e Exposure, unmap func())
	// Window is this agent's reply to a PeerWindow request: where its
	// exposed shards of one variable (rows of rowBytes) lie.
	Window(rowBytes int64, shards []ExposedShard) (func(*wire.Encoder), error)
	// Serial says whether concurrent fetches from one node take turns
	// anyway (MPI's window), so that a read is not cut into pieces.
	Serial() bool
	// Collective says whether Close is collective (MPI: every agent of the
	// world must call it), so that an agent that failed to start leaves it
	// to its launcher rather than wait for the others.
	Collective() bool
}

// ExposedShard is one exposed shard of a variable as Window describes it:
// its rows [First, First+Rows) and where they are exposed.
type ExposedShard struct {
	First, Rows int64
	Exposure
}

// RangeFetcher is an Engine that reads contiguous rows of one node in one
// request (tcp: FetchRange); the others read them row by row (Fetch).
type RangeFetcher interface {
	FetchRange(ctx context.Context, addr, name string, id, start, count int64, dst []byte) error
}

// ErrConnClosed is the cause of a control request's context
// (Handler.Control) when the connection it came on closed before it was
// answered: its asker cannot hear the answer any more.
var ErrConnClosed = errors.New("the connection the request came on closed")

// Handler is the agent side of the peer protocol.
type Handler interface {
	// Rows returns the rows asked for of variable name (whose table has
	// that id), as slices of the node's shared memory, appended to rows;
	// release is called once they are sent.
	Rows(name string, id int64, globals []int64, rows [][]byte) (out [][]byte, release func(), err error)
	// RowsRange returns the rows [start, start+count) of variable name,
	// all of this node, as slices of its shared memory (one per shard),
	// appended to rows; release is called once they are sent.
	RowsRange(name string, id, start, count int64, rows [][]byte) (out [][]byte, release func(), err error)
	// Control answers every op but Fetch. It may block (a collective waits
	// for other ranks) and runs on its own goroutine; ctx ends when the
	// server closes, or with cause ErrConnClosed when the connection the
	// request came on closes (the peer went, or dropped the connection).
	Control(ctx context.Context, op wire.Op, body []byte) (reply func(*wire.Encoder), err error)
}

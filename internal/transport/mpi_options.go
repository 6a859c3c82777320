package transport

// The MPI transport's options, limits and PeerWindow reply, which need no
// MPI: mpi.go (build tag mpi, cgo) moves the bytes; without the tag,
// mpi_stub.go refuses to start.

import (
	"context"
	"log/slog"
	"time"

	"github.com/ddstore-go/ddstore/internal/base"
	"github.com/ddstore-go/ddstore/internal/wire"
)

// MPIOptions configure the MPI transport.
type MPIOptions struct {
	// Describe asks the agent at addr where its shards of variable name
	// (table id) lie in its MPI window: the PeerWindow op, over the TCP
	// connections that carry the agents' control messages. Its errors are
	// the Fetch's (ErrFreed for a stale id, ErrPeer for an agent gone).
	Describe func(ctx context.Context, addr, name string, id int64) (wire.Window, error)
	// Grace is how long a withdrawn shard stays mapped after it left the
	// window, so that a get another agent issued just before cannot touch
	// unmapped memory (Open MPI retries a failed shared-memory read
	// forever). Zero: 30 s.
	Grace  time.Duration
	Logger *slog.Logger
}

func (o MPIOptions) withDefaults() MPIOptions {
	if o.Grace <= 0 {
		o.Grace = 30 * time.Second
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	return o
}

// MaxMPIGet bounds one MPI get: counts are C ints, so a longer run of bytes
// (a huge row, or adjacent rows merged) is cut into gets of at most this.
const MaxMPIGet = 1 << 30

// errNoMPI is what a build without the tag says.
func errNoMPI() error {
	return base.Errorf(base.ErrArgument, "transport mpi: this ddstore was built without MPI: rebuild with -tags mpi (make build-mpi)")
}

// windows is the MPI transport's cache.
type windows = windowCache[wire.Window]

// Kind is KindMPI.
func (*MPI) Kind() string { return KindMPI }

// Serial: the gets of one agent take turns on its window (getMu).
func (*MPI) Serial() bool { return true }

// Collective: Close frees the window and ends MPI, with every agent.
func (*MPI) Collective() bool { return true }

// Window is this agent's PeerWindow reply: its rank and world, and where
// the shards lie in its window.
func (m *MPI) Window(rowBytes int64, shards []ExposedShard) (func(*wire.Encoder), error) {
	w := wire.Window{World: m.World(), Rank: int64(m.Rank()), RowBytes: rowBytes}
	for _, s := range shards {
		w.Shards = append(w.Shards, wire.WindowShard{First: s.First, Rows: s.Rows, Addr: s.Addr, Token: s.Token})
	}
	return w.Encode, nil
}

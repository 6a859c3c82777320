package transport

// Open, the engines by name, and the TCP engine: rows over the Pool.

import (
	"context"
	"log/slog"
	"sync/atomic"
	"time"

	"github.com/ddstore-go/ddstore/internal/base"
	"github.com/ddstore-go/ddstore/internal/wire"
)

// The engines' names, as --transport takes them.
const (
	KindTCP    = "tcp"
	KindMPI    = "mpi"
	KindFabric = "fabric"
)

// EngineOptions configure Open.
type EngineOptions struct {
	// Pool carries the rows over tcp, and the PeerWindow requests of the
	// one-sided engines; its owner closes it (it carries the agents'
	// control messages too).
	Pool *Pool
	// Timeout bounds one PeerWindow request.
	Timeout time.Duration
	// Grace is how long a withdrawn shard stays mapped (MPIOptions.Grace,
	// FabricOptions.Grace).
	Grace  time.Duration
	Logger *slog.Logger
}

// Open starts the engine named kind (KindTCP, KindMPI or KindFabric). MPI
// is collective: every agent of the MPI world must open it.
func Open(kind string, o EngineOptions) (Engine, error) {
	ask := func(ctx context.Context, addr, name string, id int64) ([]byte, error) {
		ctx, cancel := context.WithTimeout(ctx, o.Timeout)
		defer cancel()
		m := wire.PeerWindow{Name: name, ID: id}
		return o.Pool.Call(ctx, addr, wire.OpPeerWindow, m.Encode)
	}
	switch kind {
	case KindTCP:
		return &tcpEngine{p: o.Pool}, nil
	case KindMPI:
		m, err := NewMPI(MPIOptions{Grace: o.Grace, Logger: o.Logger,
			Describe: func(ctx context.Context, addr, name string, id int64) (wire.Window, error) {
				b, err := ask(ctx, addr, name, id)
				if err != nil {
					return wire.Window{}, err
				}
				return wire.DecodeWindow(b)
			}})
		if err != nil {
			return nil, err
		}
		return m, nil
	case KindFabric:
		f, err := NewFabric(FabricOptions{Grace: o.Grace, Logger: o.Logger,
			Describe: func(ctx context.Context, addr, name string, id int64) (FabricWindow, error) {
				b, err := ask(ctx, addr, name, id)
				if err != nil {
					return FabricWindow{}, err
				}
				return DecodeFabricWindow(b)
			}})
		if err != nil {
			return nil, err
		}
		return f, nil
	}
	return nil, base.Errorf(base.ErrArgument, "transport %q: want %s, %s or %s", kind, KindTCP, KindMPI, KindFabric)
}

// tcpEngine moves rows over the pool's connections: the owner's agent
// sends them (Server), so nothing is exposed.
type tcpEngine struct {
	p *Pool
	// closed: Close was called. Fetches fail from then on, as the
	// one-sided engines' do, while the pool (which also carries the
	// agents' control messages) stays its owner's to close.
	closed atomic.Bool
}

func (t *tcpEngine) Fetch(ctx context.Context, addr, name string, id int64, globals []int64, dst [][]byte) error {
	if t.closed.Load() {
		return base.Errorf(base.ErrClosed, "transport closed")
	}
	return t.p.Fetch(ctx, addr, name, id, globals, dst)
}

// FetchRange implements RangeFetcher.
func (t *tcpEngine) FetchRange(ctx context.Context, addr, name string, id, start, count int64, dst []byte) error {
	if t.closed.Load() {
		return base.Errorf(base.ErrClosed, "transport closed")
	}
	return t.p.FetchRange(ctx, addr, name, id, start, count, dst)
}

// Close ends the engine's fetches and leaves the pool to its owner.
func (t *tcpEngine) Close() error {
	t.closed.Store(true)
	return nil
}

func (*tcpEngine) Kind() string { return KindTCP }

func (*tcpEngine) Expose(mem []byte, _ int64) (Exposure, error) {
	return Exposure{mem: mem, slot: -1}, nil
}

func (*tcpEngine) Withdraw(_ Exposure, unmap func()) { unmap() }

func (*tcpEngine) Window(int64, []ExposedShard) (func(*wire.Encoder), error) {
	return nil, base.Errorf(base.ErrArgument, "transport %s: rows move over TCP here, no shard is exposed for one-sided reads: start every agent of the job with the same --transport", KindTCP)
}

func (*tcpEngine) Serial() bool     { return false }
func (*tcpEngine) Collective() bool { return false }

package agent

// The agent's side of the MPI transport (transport.MPI, build tag mpi): its
// published shards are attached to its MPI window while other nodes may
// read them, and it tells a reader where they lie (PeerWindow). Control
// messages stay on TCP.

import (
	"context"
	"maps"
	"slices"

	"github.com/ddstore-go/ddstore/internal/base"
	"github.com/ddstore-go/ddstore/internal/transport"
	"github.com/ddstore-go/ddstore/internal/wire"
)

// Transports are the names --transport takes.
const (
	TransportTCP = "tcp"
	TransportMPI = "mpi"
	// TransportFabric: libfabric RMA reads (fabric.go).
	TransportFabric = "fabric"
)

// startTransport picks how rows of other nodes are fetched: over the TCP
// pool, or with MPI one-sided gets (the agent must then be an MPI rank,
// one per node, all of one launch).
func (a *Agent) startTransport() error {
	a.fetcher = a.pool
	switch a.cfg.Transport {
	case "", TransportTCP:
		return nil
	case TransportMPI:
		m, err := transport.NewMPI(transport.MPIOptions{Describe: a.describeWindow, Grace: a.cfg.Timeout, Logger: a.log})
		if err != nil {
			return err
		}
		a.mpi, a.fetcher = m, m
		return nil
	case TransportFabric:
		return a.startFabric()
	}
	return base.Errorf(base.ErrArgument, "transport %q: want %s, %s or %s", a.cfg.Transport, TransportTCP, TransportMPI, TransportFabric)
}

// transportName is what info says.
func (a *Agent) transportName() string {
	if a.mpi != nil {
		return TransportMPI
	}
	if a.fab != nil {
		return TransportFabric
	}
	return TransportTCP
}

// peerWindow asks the agent at addr where its shards of a variable lie
// (PeerWindow): the reply, which the one-sided transport in use decodes.
func (a *Agent) peerWindow(ctx context.Context, addr, name string, id int64) ([]byte, error) {
	ctx, cancel := context.WithTimeout(ctx, a.cfg.Timeout)
	defer cancel()
	m := wire.PeerWindow{Name: name, ID: id}
	return a.pool.Call(ctx, addr, wire.OpPeerWindow, m.Encode)
}

// describeWindow asks the agent at addr where its shards of a variable lie
// in its MPI window.
func (a *Agent) describeWindow(ctx context.Context, addr, name string, id int64) (wire.Window, error) {
	body, err := a.peerWindow(ctx, addr, name, id)
	if err != nil {
		return wire.Window{}, err
	}
	return wire.DecodeWindow(body)
}

// exposedShards are v's shards in this agent's window, by rank, as
// PeerWindow describes them, with their exposures; the caller holds v.mu.
func exposedShards(v *variable) ([]wire.WindowShard, []transport.Exposure) {
	var shards []wire.WindowShard
	var exps []transport.Exposure
	for _, r := range slices.Sorted(maps.Keys(v.exposed)) {
		e := v.exposed[r]
		shards = append(shards, wire.WindowShard{First: v.lay.First(r), Rows: v.lay.ShardRows(r), Addr: e.Addr, Token: e.Token})
		exps = append(exps, e)
	}
	return shards, exps
}

// window answers PeerWindow: this node's exposed shards of a variable.
func (a *Agent) window(name string, id int64) (wire.Window, error) {
	if a.mpi == nil {
		return wire.Window{}, base.Errorf(base.ErrArgument, "the agent of node %q runs the %s transport, not %s: start every agent of the job with the same --transport", a.cfg.Node, TransportTCP, TransportMPI)
	}
	v, err := a.served(name, id)
	if err != nil {
		return wire.Window{}, err
	}
	defer v.mu.RUnlock()
	w := wire.Window{World: a.mpi.World(), Rank: int64(a.mpi.Rank()), RowBytes: v.lay.Bytes()}
	w.Shards, _ = exposedShards(v)
	return w, nil
}

// expose attaches the local shards of a variable just published to the
// MPI window; the caller holds v.mu. A shard that cannot be attached stays
// readable locally; readers of other nodes are told it is not exposed.
func (v *variable) expose(a *Agent) {
	x := a.exposer()
	if x == nil {
		return
	}
	v.mpi = x
	for r, seg := range v.byRank {
		if seg == nil || len(seg.Data) == 0 {
			continue
		}
		e, err := x.Expose(seg.Data, v.table.ID)
		if err != nil {
			a.log.Error("cannot expose a shard for one-sided reads (mpi or fabric); other nodes cannot read it", "variable", v.name, "rank", r, "err", err)
			continue
		}
		if !e.Exposed() {
			continue
		}
		if v.exposed == nil {
			v.exposed = make(map[int]transport.Exposure)
		}
		v.exposed[r] = e
	}
}

// release unmaps a local segment: at once, or, if it is in the MPI window,
// once withdrawn from it (transport.MPI.Withdraw: after a grace period).
// The caller holds v.mu.
func (v *variable) release(r int, seg interface{ Close() error }) {
	e, ok := v.exposed[r]
	if !ok {
		seg.Close()
		return
	}
	delete(v.exposed, r)
	v.mpi.Withdraw(e, func() { seg.Close() })
}

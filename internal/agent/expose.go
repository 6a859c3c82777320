package agent

// The agent's side of its row engine (transport.Engine): which one it
// runs, its published shards exposed while other nodes may read them and
// withdrawn before they are unmapped, and the PeerWindow answer that tells
// a reader of a one-sided engine (mpi, fabric) where they lie. Control
// messages stay on TCP whatever the engine.

import (
	"maps"
	"slices"

	"github.com/ddstore-go/ddstore/internal/base"
	"github.com/ddstore-go/ddstore/internal/transport"
	"github.com/ddstore-go/ddstore/internal/wire"
)

// Transports are the names --transport takes.
const (
	TransportTCP = transport.KindTCP
	// TransportMPI: one-sided MPI gets, for agents started as the ranks of
	// one MPI launch, one per node (build tag mpi).
	TransportMPI = transport.KindMPI
	// TransportFabric: libfabric RMA reads (build tag fabric).
	TransportFabric = transport.KindFabric
)

// startTransport starts the engine that fetches rows of other nodes; the
// pool must exist (it carries the rows over tcp, and the PeerWindow
// requests otherwise).
func (a *Agent) startTransport() error {
	kind := a.cfg.Transport
	if kind == "" {
		kind = TransportTCP
	}
	e, err := transport.Open(kind, transport.EngineOptions{Pool: a.pool, Timeout: a.cfg.Timeout, Grace: a.cfg.Timeout, Logger: a.log})
	if err != nil {
		return err
	}
	a.rows = e
	return nil
}

// transportName is what info says.
func (a *Agent) transportName() string {
	if a.rows == nil {
		return TransportTCP
	}
	return a.rows.Kind()
}

// exposedShards are v's shards exposed by this agent, by rank, as
// PeerWindow describes them; the caller holds v.mu.
func exposedShards(v *variable) []transport.ExposedShard {
	var shards []transport.ExposedShard
	for _, r := range slices.Sorted(maps.Keys(v.exposed)) {
		shards = append(shards, transport.ExposedShard{First: v.lay.First(r), Rows: v.lay.ShardRows(r), Exposure: v.exposed[r]})
	}
	return shards
}

// window answers PeerWindow: this node's exposed shards of a variable.
func (a *Agent) window(name string, id int64) (func(*wire.Encoder), error) {
	v, err := a.served(name, id)
	if err != nil {
		return nil, err
	}
	defer v.mu.RUnlock()
	if v.table.Ragged() {
		return nil, base.Errorf(base.ErrArgument, "variable %q has ragged rows, which move over TCP (Fetch) whatever the transport: no window", name)
	}
	return a.rows.Window(v.lay.Bytes(), exposedShards(v))
}

// expose makes the local shards of a variable just published readable by
// other nodes' engines; the caller holds v.mu. A shard that cannot be
// exposed stays readable locally; readers of other nodes are told it is
// not exposed.
func (v *variable) expose(a *Agent) {
	v.rows = a.rows
	if v.table.Ragged() {
		return // ragged rows move over TCP whatever the engine (ragged.go)
	}
	for r, seg := range v.byRank {
		if seg == nil || len(seg.Data) == 0 {
			continue
		}
		e, err := v.rows.Expose(seg.Data, v.table.ID)
		if err != nil {
			a.log.Error("cannot expose a shard for one-sided reads; other nodes cannot read it", "transport", v.rows.Kind(), "variable", v.name, "rank", r, "err", err)
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

// release unmaps a local segment: at once, or, if it is exposed, once the
// engine has withdrawn it (after a grace period). The caller holds v.mu.
func (v *variable) release(r int, seg interface{ Close() error }) {
	e, ok := v.exposed[r]
	if !ok {
		seg.Close()
		return
	}
	delete(v.exposed, r)
	v.rows.Withdraw(e, func() { seg.Close() })
}

package agent

// The agent's side of the libfabric transport (transport.Fabric, build tag
// fabric): its published shards are registered for remote reads while
// other nodes may read them, and it tells a reader its endpoint and where
// they lie under which keys (PeerWindow). Control messages stay on TCP.
// The transport's progress loop serves other agents' reads whatever this
// agent's clients do.

import (
	"context"

	"github.com/ddstore-go/ddstore/internal/transport"
	"github.com/ddstore-go/ddstore/internal/wire"
)

// exposer is a transport that reads shards straight out of an owner's
// memory (mpi, fabric): shards are exposed when published and withdrawn
// before they are unmapped.
type exposer interface {
	Expose(mem []byte, id int64) (transport.Exposure, error)
	Withdraw(e transport.Exposure, unmap func())
}

// exposer is this agent's one-sided transport, nil over tcp.
func (a *Agent) exposer() exposer {
	switch {
	case a.mpi != nil:
		return a.mpi
	case a.fab != nil:
		return a.fab
	}
	return nil
}

func (a *Agent) startFabric() error {
	f, err := transport.NewFabric(transport.FabricOptions{Describe: a.describeFabric, Grace: a.cfg.Timeout, Logger: a.log})
	if err != nil {
		return err
	}
	a.fab, a.fetcher = f, f
	return nil
}

// describeFabric asks the agent at addr for its endpoint and where its
// shards of a variable lie.
func (a *Agent) describeFabric(ctx context.Context, addr, name string, id int64) (transport.FabricWindow, error) {
	body, err := a.peerWindow(ctx, addr, name, id)
	if err != nil {
		return transport.FabricWindow{}, err
	}
	return transport.DecodeFabricWindow(body)
}

// fabricWindow answers PeerWindow under the fabric transport.
func (a *Agent) fabricWindow(name string, id int64) (func(*wire.Encoder), error) {
	v, err := a.served(name, id)
	if err != nil {
		return nil, err
	}
	defer v.mu.RUnlock()
	w := transport.FabricWindow{Provider: a.fab.Provider(), Name: a.fab.Name(), TokenKey: a.fab.TokenKey(),
		Window: wire.Window{RowBytes: v.lay.Bytes()}}
	shards, exps := exposedShards(v)
	w.Window.Shards = shards
	for _, e := range exps {
		w.Keys = append(w.Keys, a.fab.Key(e))
	}
	return w.Encode, nil
}

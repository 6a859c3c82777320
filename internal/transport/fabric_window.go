package transport

// The parts of the libfabric transport that need no libfabric: its
// options and the PeerWindow reply of an agent of that transport (where
// its shards lie, under which keys, and its endpoint's name). fabric.go
// (build tag fabric, cgo) moves the bytes; without the tag,
// fabric_stub.go refuses to start.

import (
	"context"
	"log/slog"
	"time"

	"github.com/ddstore-go/ddstore/internal/base"
	"github.com/ddstore-go/ddstore/internal/wire"
)

// FabricOptions configure the libfabric transport.
type FabricOptions struct {
	// Provider is the libfabric provider to use ("tcp", "sockets",
	// "verbs", ...); empty: DDSTORE_FABRIC, else whatever libfabric offers
	// first (FI_PROVIDER, read by libfabric itself, narrows that).
	Provider string
	// Describe asks the agent at addr where its shards of variable name
	// (table id) lie: the PeerWindow op over the TCP control connections.
	Describe func(ctx context.Context, addr, name string, id int64) (FabricWindow, error)
	// Grace is how long a withdrawn shard stays mapped after its memory
	// region was closed, so that a read another agent's provider is
	// serving right then never touches unmapped memory. Zero: 30 s.
	Grace  time.Duration
	Logger *slog.Logger
	// NoProgress stops the agent's own progress loop (tests only: it is
	// what makes a read of an idle agent hang on a provider with manual
	// progress, DDStore's loopback deadlock).
	NoProgress bool
}

func (o FabricOptions) withDefaults() FabricOptions {
	if o.Grace <= 0 {
		o.Grace = 30 * time.Second
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	return o
}

// FabricWindow is an agent's PeerWindow reply under the libfabric
// transport: its endpoint, and its shards of a variable as remote
// addresses and keys of registered memory.
type FabricWindow struct {
	Provider string // the owner's provider: a reader must use the same
	Name     []byte // the owner's endpoint name (fi_getname)
	TokenKey uint64 // key of the owner's token words
	Keys     []uint64
	// Window is the shards: Addr and Token are remote addresses (virtual
	// addresses or offsets, as the provider's mr_mode has it), Keys[i] the
	// key of Shards[i]; World and Rank are unused.
	Window wire.Window
}

func (m *FabricWindow) Encode(e *wire.Encoder) {
	e.String(m.Provider)
	e.String(string(m.Name))
	e.U64(m.TokenKey)
	e.U32(uint32(len(m.Keys)))
	for _, k := range m.Keys {
		e.U64(k)
	}
	var w wire.Encoder
	m.Window.Encode(&w)
	e.String32(string(w.Bytes()))
}

// DecodeFabricWindow reads a FabricWindow and checks it.
func DecodeFabricWindow(b []byte) (m FabricWindow, err error) {
	d := wire.NewDecoder(b)
	m.Provider = d.String()
	m.Name = []byte(d.String())
	m.TokenKey = d.U64()
	n := int(d.U32())
	if d.Err() == nil && n > len(b)/8 {
		return m, base.Errorf(base.ErrProtocol, "fabric window: %d keys in %d bytes", n, len(b))
	}
	for range n {
		m.Keys = append(m.Keys, d.U64())
	}
	inner := d.String32()
	if err := d.Done(); err != nil {
		return m, err
	}
	if m.Window, err = wire.DecodeWindow([]byte(inner)); err != nil {
		return m, err
	}
	if len(m.Keys) != len(m.Window.Shards) {
		return m, base.Errorf(base.ErrProtocol, "fabric window: %d keys for %d shards", len(m.Keys), len(m.Window.Shards))
	}
	if len(m.Name) == 0 {
		return m, base.Errorf(base.ErrProtocol, "fabric window: no endpoint name")
	}
	return m, nil
}

// errNoFabric is what a build without the tag says.
func errNoFabric() error {
	return base.Errorf(base.ErrArgument, "transport fabric: this ddstore was built without libfabric: rebuild with -tags fabric (make build-fabric; needs libfabric-dev)")
}

// Kind is KindFabric.
func (*Fabric) Kind() string { return KindFabric }

// Serial: reads of one peer run side by side.
func (*Fabric) Serial() bool { return false }

// Collective: each agent closes its endpoint alone.
func (*Fabric) Collective() bool { return false }

// Window is this agent's PeerWindow reply: its endpoint, and where its
// shards lie under which keys.
func (fb *Fabric) Window(rowBytes int64, shards []ExposedShard) (func(*wire.Encoder), error) {
	w := FabricWindow{Provider: fb.Provider(), Name: fb.Name(), TokenKey: fb.TokenKey(), Window: wire.Window{RowBytes: rowBytes}}
	for _, s := range shards {
		w.Window.Shards = append(w.Window.Shards, wire.WindowShard{First: s.First, Rows: s.Rows, Addr: s.Addr, Token: s.Token})
		w.Keys = append(w.Keys, fb.Key(s.Exposure))
	}
	return w.Encode, nil
}

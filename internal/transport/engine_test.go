package transport

import (
	"errors"
	"testing"

	"github.com/ddstore-go/ddstore/internal/base"
)

// What the tcp engine is beyond the conformance suite: its reads take no
// turns, its Close is its own, it exposes nothing and refuses to describe
// a window; Open refuses a transport it does not know.
func TestOpenTCP(t *testing.T) {
	p := newPool(t, Options{})
	e, err := Open(KindTCP, EngineOptions{Pool: p})
	if err != nil {
		t.Fatal(err)
	}
	if e.Kind() != KindTCP || e.Serial() || e.Collective() {
		t.Errorf("tcp engine: kind %q, serial %v, collective %v", e.Kind(), e.Serial(), e.Collective())
	}
	x, err := e.Expose(make([]byte, 8), 1)
	if err != nil || x.Exposed() {
		t.Fatalf("Expose over tcp: %+v, %v; want nothing exposed", x, err)
	}
	if _, err := e.Window(8, nil); !errors.Is(err, base.ErrArgument) {
		t.Errorf("Window over tcp: %v, want ErrArgument", err)
	}
	if _, err := Open("carrier-pigeon", EngineOptions{Pool: p}); !errors.Is(err, base.ErrArgument) {
		t.Errorf("Open of an unknown transport: %v, want ErrArgument", err)
	}
}

//go:build fabric && cgo

package transport

// The libfabric transport between endpoints of this process, over the
// provider DDSTORE_FABRIC names (tcp when unset) on loopback: the
// conformance suite (conformance_test.go), and what is libfabric's own.
// Each Fabric has its own fabric, domain and completion queue, so an owner
// serves a read only when its own progress loop polls;
// TestFabricProgressNeeded shows that the read hangs without it (DDStore's
// loopback deadlock) and completes with it.

import (
	"context"
	"encoding/binary"
	"os"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/ddstore-go/ddstore/internal/wire"
)

const (
	fabRB    = 4096
	fabRowsA = 300 // global rows [0, 300)
	fabRowsB = 50  // global rows [300, 350)
	fabID    = 7
)

func fabricProvider() string {
	if p := os.Getenv("DDSTORE_FABRIC"); p != "" {
		return p
	}
	return "tcp"
}

func newTestFabric(t *testing.T, noProgress bool) *Fabric {
	t.Helper()
	fb, err := NewFabric(FabricOptions{Provider: fabricProvider(), Grace: 50 * time.Millisecond, Logger: discardLog(), NoProgress: noProgress})
	if err != nil {
		t.Skipf("no libfabric endpoint: %v", err)
	}
	t.Cleanup(func() { fb.Close() })
	return fb
}

// fabShard maps rows of the global pattern outside Go's heap, as a segment.
func fabShard(t *testing.T, rows int, first int64) []byte {
	t.Helper()
	mem, err := unix.Mmap(-1, 0, rows*fabRB, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_ANON|unix.MAP_PRIVATE)
	if err != nil {
		t.Fatal(err)
	}
	for r := range rows {
		fabFill(mem[r*fabRB:(r+1)*fabRB], first+int64(r))
	}
	return mem
}

func fabFill(row []byte, g int64) {
	for i := 0; i < len(row); i += 8 {
		binary.LittleEndian.PutUint64(row[i:], uint64(g)<<20|uint64(i))
	}
}

func fabRowIs(row []byte, g int64) bool {
	for i := 0; i < len(row); i += 8 {
		if binary.LittleEndian.Uint64(row[i:]) != uint64(g)<<20|uint64(i) {
			return false
		}
	}
	return true
}

// fabOwner exposes two shards and returns what its PeerWindow would say.
func fabOwner(t *testing.T, fb *Fabric) (FabricWindow, []Exposure, [][]byte) {
	t.Helper()
	a, b := fabShard(t, fabRowsA, 0), fabShard(t, fabRowsB, fabRowsA)
	w := FabricWindow{Provider: fb.Provider(), Name: fb.Name(), TokenKey: fb.TokenKey(), Window: wire.Window{RowBytes: fabRB}}
	var es []Exposure
	for i, mem := range [][]byte{a, b} {
		e, err := fb.Expose(mem, fabID)
		if err != nil {
			t.Fatal(err)
		}
		if !e.Exposed() {
			t.Fatal("shard not exposed")
		}
		es = append(es, e)
		first, rows := int64(0), int64(fabRowsA)
		if i == 1 {
			first, rows = fabRowsA, fabRowsB
		}
		w.Window.Shards = append(w.Window.Shards, wire.WindowShard{First: first, Rows: rows, Addr: e.Addr, Token: e.Token})
		w.Keys = append(w.Keys, fb.Key(e))
	}
	// The reply goes over the wire in an agent; so it does here.
	var enc wire.Encoder
	w.Encode(&enc)
	w, err := DecodeFabricWindow(enc.Bytes())
	if err != nil {
		t.Fatal(err)
	}
	return w, es, [][]byte{a, b}
}

func fabReader(t *testing.T, w FabricWindow) *Fabric {
	t.Helper()
	fb, err := NewFabric(FabricOptions{Provider: fabricProvider(), Logger: discardLog(),
		Describe: func(context.Context, string, string, int64) (FabricWindow, error) { return w, nil }})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { fb.Close() })
	return fb
}

func fabFetch(fb *Fabric, globals []int64) ([][]byte, error) {
	dst := make([][]byte, len(globals))
	buf := make([]byte, len(globals)*fabRB)
	for i := range dst {
		dst[i] = buf[i*fabRB : (i+1)*fabRB]
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	return dst, fb.Fetch(ctx, "owner:1", "x", fabID, globals, dst)
}

// TestConformanceFabric runs the conformance suite over libfabric: a
// reader and two owner endpoints of this process, on loopback.
func TestConformanceFabric(t *testing.T) {
	if os.Getenv("DDSTORE_FABRIC") == "" {
		t.Setenv("DDSTORE_FABRIC", fabricProvider())
	}
	testEngine(t, KindFabric, func(t *testing.T) confNet {
		return confLocalNet(t, func(t *testing.T, p *Pool) Engine { return openEngine(t, KindFabric, p) })
	})
}

// TestFabricProgressNeeded is DDStore's loopback deadlock: a read of an
// agent that does not call into libfabric (its clients idle) waits for it
// on a provider with manual progress. Without its progress loop the read
// stays pending; once the loop runs, as it always does in an agent, the
// read completes.
func TestFabricProgressNeeded(t *testing.T) {
	owner := newTestFabric(t, true)
	w, _, _ := fabOwner(t, owner)
	r := fabReader(t, w)
	done := make(chan error, 1)
	var dst [][]byte
	go func() {
		var err error
		dst, err = fabFetch(r, []int64{1, 2, 3, 299, 300, 349})
		done <- err
	}()
	select {
	case err := <-done:
		// The provider progresses by itself (sockets has a progress
		// thread): nothing to deadlock on.
		t.Logf("read completed without the owner's progress loop (provider %s): %v", owner.Provider(), err)
		if err != nil {
			t.Fatal(err)
		}
		return
	case <-time.After(500 * time.Millisecond):
		t.Logf("read pending while the owner makes no progress (provider %s), as expected", owner.Provider())
	}
	owner.wg.Add(1)
	go owner.progress()
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(15 * time.Second):
		t.Fatal("the read did not complete within 15 s of the owner's progress loop starting")
	}
	for i, g := range []int64{1, 2, 3, 299, 300, 349} {
		if !fabRowIs(dst[i], g) {
			t.Fatalf("row %d wrong", g)
		}
	}
}

// TestFabricWindowDecode rejects replies a reader could not use.
func TestFabricWindowDecode(t *testing.T) {
	w := FabricWindow{Provider: "tcp", Name: []byte{1, 2}, Keys: []uint64{1}, Window: wire.Window{RowBytes: 8, Shards: []wire.WindowShard{{First: 0, Rows: 1, Addr: 0, Token: 8}}}}
	var e wire.Encoder
	w.Encode(&e)
	if _, err := DecodeFabricWindow(e.Bytes()); err != nil {
		t.Fatal(err)
	}
	w.Keys = nil
	e = wire.Encoder{}
	w.Encode(&e)
	if _, err := DecodeFabricWindow(e.Bytes()); err == nil {
		t.Fatal("a window with fewer keys than shards decoded")
	}
	if _, err := DecodeFabricWindow(e.Bytes()[:3]); err == nil {
		t.Fatal("a short window decoded")
	}
}

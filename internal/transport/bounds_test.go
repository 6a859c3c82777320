package transport

import (
	"fmt"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/ddstore-go/ddstore/internal/auth"
	"github.com/ddstore-go/ddstore/internal/testutil"
	"github.com/ddstore-go/ddstore/internal/wire"
)

// TestServerShedsUnauthenticated: a server holds at most MaxUnauthenticated
// connections that have not proved the key; one more is closed on arrival
// (counted), while those held still get their handshake, and once they
// are gone a new connection authenticates as ever. (Without the bound,
// every idle connection is held until its handshake deadline: the extra
// one would be closed only after the first ones' deadlines had passed.)
func TestServerShedsUnauthenticated(t *testing.T) {
	k := auth.Generate()
	h := newFakeHandler()
	s := NewServer(listen(t), h, discardLog(), 5*time.Second, func() (auth.Key, error) { return k, nil })
	var once sync.Once
	t.Cleanup(func() { h.release(); once.Do(func() { s.Close() }) })
	dial := func() net.Conn {
		c, err := net.Dial("tcp", s.Addr())
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		return c
	}
	held := make([]net.Conn, MaxUnauthenticated)
	for i := range held {
		held[i] = dial()
	}
	testutil.WaitFor(t, 20*time.Second, func() error {
		if n := s.Unauthenticated(); n != MaxUnauthenticated {
			return fmt.Errorf("%d connections authenticating, want %d", n, MaxUnauthenticated)
		}
		return nil
	})
	extra := dial()
	var b [1]byte
	if n, err := extra.Read(b[:]); err == nil {
		t.Fatalf("connection over the bound: read %d bytes, want it closed", n)
	}
	if n := s.Shed.Load(); n != 1 {
		t.Fatalf("Shed = %d, want 1", n)
	}
	// The first connection, older than the one shed, is still served.
	held[0].SetDeadline(time.Now().Add(20 * time.Second))
	if err := auth.Initiate(held[0], k, auth.Peer); err != nil {
		t.Fatalf("a held connection's handshake: %v", err)
	}
	for _, c := range held[1:] {
		c.Close()
	}
	testutil.WaitFor(t, 20*time.Second, func() error {
		if n := s.Unauthenticated(); n != 0 {
			return fmt.Errorf("%d connections authenticating, want 0", n)
		}
		return nil
	})
	p := newPool(t, Options{ConnsPerPeer: 1, Timeout: 5 * time.Second, Key: func() (auth.Key, error) { return k, nil }})
	if _, err := p.Call(t.Context(), s.Addr(), opEcho, (&wire.Text{Text: "x"}).Encode); err != nil {
		t.Fatalf("a new connection after the others left: %v", err)
	}
}

// TestServerBoundsInFlight: a peer that pipelines control requests without
// reading the replies gets at most MaxInFlight of them answered at once;
// the server stops reading its connection meanwhile (counted), and answers
// every request once replies are read again.
func TestServerBoundsInFlight(t *testing.T) {
	h := newFakeHandler()
	s, _ := startServer(t, h)
	c, err := net.Dial("tcp", s.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	const n = MaxInFlight + 50
	var req []byte
	for id := uint64(1); id <= n; id++ {
		req = wire.AppendFrame(req, opBlock, 0, id, 0, nil)
	}
	if _, err := c.Write(req); err != nil { // 32 bytes each: the socket takes them all
		t.Fatal(err)
	}
	testutil.WaitFor(t, 20*time.Second, func() error {
		if in, th := h.ctlIn.Load(), s.Throttled.Load(); in != MaxInFlight || th == 0 {
			return fmt.Errorf("%d requests under way (throttled %d times): want %d and the read loop waiting", in, th, MaxInFlight)
		}
		return nil
	})
	if m := h.ctlMax.Load(); m > MaxInFlight {
		t.Fatalf("%d requests of one connection under way at once: want at most %d", m, MaxInFlight)
	}
	h.ctlGate.open()
	c.SetReadDeadline(time.Now().Add(20 * time.Second))
	seen := make(map[uint64]bool, n)
	var buf []byte
	for len(seen) < n {
		hd, body, err := wire.ReadFrame(c, buf)
		buf = body[:0]
		if err != nil {
			t.Fatalf("after %d replies: %v", len(seen), err)
		}
		if err := wire.StatusError(hd, body); err != nil || seen[hd.ID] {
			t.Fatalf("reply #%d: %v (seen before: %v)", hd.ID, err, seen[hd.ID])
		}
		seen[hd.ID] = true
	}
	if m := h.ctlMax.Load(); m > MaxInFlight {
		t.Fatalf("%d requests of one connection under way at once: want at most %d", m, MaxInFlight)
	}
}

package transport

import (
	"context"
	"fmt"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ddstore-go/ddstore/internal/auth"
	"github.com/ddstore-go/ddstore/internal/base"
)

// TestAuthenticatedConnections: with a key, every connection proves it
// before its first request; a pool with another key, or none, is refused
// and counted, and a server without a key yet refuses everyone, saying why.
func TestAuthenticatedConnections(t *testing.T) {
	k := auth.Generate()
	keyOf := func(k auth.Key) func() (auth.Key, error) { return func() (auth.Key, error) { return k, nil } }
	notYet := func() (auth.Key, error) { return auth.Key{}, base.Errorf(base.ErrAuth, "no key here yet") }
	cases := []struct {
		name      string
		server    func() (auth.Key, error)
		pool      func() (auth.Key, error)
		ok        bool
		says      string
		sentinels []error
	}{
		{"same key", keyOf(k), keyOf(k), true, "", nil},
		{"another key", keyOf(k), keyOf(auth.Generate()), false, "does not hold this key", []error{base.ErrAuth}},
		// A pool that does not authenticate sends a Fetch at once: refused.
		{"pool without a key", keyOf(k), nil, false, "before the authentication handshake", []error{base.ErrAuth}},
		{"server without a key yet", notYet, keyOf(k), false, "no key here yet", []error{base.ErrAuth}},
		{"pool without a key yet", keyOf(k), notYet, false, "no key here yet", []error{base.ErrAuth}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			h := newFakeHandler()
			v := h.addVar("v", 10, 8, false)
			ln := listen(t)
			s := NewServer(ln, h, discardLog(), 5*time.Second, c.server)
			var once sync.Once
			t.Cleanup(func() { h.release(); once.Do(func() { s.Close() }) })
			p := newPool(t, Options{ConnsPerPeer: 1, Timeout: 5 * time.Second, Key: c.pool})
			dst := newRowBuffers(2, 8, 0)
			err := p.Fetch(context.Background(), s.Addr(), "v", 0, []int64{3, 4}, dst.rows)
			if c.ok {
				if err != nil {
					t.Fatal(err)
				}
				if err := checkRows(v, []int64{3, 4}, dst.rows); err != nil {
					t.Fatal(err)
				}
				if s.Refused.Load() != 0 {
					t.Fatalf("Refused = %d", s.Refused.Load())
				}
				return
			}
			wantSentinel(t, err, c.sentinels...)
			wantText(t, err, c.says)
			if c.name == "pool without a key yet" {
				return // it never connected
			}
			eventually(t, 5*time.Second, "the refusal to be counted", func() bool { return s.Refused.Load() == 1 })
		})
	}
}

// shedListener closes the first n connections it accepts at once, as a
// server shedding connections beyond MaxUnauthenticated does.
type shedListener struct {
	net.Listener
	n atomic.Int64
}

func (l *shedListener) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil || l.n.Add(-1) < 0 {
			return c, err
		}
		c.Close()
	}
}

// TestDialAgainAfterShed: a connection the peer closes during the
// handshake is dialed again, so a call goes through once the peer takes
// it; one closed every time fails naming the peer.
func TestDialAgainAfterShed(t *testing.T) {
	k := auth.Generate()
	key := func() (auth.Key, error) { return k, nil }
	for _, c := range []struct {
		shed int64
		ok   bool
	}{{2, true}, {100, false}} {
		t.Run(fmt.Sprint(c.shed), func(t *testing.T) {
			h := newFakeHandler()
			v := h.addVar("v", 10, 8, false)
			ln := &shedListener{Listener: listen(t)}
			ln.n.Store(c.shed)
			s := NewServer(ln, h, discardLog(), 5*time.Second, key)
			t.Cleanup(func() { h.release(); s.Close() })
			p := newPool(t, Options{ConnsPerPeer: 1, Timeout: 5 * time.Second, Key: key})
			dst := newRowBuffers(2, 8, 0)
			err := p.Fetch(context.Background(), s.Addr(), "v", 0, []int64{3, 4}, dst.rows)
			if !c.ok {
				wantSentinel(t, err, base.ErrPeer)
				wantText(t, err, s.Addr())
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if err := checkRows(v, []int64{3, 4}, dst.rows); err != nil {
				t.Fatal(err)
			}
		})
	}
}

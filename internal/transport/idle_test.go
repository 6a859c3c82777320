package transport

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"
	"time"
)

// fetchOK fetches rows 1 and 2 of v from addr and checks them.
func fetchOK(t *testing.T, p *Pool, addr string, v *fakeVar) {
	t.Helper()
	g := []int64{1, 2}
	dst := newRowBuffers(2, v.rowSize, 0)
	if err := p.Fetch(context.Background(), addr, "v", 0, g, dst.rows); err != nil {
		t.Fatalf("fetch from %s: %v", addr, err)
	}
	if err := checkRows(v, g, dst.rows); err != nil {
		t.Fatal(err)
	}
}

// TestIdleClose: a peer's connections unused for IdleClose are closed, and
// the next fetch dials again.
func TestIdleClose(t *testing.T) {
	h := newFakeHandler()
	v := h.addVar("v", 16, 64, false)
	s, ln := startServer(t, h)
	p := newPool(t, Options{IdleClose: 20 * time.Millisecond})
	fetchOK(t, p, s.Addr(), v)
	eventually(t, 5*time.Second, "the idle connection closed", func() bool { return p.Conns() == 0 })
	if p.IdleClosed() != 1 {
		t.Errorf("%d connections counted closed idle, want 1", p.IdleClosed())
	}
	fetchOK(t, p, s.Addr(), v)
	if got := ln.accepted.Load(); got != 2 {
		t.Errorf("%d connections accepted, want 2 (dialed again after the idle close)", got)
	}
}

// TestMaxPeers: dialing a peer beyond MaxPeers closes the connections of
// the least recently used one, unless a call is in flight on them.
func TestMaxPeers(t *testing.T) {
	h := newFakeHandler()
	v := h.addVar("v", 16, 64, false)
	h.addVar("slow", 16, 64, true)
	var addrs []string
	for range 3 {
		s, _ := startServer(t, h)
		addrs = append(addrs, s.Addr())
	}
	p := newPool(t, Options{MaxPeers: 2})
	fetchOK(t, p, addrs[0], v)
	fetchOK(t, p, addrs[1], v)
	if p.Conns() != 2 || p.IdleClosed() != 0 {
		t.Fatalf("two peers: %d connections, %d closed; want 2, 0", p.Conns(), p.IdleClosed())
	}
	fetchOK(t, p, addrs[2], v) // closes peer 0's
	eventually(t, 5*time.Second, "two connections", func() bool { return p.Conns() == 2 })
	if p.IdleClosed() != 1 {
		t.Fatalf("%d connections closed over the cap, want 1", p.IdleClosed())
	}
	// Peer 1 is now the least recently used; a call in flight on it keeps it.
	g := []int64{3}
	dst := newRowBuffers(1, 64, 0)
	slow := goFetch(p, addrs[1], "slow", g, dst.rows)
	waitSignal(t, h.rowsEntered, 5*time.Second, "the slow fetch under way")
	fetchOK(t, p, addrs[0], v) // peer 2 goes, not the busy peer 1
	if p.IdleClosed() != 2 {
		t.Fatalf("%d connections closed over the cap, want 2", p.IdleClosed())
	}
	h.rowsGate.open()
	if r := waitResult(t, slow, 5*time.Second, "the slow fetch"); r.err != nil {
		t.Fatalf("the fetch in flight on the busy peer failed: %v", r.err)
	}
	if err := checkRows(h.vars["slow"], g, dst.rows); err != nil {
		t.Fatal(err)
	}
	eventually(t, 5*time.Second, "two connections", func() bool { return p.Conns() == 2 })
}

// TestIdleCloseUnderLoad: connections closed idle while fetches keep
// taking them (a close between taking a connection and sending on it)
// fail no fetch.
func TestIdleCloseUnderLoad(t *testing.T) {
	h := newFakeHandler()
	v := h.addVar("v", 64, 256, false)
	var addrs []string
	for range 3 {
		s, _ := startServer(t, h)
		addrs = append(addrs, s.Addr())
	}
	p := newPool(t, Options{IdleClose: time.Millisecond, MaxPeers: 2, ConnsPerPeer: 2})
	var wg sync.WaitGroup
	errs := make(chan error, 8)
	for w := range 8 {
		wg.Go(func() {
			r := rand.New(rand.NewPCG(uint64(w), 7))
			for range 150 {
				addr := addrs[r.IntN(len(addrs))]
				g := randGlobals(r, 1+r.IntN(4), 64)
				dst := newRowBuffers(len(g), 256, 0)
				if err := p.Fetch(context.Background(), addr, "v", 0, g, dst.rows); err != nil {
					errs <- fmt.Errorf("worker %d: fetch from %s: %w", w, addr, err)
					return
				}
				if err := checkRows(v, g, dst.rows); err != nil {
					errs <- err
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	// Idle or over the cap: during the load when a peer had no call in
	// flight, else by the sweep once the workers are done.
	eventually(t, 5*time.Second, "a connection closed idle or over the cap", func() bool { return p.IdleClosed() > 0 })
}

package transport

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ddstore-go/ddstore/internal/base"
	"github.com/ddstore-go/ddstore/internal/wire"
)

func TestFetchConcurrent(t *testing.T) {
	for _, conns := range []int{1, 3} {
		t.Run(fmt.Sprintf("conns=%d", conns), func(t *testing.T) {
			h := newFakeHandler()
			sizes := []int{1, 64, 4096, 65536}
			vars := make([]*fakeVar, len(sizes))
			for i, size := range sizes {
				vars[i] = h.addVar(fmt.Sprintf("v%d", size), min(2000, (4<<20)/size), size, false)
			}
			s, ln := startServer(t, h)
			p := newPool(t, Options{ConnsPerPeer: conns, Timeout: 20 * time.Second})
			const workers, iters = 16, 12
			var wg sync.WaitGroup
			errs := make(chan error, workers)
			for w := range workers {
				wg.Go(func() {
					r := rand.New(rand.NewPCG(uint64(w), 99))
					for it := range iters {
						k := r.IntN(len(sizes))
						v, size := vars[k], sizes[k]
						n := 1 + r.IntN(max(1, (256<<10)/size)) // up to 256 KiB a call
						n = min(n, 1500)
						globals := randGlobals(r, n, len(v.data)/size)
						dst := newRowBuffers(n, size, byte(w))
						name := fmt.Sprintf("v%d", size)
						if it%4 == 3 {
							// Interleave control calls (on their own connection).
							body, err := p.Call(context.Background(), s.Addr(), opEcho, (&wire.Text{Text: name}).Encode)
							if err != nil {
								errs <- fmt.Errorf("worker %d: Call: %w", w, err)
								return
							}
							if m, err := wire.DecodeText(body); err != nil || m.Text != "echo:"+name {
								errs <- fmt.Errorf("worker %d: echo reply %q, %v", w, m.Text, err)
								return
							}
						}
						if err := p.Fetch(context.Background(), s.Addr(), name, 0, globals, dst.rows); err != nil {
							errs <- fmt.Errorf("worker %d: Fetch %d rows of %d bytes: %w", w, n, size, err)
							return
						}
						if err := checkRows(v, globals, dst.rows); err != nil {
							errs <- fmt.Errorf("worker %d: %w", w, err)
							return
						}
						stride := size + 1
						for i := range n {
							if dst.buf[i*stride+size] != guardByte {
								errs <- fmt.Errorf("worker %d: guard after row %d overwritten", w, i)
								return
							}
						}
					}
				})
			}
			wg.Wait()
			close(errs)
			for err := range errs {
				t.Error(err)
			}
			if got := ln.accepted.Load(); got != int64(conns)+2 {
				t.Errorf("server accepted %d connections, want %d (ConnsPerPeer for large fetches, one for small ones, one for control calls)", got, conns+2)
			}
		})
	}
}

func TestCallEcho(t *testing.T) {
	h := newFakeHandler()
	s, _ := startServer(t, h)
	p := newPool(t, Options{ConnsPerPeer: 2})
	for _, text := range []string{"", "hello", strings.Repeat("x", 100000)} {
		body, err := p.Call(context.Background(), s.Addr(), opEcho, (&wire.Text{Text: text}).Encode)
		if err != nil {
			t.Fatalf("Call(%d bytes): %v", len(text), err)
		}
		m, err := wire.DecodeText(body)
		if err != nil {
			t.Fatalf("reply body: %v", err)
		}
		if m.Text != "echo:"+text {
			t.Fatalf("reply %q..., want echo of %d bytes", head([]byte(m.Text)), len(text))
		}
	}
}

// TestControlNotBoundByTimeout: control calls (collectives) wait as long as
// their ctx allows, not Options.Timeout.
func TestControlNotBoundByTimeout(t *testing.T) {
	h := newFakeHandler()
	s, _ := startServer(t, h)
	p := newPool(t, Options{ConnsPerPeer: 1, Timeout: 100 * time.Millisecond})
	ch := make(chan result, 1)
	var body []byte
	go func() {
		var err error
		body, err = p.Call(context.Background(), s.Addr(), opBlock, nil)
		ch <- result{err: err}
	}()
	waitSignal(t, h.ctlEntered, 5*time.Second, "the control op to start")
	select {
	case r := <-ch:
		t.Fatalf("control call returned before release: %v", r.err)
	case <-time.After(3 * p.opts.Timeout):
	}
	h.ctlGate.open()
	r := waitResult(t, ch, 5*time.Second, "released control call")
	if r.err != nil {
		t.Fatalf("Call: %v", r.err)
	}
	if m, err := wire.DecodeText(body); err != nil || m.Text != "unblocked" {
		t.Fatalf("reply %q, %v", m.Text, err)
	}
}

func TestHandlerErrors(t *testing.T) {
	h := newFakeHandler()
	v := h.addVar("v", 50, 16, false)
	s, ln := startServer(t, h)
	p := newPool(t, Options{ConnsPerPeer: 1})
	ctx := context.Background()
	ok := func() {
		t.Helper()
		dst := newRowBuffers(3, 16, 0)
		g := []int64{4, 0, 49}
		if err := p.Fetch(ctx, s.Addr(), "v", 0, g, dst.rows); err != nil {
			t.Fatalf("Fetch after an error reply: %v", err)
		}
		if err := checkRows(v, g, dst.rows); err != nil {
			t.Fatal(err)
		}
	}
	ok()
	cases := []struct {
		name     string
		call     func() error
		sentinel error
		text     []string
	}{
		{"unknown variable", func() error {
			return p.Fetch(ctx, s.Addr(), "nope", 0, []int64{1}, [][]byte{make([]byte, 16)})
		}, base.ErrUnknown, []string{`variable "nope" is not here`}},
		{"index out of range", func() error {
			return p.Fetch(ctx, s.Addr(), "v", 0, []int64{1, 50}, [][]byte{make([]byte, 16), make([]byte, 16)})
		}, base.ErrIndex, []string{`row 50 of "v" not in [0, 50)`}},
		{"plain error", func() error {
			return p.Fetch(ctx, s.Addr(), "plain-error", 0, []int64{1}, [][]byte{make([]byte, 16)})
		}, base.ErrInternal, []string{"plain failure without a sentinel"}},
		{"control error", func() error {
			_, err := p.Call(ctx, s.Addr(), opFail, nil)
			return err
		}, base.ErrExists, []string{"refused on purpose"}},
		{"control unknown op", func() error {
			_, err := p.Call(ctx, s.Addr(), wire.Op(200), nil)
			return err
		}, base.ErrProtocol, []string{"unknown op"}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			err := c.call()
			wantSentinel(t, err, c.sentinel)
			wantText(t, err, c.text...)
			ok()
		})
	}
	if got := ln.accepted.Load(); got != 2 {
		t.Errorf("server accepted %d connections, want 2 (one for fetches, one for control calls): error replies must not cost the connection", got)
	}
}

func TestFetchTimeoutBeforeReply(t *testing.T) {
	h := newFakeHandler()
	blk := h.addVar("block", 20, 32, true)
	v := h.addVar("v", 20, 32, false)
	s, ln := startServer(t, h)
	const timeout = 200 * time.Millisecond
	p := newPool(t, Options{ConnsPerPeer: 1, Timeout: timeout})
	ctx := context.Background()
	// Connect first, so that the timing below is the call's alone.
	if err := p.Fetch(ctx, s.Addr(), "v", 0, []int64{0}, [][]byte{make([]byte, 32)}); err != nil {
		t.Fatalf("warm-up Fetch: %v", err)
	}

	globals := []int64{3, 1, 4, 1, 5}
	dst := newRowBuffers(len(globals), 32, 0xEE)
	start := time.Now()
	err := p.Fetch(ctx, s.Addr(), "block", 0, globals, dst.rows)
	elapsed := time.Since(start)
	wantSentinel(t, err, base.ErrTimeout)
	wantText(t, err, s.Addr())
	if elapsed < timeout*9/10 {
		t.Errorf("Fetch timed out after %v, before its %v timeout", elapsed, timeout)
	}

	// The reply comes late; it must not land in dst.
	h.rowsGate.open()
	eventually(t, 5*time.Second, "the late reply to be sent", func() bool { return h.released.Load() >= 2 })
	// The next reply on the same connection comes after the late one, so
	// once this Fetch is done the late reply has been read and dropped.
	g2 := []int64{7, 8}
	d2 := newRowBuffers(2, 32, 0)
	if err := p.Fetch(ctx, s.Addr(), "v", 0, g2, d2.rows); err != nil {
		t.Fatalf("Fetch after a timeout: %v", err)
	}
	if err := checkRows(v, g2, d2.rows); err != nil {
		t.Fatal(err)
	}
	for i, row := range dst.rows {
		if !bytes.Equal(row, bytes.Repeat([]byte{0xEE}, 32)) {
			t.Fatalf("row %d of the timed-out Fetch was written after it returned: % x", i, head(row))
		}
	}
	dst.checkGuards(t)
	if got := ln.accepted.Load(); got != 1 {
		t.Errorf("server accepted %d connections, want 1 (a call abandoned before its reply keeps the connection)", got)
	}
	// The blocking variable works now that it is released.
	d3 := newRowBuffers(len(globals), 32, 0)
	if err := p.Fetch(ctx, s.Addr(), "block", 0, globals, d3.rows); err != nil {
		t.Fatalf("Fetch of the released variable: %v", err)
	}
	if err := checkRows(blk, globals, d3.rows); err != nil {
		t.Fatal(err)
	}
}

func TestFetchContext(t *testing.T) {
	for _, kind := range []string{"cancel", "deadline"} {
		t.Run(kind, func(t *testing.T) {
			h := newFakeHandler()
			h.addVar("block", 10, 8, true)
			v := h.addVar("v", 10, 8, false)
			s, _ := startServer(t, h)
			p := newPool(t, Options{ConnsPerPeer: 1, Timeout: 30 * time.Second})
			if err := p.Fetch(context.Background(), s.Addr(), "v", 0, []int64{0}, [][]byte{make([]byte, 8)}); err != nil {
				t.Fatalf("warm-up Fetch: %v", err)
			}
			var ctx context.Context
			var cancel context.CancelFunc
			if kind == "cancel" {
				ctx, cancel = context.WithCancel(context.Background())
			} else {
				ctx, cancel = context.WithTimeout(context.Background(), 150*time.Millisecond)
			}
			defer cancel()
			dst := newRowBuffers(2, 8, 0xEE)
			ch := make(chan result, 1)
			go func() {
				start := time.Now()
				err := p.Fetch(ctx, s.Addr(), "block", 0, []int64{1, 2}, dst.rows)
				ch <- result{err, time.Since(start)}
			}()
			waitSignal(t, h.rowsEntered, 5*time.Second, "Rows to start")
			if kind == "cancel" {
				cancel()
			}
			r := waitResult(t, ch, 5*time.Second, "Fetch with an ended ctx")
			wantSentinel(t, r.err, base.ErrTimeout)
			wantText(t, r.err, s.Addr())
			if kind == "cancel" && !errors.Is(r.err, context.Canceled) {
				t.Errorf("error %q does not wrap context.Canceled", r.err)
			}
			if kind == "deadline" && !errors.Is(r.err, context.DeadlineExceeded) {
				t.Errorf("error %q does not wrap context.DeadlineExceeded", r.err)
			}
			h.rowsGate.open()
			eventually(t, 5*time.Second, "the late reply", func() bool { return h.released.Load() >= 2 })
			after := [][]byte{make([]byte, 8)}
			if err := p.Fetch(context.Background(), s.Addr(), "v", 0, []int64{9}, after); err != nil {
				t.Fatalf("Fetch after the cancelled one: %v", err)
			}
			if err := checkRows(v, []int64{9}, after); err != nil {
				t.Fatal(err)
			}
			for i, row := range dst.rows {
				if !bytes.Equal(row, bytes.Repeat([]byte{0xEE}, 8)) {
					t.Fatalf("row %d written after Fetch returned: % x", i, row)
				}
			}
		})
	}
}

// TestCallContext: a control call ends with its ctx, as ErrTimeout.
func TestCallContext(t *testing.T) {
	h := newFakeHandler()
	s, _ := startServer(t, h)
	p := newPool(t, Options{ConnsPerPeer: 1})
	ctx, cancel := context.WithTimeout(context.Background(), 150*time.Millisecond)
	defer cancel()
	_, err := p.Call(ctx, s.Addr(), opBlock, nil)
	wantSentinel(t, err, base.ErrTimeout)
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("error %q does not wrap context.DeadlineExceeded", err)
	}
	h.ctlGate.open()
	eventually(t, 5*time.Second, "the blocked control op to finish", func() bool { return h.ctlDone.Load() == 1 })
	body, err := p.Call(context.Background(), s.Addr(), opEcho, (&wire.Text{Text: "after"}).Encode)
	if err != nil {
		t.Fatalf("Call after the timed-out one: %v", err)
	}
	if m, _ := wire.DecodeText(body); m.Text != "echo:after" {
		t.Fatalf("reply %q: the late reply of the timed-out call was delivered to the next", m.Text)
	}
}

func TestFetchPreCancelledContext(t *testing.T) {
	h := newFakeHandler()
	h.addVar("v", 10, 8, false)
	s, _ := startServer(t, h)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	t.Run("connected", func(t *testing.T) {
		p := newPool(t, Options{ConnsPerPeer: 1})
		if err := p.Fetch(context.Background(), s.Addr(), "v", 0, []int64{0}, [][]byte{make([]byte, 8)}); err != nil {
			t.Fatalf("warm-up Fetch: %v", err)
		}
		// Either the reply wins or the ctx does; a ctx error must be ErrTimeout.
		err := p.Fetch(ctx, s.Addr(), "v", 0, []int64{0}, [][]byte{make([]byte, 8)})
		if err != nil {
			wantSentinel(t, err, base.ErrTimeout)
		}
	})
	t.Run("not connected", func(t *testing.T) {
		p := newPool(t, Options{ConnsPerPeer: 1})
		err := p.Fetch(ctx, s.Addr(), "v", 0, []int64{0}, [][]byte{make([]byte, 8)})
		if err == nil {
			t.Fatal("Fetch with a cancelled ctx on a new pool succeeded")
		}
		if !errors.Is(err, base.ErrTimeout) {
			t.Fatalf("Pool.Fetch (tcp.go Pool.get) with a ctx already cancelled before the first connection is dialed returns %q, "+
				"which wraps base.ErrPeer (\"connect to ...\"), not base.ErrTimeout as a cancelled ctx does once connected", err)
		}
	})
}

func TestServerCloseWhileFetchWaits(t *testing.T) {
	h := newFakeHandler()
	h.addVar("block", 10, 8, true)
	s, _ := startServer(t, h)
	// A long timeout: the call must end because the peer went, not by timer.
	p := newPool(t, Options{ConnsPerPeer: 1, Timeout: 20 * time.Second})
	dst := newRowBuffers(2, 8, 0xEE)
	fetch := goFetch(p, s.Addr(), "block", []int64{1, 2}, dst.rows)
	waitSignal(t, h.rowsEntered, 5*time.Second, "Rows to start")
	closed := make(chan error, 1)
	go func() { closed <- s.Close() }()
	r := waitResult(t, fetch, 5*time.Second, "Fetch from a closing server")
	wantSentinel(t, r.err, base.ErrPeer, base.ErrTimeout)
	wantText(t, r.err, s.Addr())
	// Server.Close waits for the handler's Rows, which only the test ends.
	h.rowsGate.open()
	select {
	case <-closed:
	case <-time.After(5 * time.Second):
		t.Fatal("Server.Close did not return after the handler was released")
	}
	for i, row := range dst.rows {
		if !bytes.Equal(row, bytes.Repeat([]byte{0xEE}, 8)) {
			t.Fatalf("row %d written after Fetch returned: % x", i, row)
		}
	}

	// A new server at a new address serves the same pool.
	h2 := newFakeHandler()
	v2 := h2.addVar("v", 10, 8, false)
	s2, _ := startServer(t, h2)
	if s2.Addr() == s.Addr() {
		t.Fatalf("new server got the old address %s", s.Addr())
	}
	d := newRowBuffers(3, 8, 0)
	g := []int64{9, 0, 5}
	if err := p.Fetch(context.Background(), s2.Addr(), "v", 0, g, d.rows); err != nil {
		t.Fatalf("Fetch from a new server: %v", err)
	}
	if err := checkRows(v2, g, d.rows); err != nil {
		t.Fatal(err)
	}
	// The old address is gone for good.
	err := p.Fetch(context.Background(), s.Addr(), "block", 0, []int64{1}, [][]byte{make([]byte, 8)})
	wantSentinel(t, err, base.ErrPeer)
}

// TestServerCloseWhileControlWaits: Close ends a blocked control op (its ctx
// ends) and the caller, whose own ctx has no deadline, gets ErrPeer.
func TestServerCloseWhileControlWaits(t *testing.T) {
	h := newFakeHandler()
	s, _ := startServer(t, h)
	p := newPool(t, Options{ConnsPerPeer: 1})
	ch := make(chan result, 1)
	go func() {
		_, err := p.Call(context.Background(), s.Addr(), opBlock, nil)
		ch <- result{err: err}
	}()
	waitSignal(t, h.ctlEntered, 5*time.Second, "the control op to start")
	closed := make(chan error, 1)
	go func() { closed <- s.Close() }()
	select {
	case <-closed:
	case <-time.After(5 * time.Second):
		t.Fatal("Server.Close hangs on a control op waiting on its ctx")
	}
	r := waitResult(t, ch, 5*time.Second, "Call to a closed server")
	wantSentinel(t, r.err, base.ErrPeer, base.ErrClosed)
}

func TestFetchNobodyListening(t *testing.T) {
	ln := listen(t)
	addr := ln.Addr().String()
	ln.Close()
	p := newPool(t, Options{ConnsPerPeer: 2, Timeout: 10 * time.Second})
	err := p.Fetch(context.Background(), addr, "v", 0, []int64{0}, [][]byte{make([]byte, 8)})
	wantSentinel(t, err, base.ErrPeer)
	wantText(t, err, addr)
	_, err = p.Call(context.Background(), addr, opEcho, nil)
	wantSentinel(t, err, base.ErrPeer)
}

// readLoops counts goroutines running a pool connection's read loop.
func readLoops() int {
	buf := make([]byte, 1<<20)
	for {
		n := runtime.Stack(buf, true)
		if n < len(buf) {
			return strings.Count(string(buf[:n]), "transport.(*conn).readLoop")
		}
		buf = make([]byte, 2*len(buf))
	}
}

func TestPoolCloseFailsCallsInFlight(t *testing.T) {
	baseline := runtime.NumGoroutine()
	h := newFakeHandler()
	h.addVar("block", 10, 8, true)
	h.addVar("v", 10, 8, false)
	h.addVar("big", 4, SmallFetchBytes/2+8, false)
	s, _ := startServer(t, h)
	p := NewPool(Options{ConnsPerPeer: 3, Timeout: 20 * time.Second})
	// Dial every fetch slot: the three of the bulk lane, then the small lane.
	for range 3 {
		big := newRowBuffers(2, SmallFetchBytes/2+8, 0)
		if err := p.Fetch(context.Background(), s.Addr(), "big", 0, []int64{1, 2}, big.rows); err != nil {
			t.Fatalf("warm-up Fetch: %v", err)
		}
	}
	if err := p.Fetch(context.Background(), s.Addr(), "v", 0, []int64{1}, [][]byte{make([]byte, 8)}); err != nil {
		t.Fatalf("warm-up Fetch: %v", err)
	}
	if n := readLoops(); n != 4 {
		t.Fatalf("%d read loops running, want 4", n)
	}
	dst := newRowBuffers(2, 8, 0xEE)
	fetch := goFetch(p, s.Addr(), "block", []int64{1, 2}, dst.rows)
	waitSignal(t, h.rowsEntered, 5*time.Second, "Rows to start")
	call := make(chan result, 1)
	go func() {
		_, err := p.Call(context.Background(), s.Addr(), opBlock, nil)
		call <- result{err: err}
	}()
	waitSignal(t, h.ctlEntered, 5*time.Second, "the control op to start")

	type closeResult struct {
		err   error
		loops int
	}
	closed := make(chan closeResult, 1)
	go func() {
		err := p.Close()
		// Close waits for its read loops: none is left the moment it returns.
		closed <- closeResult{err, readLoops()}
	}()
	select {
	case r := <-closed:
		if r.err != nil {
			t.Errorf("Pool.Close: %v", r.err)
		}
		if r.loops != 0 {
			t.Errorf("%d read loops still running when Pool.Close returned", r.loops)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Pool.Close hangs with calls in flight")
	}
	r := waitResult(t, fetch, 5*time.Second, "Fetch in flight at Close")
	wantSentinel(t, r.err, base.ErrClosed, base.ErrPeer)
	r = waitResult(t, call, 5*time.Second, "Call in flight at Close")
	wantSentinel(t, r.err, base.ErrClosed, base.ErrPeer)

	err := p.Fetch(context.Background(), s.Addr(), "v", 0, []int64{1}, [][]byte{make([]byte, 8)})
	wantSentinel(t, err, base.ErrClosed)
	_, err = p.Call(context.Background(), s.Addr(), opEcho, nil)
	wantSentinel(t, err, base.ErrClosed)
	if err := p.Close(); err != nil {
		t.Errorf("second Pool.Close: %v", err)
	}

	h.release()
	if err := s.Close(); err != nil {
		t.Errorf("Server.Close: %v", err)
	}
	for i, row := range dst.rows {
		if !bytes.Equal(row, bytes.Repeat([]byte{0xEE}, 8)) {
			t.Fatalf("row %d written after Fetch returned: % x", i, row)
		}
	}
	eventually(t, 5*time.Second, fmt.Sprintf("goroutines back to %d", baseline), func() bool {
		return runtime.NumGoroutine() <= baseline
	})
}

// TestFetchRange reads contiguous rows of one variable in one request,
// byte rows included, and an error reply leaves the connection usable.
func TestFetchRange(t *testing.T) {
	h := newFakeHandler()
	bytes1 := h.addVar("b", 20000, 1, false)
	rows16 := h.addVar("v", 50, 16, false)
	s, ln := startServer(t, h)
	p := newPool(t, Options{ConnsPerPeer: 1})
	ctx := context.Background()
	for _, c := range []struct {
		name         string
		v            *fakeVar
		start, count int64
	}{{"b", bytes1, 0, 1}, {"b", bytes1, 1234, 10240}, {"b", bytes1, 19999, 1}, {"v", rows16, 3, 47}, {"v", rows16, 0, 0}} {
		dst := make([]byte, c.count*int64(c.v.rowSize)+1)
		dst[len(dst)-1] = guardByte
		calls := h.rowsCalls.Load()
		if err := p.FetchRange(ctx, s.Addr(), c.name, 0, c.start, c.count, dst[:len(dst)-1]); err != nil {
			t.Fatalf("FetchRange %s [%d, +%d): %v", c.name, c.start, c.count, err)
		}
		want := c.v.data[c.start*int64(c.v.rowSize) : (c.start+c.count)*int64(c.v.rowSize)]
		if string(dst[:len(dst)-1]) != string(want) {
			t.Errorf("FetchRange %s [%d, +%d): wrong bytes", c.name, c.start, c.count)
		}
		if dst[len(dst)-1] != guardByte {
			t.Errorf("FetchRange %s [%d, +%d) wrote past its destination", c.name, c.start, c.count)
		}
		if got := h.rowsCalls.Load() - calls; got != 1 {
			t.Errorf("FetchRange %s [%d, +%d): %d requests served, want 1", c.name, c.start, c.count, got)
		}
	}
	err := p.FetchRange(ctx, s.Addr(), "b", 0, 19990, 11, make([]byte, 11))
	wantSentinel(t, err, base.ErrIndex)
	wantText(t, err, `rows [19990, 20001) of "b" not in [0, 20000)`)
	dst := make([]byte, 16)
	if err := p.FetchRange(ctx, s.Addr(), "v", 0, 49, 1, dst); err != nil || string(dst) != string(rows16.row(49)) {
		t.Errorf("FetchRange after an error reply: %v", err)
	}
	if got := ln.accepted.Load(); got != 1 {
		t.Errorf("server accepted %d connections, want 1", got)
	}
}

// TestControlConnection: control calls take one connection of their own,
// dialed when first needed, and never a fetch connection: a node that
// only speaks to a peer (the coordinator) holds one connection to it,
// whatever ConnsPerPeer.
func TestControlConnection(t *testing.T) {
	h := newFakeHandler()
	v := h.addVar("v", 50, 16, false)
	big := h.addVar("big", 4, SmallFetchBytes/2+8, false)
	s, ln := startServer(t, h)
	p := newPool(t, Options{ConnsPerPeer: 4})
	ctx := context.Background()
	for i := range 20 {
		if _, err := p.Call(ctx, s.Addr(), opEcho, (&wire.Text{Text: fmt.Sprint(i)}).Encode); err != nil {
			t.Fatal(err)
		}
	}
	if got := ln.accepted.Load(); got != 1 || p.Conns() != 1 {
		t.Errorf("after 20 control calls: %d connections accepted, %d held; want 1", got, p.Conns())
	}
	for range 8 {
		dst := newRowBuffers(2, 16, 0)
		g := []int64{3, 7}
		if err := p.Fetch(ctx, s.Addr(), "v", 0, g, dst.rows); err != nil {
			t.Fatal(err)
		}
		if err := checkRows(v, g, dst.rows); err != nil {
			t.Fatal(err)
		}
	}
	if got := ln.accepted.Load(); got != 2 || p.Conns() != 2 {
		t.Errorf("after small fetches too: %d connections accepted, %d held; want 2 (the small lane, control)", got, p.Conns())
	}
	for range 8 {
		dst := newRowBuffers(2, SmallFetchBytes/2+8, 0)
		g := []int64{0, 3}
		if err := p.Fetch(ctx, s.Addr(), "big", 0, g, dst.rows); err != nil {
			t.Fatal(err)
		}
		if err := checkRows(big, g, dst.rows); err != nil {
			t.Fatal(err)
		}
	}
	if got := ln.accepted.Load(); got != 6 || p.Conns() != 6 {
		t.Errorf("after large fetches: %d connections accepted, %d held; want 6 (4 for large fetches, the small lane, control)", got, p.Conns())
	}
}

// TestSmallFetchPassesLargeOne: a fetch of a few rows is answered while a
// large fetch from the same peer has not been (its rows held back by the
// handler): it goes over the small lane, not behind the large reply on a
// connection whose fetches the peer answers in turn.
func TestSmallFetchPassesLargeOne(t *testing.T) {
	h := newFakeHandler()
	h.addVar("block", 4, SmallFetchBytes/2+8, true)
	v := h.addVar("v", 10, 8, false)
	s, _ := startServer(t, h)
	p := newPool(t, Options{ConnsPerPeer: 1, Timeout: 20 * time.Second})
	t.Cleanup(h.release)
	large := newRowBuffers(2, SmallFetchBytes/2+8, 0)
	fetch := goFetch(p, s.Addr(), "block", []int64{0, 1}, large.rows)
	waitSignal(t, h.rowsEntered, 5*time.Second, "the large fetch to reach the handler")
	dst := newRowBuffers(3, 8, 0)
	g := []int64{2, 9, 2}
	if err := p.Fetch(context.Background(), s.Addr(), "v", 0, g, dst.rows); err != nil {
		t.Fatalf("small Fetch while a large one waits: %v", err)
	}
	if err := checkRows(v, g, dst.rows); err != nil {
		t.Fatal(err)
	}
	select {
	case r := <-fetch:
		t.Fatalf("the large fetch returned before its rows were released: %v", r.err)
	default:
	}
	h.release()
	if r := waitResult(t, fetch, 5*time.Second, "the large fetch"); r.err != nil {
		t.Fatalf("large Fetch: %v", r.err)
	}
}

package transport

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"io"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/ddstore-go/ddstore/internal/base"
	"github.com/ddstore-go/ddstore/internal/wire"
)

// expectDropped reads from c until the server closes it (EOF or reset).
func expectDropped(t *testing.T, c net.Conn) {
	t.Helper()
	c.SetReadDeadline(time.Now().Add(5 * time.Second))
	buf := make([]byte, 4096)
	for {
		n, err := c.Read(buf)
		if err == nil {
			t.Fatalf("server answered a malformed frame with %d bytes: % x", n, head(buf[:n]))
		}
		if errors.Is(err, io.EOF) || errors.Is(err, syscall.ECONNRESET) {
			return
		}
		var ne net.Error
		if errors.As(err, &ne) && ne.Timeout() {
			t.Fatal("server kept a connection that sent a malformed frame")
		}
		t.Fatalf("reading from the dropped connection: %v", err)
	}
}

func frame(op wire.Op, status uint16, id, payload uint64, fill func(*wire.Encoder)) []byte {
	return wire.AppendFrame(nil, op, status, id, payload, fill)
}

func TestServerMalformedFrames(t *testing.T) {
	h := newFakeHandler()
	v := h.addVar("v", 200, 64, false)
	s, _ := startServer(t, h)
	p := newPool(t, Options{ConnsPerPeer: 2, Timeout: 10 * time.Second})

	// A pool keeps fetching from the same server throughout.
	stop := make(chan struct{})
	var fetches atomic.Int64
	var bg sync.WaitGroup
	bgErr := make(chan error, 1)
	bg.Go(func() {
		g := []int64{0, 17, 199, 3}
		for {
			select {
			case <-stop:
				return
			default:
			}
			dst := newRowBuffers(len(g), 64, 0)
			if err := p.Fetch(context.Background(), s.Addr(), "v", 0, g, dst.rows); err != nil {
				bgErr <- err
				return
			}
			if err := checkRows(v, g, dst.rows); err != nil {
				bgErr <- err
				return
			}
			fetches.Add(1)
		}
	})
	defer func() {
		close(stop)
		bg.Wait()
		select {
		case err := <-bgErr:
			t.Errorf("background Fetch failed: %v", err)
		default:
		}
	}()

	garbage := make([]byte, 100)
	for i := range garbage {
		garbage[i] = byte(i*37 + 11)
	}
	badMagic := frame(wire.OpFetch, 0, 1, 0, (&wire.Fetch{Name: "v", Globals: []int64{1}}).Encode)
	binary.LittleEndian.PutUint16(badMagic, 0xBEEF)
	truncated := frame(wire.OpFetch, 0, 1, 0, (&wire.Fetch{Name: "v", Globals: []int64{1, 2, 3}}).Encode)
	truncated = truncated[:wire.HeaderSize+5]
	withPayload := frame(wire.OpFetch, 0, 1, 8, (&wire.Fetch{Name: "v", Globals: []int64{1}}).Encode)
	withPayload = append(withPayload, 1, 2, 3, 4, 5, 6, 7, 8)
	undecodable := frame(wire.OpFetch, 0, 1, 0, func(e *wire.Encoder) {
		e.String("v")
		e.I64(0)    // the variable's id
		e.U32(1000) // a list of 1000 indices...
		e.U64(1)    // ...with one in it
	})
	withStatus := frame(wire.OpFetch, uint16(base.Code(base.ErrIndex)), 1, 0, (&wire.Fetch{Name: "v", Globals: []int64{1}}).Encode)
	badVersion := frame(wire.OpPeerInfo, 0, 1, 0, nil)
	badVersion[2] = 9

	cases := []struct {
		name      string
		send      []byte
		closeSend bool // half-close after sending
		counted   bool // BadFrames goes up
	}{
		{"garbage", garbage, false, true},
		{"bad magic", badMagic, false, true},
		{"bad version", badVersion, false, true},
		{"truncated then closed", truncated, true, false},
		{"payload on a request", withPayload, false, true},
		{"status on a request", withStatus, false, true},
		{"undecodable fetch", undecodable, false, true},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			before := s.BadFrames.Load()
			n0 := fetches.Load()
			raw, err := net.Dial("tcp", s.Addr())
			if err != nil {
				t.Fatalf("dial: %v", err)
			}
			defer raw.Close()
			if _, err := raw.Write(c.send); err != nil {
				t.Fatalf("write: %v", err)
			}
			if c.closeSend {
				raw.(*net.TCPConn).CloseWrite()
			}
			expectDropped(t, raw)
			if c.counted {
				eventually(t, 5*time.Second, "BadFrames to count the frame", func() bool { return s.BadFrames.Load() > before })
			}
			// The pool's connections were not disturbed.
			eventually(t, 5*time.Second, "background fetches to go on", func() bool { return fetches.Load() > n0 })
		})
	}
	if got := s.BadFrames.Load(); got != 6 {
		t.Errorf("BadFrames = %d, want 6", got)
	}
}

// fakePeer is a raw TCP peer that answers each Fetch frame with serve.
type fakePeer struct {
	ln    net.Listener
	wg    sync.WaitGroup
	mu    sync.Mutex
	conns []net.Conn
}

func startFakePeer(t *testing.T, serve func(c net.Conn, h wire.Header, m wire.Fetch) bool) *fakePeer {
	t.Helper()
	fp := &fakePeer{ln: listen(t)}
	fp.wg.Go(func() {
		for {
			c, err := fp.ln.Accept()
			if err != nil {
				return
			}
			fp.mu.Lock()
			fp.conns = append(fp.conns, c)
			fp.mu.Unlock()
			fp.wg.Go(func() {
				defer c.Close()
				var buf []byte
				for {
					h, body, err := wire.ReadFrame(c, buf)
					if err != nil {
						return
					}
					var m wire.Fetch
					if h.Op == wire.OpFetch {
						if err := wire.DecodeFetch(body, &m); err != nil {
							return
						}
					}
					if !serve(c, h, m) {
						return
					}
				}
			})
		}
	})
	t.Cleanup(func() {
		fp.ln.Close()
		fp.mu.Lock()
		for _, c := range fp.conns {
			c.Close()
		}
		fp.mu.Unlock()
		fp.wg.Wait()
	})
	return fp
}

func (fp *fakePeer) Addr() string { return fp.ln.Addr().String() }

// rowByte is the content the fake peers send: byte i of the reply.
func rowByte(i int) byte { return byte(i*7 + 1) }

func replyBytes(n int) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = rowByte(i)
	}
	return b
}

func TestBadReplies(t *testing.T) {
	const rowSize = 8
	cases := []struct {
		name     string
		serve    func(c net.Conn, h wire.Header, m wire.Fetch) bool
		sentinel []error
	}{
		{"payload one byte long", func(c net.Conn, h wire.Header, m wire.Fetch) bool {
			n := len(m.Globals)*rowSize + 1
			c.Write(append(frame(h.Op, 0, h.ID, uint64(n), nil), replyBytes(n)...))
			return true
		}, []error{base.ErrProtocol}},
		{"payload one byte short", func(c net.Conn, h wire.Header, m wire.Fetch) bool {
			n := len(m.Globals)*rowSize - 1
			c.Write(append(frame(h.Op, 0, h.ID, uint64(n), nil), replyBytes(n)...))
			return true
		}, []error{base.ErrProtocol}},
		{"payload one byte short, more to come", func(c net.Conn, h wire.Header, m wire.Fetch) bool {
			// The header is wrong but the connection stays open: the client
			// must not wait for bytes that are never coming.
			n := len(m.Globals)*rowSize - 1
			c.Write(frame(h.Op, 0, h.ID, uint64(n), nil))
			return true
		}, []error{base.ErrProtocol}},
		{"no payload", func(c net.Conn, h wire.Header, m wire.Fetch) bool {
			c.Write(frame(h.Op, 0, h.ID, 0, nil))
			return true
		}, []error{base.ErrProtocol}},
		{"error reply with payload", func(c net.Conn, h wire.Header, m wire.Fetch) bool {
			b := wire.AppendError(nil, h.Op, h.ID, base.Errorf(base.ErrIndex, "bad row"))
			binary.LittleEndian.PutUint64(b[24:], 16)
			c.Write(append(b, make([]byte, 16)...))
			return true
		}, []error{base.ErrProtocol}},
		{"bad magic in reply", func(c net.Conn, h wire.Header, m wire.Fetch) bool {
			b := frame(h.Op, 0, h.ID, uint64(len(m.Globals)*rowSize), nil)
			b[0] ^= 0xFF
			c.Write(b)
			return true
		}, []error{base.ErrPeer, base.ErrProtocol}},
		{"closed mid-payload", func(c net.Conn, h wire.Header, m wire.Fetch) bool {
			n := len(m.Globals) * rowSize
			c.Write(append(frame(h.Op, 0, h.ID, uint64(n), nil), replyBytes(n/2)...))
			return false
		}, []error{base.ErrPeer}},
		{"closed before replying", func(c net.Conn, h wire.Header, m wire.Fetch) bool {
			return false
		}, []error{base.ErrPeer}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			fp := startFakePeer(t, c.serve)
			p := newPool(t, Options{ConnsPerPeer: 1, Timeout: 20 * time.Second})
			dst := newRowBuffers(4, rowSize, 0)
			ch := goFetch(p, fp.Addr(), "v", []int64{0, 1, 2, 3}, dst.rows)
			r := waitResult(t, ch, 5*time.Second, "Fetch from a misbehaving peer")
			wantSentinel(t, r.err, c.sentinel...)
			wantText(t, r.err, fp.Addr())
			dst.checkGuards(t)
		})
	}
}

// TestReplyToUnknownID: a reply nobody waits for (with rows) is skipped and
// the next reply on the connection is still read right.
func TestReplyToUnknownID(t *testing.T) {
	const rowSize = 8
	fp := startFakePeer(t, func(c net.Conn, h wire.Header, m wire.Fetch) bool {
		stray := append(frame(h.Op, 0, h.ID+1000, 24, nil), bytes.Repeat([]byte{0xFF}, 24)...)
		n := len(m.Globals) * rowSize
		c.Write(append(append(stray, frame(h.Op, 0, h.ID, uint64(n), nil)...), replyBytes(n)...))
		return true
	})
	p := newPool(t, Options{ConnsPerPeer: 1, Timeout: 10 * time.Second})
	for range 3 {
		dst := newRowBuffers(5, rowSize, 0)
		if err := p.Fetch(context.Background(), fp.Addr(), "v", 0, []int64{0, 1, 2, 3, 4}, dst.rows); err != nil {
			t.Fatalf("Fetch: %v", err)
		}
		want := replyBytes(5 * rowSize)
		for i, row := range dst.rows {
			if !bytes.Equal(row, want[i*rowSize:(i+1)*rowSize]) {
				t.Fatalf("row %d = % x, want % x", i, row, want[i*rowSize:(i+1)*rowSize])
			}
		}
		dst.checkGuards(t)
	}
}

// TestTimeoutMidPayload: the reply starts, then stalls; Fetch times out and,
// once it has returned, the rest of the reply does not reach dst.
func TestTimeoutMidPayload(t *testing.T) {
	const rowSize, nrows = 16, 8
	const n = rowSize * nrows
	resume := make(chan struct{})
	restDone := make(chan error, 1)
	fp := startFakePeer(t, func(c net.Conn, h wire.Header, m wire.Fetch) bool {
		b := replyBytes(n)
		if _, err := c.Write(append(frame(h.Op, 0, h.ID, n, nil), b[:n/2]...)); err != nil {
			restDone <- err
			return false
		}
		<-resume
		_, err := c.Write(b[n/2:])
		if err == nil {
			// Wait until the client has dropped the connection.
			c.SetReadDeadline(time.Now().Add(5 * time.Second))
			_, err = c.Read(make([]byte, 1))
		}
		restDone <- err
		return false
	})
	const timeout = 200 * time.Millisecond
	p := newPool(t, Options{ConnsPerPeer: 1, Timeout: timeout})
	dst := newRowBuffers(nrows, rowSize, 0xEE)
	globals := make([]int64, nrows)
	start := time.Now()
	err := p.Fetch(context.Background(), fp.Addr(), "v", 0, globals, dst.rows)
	elapsed := time.Since(start)
	wantSentinel(t, err, base.ErrTimeout)
	wantText(t, err, fp.Addr())
	if elapsed < timeout*9/10 {
		t.Errorf("Fetch timed out after %v, before its %v timeout", elapsed, timeout)
	}
	snapshot := append([]byte(nil), dst.buf...)
	close(resume)
	select {
	case err := <-restDone:
		if err == nil {
			t.Fatal("the client kept the stalled connection open")
		}
	case <-time.After(5 * time.Second):
		t.Fatal("fake peer did not finish")
	}
	if !bytes.Equal(dst.buf, snapshot) {
		t.Fatal("rows were written into dst after Fetch returned")
	}
	dst.checkGuards(t)
}

// flakyListener fails its first Accept with a transient error (the process
// out of descriptors), then accepts normally.
type flakyListener struct {
	net.Listener
	failed atomic.Bool
}

func (l *flakyListener) Accept() (net.Conn, error) {
	if l.failed.CompareAndSwap(false, true) {
		return nil, &net.OpError{Op: "accept", Net: "tcp", Addr: l.Addr(), Err: os.NewSyscallError("accept4", syscall.EMFILE)}
	}
	return l.Listener.Accept()
}

// TestServerSurvivesAcceptError: one failed Accept (EMFILE) must not stop a
// server whose listener is still open from serving new peers.
func TestServerSurvivesAcceptError(t *testing.T) {
	h := newFakeHandler()
	v := h.addVar("v", 10, 8, false)
	ln := &flakyListener{Listener: listen(t)}
	s := NewServer(ln, h, discardLog(), 5*time.Second, nil)
	t.Cleanup(func() { s.Close() })
	p := newPool(t, Options{ConnsPerPeer: 1, Timeout: 300 * time.Millisecond})
	eventually(t, 5*time.Second, "the injected Accept error", ln.failed.Load)
	dst := newRowBuffers(2, 8, 0)
	err := p.Fetch(context.Background(), s.Addr(), "v", 0, []int64{3, 4}, dst.rows)
	if err != nil {
		t.Fatalf("transport.Server.acceptLoop (server.go) returns on the first Accept error that is not net.ErrClosed "+
			"(here EMFILE), so the server never accepts again although its listener stays open and Close was not called; "+
			"peers connect (the kernel completes the handshake) and then time out: Fetch = %v", err)
	}
	if err := checkRows(v, []int64{3, 4}, dst.rows); err != nil {
		t.Fatal(err)
	}
}

// TestFetchTimeoutWhileSending: a peer that stops reading must not hold a
// Fetch past Options.Timeout or its ctx while the request is being written
// (a large request fills the socket buffers).
func TestFetchTimeoutWhileSending(t *testing.T) {
	// A peer that accepts and never reads.
	ln := listen(t)
	var mu sync.Mutex
	var conns []net.Conn
	var wg sync.WaitGroup
	wg.Go(func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns = append(conns, c)
			mu.Unlock()
		}
	})
	t.Cleanup(func() {
		ln.Close()
		wg.Wait()
		mu.Lock()
		for _, c := range conns {
			c.Close()
		}
		mu.Unlock()
	})
	const timeout = 200 * time.Millisecond
	p := NewPool(Options{ConnsPerPeer: 1, Timeout: timeout})
	// 3M indices: a 24 MiB request body, more than loopback buffers hold.
	globals := make([]int64, 3<<20)
	ctx, cancel := context.WithTimeout(context.Background(), 2*timeout)
	defer cancel()
	ch := make(chan result, 1)
	go func() {
		start := time.Now()
		err := p.Fetch(ctx, ln.Addr().String(), "v", 0, globals, nil)
		ch <- result{err, time.Since(start)}
	}()
	select {
	case r := <-ch:
		p.Close()
		wantSentinel(t, r.err, base.ErrTimeout)
	case <-time.After(15 * time.Second):
		// Half the fixed 30 s write deadline: a call bounded by Timeout and
		// ctx has long returned, at any load (the request alone takes a
		// while to encode under -race), while one bounded only by the
		// fixed deadline is still blocked.
		p.Close() // ends the write, so the Fetch goroutine returns
		r := waitResult(t, ch, 5*time.Second, "Fetch after Pool.Close")
		t.Fatalf("Pool.Fetch/Call (tcp.go conn.send) writes the request with only a fixed 30 s write deadline before "+
			"Options.Timeout and ctx are looked at; to a peer that stops reading, a request larger than the socket buffers "+
			"(here 3M indices, 24 MiB) blocks the call (and every other call on that connection, behind wmu) for up to 30 s: "+
			"still blocked %v after Timeout %v and a ctx of %v; it returned %v only when Pool.Close cut the connection",
			15*time.Second, timeout, 2*timeout, r.err)
	}
}

// A control request waiting when its connection closes learns it: its
// context ends with cause ErrConnClosed, while the server keeps serving
// other connections.
func TestControlEndsWithItsConnection(t *testing.T) {
	h := newFakeHandler()
	s, _ := startServer(t, h)
	c, err := net.Dial("tcp", s.Addr())
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Write(wire.AppendFrame(nil, opBlock, 0, 1, 0, nil)); err != nil {
		t.Fatal(err)
	}
	<-h.ctlEntered
	c.Close()
	select {
	case cause := <-h.ctlCauses:
		if !errors.Is(cause, ErrConnClosed) {
			t.Fatalf("the waiting request's context ended with %v, want ErrConnClosed", cause)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("the waiting request still waits after its connection closed")
	}
	p := NewPool(Options{Timeout: 5 * time.Second})
	defer p.Close()
	body, err := p.Call(context.Background(), s.Addr(), opEcho, (&wire.Text{Text: "hi"}).Encode)
	if err != nil {
		t.Fatal(err)
	}
	if m, err := wire.DecodeText(body); err != nil || m.Text != "echo:hi" {
		t.Fatalf("echo after a closed connection: %q, %v", m.Text, err)
	}
}

// TestServerRequestsBackToBack: requests sent back to back in one write,
// one whose body is longer than the read buffer, and one whose header
// comes in two writes, are each answered, in order, with the right rows.
func TestServerRequestsBackToBack(t *testing.T) {
	h := newFakeHandler()
	v := h.addVar("v", 2000, 64, false)
	s, _ := startServer(t, h)
	fetch := func(id uint64, globals []int64) []byte {
		return frame(wire.OpFetch, 0, id, 0, func(e *wire.Encoder) {
			e.String("v")
			e.I64(0)
			e.U32(uint32(len(globals)))
			for _, g := range globals {
				e.I64(g)
			}
		})
	}
	large := make([]int64, 1500) // a body of 12 KB: past the read buffer
	for i := range large {
		large[i] = int64(1999 - i)
	}
	fr := wire.FetchRange{Name: "v", ID: 0, Start: 10, Count: 3}
	want := [][]int64{{3, 5}, {10, 11, 12}, large, {7}}
	var out []byte
	out = append(out, fetch(1, want[0])...)
	out = append(out, frame(wire.OpFetchRange, 0, 2, 0, fr.Encode)...)
	out = append(out, fetch(3, want[2])...)
	last := fetch(4, want[3])
	out = append(out, last[:wire.HeaderSize/2]...)

	c, err := net.Dial("tcp", s.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := c.Write(out); err != nil {
		t.Fatal(err)
	}
	ops := []wire.Op{wire.OpFetch, wire.OpFetchRange, wire.OpFetch, wire.OpFetch}
	for i, globals := range want {
		if i == len(want)-1 {
			// The rest of the last request, once the others are answered.
			if _, err := c.Write(last[wire.HeaderSize/2:]); err != nil {
				t.Fatal(err)
			}
		}
		hd, body, err := wire.ReadFrame(c, nil)
		if err != nil {
			t.Fatalf("reply %d: %v", i+1, err)
		}
		if err := wire.StatusError(hd, body); err != nil {
			t.Fatalf("reply %d: %v", i+1, err)
		}
		if hd.ID != uint64(i+1) || hd.Op != ops[i] || hd.Payload != uint64(len(globals)*64) {
			t.Fatalf("reply %d: %s #%d with %d row bytes, want %s #%d with %d", i+1, hd.Op, hd.ID, hd.Payload, ops[i], i+1, len(globals)*64)
		}
		rows := make([]byte, hd.Payload)
		if _, err := io.ReadFull(c, rows); err != nil {
			t.Fatal(err)
		}
		for k, g := range globals {
			if string(rows[k*64:(k+1)*64]) != string(v.row(g)) {
				t.Fatalf("reply %d: row %d (global %d) wrong", i+1, k, g)
			}
		}
	}
}

// TestServerDropsAPeerThatStopsReading: a peer that sends requests and
// never reads their replies fills the socket; the reply then being
// written fails at the write deadline and the connection is dropped,
// while a peer that reads is served on as before (the deadline is moved
// on only once half of it is used: serverConn.by).
func TestServerDropsAPeerThatStopsReading(t *testing.T) {
	h := newFakeHandler()
	v := h.addVar("v", 64, 64<<10, false)
	ln := listen(t)
	s := NewServer(ln, h, discardLog(), 300*time.Millisecond, nil)
	t.Cleanup(func() { s.Close() })
	// Replies of 1 MiB, far more of them than loopback's buffers hold.
	var out []byte
	for id := uint64(1); id <= 64; id++ {
		out = append(out, frame(wire.OpFetch, 0, id, 0, func(e *wire.Encoder) {
			e.String("v")
			e.I64(0)
			e.U32(16)
			for g := range int64(16) {
				e.I64(g)
			}
		})...)
	}
	stuck, err := net.Dial("tcp", s.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer stuck.Close()
	if _, err := stuck.Write(out); err != nil {
		t.Fatal(err)
	}
	eventually(t, 10*time.Second, "the server holding the connection", func() bool { return s.Conns() == 1 })
	eventually(t, 20*time.Second, "the connection of the peer that stopped reading dropped", func() bool { return s.Conns() == 0 })
	p := newPool(t, Options{ConnsPerPeer: 1, Timeout: 5 * time.Second})
	dst := newRowBuffers(3, 64<<10, 0)
	if err := p.Fetch(context.Background(), s.Addr(), "v", 0, []int64{5, 0, 63}, dst.rows); err != nil {
		t.Fatal(err)
	}
	if err := checkRows(v, []int64{5, 0, 63}, dst.rows); err != nil {
		t.Fatal(err)
	}
}

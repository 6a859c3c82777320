package transport

import (
	"bytes"
	"context"
	"errors"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/ddstore-go/ddstore/internal/base"
	"github.com/ddstore-go/ddstore/internal/testutil"
	"github.com/ddstore-go/ddstore/internal/wire"
)

// A fetch connection's read loop reads a reply's header and rows with one
// readv when the call it answers is waiting (replyReader.readAhead). These
// tests give it replies that are not what it readied for, or that come a
// few bytes at a time.

func (fp *fakePeer) connCount() int {
	fp.mu.Lock()
	defer fp.mu.Unlock()
	return len(fp.conns)
}

// smallConn is the pool's small-lane connection to addr (dialed by an
// earlier fetch).
func smallConn(t *testing.T, p *Pool, addr string) *conn {
	t.Helper()
	p.mu.Lock()
	pc := p.mu.peers[addr]
	p.mu.Unlock()
	if pc == nil {
		t.Fatalf("no connection to %s", addr)
	}
	pc.mu.Lock()
	defer pc.mu.Unlock()
	c := pc.conns[p.opts.ConnsPerPeer]
	if c == nil {
		t.Fatalf("no small-lane connection to %s", addr)
	}
	return c
}

// unread is how many bytes wait in c's socket, not yet read.
func unreadBytes(c *conn) int {
	n := -1
	c.raw.Control(func(fd uintptr) {
		v, err := unix.IoctlGetInt(int(fd), unix.SIOCINQ)
		if err == nil {
			n = v
		}
	})
	return n
}

// TestReadAheadShortReads: replies arrive a few bytes at a time, each
// piece read before the next is sent, so that the read-ahead sees a
// header cut short, then rows cut short, of good replies and of an error
// reply.
func TestReadAheadShortReads(t *testing.T) {
	const rowSize = 24
	var (
		mu  sync.Mutex
		cli *conn // the pool's connection, once known
	)
	sizes := []int{1, 3, 7, 13, 5, 31, 2, 64}
	fp := startFakePeer(t, func(c net.Conn, h wire.Header, m wire.Fetch) bool {
		var reply []byte
		if m.Name == "missing" {
			reply = wire.AppendError(nil, h.Op, h.ID, base.Errorf(base.ErrUnknown, "variable %q is not here", m.Name))
		} else {
			n := len(m.Globals) * rowSize
			reply = append(frame(h.Op, 0, h.ID, uint64(n), nil), replyBytes(n)...)
		}
		mu.Lock()
		cc := cli
		mu.Unlock()
		for i := 0; len(reply) > 0; i++ {
			k := min(sizes[i%len(sizes)], len(reply))
			if _, err := c.Write(reply[:k]); err != nil {
				return false
			}
			reply = reply[k:]
			if cc != nil {
				// The piece is read before the next comes (-1: the pool
				// is closed, the test over); past the deadline the next
				// comes anyway.
				testutil.Poll(5*time.Second, func() error {
					if unreadBytes(cc) > 0 {
						return errors.New("a piece unread")
					}
					return nil
				})
			}
		}
		return true
	})
	p := newPool(t, Options{ConnsPerPeer: 1, Timeout: 20 * time.Second})
	ctx := context.Background()
	if err := p.Fetch(ctx, fp.Addr(), "v", 0, []int64{0}, [][]byte{make([]byte, rowSize)}); err != nil {
		t.Fatalf("first Fetch: %v", err)
	}
	mu.Lock()
	cli = smallConn(t, p, fp.Addr())
	mu.Unlock()
	for _, nrows := range []int{1, 2, 5, 17} {
		dst := newRowBuffers(nrows, rowSize, 0)
		if err := p.Fetch(ctx, fp.Addr(), "v", 0, make([]int64, nrows), dst.rows); err != nil {
			t.Fatalf("Fetch of %d rows: %v", nrows, err)
		}
		want := replyBytes(nrows * rowSize)
		for i, row := range dst.rows {
			if !bytes.Equal(row, want[i*rowSize:(i+1)*rowSize]) {
				t.Fatalf("%d rows: row %d = % x, want % x", nrows, i, head(row), head(want[i*rowSize:]))
			}
		}
		dst.checkGuards(t)
		dst = newRowBuffers(3, rowSize, 0)
		err := p.Fetch(ctx, fp.Addr(), "missing", 0, []int64{0, 1, 2}, dst.rows)
		wantSentinel(t, err, base.ErrUnknown)
		wantText(t, err, `variable "missing" is not here`)
		dst.checkGuards(t)
	}
	if n := fp.connCount(); n != 1 {
		t.Errorf("the peer saw %d connections, want 1", n)
	}
}

// TestReadAheadErrorThenReply: an error reply and the reply to the next
// request come in one write, so that the readv readied for the first
// call's rows takes the error and the start of the next reply; the error
// goes to the first call, the rows to the second, on the same connection.
func TestReadAheadErrorThenReply(t *testing.T) {
	const rowSize = 64
	var first wire.Header // the peer's goroutine's
	heldIn := make(chan struct{}, 1)
	fp := startFakePeer(t, func(c net.Conn, h wire.Header, m wire.Fetch) bool {
		if m.Name == "held" {
			first = h // answered with the next request's reply
			heldIn <- struct{}{}
			return true
		}
		n := len(m.Globals) * rowSize
		var b []byte
		if first.ID != 0 {
			b = wire.AppendError(nil, first.Op, first.ID, base.Errorf(base.ErrIndex, "row 99 of held: not in [0, 8)"))
			first = wire.Header{}
		}
		b = append(append(b, frame(h.Op, 0, h.ID, uint64(n), nil)...), replyBytes(n)...)
		_, err := c.Write(b)
		return err == nil
	})
	p := newPool(t, Options{ConnsPerPeer: 1, Timeout: 20 * time.Second})
	ctx := context.Background()
	if err := p.Fetch(ctx, fp.Addr(), "v", 0, []int64{0}, [][]byte{make([]byte, rowSize)}); err != nil {
		t.Fatalf("first Fetch: %v", err)
	}
	for range 3 {
		held := newRowBuffers(8, rowSize, 0)
		ch := goFetch(p, fp.Addr(), "held", make([]int64, 8), held.rows)
		// The second request goes once the peer has the first (it answers
		// both when the second arrives).
		waitSignal(t, heldIn, 5*time.Second, "the peer to get the first request")
		dst := newRowBuffers(5, rowSize, 0)
		if err := p.Fetch(ctx, fp.Addr(), "v", 0, make([]int64, 5), dst.rows); err != nil {
			t.Fatalf("Fetch after an error reply: %v", err)
		}
		want := replyBytes(5 * rowSize)
		for i, row := range dst.rows {
			if !bytes.Equal(row, want[i*rowSize:(i+1)*rowSize]) {
				t.Fatalf("row %d = % x, want % x", i, head(row), head(want[i*rowSize:]))
			}
		}
		dst.checkGuards(t)
		r := waitResult(t, ch, 5*time.Second, "the held Fetch")
		wantSentinel(t, r.err, base.ErrIndex)
		wantText(t, r.err, "row 99 of held")
		held.checkGuards(t)
	}
	if n := fp.connCount(); n != 1 {
		t.Errorf("the peer saw %d connections, want 1", n)
	}
}

// TestReadAheadWrongSize: a reply of more or fewer rows than asked for,
// sent whole, is a protocol error naming the peer; nothing lands past the
// destinations, and the next fetch goes over a new connection, never the
// one being dropped (which is marked dead before the failed call returns;
// when it was marked after, about 1 run in 100 sent the next fetch on it
// and failed that too).
func TestReadAheadWrongSize(t *testing.T) {
	const rowSize = 32
	var extra atomic.Int64
	fp := startFakePeer(t, func(c net.Conn, h wire.Header, m wire.Fetch) bool {
		n := len(m.Globals)*rowSize + int(extra.Load())
		_, err := c.Write(append(frame(h.Op, 0, h.ID, uint64(n), nil), replyBytes(n)...))
		return err == nil
	})
	p := newPool(t, Options{ConnsPerPeer: 1, Timeout: 20 * time.Second})
	ctx := context.Background()
	for _, e := range []int{rowSize, 1, -1, -rowSize} {
		extra.Store(int64(e))
		dst := newRowBuffers(4, rowSize, 0)
		err := p.Fetch(ctx, fp.Addr(), "v", 0, make([]int64, 4), dst.rows)
		wantSentinel(t, err, base.ErrProtocol)
		wantText(t, err, fp.Addr(), "row bytes")
		dst.checkGuards(t)
	}
	extra.Store(0)
	dst := newRowBuffers(4, rowSize, 0)
	if err := p.Fetch(ctx, fp.Addr(), "v", 0, make([]int64, 4), dst.rows); err != nil {
		t.Fatalf("Fetch after the bad replies: %v", err)
	}
	dst.checkGuards(t)
	if n := fp.connCount(); n != 5 {
		t.Errorf("the peer saw %d connections, want 5 (each bad reply costs its connection)", n)
	}
}

// TestFetchAllocationsPerRow: a fetch allocates as much for 256 rows as
// for 2 (the calling side and the serving side, both in this process).
func TestFetchAllocationsPerRow(t *testing.T) {
	const rowSize = 64
	h := newFakeHandler()
	h.addVar("v", 512, rowSize, false)
	s, _ := startServer(t, h)
	p := newPool(t, Options{ConnsPerPeer: 1, Timeout: 20 * time.Second})
	ctx := context.Background()
	allocs := func(n int) float64 {
		globals := make([]int64, n)
		for i := range globals {
			globals[i] = int64(i * 2)
		}
		dst := newRowBuffers(n, rowSize, 0).rows
		fetch := func() {
			if err := p.Fetch(ctx, s.Addr(), "v", 0, globals, dst); err != nil {
				t.Fatal(err)
			}
		}
		fetch() // buffers grow to this size once
		return testing.AllocsPerRun(50, fetch)
	}
	few, many := allocs(2), allocs(256)
	// One allocation of slack: under the race detector sync.Pool drops
	// some of what it is given (the calls' timers). An allocation per row
	// would be 254 more.
	if many > few+1 {
		t.Errorf("a fetch of 256 rows allocates %v times, of 2 rows %v: allocations per row", many, few)
	}
}

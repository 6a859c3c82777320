package transport

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ddstore-go/ddstore/internal/base"
	"github.com/ddstore-go/ddstore/internal/testutil"
	"github.com/ddstore-go/ddstore/internal/wire"
)

// Control ops the fake handler understands.
const (
	opEcho  = wire.OpPeerInfo   // replies Text{"echo:" + request text}
	opBlock = wire.OpPeerLookup // waits for the control gate or the server's ctx
	opFail  = wire.OpPeerFree   // fails with ErrExists
)

// fakeVar is a variable the fake handler serves: nrows rows of rowSize bytes.
type fakeVar struct {
	rowSize int
	data    []byte
	block   bool // Rows waits for the handler's gate
}

func (v *fakeVar) row(g int64) []byte {
	return v.data[int(g)*v.rowSize : int(g+1)*v.rowSize]
}

// gate is a one-shot release.
type gate struct {
	ch   chan struct{}
	once sync.Once
}

func newGate() *gate                  { return &gate{ch: make(chan struct{})} }
func (g *gate) open()                 { g.once.Do(func() { close(g.ch) }) }
func (g *gate) wait() <-chan struct{} { return g.ch }

// fakeHandler is a Handler serving rows from memory and control ops by echo
// or by blocking.
type fakeHandler struct {
	vars map[string]*fakeVar // read-only once serving

	rowsGate *gate
	ctlGate  *gate
	// rowsEntered and ctlEntered get a value (without blocking) whenever a
	// blocking Rows or Control call starts waiting.
	rowsEntered chan struct{}
	ctlEntered  chan struct{}

	rowsCalls atomic.Int64 // Rows calls
	released  atomic.Int64 // release calls: replies fully written
	ctlDone   atomic.Int64 // blocking Control calls that returned
	ctlIn     atomic.Int64 // blocking Control calls under way
	ctlMax    atomic.Int64 // the most of them under way at once
	// ctlCauses gets, without blocking, the cause of each blocking
	// Control call's context that ended it.
	ctlCauses chan error
}

func newFakeHandler() *fakeHandler {
	return &fakeHandler{
		vars:        make(map[string]*fakeVar),
		rowsGate:    newGate(),
		ctlGate:     newGate(),
		rowsEntered: make(chan struct{}, 64),
		ctlEntered:  make(chan struct{}, 64),
		ctlCauses:   make(chan error, 64),
	}
}

// addVar adds a variable of random bytes (seeded by its name, so runs repeat).
func (h *fakeHandler) addVar(name string, nrows, rowSize int, block bool) *fakeVar {
	var seed uint64
	for _, c := range []byte(name) {
		seed = seed*131 + uint64(c)
	}
	r := rand.New(rand.NewPCG(seed, uint64(nrows)*1000003+uint64(rowSize)))
	data := make([]byte, nrows*rowSize)
	for i := 0; i < len(data); i += 8 {
		v := r.Uint64()
		for j := 0; j < 8 && i+j < len(data); j++ {
			data[i+j] = byte(v >> (8 * j))
		}
	}
	v := &fakeVar{rowSize: rowSize, data: data, block: block}
	h.vars[name] = v
	return v
}

// release opens both gates, so nothing stays blocked (used by cleanups).
func (h *fakeHandler) release() {
	h.rowsGate.open()
	h.ctlGate.open()
}

// RowsRange serves a FetchRange as the one slice of the variable's bytes.
func (h *fakeHandler) RowsRange(name string, id, start, count int64, rows [][]byte) ([][]byte, func(), error) {
	h.rowsCalls.Add(1)
	v := h.vars[name]
	if v == nil {
		return rows, nil, base.Errorf(base.ErrUnknown, "variable %q is not here", name)
	}
	nrows := int64(len(v.data) / v.rowSize)
	if start < 0 || count < 0 || start+count > nrows {
		return rows, func() { h.released.Add(1) }, base.Errorf(base.ErrIndex, "rows [%d, %d) of %q not in [0, %d)", start, start+count, name, nrows)
	}
	rows = append(rows, v.data[int(start)*v.rowSize:int(start+count)*v.rowSize])
	return rows, func() { h.released.Add(1) }, nil
}

func (h *fakeHandler) Rows(name string, id int64, globals []int64, rows [][]byte) ([][]byte, func(), error) {
	h.rowsCalls.Add(1)
	if name == "plain-error" {
		return rows, nil, errors.New("plain failure without a sentinel")
	}
	v := h.vars[name]
	if v == nil {
		return rows, nil, base.Errorf(base.ErrUnknown, "variable %q is not here", name)
	}
	if v.block {
		select {
		case h.rowsEntered <- struct{}{}:
		default:
		}
		<-h.rowsGate.wait()
	}
	nrows := int64(len(v.data) / v.rowSize)
	for _, g := range globals {
		if g < 0 || g >= nrows {
			return rows, func() { h.released.Add(1) }, base.Errorf(base.ErrIndex, "row %d of %q not in [0, %d)", g, name, nrows)
		}
		rows = append(rows, v.row(g))
	}
	return rows, func() { h.released.Add(1) }, nil
}

func (h *fakeHandler) Control(ctx context.Context, op wire.Op, body []byte) (func(*wire.Encoder), error) {
	switch op {
	case opEcho:
		m, err := wire.DecodeText(body)
		if err != nil {
			return nil, err
		}
		r := wire.Text{Text: "echo:" + m.Text}
		return r.Encode, nil
	case opBlock:
		select {
		case h.ctlEntered <- struct{}{}:
		default:
		}
		defer h.ctlDone.Add(1)
		n := h.ctlIn.Add(1)
		defer h.ctlIn.Add(-1)
		for m := h.ctlMax.Load(); n > m && !h.ctlMax.CompareAndSwap(m, n); m = h.ctlMax.Load() {
		}
		select {
		case <-h.ctlGate.wait():
			r := wire.Text{Text: "unblocked"}
			return r.Encode, nil
		case <-ctx.Done():
			select {
			case h.ctlCauses <- context.Cause(ctx):
			default:
			}
			return nil, base.Errorf(base.ErrClosed, "server closing")
		}
	case opFail:
		return nil, base.Errorf(base.ErrExists, "control op %v refused on purpose", op)
	}
	return nil, base.Errorf(base.ErrProtocol, "fake handler: unknown op %v", op)
}

// countingListener counts the connections a server accepted.
type countingListener struct {
	net.Listener
	accepted atomic.Int64
}

func (l *countingListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err == nil {
		l.accepted.Add(1)
	}
	return c, err
}

func listen(t *testing.T) net.Listener {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("listen: %v", err)
	}
	return ln
}

func discardLog() *slog.Logger { return slog.New(slog.DiscardHandler) }

// startServer serves h on a fresh loopback port; the cleanup releases h and
// closes the server (once, even if the test closed it already).
func startServer(t *testing.T, h *fakeHandler) (*Server, *countingListener) {
	t.Helper()
	ln := &countingListener{Listener: listen(t)}
	s := NewServer(ln, h, discardLog(), 5*time.Second, nil)
	var once sync.Once
	t.Cleanup(func() {
		h.release()
		once.Do(func() { s.Close() })
	})
	return s, ln
}

func newPool(t *testing.T, opts Options) *Pool {
	t.Helper()
	p := NewPool(opts)
	t.Cleanup(func() { p.Close() })
	return p
}

// eventually polls cond until it holds or the deadline passes.
func eventually(t *testing.T, d time.Duration, what string, cond func() bool) {
	t.Helper()
	testutil.WaitFor(t, d, func() error {
		if !cond() {
			return fmt.Errorf("waiting for %s", what)
		}
		return nil
	})
}

// waitSignal waits for one value on ch.
func waitSignal(t *testing.T, ch <-chan struct{}, d time.Duration, what string) {
	t.Helper()
	select {
	case <-ch:
	case <-time.After(d):
		t.Fatalf("timed out after %v waiting for %s", d, what)
	}
}

// result is what a call run in the background returned.
type result struct {
	err     error
	elapsed time.Duration
}

// goFetch runs a Fetch in the background.
func goFetch(p *Pool, addr, name string, globals []int64, dst [][]byte) <-chan result {
	ch := make(chan result, 1)
	go func() {
		start := time.Now()
		err := p.Fetch(context.Background(), addr, name, 0, globals, dst)
		ch <- result{err, time.Since(start)}
	}()
	return ch
}

func waitResult(t *testing.T, ch <-chan result, d time.Duration, what string) result {
	t.Helper()
	select {
	case r := <-ch:
		return r
	case <-time.After(d):
		t.Fatalf("%s did not return within %v", what, d)
		return result{}
	}
}

// rowBuffers makes n destination rows of size bytes carved out of one buffer
// with a guard byte between rows, so a write past a row's end shows.
type rowBuffers struct {
	buf  []byte
	rows [][]byte
	size int
}

const guardByte = 0xA5

func newRowBuffers(n, size int, fill byte) *rowBuffers {
	stride := size + 1
	b := &rowBuffers{buf: make([]byte, n*stride), rows: make([][]byte, n), size: size}
	for i := range b.buf {
		b.buf[i] = fill
	}
	for i := range n {
		off := i * stride
		b.rows[i] = b.buf[off : off+size : off+size]
		b.buf[off+size] = guardByte
	}
	return b
}

func (b *rowBuffers) checkGuards(t *testing.T) {
	t.Helper()
	stride := b.size + 1
	for i := range b.rows {
		if g := b.buf[i*stride+b.size]; g != guardByte {
			t.Fatalf("guard byte after row %d overwritten: %#x", i, g)
		}
	}
}

// checkRows compares dst with the rows globals of v.
func checkRows(v *fakeVar, globals []int64, dst [][]byte) error {
	for i, g := range globals {
		if !bytes.Equal(dst[i], v.row(g)) {
			return fmt.Errorf("row %d (global %d) differs: got % x..., want % x...", i, g, head(dst[i]), head(v.row(g)))
		}
	}
	return nil
}

func head(b []byte) []byte {
	if len(b) > 8 {
		return b[:8]
	}
	return b
}

func randGlobals(r *rand.Rand, n, nrows int) []int64 {
	g := make([]int64, n)
	for i := range g {
		g[i] = int64(r.IntN(nrows))
	}
	return g
}

func wantSentinel(t *testing.T, err error, sentinels ...error) {
	t.Helper()
	if err == nil {
		t.Fatalf("got nil error, want one of %v", sentinels)
	}
	for _, s := range sentinels {
		if errors.Is(err, s) {
			return
		}
	}
	t.Fatalf("error %q matches none of %v", err, sentinels)
}

func wantText(t *testing.T, err error, parts ...string) {
	t.Helper()
	for _, p := range parts {
		if !strings.Contains(err.Error(), p) {
			t.Fatalf("error %q does not mention %q", err, p)
		}
	}
}

package transport

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"slices"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/ddstore-go/ddstore/internal/auth"
	"github.com/ddstore-go/ddstore/internal/base"
	"github.com/ddstore-go/ddstore/internal/wire"
)

// Options tune the TCP transport.
type Options struct {
	// ConnsPerPeer is how many connections a pool keeps to each peer for
	// fetches of more than SmallFetchBytes; they are spread over them so
	// that a large reply does not hold up the rest, and both ends move
	// rows on several cores. Fetches of at most SmallFetchBytes go over a
	// connection of their own (the small lane), so that a single row
	// never waits behind megabytes of another read's rows (a peer answers
	// the fetches of one connection in turn). Control calls (Call) go
	// over one more connection, so that a node that only speaks to a
	// peer (the coordinator) holds one connection to it, and no control
	// reply waits behind rows. Each is dialed on first use.
	ConnsPerPeer int
	// Timeout bounds a call: a peer that has not answered by then fails it
	// with ErrTimeout, naming the peer. Zero means 30 s.
	Timeout time.Duration
	// DialTimeout bounds connecting, authentication included. Zero means 5 s.
	DialTimeout time.Duration
	// IdleClose closes a peer's connections once none of them has been
	// used for that long and no call is in flight on them; they are
	// dialed again when next needed. Zero: never.
	IdleClose time.Duration
	// MaxPeers caps the peers the pool holds connections to: dialing one
	// more closes the connections of the least recently used peer with no
	// call in flight (a soft cap: when every peer has calls in flight, none
	// is closed and the pool goes over it). Zero: no cap.
	MaxPeers int
	// Key gives the job's key, which every new connection proves before
	// its first request (auth.Initiate), or the reason there is none yet.
	// Nil: connections are not authenticated (tests of the transport
	// alone; the agent always sets it).
	Key func() (auth.Key, error)
}

// SmallFetchBytes is the largest reply a fetch sends on the small lane
// (Options.ConnsPerPeer): a few rows of a few KiB, each answered in
// microseconds, so that those queued on it wait for little.
const SmallFetchBytes = 64 << 10

// The lanes of a peer's connections, and the slots of peerConns.conns
// after the ConnsPerPeer fetch connections: the small lane, then the
// control connection.
type lane int

const (
	laneBulk lane = iota
	laneSmall
	laneControl
)

func (o Options) withDefaults() Options {
	if o.ConnsPerPeer <= 0 {
		o.ConnsPerPeer = 4
	}
	if o.Timeout <= 0 {
		o.Timeout = 30 * time.Second
	}
	if o.DialTimeout <= 0 {
		o.DialTimeout = 5 * time.Second
	}
	return o
}

// Pool is the calling side: persistent connections to peers, each
// multiplexing many requests by id.
type Pool struct {
	opts Options
	// mu is taken under a peerConns.mu (lock order: internal/LOCKS.md).
	mu struct {
		sync.Mutex
		peers  map[string]*peerConns
		closed bool
	}
	wg   sync.WaitGroup // read loops and the idle sweep
	open atomic.Int64   // connections whose read loop runs
	// idleClosed counts connections closed idle or over MaxPeers.
	idleClosed atomic.Int64
	stop       chan struct{} // closed by Close: ends the idle sweep
}

// Conns is how many connections to peers the pool holds open.
func (p *Pool) Conns() int { return int(p.open.Load()) }

// IdleClosed is how many connections the pool closed because they were
// idle (Options.IdleClose) or to stay within Options.MaxPeers.
func (p *Pool) IdleClosed() int64 { return p.idleClosed.Load() }

// errIdle is what a connection closed idle says to a call that took it
// just before: the call dials again.
var errIdle = errors.New("connection closed idle")

type peerConns struct {
	used  atomic.Int64 // when a call last took one of them (UnixNano)
	next  atomic.Uint32
	conns []*conn    // slots: the bulk lane's, the small lane's, the control connection; nil or dead ones are redialed
	mu    sync.Mutex // guards conns, held while dialing one; lock order: internal/LOCKS.md
}

var _ Transport = (*Pool)(nil)

// NewPool makes an empty pool; connections are dialed on first use.
func NewPool(opts Options) *Pool {
	p := &Pool{opts: opts.withDefaults(), stop: make(chan struct{})}
	p.mu.peers = make(map[string]*peerConns)
	if p.opts.IdleClose > 0 {
		p.wg.Add(1)
		go p.sweep()
	}
	return p
}

// sweep closes idle peers' connections until Close.
func (p *Pool) sweep() {
	defer p.wg.Done()
	t := time.NewTicker(max(p.opts.IdleClose/2, time.Millisecond))
	defer t.Stop()
	for {
		select {
		case <-p.stop:
			return
		case <-t.C:
			before := time.Now().Add(-p.opts.IdleClose).UnixNano()
			for _, pc := range p.peerList("") {
				if pc.used.Load() < before {
					pc.closeIdle(p)
				}
			}
		}
	}
}

// peerList is the pool's peers but addr's, least recently used first.
func (p *Pool) peerList(addr string) []*peerConns {
	p.mu.Lock()
	l := make([]*peerConns, 0, len(p.mu.peers))
	for a, pc := range p.mu.peers {
		if a != addr {
			l = append(l, pc)
		}
	}
	p.mu.Unlock()
	slices.SortFunc(l, func(x, y *peerConns) int { return cmp.Compare(x.used.Load(), y.used.Load()) })
	return l
}

// trim closes the connections of the least recently used peers other than
// addr with no call in flight, until at most MaxPeers peers have any.
func (p *Pool) trim(addr string) {
	if p.opts.MaxPeers <= 0 {
		return
	}
	l := p.peerList(addr)
	n := 1 // addr's
	for _, pc := range l {
		if pc.live() {
			n++
		}
	}
	for _, pc := range l {
		if n <= p.opts.MaxPeers {
			return
		}
		if pc.live() && pc.closeIdle(p) {
			n--
		}
	}
}

// live says whether any of the peer's connections is open.
func (pc *peerConns) live() bool {
	pc.mu.Lock()
	defer pc.mu.Unlock()
	for _, c := range pc.conns {
		if c != nil && !c.dead.Load() {
			return true
		}
	}
	return false
}

// closeIdle closes the peer's connections if none has a call in flight,
// and reports whether it did.
func (pc *peerConns) closeIdle(p *Pool) bool {
	pc.mu.Lock()
	defer pc.mu.Unlock()
	var open []*conn
	for _, c := range pc.conns {
		if c == nil || c.dead.Load() {
			continue
		}
		c.mu.Lock()
		busy := len(c.mu.pending) > 0 || c.receiving.Load()
		c.mu.Unlock()
		if busy {
			return false
		}
		open = append(open, c)
	}
	closed := false
	for _, c := range open {
		if c.closeIdle() {
			p.idleClosed.Add(1)
			closed = true
		}
	}
	return closed
}

// Close closes every connection; calls in flight fail with ErrClosed.
func (p *Pool) Close() error {
	p.mu.Lock()
	if !p.mu.closed {
		close(p.stop)
	}
	p.mu.closed = true
	peers := p.mu.peers
	p.mu.peers = nil
	p.mu.Unlock()
	for _, pc := range peers {
		pc.mu.Lock()
		for _, c := range pc.conns {
			if c != nil {
				c.fail(base.Errorf(base.ErrClosed, "transport closed"))
			}
		}
		pc.mu.Unlock()
	}
	p.wg.Wait()
	return nil
}

// get returns a live connection to addr of lane l: the control one, the
// small lane's, or one of the ConnsPerPeer bulk connections in turn; dialed
// says it was dialed now (so that the pool trims its peers, outside of
// pc.mu).
func (p *Pool) get(ctx context.Context, addr string, l lane) (c *conn, dialed bool, err error) {
	c, err = p.getConn(ctx, addr, l, &dialed)
	return c, dialed, err
}

func (p *Pool) getConn(ctx context.Context, addr string, l lane, dialed *bool) (*conn, error) {
	p.mu.Lock()
	if p.mu.closed {
		p.mu.Unlock()
		return nil, base.Errorf(base.ErrClosed, "transport closed")
	}
	pc := p.mu.peers[addr]
	if pc == nil {
		pc = &peerConns{conns: make([]*conn, p.opts.ConnsPerPeer+2)}
		p.mu.peers[addr] = pc
	}
	p.mu.Unlock()
	pc.used.Store(time.Now().UnixNano())
	var i int
	switch l {
	case laneControl:
		i = p.opts.ConnsPerPeer + 1
	case laneSmall:
		i = p.opts.ConnsPerPeer
	default:
		i = int(pc.next.Add(1)) % p.opts.ConnsPerPeer
	}
	pc.mu.Lock()
	defer pc.mu.Unlock()
	if c := pc.conns[i]; c != nil && !c.dead.Load() {
		return c, nil
	}
	nc, err := p.dial(ctx, addr)
	if err != nil {
		return nil, err
	}
	c, err := newConn(nc.(*net.TCPConn), addr, l != laneControl)
	if err != nil {
		nc.Close()
		return nil, err
	}
	p.mu.Lock()
	if p.mu.closed {
		p.mu.Unlock()
		nc.Close()
		return nil, base.Errorf(base.ErrClosed, "transport closed")
	}
	p.wg.Add(1)
	p.mu.Unlock()
	p.open.Add(1)
	go func() {
		defer p.wg.Done()
		defer p.open.Add(-1)
		c.readLoop()
	}()
	pc.conns[i] = c
	*dialed = true
	return c, nil
}

// dial connects to addr and authenticates. A connection the peer closes
// before the handshake ends — a server that sheds connections arriving
// while too many others are unauthenticated (MaxUnauthenticated), as when
// every node of a large job dials the coordinator at once — is dialed
// again, a few times with a growing pause: nothing was sent on it. A peer
// that refuses the connection, or the key, fails at once.
func (p *Pool) dial(ctx context.Context, addr string) (net.Conn, error) {
	pause := 10 * time.Millisecond
	for try := 0; ; try++ {
		d := net.Dialer{Timeout: p.opts.DialTimeout}
		nc, err := d.DialContext(ctx, "tcp", addr)
		if err != nil && ctx.Err() != nil {
			return nil, fmt.Errorf("%w: connect to %s: %w", base.ErrTimeout, addr, ctx.Err())
		}
		if err != nil {
			return nil, fmt.Errorf("%w: connect to %s: %w", base.ErrPeer, addr, err)
		}
		err = p.authenticate(ctx, nc, addr)
		if err == nil {
			return nc, nil
		}
		nc.Close()
		if !errors.Is(err, errShed) || try == 4 {
			return nil, err
		}
		t := time.NewTimer(pause)
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			return nil, fmt.Errorf("%w: connect to %s: %w", base.ErrTimeout, addr, ctx.Err())
		}
		pause *= 2
	}
}

// errShed marks an authentication the peer cut short by closing the
// connection.
var errShed = errors.New("closed by the peer during the handshake")

// authenticate proves the job's key on a new connection, before anything
// else is sent on it.
func (p *Pool) authenticate(ctx context.Context, nc net.Conn, addr string) error {
	if p.opts.Key == nil {
		return nil
	}
	k, err := p.opts.Key()
	if err != nil {
		return fmt.Errorf("connecting to peer %s: %w", addr, err)
	}
	by := time.Now().Add(p.opts.DialTimeout)
	if d, ok := ctx.Deadline(); ok && d.Before(by) {
		by = d
	}
	nc.SetDeadline(by)
	defer nc.SetDeadline(time.Time{})
	err = auth.Initiate(nc, k, auth.Peer)
	switch {
	case err == nil:
		return nil
	case errors.Is(err, base.ErrAuth) || errors.Is(err, base.ErrProtocol):
		return fmt.Errorf("authenticating to peer %s: %w", addr, err)
	case errors.Is(err, os.ErrDeadlineExceeded):
		return fmt.Errorf("%w: peer %s did not complete authentication in time: %w", base.ErrTimeout, addr, err)
	case errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, syscall.ECONNRESET):
		return fmt.Errorf("%w: authenticating to peer %s: %w (%w)", base.ErrPeer, addr, err, errShed)
	default:
		return fmt.Errorf("%w: authenticating to peer %s: %w", base.ErrPeer, addr, err)
	}
}

// Fetch implements Transport.
func (p *Pool) Fetch(ctx context.Context, addr, name string, id int64, globals []int64, dst [][]byte) error {
	var want uint64
	for _, d := range dst {
		want += uint64(len(d))
	}
	m := wire.Fetch{Name: name, ID: id, Globals: globals}
	_, err := p.call(ctx, addr, wire.OpFetch, m.Encode, dst, want)
	return err
}

// FetchRange asks addr for its rows [start, start+count) of a variable,
// into dst (their bytes, in order): one request (FetchRange) whatever the
// rows' size.
func (p *Pool) FetchRange(ctx context.Context, addr, name string, id, start, count int64, dst []byte) error {
	m := wire.FetchRange{Name: name, ID: id, Start: start, Count: count}
	_, err := p.call(ctx, addr, wire.OpFetchRange, m.Encode, [][]byte{dst}, uint64(len(dst)))
	return err
}

// Call sends a control request and returns the reply's body.
func (p *Pool) Call(ctx context.Context, addr string, op wire.Op, fill func(*wire.Encoder)) ([]byte, error) {
	return p.call(ctx, addr, op, fill, nil, 0)
}

func (p *Pool) call(ctx context.Context, addr string, op wire.Op, fill func(*wire.Encoder), dst [][]byte, want uint64) ([]byte, error) {
	l := laneControl
	if op == wire.OpFetch || op == wire.OpFetchRange {
		l = laneBulk
		if want <= SmallFetchBytes {
			l = laneSmall
		}
	}
	cl := &call{done: make(chan struct{}), dst: dst, want: want}
	c, err := p.sendCall(ctx, addr, l, cl, op, fill)
	if err != nil {
		return nil, err
	}
	timeout := p.opts.Timeout
	if l == laneControl {
		timeout = 0 // control calls (collectives) are bounded by ctx, which carries their own timeout
	}
	var timer <-chan time.Time
	if timeout > 0 {
		t := getTimer(timeout)
		defer putTimer(t)
		timer = t.C
	}
	select {
	case <-cl.done:
		return cl.body, cl.err
	case <-timer:
		err = base.Errorf(base.ErrTimeout, "peer %s did not answer %s within %v", addr, op, timeout)
	case <-ctx.Done():
		err = fmt.Errorf("%w: %s to peer %s: %w", base.ErrTimeout, op, addr, ctx.Err())
	}
	if c.abandon(cl) {
		return nil, err
	}
	select {
	case <-cl.done: // it finished as the timer fired
		return cl.body, cl.err
	default:
	}
	// The reply is being read into dst right now: cut the connection so
	// that the read ends, and return only once nothing more is written.
	c.fail(err)
	<-cl.done
	return nil, err
}

// timers keeps the calls' timers, stopped: a fetch per owner of a batch
// would otherwise make one (three allocations) each.
var timers sync.Pool

func getTimer(d time.Duration) *time.Timer {
	if t, ok := timers.Get().(*time.Timer); ok {
		t.Reset(d)
		return t
	}
	return time.NewTimer(d)
}

// putTimer stops t and keeps it; once stopped, its channel holds nothing
// (timers' channels are unbuffered since Go 1.23), so the next call that
// takes it cannot see this one's expiry.
func putTimer(t *time.Timer) {
	t.Stop()
	timers.Put(t)
}

// sendCall sends cl on a connection to addr of lane l and returns the
// connection; one closed idle just as it was taken is dialed again.
func (p *Pool) sendCall(ctx context.Context, addr string, l lane, cl *call, op wire.Op, fill func(*wire.Encoder)) (*conn, error) {
	// Sending is bounded like the rest: a peer that stops reading must not
	// hold a large request (and the calls queued behind it) forever.
	sendBy := time.Now().Add(30 * time.Second)
	if l != laneControl {
		sendBy = time.Now().Add(p.opts.Timeout)
	}
	if d, ok := ctx.Deadline(); ok && d.Before(sendBy) {
		sendBy = d
	}
	for {
		c, dialed, err := p.get(ctx, addr, l)
		if err != nil {
			return nil, err
		}
		if dialed {
			p.trim(addr)
		}
		err = c.send(cl, op, fill, sendBy)
		switch {
		case err == nil:
			return c, nil
		case errors.Is(err, errIdle):
			continue
		case errors.Is(err, os.ErrDeadlineExceeded):
			return nil, fmt.Errorf("%w: sending %s to peer %s: %w", base.ErrTimeout, op, addr, err)
		}
		return nil, err
	}
}

// call is one request in flight.
type call struct {
	id    uint64
	state atomic.Int32 // callPending → callReceiving, or → callAbandoned
	dst   [][]byte
	want  uint64
	body  []byte
	err   error
	done  chan struct{}
}

const (
	callPending int32 = iota
	callReceiving
	callAbandoned
)

// conn is one connection of a pool: writes under a mutex, one read loop
// that routes replies to their calls by id.
type conn struct {
	addr string
	nc   *net.TCPConn
	raw  syscall.RawConn
	// ordered: a fetch connection, whose replies come in request order
	// (the serving side answers fetches one at a time, on its read loop:
	// docs/protocol.md), so that the read loop knows which call the next
	// reply answers before reading it (replyReader.readAhead).
	ordered bool
	rd      *replyReader
	// wmu guards wbuf, wn, werr; held while a request is numbered and
	// written, so that requests go out in the order of their ids (lock
	// order: internal/LOCKS.md).
	wmu   sync.Mutex
	wbuf  []byte
	wn    int
	werr  error
	wstep func(uintptr) bool // writeStep, bound once
	// mu is a leaf (lock order: internal/LOCKS.md).
	mu struct {
		sync.Mutex
		next    uint64
		pending map[uint64]*call
		err     error
	}
	dead atomic.Bool
	// receiving: the read loop has taken a reply's call out of pending and
	// is reading its rows (set under mu, so that closeIdle, which checks
	// it under mu, never closes a connection in the middle of a reply).
	receiving atomic.Bool
}

func newConn(nc *net.TCPConn, addr string, ordered bool) (*conn, error) {
	raw, err := nc.SyscallConn()
	if err != nil {
		return nil, err
	}
	nc.SetNoDelay(true)
	nc.SetReadBuffer(4 << 20)
	c := &conn{addr: addr, nc: nc, raw: raw, ordered: ordered}
	c.mu.pending = make(map[uint64]*call)
	c.rd = newReplyReader(c)
	c.wstep = c.writeStep
	return c, nil
}

func (c *conn) send(cl *call, op wire.Op, fill func(*wire.Encoder), by time.Time) error {
	c.wmu.Lock()
	defer c.wmu.Unlock()
	c.mu.Lock()
	if c.mu.err != nil {
		err := c.mu.err
		c.mu.Unlock()
		return err
	}
	c.mu.next++
	cl.id = c.mu.next
	c.mu.pending[cl.id] = cl
	c.mu.Unlock()

	c.wbuf = wire.AppendFrame(c.wbuf[:0], op, 0, cl.id, 0, fill)
	// A request is a few hundred bytes, which an open socket takes at
	// once: try that first, with no deadline to set (a timer change per
	// request); only one the socket cannot take whole waits, bounded by by.
	err := c.raw.Write(c.wstep)
	if err == nil {
		err = c.werr
	}
	if err == nil && c.wn < len(c.wbuf) {
		c.nc.SetWriteDeadline(by)
		_, err = c.nc.Write(c.wbuf[c.wn:])
		c.nc.SetWriteDeadline(time.Time{})
	}
	if err != nil {
		err = fmt.Errorf("%w: send %s to %s: %w", base.ErrPeer, op, c.addr, err)
		c.fail(err)
		return err
	}
	return nil
}

// writeStep is send's one try at writing wbuf whole, without waiting.
func (c *conn) writeStep(fd uintptr) bool {
	for {
		c.wn, c.werr = unix.Write(int(fd), c.wbuf)
		if c.werr != unix.EINTR {
			break
		}
	}
	if c.werr != nil {
		c.wn = 0
		if c.werr == unix.EAGAIN {
			c.werr = nil
		}
	}
	return true
}

// claim takes the call numbered id out of pending for the read loop to
// read its reply into, if it is waiting and its reply small (at most
// SmallFetchBytes: where a system call is worth saving; a larger one is
// read as it comes, header first); nil if not (not sent yet, given up on,
// or large).
func (c *conn) claim(id uint64) *call {
	c.mu.Lock()
	defer c.mu.Unlock()
	cl := c.mu.pending[id]
	if cl == nil || cl.want > SmallFetchBytes || !cl.state.CompareAndSwap(callPending, callReceiving) {
		return nil
	}
	delete(c.mu.pending, id)
	c.receiving.Store(true)
	return cl
}

// unclaim puts back a call claimed before anything of its reply was read.
// A caller that gave up in between has seen it receiving, and cuts the
// connection (call): the read loop then ends and fails it with the rest.
func (c *conn) unclaim(cl *call) {
	c.mu.Lock()
	c.mu.pending[cl.id] = cl
	cl.state.Store(callPending)
	c.receiving.Store(false)
	c.mu.Unlock()
}

// closeIdle closes the connection if no call is in flight on it, and
// reports whether it did; a call that took it meanwhile finds errIdle and
// dials again.
func (c *conn) closeIdle() bool {
	c.mu.Lock()
	if c.mu.err != nil || len(c.mu.pending) > 0 || c.receiving.Load() {
		c.mu.Unlock()
		return false
	}
	c.mu.err = errIdle
	c.dead.Store(true)
	c.mu.Unlock()
	c.nc.Close()
	return true
}

// abandon gives up on a call that has not started receiving; it reports
// whether that worked (else the read loop owns the call until done).
func (c *conn) abandon(cl *call) bool {
	if !cl.state.CompareAndSwap(callPending, callAbandoned) {
		return false
	}
	c.mu.Lock()
	delete(c.mu.pending, cl.id)
	c.mu.Unlock()
	return true
}

// fail closes the connection and fails every call still waiting on it.
func (c *conn) fail(err error) {
	c.mu.Lock()
	if c.mu.err == nil {
		c.mu.err = err
	}
	c.dead.Store(true)
	c.mu.Unlock()
	c.nc.Close()
}

func (c *conn) readLoop() {
	r := c.rd
	var buf []byte
	var iovs [][]byte
	var err error
	expect := uint64(1) // on an ordered connection, the id of the next reply
	for {
		c.receiving.Store(false)
		var cl *call // the call being read into: out of pending, receiving
		var got int  // bytes of cl's rows read with the header
		if c.ordered && len(r.carry) == 0 {
			cl, got, err = r.readAhead(expect)
		} else {
			_, err = io.ReadFull(r, r.hdr[:])
		}
		if err != nil {
			c.abort(cl, fmt.Errorf("%w: reading a reply from %s: %w", base.ErrPeer, c.addr, err))
			break
		}
		var h wire.Header
		if h, err = wire.ParseHeader(r.hdr[:]); err != nil {
			err = fmt.Errorf("reply from %s: %w", c.addr, err)
			c.abort(cl, err)
			break
		}
		if cl != nil && h.ID == cl.id && h.Status == 0 && h.BodyLen == 0 && h.Payload == cl.want {
			// The reply readied for, as nearly every one is.
			if uint64(got) < cl.want {
				iovs = append(iovs[:0], cl.dst...)
				if rerr := r.rows(Advance(iovs, got)); rerr != nil {
					err = rerr
					c.abort(cl, fmt.Errorf("%w: reading rows from %s: %w", base.ErrPeer, c.addr, rerr))
					break
				}
				clear(iovs)
			}
			expect++
			c.done(cl)
			continue
		}
		// Any other frame is taken apart as on any connection, matched by
		// id, the bytes read ahead of it first.
		if got > 0 {
			r.unread(cl.dst, got)
		}
		if cl != nil && h.ID != cl.id {
			// Not its reply (one the peer was not asked for): the call
			// waits for its own, and may give up meanwhile. What was read
			// into its rows is overwritten by them.
			c.unclaim(cl)
			cl = nil
		}
		var body []byte
		h, body, err = wire.ReadBody(r, h, buf, wire.MaxBody)
		buf = body[:0]
		if err != nil {
			err = fmt.Errorf("reply from %s: %w", c.addr, err)
			c.abort(cl, err)
			break
		}
		if h.ID >= expect {
			// Past any id the peer skipped (it answers in order, so one it
			// skipped will not come): the next reply is readied for again.
			expect = h.ID + 1
		}
		if cl == nil {
			c.mu.Lock()
			cl = c.mu.pending[h.ID]
			delete(c.mu.pending, h.ID)
			c.receiving.Store(true)
			c.mu.Unlock()
			if cl == nil || !cl.state.CompareAndSwap(callPending, callReceiving) {
				// A reply to a call that timed out: drop its rows.
				if _, err = io.CopyN(io.Discard, r, int64(h.Payload)); err != nil {
					break
				}
				continue
			}
		}
		if serr := wire.StatusError(h, body); serr != nil {
			if h.Payload != 0 {
				err = base.Errorf(base.ErrProtocol, "error reply from %s carries %d payload bytes", c.addr, h.Payload)
				c.abort(cl, err)
				break
			}
			c.finish(cl, serr)
			continue
		}
		if h.Payload != cl.want {
			err = base.Errorf(base.ErrProtocol, "peer %s sent %d row bytes, want %d", c.addr, h.Payload, cl.want)
			c.abort(cl, err)
			break
		}
		if h.Payload > 0 {
			iovs = append(iovs[:0], cl.dst...)
			if rerr := r.rows(iovs); rerr != nil {
				err = rerr
				c.abort(cl, fmt.Errorf("%w: reading rows from %s: %w", base.ErrPeer, c.addr, rerr))
				break
			}
			clear(iovs)
		}
		cl.body = append([]byte(nil), body...)
		c.done(cl)
	}
	if errors.Is(err, io.EOF) {
		err = io.ErrUnexpectedEOF
	}
	c.fail(fmt.Errorf("%w: connection to %s: %w", base.ErrPeer, c.addr, err))
	c.mu.Lock()
	ferr := c.mu.err
	pending := c.mu.pending
	c.mu.pending = map[uint64]*call{}
	c.mu.Unlock()
	for _, cl := range pending {
		if cl.state.CompareAndSwap(callPending, callReceiving) {
			cl.err = ferr
			close(cl.done)
		}
	}
}

// abort ends the connection for a reason it cannot go on from, then the
// read loop's call cl (if any) with err: in that order, so that a caller
// woken by err does not send its next request on this connection.
func (c *conn) abort(cl *call, err error) {
	cause := err
	if errors.Is(cause, io.EOF) {
		cause = io.ErrUnexpectedEOF
	}
	c.fail(fmt.Errorf("%w: connection to %s: %w", base.ErrPeer, c.addr, cause))
	c.finish(cl, err)
}

// finish ends the read loop's call cl (if any) with err.
func (c *conn) finish(cl *call, err error) {
	if cl != nil {
		cl.err = err
		c.done(cl)
	}
}

// done wakes the caller of cl, whose reply has been read: the connection
// is no longer receiving by then, so that the caller's next move (a dial
// that trims the pool's peers, say) sees it idle.
func (c *conn) done(cl *call) {
	c.receiving.Store(false)
	close(cl.done)
}

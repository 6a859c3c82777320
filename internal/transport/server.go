package transport

import (
	"bufio"
	"context"
	"errors"
	"log/slog"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ddstore-go/ddstore/internal/auth"
	"github.com/ddstore-go/ddstore/internal/base"
	"github.com/ddstore-go/ddstore/internal/wire"
)

// Server answers the peer protocol on a TCP listener.
type Server struct {
	ln      net.Listener
	h       Handler
	log     *slog.Logger
	timeout time.Duration
	ctx     context.Context
	cancel  context.CancelFunc
	wg      sync.WaitGroup
	// mu guards conns; a leaf (lock order: internal/LOCKS.md).
	mu struct {
		sync.Mutex
		conns map[net.Conn]struct{}
	}
	// BadFrames counts connections dropped for a malformed frame.
	BadFrames atomic.Int64
	// Refused counts connections dropped because they did not prove the
	// job's key (see key in NewServer).
	Refused atomic.Int64
	// Shed counts connections closed on arrival because MaxUnauthenticated
	// others had not authenticated yet.
	Shed atomic.Int64
	// Throttled counts the times a connection's read loop waited for one
	// of its MaxInFlight requests to be answered before reading more.
	Throttled atomic.Int64
	// Direct is how many connections of clients reading rows straight
	// from this node (auth.Direct) are open.
	Direct atomic.Int64
	// unauth counts the connections accepted that have not finished their
	// handshake (incremented by the accept loop only).
	unauth atomic.Int64
	key    func() (auth.Key, error)
}

// MaxUnauthenticated bounds the connections a server holds that have not
// proved the key yet; one more arriving is closed at once (Shed). Each is
// dropped after authTimeout, and reads at most two handshake frames of
// auth.MaxBody bytes, so until a peer proves the key it costs the server
// a goroutine and a few hundred bytes.
const MaxUnauthenticated = 64

// Unauthenticated is the number of connections accepted that have not
// finished their handshake.
func (s *Server) Unauthenticated() int { return int(s.unauth.Load()) }

// NewServer serves ln with h until Close. writeTimeout bounds sending one
// reply to a peer that stopped reading (a reply fails once it has waited
// between half of writeTimeout and all of it: serverConn.by). key gives the job's key, which
// every connection must prove (auth.Respond) before its first request, or
// the reason there is none yet (then every connection is refused); nil:
// connections are not authenticated (tests of the transport alone; the
// agent always sets it).
func NewServer(ln net.Listener, h Handler, log *slog.Logger, writeTimeout time.Duration, key func() (auth.Key, error)) *Server {
	if writeTimeout <= 0 {
		writeTimeout = 30 * time.Second
	}
	s := &Server{ln: ln, h: h, log: log, timeout: writeTimeout, key: key}
	s.ctx, s.cancel = context.WithCancel(context.Background())
	s.mu.conns = make(map[net.Conn]struct{})
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		s.acceptLoop()
	}()
	return s
}

// Conns is how many connections from peers the server holds open.
func (s *Server) Conns() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.mu.conns)
}

// Addr is where the server listens.
func (s *Server) Addr() string { return s.ln.Addr().String() }

// Close stops accepting, closes every connection and waits for every
// goroutine the server started.
func (s *Server) Close() error {
	s.cancel()
	err := s.ln.Close()
	s.mu.Lock()
	for c := range s.mu.conns {
		c.Close()
	}
	s.mu.Unlock()
	s.wg.Wait()
	return err
}

func (s *Server) acceptLoop() {
	var backoff time.Duration
	for {
		nc, err := s.ln.Accept()
		if err != nil {
			if s.ctx.Err() != nil || errors.Is(err, net.ErrClosed) {
				return
			}
			// Out of descriptors and the like pass: keep serving.
			backoff = min(max(2*backoff, 5*time.Millisecond), time.Second)
			s.log.Error("peer accept; retrying", "err", err, "in", backoff)
			select {
			case <-s.ctx.Done():
				return
			case <-time.After(backoff):
			}
			continue
		}
		backoff = 0
		if s.key != nil && s.unauth.Load() >= MaxUnauthenticated {
			s.Shed.Add(1)
			s.log.Debug("peer connection closed: too many connections authenticating", "remote", nc.RemoteAddr().String(), "max", MaxUnauthenticated)
			nc.Close()
			continue
		}
		if tc, ok := nc.(*net.TCPConn); ok {
			tc.SetNoDelay(true)
			tc.SetWriteBuffer(4 << 20)
		}
		s.mu.Lock()
		if s.ctx.Err() != nil {
			s.mu.Unlock()
			nc.Close()
			return
		}
		s.mu.conns[nc] = struct{}{}
		s.wg.Add(1)
		s.mu.Unlock()
		if s.key != nil {
			s.unauth.Add(1)
		}
		go func() {
			defer s.wg.Done()
			s.serveConn(nc)
			s.mu.Lock()
			delete(s.mu.conns, nc)
			s.mu.Unlock()
			nc.Close()
		}()
	}
}

// serverConn is the write side of one accepted connection, shared by the
// read loop (row replies) and control goroutines (their replies).
type serverConn struct {
	nc      net.Conn
	timeout time.Duration
	mu      sync.Mutex // guards hdr, bufs and by, held while a reply is written; lock order: internal/LOCKS.md
	hdr     []byte
	bufs    net.Buffers
	// by is the write deadline set on nc: moved on only once less than
	// half the timeout is left, so that a reply seldom costs a change of
	// the runtime's timer (a reply still fails if it has not gone in
	// between half the timeout and the whole).
	by time.Time
}

func (w *serverConn) reply(op wire.Op, id uint64, err error, fill func(*wire.Encoder), rows [][]byte) error {
	w.mu.Lock()
	defer w.mu.Unlock()
	if err != nil {
		w.hdr = wire.AppendError(w.hdr[:0], op, id, err)
		rows = nil
	} else {
		var n uint64
		for _, r := range rows {
			n += uint64(len(r))
		}
		w.hdr = wire.AppendFrame(w.hdr[:0], op, 0, id, n, fill)
	}
	w.bufs = append(append(w.bufs[:0], w.hdr), rows...)
	if now := time.Now(); w.by.Sub(now) < w.timeout/2 {
		w.by = now.Add(w.timeout)
		w.nc.SetWriteDeadline(w.by)
	}
	bufs := w.bufs // WriteTo consumes its receiver
	_, werr := bufs.WriteTo(w.nc)
	clear(w.bufs)
	return werr
}

// requestBuffer is the buffer a connection's requests are read through:
// a Fetch of up to about 500 rows; a larger body is read past it.
const requestBuffer = 4 << 10

// authTimeout bounds a peer's handshake: a connection that has not proved
// the key by then is dropped.
const authTimeout = 10 * time.Second

// authenticate runs the handshake on a new connection: an agent proving
// the peer key, or a client of another node proving the direct key
// (auth.DirectKeyOf the peer key), which may only read rows. False: it is
// refused (counted, logged) and the caller closes it.
func (s *Server) authenticate(nc net.Conn) (p auth.Proto, ok bool) {
	if s.key == nil {
		return auth.Peer, true
	}
	nc.SetDeadline(time.Now().Add(authTimeout))
	p, err := auth.RespondAny(nc, []auth.Proto{auth.Peer, auth.Direct}, func(p auth.Proto) (auth.Key, error) {
		k, err := s.key()
		if p == auth.Direct {
			k = auth.DirectKeyOf(k)
		}
		return k, err
	})
	nc.SetDeadline(time.Time{})
	s.unauth.Add(-1)
	if err == nil {
		return p, true
	}
	if errors.Is(err, auth.ErrHungUp) {
		s.log.Debug("peer connection closed before authenticating", "remote", nc.RemoteAddr().String())
		return p, false
	}
	s.Refused.Add(1)
	s.log.Warn("peer connection refused: it did not prove the job's key", "remote", nc.RemoteAddr().String(), "proto", p.String(), "err", err)
	return p, false
}

// MaxInFlight bounds the control requests of one connection being answered
// at once, and MaxInFlightBytes their bodies (each kept until its reply):
// past either, the connection's read loop stops reading until a reply is
// written, so a peer that sends requests without reading the replies
// fills its own socket buffers, not this agent's memory. (Fetches are
// answered one at a time in the read loop itself.) A legitimate agent has
// at most one request in flight per client of its node at a time, spread
// over its pool's connections, so collectives waiting for other ranks
// never fill the bound in a real job.
const (
	MaxInFlight      = 256
	MaxInFlightBytes = 64 << 20
)

// inFlight counts one connection's control requests being answered.
type inFlight struct {
	mu    sync.Mutex // guards n and bytes; a leaf (lock order: internal/LOCKS.md)
	n     int
	bytes int64
	freed chan struct{} // one slot: a request was answered since the last look
}

func (f *inFlight) try(size int64) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.n >= MaxInFlight || (f.n > 0 && f.bytes+size > MaxInFlightBytes) {
		return false
	}
	f.n++
	f.bytes += size
	return true
}

func (f *inFlight) release(size int64) {
	f.mu.Lock()
	f.n--
	f.bytes -= size
	f.mu.Unlock()
	select {
	case f.freed <- struct{}{}:
	default:
	}
}

// acquire waits for room for a request of size bytes (counted in
// Throttled when it has to); false: the server is closing.
func (s *Server) acquire(f *inFlight, size int64) bool {
	if f.try(size) {
		return true
	}
	s.Throttled.Add(1)
	for {
		select {
		case <-f.freed:
		case <-s.ctx.Done():
			return false
		}
		if f.try(size) {
			return true
		}
	}
}

func (s *Server) serveConn(nc net.Conn) {
	proto, ok := s.authenticate(nc)
	if !ok {
		return
	}
	direct := proto == auth.Direct
	if direct {
		s.Direct.Add(1)
		defer s.Direct.Add(-1)
	}
	w := &serverConn{nc: nc, timeout: s.timeout}
	busy := &inFlight{freed: make(chan struct{}, 1)}
	// The control requests of this connection end with it: a request
	// waiting in a collective learns that its asker is gone.
	ctx, cancel := context.WithCancelCause(s.ctx)
	var ctl sync.WaitGroup
	defer ctl.Wait()
	defer cancel(ErrConnClosed)
	var buf []byte
	var fetch wire.Fetch
	var rows [][]byte
	// Requests are read through a buffer: a request's header and body,
	// and requests sent back to back, come in one read.
	in := bufio.NewReaderSize(nc, requestBuffer)
	for {
		h, body, err := wire.ReadFrame(in, buf)
		buf = body[:0]
		if err != nil {
			if errors.Is(err, base.ErrProtocol) {
				s.BadFrames.Add(1)
				s.log.Warn("peer sent a malformed frame; dropping its connection", "remote", nc.RemoteAddr().String(), "err", err)
			}
			nc.Close() // ends control replies still being written
			return
		}
		if h.Payload != 0 || h.Status != 0 {
			s.BadFrames.Add(1)
			s.log.Warn("peer request with payload or status; dropping its connection", "remote", nc.RemoteAddr().String(), "op", h.Op)
			nc.Close()
			return
		}
		if h.Op == wire.OpFetch {
			if err := wire.DecodeFetch(body, &fetch); err != nil {
				s.BadFrames.Add(1)
				s.log.Warn("bad fetch frame; dropping connection", "remote", nc.RemoteAddr().String(), "err", err)
				nc.Close()
				return
			}
			var release func()
			rows, release, err = s.h.Rows(fetch.Name, fetch.ID, fetch.Globals, rows[:0])
			werr := w.reply(h.Op, h.ID, err, nil, rows)
			if release != nil {
				release()
			}
			clear(rows)
			if werr != nil {
				return
			}
			continue
		}
		if h.Op == wire.OpFetchRange {
			m, err := wire.DecodeFetchRange(body)
			if err != nil {
				s.BadFrames.Add(1)
				s.log.Warn("bad fetch-range frame; dropping connection", "remote", nc.RemoteAddr().String(), "err", err)
				nc.Close()
				return
			}
			var release func()
			rows, release, err = s.h.RowsRange(m.Name, m.ID, m.Start, m.Count, rows[:0])
			werr := w.reply(h.Op, h.ID, err, nil, rows)
			if release != nil {
				release()
			}
			clear(rows)
			if werr != nil {
				return
			}
			continue
		}
		if direct {
			// A client's direct connection reads rows, nothing else.
			s.Refused.Add(1)
			w.reply(h.Op, h.ID, base.Errorf(base.ErrAuth, "%s on a client's direct connection, which may only fetch rows", h.Op), nil, nil)
			s.log.Warn("client's direct connection asked for a control op; dropping it", "remote", nc.RemoteAddr().String(), "op", h.Op)
			nc.Close()
			return
		}
		// Control ops may wait (a collective): answer them off the read
		// loop, up to MaxInFlight at once.
		size := int64(len(body))
		if !s.acquire(busy, size) {
			nc.Close()
			return
		}
		req := append([]byte(nil), body...)
		ctl.Add(1)
		go func(h wire.Header) {
			defer ctl.Done()
			defer busy.release(size)
			fill, err := s.h.Control(ctx, h.Op, req)
			w.reply(h.Op, h.ID, err, fill, nil)
		}(h)
	}
}

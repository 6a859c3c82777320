package transport

import (
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
	key     func() (auth.Key, error)
}

// NewServer serves ln with h until Close. writeTimeout bounds sending one
// reply to a peer that stopped reading. key gives the job's key, which
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
	mu      sync.Mutex // guards hdr and bufs, held while a reply is written; lock order: internal/LOCKS.md
	hdr     []byte
	bufs    net.Buffers
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
	w.nc.SetWriteDeadline(time.Now().Add(w.timeout))
	bufs := w.bufs // WriteTo consumes its receiver
	_, werr := bufs.WriteTo(w.nc)
	clear(w.bufs)
	return werr
}

// authTimeout bounds a peer's handshake: a connection that has not proved
// the key by then is dropped.
const authTimeout = 10 * time.Second

// authenticate runs the handshake on a new connection; false: it is
// refused (counted, logged) and the caller closes it.
func (s *Server) authenticate(nc net.Conn) bool {
	if s.key == nil {
		return true
	}
	nc.SetDeadline(time.Now().Add(authTimeout))
	err := auth.Respond(nc, auth.Peer, s.key)
	nc.SetDeadline(time.Time{})
	if err == nil {
		return true
	}
	if errors.Is(err, auth.ErrHungUp) {
		s.log.Debug("peer connection closed before authenticating", "remote", nc.RemoteAddr().String())
		return false
	}
	s.Refused.Add(1)
	s.log.Warn("peer connection refused: it did not prove the job's key", "remote", nc.RemoteAddr().String(), "err", err)
	return false
}

func (s *Server) serveConn(nc net.Conn) {
	if !s.authenticate(nc) {
		return
	}
	w := &serverConn{nc: nc, timeout: s.timeout}
	var ctl sync.WaitGroup
	defer ctl.Wait()
	var buf []byte
	var fetch wire.Fetch
	var rows [][]byte
	for {
		h, body, err := wire.ReadFrame(nc, buf)
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
		// Control ops may wait (a collective): answer them off the read loop.
		req := append([]byte(nil), body...)
		ctl.Add(1)
		go func(h wire.Header) {
			defer ctl.Done()
			fill, err := s.h.Control(s.ctx, h.Op, req)
			w.reply(h.Op, h.ID, err, fill, nil)
		}(h)
	}
}

package client

// The pool of lanes a Store reads and makes requests on, and the control
// lane its receive buffers are registered on.

import (
	"time"

	"github.com/ddstore-go/ddstore/internal/base"
	"github.com/ddstore-go/ddstore/internal/wire"
)

// getLane takes a slot (waiting at most the request timeout), then the most
// recently used idle lane, or dials one.
func (s *Store) getLane() (*lane, error) {
	select {
	case s.slots <- struct{}{}:
	default:
		t := time.NewTimer(s.cfg.Timeout)
		defer t.Stop()
		select {
		case s.slots <- struct{}{}:
		case <-t.C:
			return nil, base.Errorf(base.ErrTimeout, "all %d connections to the agent stayed busy for %v", s.cfg.MaxLanes, s.cfg.Timeout)
		}
	}
	s.idle.Lock()
	if n := len(s.idle.lanes); n > 0 {
		l := s.idle.lanes[n-1]
		s.idle.lanes = s.idle.lanes[:n-1]
		s.idle.Unlock()
		return l, nil
	}
	s.idle.Unlock()
	l, _, err := dialLane(s.socket, &s.hello, s.cfg.Timeout)
	if err != nil {
		<-s.slots
		return nil, err
	}
	return l, nil
}

// putLane returns a lane and its slot; a broken lane, or one of a closed
// store, is closed instead of kept.
func (s *Store) putLane(l *lane) {
	s.mu.RLock()
	closed := s.mu.closed
	s.mu.RUnlock()
	if l.broken || closed {
		l.close()
	} else {
		s.idle.Lock()
		s.idle.lanes = append(s.idle.lanes, l)
		s.idle.Unlock()
	}
	<-s.slots
}

// request runs a request on a lane of the pool: a collective that waits
// minutes for other ranks holds one lane, not the whole store.
func (s *Store) request(op wire.Op, fill func(*wire.Encoder), timeout time.Duration) ([]byte, error) {
	if err := s.checkOpen(); err != nil {
		return nil, err
	}
	var body []byte
	err := s.withLane(func(l *lane) error {
		b, err := l.call(op, fill, timeout)
		body = append(body[:0], b...)
		return err
	})
	return body, err
}

// withLane runs f on a lane of the pool. When the lane turns out dead
// before its request left (the agent was restarted: every pooled lane is
// then dead), the idle lanes are dropped and f runs once more on a new one.
func (s *Store) withLane(f func(l *lane) error) error {
	for attempt := 0; ; attempt++ {
		l, err := s.getLane()
		if err != nil {
			return err
		}
		err = f(l)
		unsent := l.unsent
		s.putLane(l)
		if err == nil || !unsent || attempt > 0 {
			return err
		}
		s.dropIdle()
	}
}

// dropIdle closes every idle lane.
func (s *Store) dropIdle() {
	s.idle.Lock()
	lanes := s.idle.lanes
	s.idle.lanes = nil
	s.idle.Unlock()
	for _, l := range lanes {
		l.close()
	}
}

// ctlLocked returns the control lane, the session receive buffers are
// registered on. A broken one (or, with renew, any) is replaced and the
// buffers registered again on the new session: the agent dropped them with
// the old. The caller holds ctlMu.
func (s *Store) ctlLocked(renew bool) (*lane, error) {
	if s.ctl == nil {
		return nil, base.Errorf(base.ErrClosed, "store of rank %d closed", s.id.Rank)
	}
	if !s.ctl.broken && !renew {
		return s.ctl, nil
	}
	l, _, err := dialLane(s.socket, &s.hello, s.cfg.Timeout)
	if err != nil {
		return nil, err
	}
	s.ctl.close()
	s.ctl = l
	for _, r := range *s.recv.Load() {
		id, err := l.register(r.region, s.cfg.Timeout)
		if err != nil {
			return nil, err
		}
		r.id.Store(id)
	}
	return l, nil
}

func (s *Store) checkOpen() error {
	s.mu.RLock()
	defer s.mu.RUnlock()
	if s.mu.closed {
		return base.Errorf(base.ErrClosed, "store of rank %d closed", s.id.Rank)
	}
	return nil
}

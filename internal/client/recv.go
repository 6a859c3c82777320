package client

// Receive buffers: shared memory the agent writes rows of other nodes
// into, registered on the control session, and registered again when
// that session ends.

import (
	"errors"
	"fmt"
	"os"
	"sync/atomic"
	"unsafe"

	"github.com/ddstore-go/ddstore/internal/base"
	"github.com/ddstore-go/ddstore/internal/shm"
	"github.com/ddstore-go/ddstore/internal/wire"
)

// recvBuf is a receive buffer the agent can write into (AllocRecv).
type recvBuf struct {
	region *shm.Region
	id     atomic.Uint32 // the agent's id; changes if the control session is redialed
	base   uintptr
	size   uintptr // len(region.Mem), which Close clears: read this instead
}

// regionLost tells whether a read failed because its agent does not hold
// the receive region it named (the control session the buffer was
// registered on ended, or the agent was restarted): the agent says so with
// ErrRegion's code, and the client registers its buffers again and reads
// once more.
func regionLost(err error) bool { return errors.Is(err, base.ErrRegion) }

// regionAgain is the id under which rbuf is registered now, after a read
// that named used found the region lost: the id it has if the control
// session was replaced since, else that of a new control session, on
// which every buffer is registered again.
func (s *Store) regionAgain(rbuf *recvBuf, used uint32) (uint32, bool) {
	s.ctlMu.Lock()
	defer s.ctlMu.Unlock()
	if id := rbuf.id.Load(); id != used {
		return id, true
	}
	if _, err := s.ctlLocked(true); err != nil {
		return 0, false
	}
	return rbuf.id.Load(), true
}

// callRead sends the read l.read holds. When it named rbuf's region and
// the agent had lost that, rbuf is registered again and the read sent once
// more, under the new id.
func (s *Store) callRead(l *lane, rbuf *recvBuf) error {
	m := &l.read
	_, err := l.call(wire.OpRead, m.Encode, s.cfg.Timeout)
	if err != nil && rbuf != nil && regionLost(err) {
		if id, ok := s.regionAgain(rbuf, m.Region); ok {
			m.Region = id
			_, err = l.call(wire.OpRead, m.Encode, s.cfg.Timeout)
		}
	}
	return err
}

// recvOf finds the receive buffer dst lies in, and dst's offset there.
func (s *Store) recvOf(dst []byte) (*recvBuf, int64) {
	if len(dst) == 0 {
		return nil, 0
	}
	p := uintptr(unsafe.Pointer(unsafe.SliceData(dst)))
	for _, r := range *s.recv.Load() {
		if p >= r.base && p+uintptr(len(dst)) <= r.base+r.size {
			return r, int64(p - r.base)
		}
	}
	return nil, 0
}

// AllocRecv returns a buffer of n bytes in shared memory that the agent
// writes rows of other nodes into directly: reads into it, or into any
// slice of it, skip a copy (DDStore's register_recv). Release it with
// FreeRecv; Close releases the rest.
func (s *Store) AllocRecv(n int) ([]byte, error) {
	if n <= 0 {
		return nil, base.Errorf(base.ErrArgument, "receive buffer of %d bytes: want > 0", n)
	}
	r, err := shm.NewRegion(fmt.Sprintf("ddstore-recv-%d", os.Getpid()), n)
	if err != nil {
		return nil, err
	}
	s.ctlMu.Lock()
	defer s.ctlMu.Unlock()
	ctl, err := s.ctlLocked(false)
	if err != nil {
		r.Close()
		return nil, err
	}
	id, err := ctl.register(r, s.cfg.Timeout)
	if err != nil && ctl.unsent {
		// The agent was restarted: a new control session, with the other
		// buffers registered again, then this one.
		if ctl, err = s.ctlLocked(true); err == nil {
			id, err = ctl.register(r, s.cfg.Timeout)
		}
	}
	if err != nil {
		r.Close()
		return nil, err
	}
	rb := &recvBuf{region: r, base: uintptr(unsafe.Pointer(unsafe.SliceData(r.Mem))), size: uintptr(len(r.Mem))}
	rb.id.Store(id)
	old := *s.recv.Load()
	next := append(append([]*recvBuf(nil), old...), rb)
	s.recv.Store(&next)
	return r.Mem[:n:n], nil
}

// FreeRecv releases a buffer from AllocRecv.
func (s *Store) FreeRecv(buf []byte) error {
	// Under ctlMu, which every change of the list takes: a buffer freed
	// twice at once is freed once, the other call told it is not one.
	s.ctlMu.Lock()
	defer s.ctlMu.Unlock()
	r, off := s.recvOf(buf)
	if r == nil || off != 0 {
		return base.Errorf(base.ErrBuffer, "buffer of %d bytes was not returned by AllocRecv", len(buf))
	}
	old := *s.recv.Load()
	next := make([]*recvBuf, 0, len(old))
	for _, x := range old {
		if x != r {
			next = append(next, x)
		}
	}
	s.recv.Store(&next)
	if ctl, err := s.ctlLocked(false); err == nil {
		m := wire.Region{ID: r.id.Load()}
		ctl.call(wire.OpUnregister, m.Encode, s.cfg.Timeout)
	}
	return r.region.Close()
}

package client

// Reads of a variable the agents dropped. A rank's mappings of a
// variable's node-local segments stay readable after every rank has freed
// it and the agents have unlinked them, holding the freed rows; a reader of
// another job (split mode), which takes no part in the Free, would serve
// them on. The agent marks each segment dropped before it unlinks it
// (shm.Segment.MarkDropped); a read copies its node-local rows and only
// then checks the marks, with no syscall or round trip, so rows that come
// back were the live variable's at some instant of the call. Rows found
// stale are discarded, the variable is forgotten, and the read runs again
// on the variable now of that name, or fails with ErrFreed if there is
// none. A read that an agent refuses with ErrFreed (its table id is a
// freed variable's) is run again the same way.

import (
	"errors"

	"github.com/ddstore-go/ddstore/internal/base"
)

// staleTries bounds the tries of one read: the variable would have to be
// freed and added again between each of them.
const staleTries = 3

// stale reports whether the agent has dropped a segment v maps: rows copied
// out of v before it says so may be a freed variable's. The caller holds
// v.mu (R).
func (v *variable) stale() bool {
	for _, seg := range v.segs {
		if seg.Dropped() {
			return true
		}
	}
	return false
}

// read runs f on the variable name, read-locked; if the variable f read
// turns out dropped (stale after f, or f failing with ErrFreed from an
// agent), it forgets it and runs f again on the variable of that name
// looked up anew. f writes every byte it returns on each run, so what an
// earlier run left in the destination is overwritten.
func (s *Store) read(name string, f func(v *variable) error) error {
	for try := 1; ; try++ {
		v, err := s.acquire(name)
		if err != nil {
			if try > 1 && errors.Is(err, base.ErrUnknown) {
				return base.Errorf(base.ErrFreed, "variable %q was freed, and there is no variable of that name now (%v)", name, err)
			}
			return err
		}
		err = f(v)
		stale := v.stale() || errors.Is(err, base.ErrFreed)
		v.mu.RUnlock()
		if !stale {
			return err
		}
		s.forget(name, v)
		if try == staleTries {
			return base.Errorf(base.ErrFreed, "variable %q was freed and added again while it was read, %d times", name, staleTries)
		}
	}
}

// forget unmaps a dropped variable and takes it out of the store, so that
// the next acquire of its name asks the agent for its table again. The
// caller holds no lock of v.
func (s *Store) forget(name string, v *variable) {
	s.mu.Lock()
	if s.mu.vars[name] == v {
		delete(s.mu.vars, name)
	}
	s.mu.Unlock()
	v.mu.Lock()
	defer v.mu.Unlock()
	if !v.freed && !v.dropped {
		v.dropped = true
		s.release(v)
	}
}

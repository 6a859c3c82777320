package agent

// Client processes as the coordinator knows them. Each process connected
// to this agent (its pid, SO_PEERCRED) gets a number of its own, drawn when
// its first connection comes and kept until its last closes; the agent
// sets it on every shard and barrier the process sends (Shard.Client,
// Barrier.Client), so a collective knows the processes of its ranks. When a
// process that is a rank goes (its last connection closes), the agent tells
// the coordinator (Gone), which fails every collective of that rank for the
// others at once and forgets the failed ones no live process came to: a
// job started afterwards never meets them. A process killed while it waits
// in a collective closes the connection that waits: the agent watches that
// connection during the wait (watchLeave), so the wait ends, the round
// fails, and the process's last connection closes as it should.

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/ddstore-go/ddstore/internal/wire"
)

// clientProc is one client process of this agent. Its fields are guarded
// by Agent.mu, but for id, pid and since, set before any session has it.
type clientProc struct {
	id       uint64 // never 0
	pid      int32
	since    time.Time // when the process started (processStart)
	sessions int       // its open connections
	// rank and size are the world rank and size of its last Hello with a
	// rank (-1, 0 before any).
	rank, size int64
	// ranked says it created a shard or came to a collective: a rank's
	// own process, whose going the coordinator hears. A process that only
	// reads (a DataLoader worker forked from a rank, which says hello
	// with the rank's identity) is none.
	ranked bool
}

// errClientLeft is the cause of a collective's context when its client
// closed the connection that waited in it.
var errClientLeft = errors.New("the client closed its connection")

func newClientID() uint64 {
	var b [8]byte
	for {
		rand.Read(b[:])
		if id := binary.LittleEndian.Uint64(b[:]); id != 0 {
			return id
		}
	}
}

// attachLocked gives session s its process (a new one for its first
// connection, or when the kernel cannot tell the pid); the caller holds
// a.mu.
func (a *Agent) attachLocked(s *session) {
	if p := a.mu.procs[s.pid]; s.pid > 0 && p != nil {
		p.sessions++
		s.proc = p
		return
	}
	s.proc = &clientProc{id: newClientID(), pid: s.pid, since: processStart(s.pid), sessions: 1, rank: -1}
	if s.pid > 0 {
		a.mu.procs[s.pid] = s.proc
	}
}

// detachLocked ends session s's part in its process and returns the
// process if s was its last connection, else nil; the caller holds a.mu.
func (a *Agent) detachLocked(s *session) *clientProc {
	p := s.proc
	if p == nil {
		return nil
	}
	p.sessions--
	if p.sessions > 0 {
		return nil
	}
	if a.mu.procs[p.pid] == p {
		delete(a.mu.procs, p.pid)
	}
	return p
}

// noteRank records the rank a process said hello with.
func (a *Agent) noteRank(s *session, m wire.Hello) {
	if m.Rank < 0 || s.proc == nil {
		return
	}
	a.mu.Lock()
	s.proc.rank, s.proc.size = m.Rank, m.Size
	a.mu.Unlock()
}

// noteRanked records that session s's process acts as a rank (Create,
// Publish, Barrier).
func (a *Agent) noteRanked(s *session) {
	if s.proc == nil {
		return
	}
	a.mu.Lock()
	s.proc.ranked = true
	a.mu.Unlock()
}

// processStart is when process pid started, as /proc tells (the clock
// ticks since boot of its stat's starttime); now if it cannot tell. The
// ranks of a job start together, and a job started after another died
// starts its processes after that one's exited, so a process's start says
// which job it can be of (coord: ofJob).
func processStart(pid int32) time.Time {
	now := time.Now()
	if pid <= 0 {
		return now
	}
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	i := bytes.LastIndexByte(b, ')')
	var boot unix.Timespec
	if err != nil || i < 0 || unix.ClockGettime(unix.CLOCK_BOOTTIME, &boot) != nil {
		return now
	}
	// After "pid (comm) ": state is field 3, starttime field 22.
	f := strings.Fields(string(b[i+1:]))
	if len(f) < 20 {
		return now
	}
	ticks, err := strconv.ParseInt(f[19], 10, 64)
	if err != nil {
		return now
	}
	const clockTicks = 100 // USER_HZ, the unit of /proc's times on Linux
	age := time.Duration(boot.Nano()) - time.Duration(ticks)*time.Second/clockTicks
	if age < 0 {
		return now
	}
	return now.Add(-age)
}

// client is the number of session s's process and its age in ms (see
// wire.Shard.Client).
func (s *session) client() (uint64, int64) {
	if s.proc == nil {
		return 0, 0
	}
	return s.proc.id, time.Since(s.proc.since).Milliseconds() // since: set once, before the session runs
}

// procGone tells the coordinator that process p, whose last connection
// closed, went, if it acted as a rank; on a goroutine of its own (the
// coordinator may be another node's agent, or not found yet).
func (a *Agent) procGone(p *clientProc) {
	a.mu.Lock()
	g := wire.Gone{Node: a.cfg.Node, Client: p.id, Pid: int64(p.pid), Rank: p.rank, Size: p.size}
	ranked := p.ranked
	a.mu.Unlock()
	if !ranked {
		return // a reader, a tool, a forked reading worker: no collective waits for it
	}
	if c := a.coord.Load(); c != nil {
		c.gone(g)
		return
	}
	a.go_(func() {
		ctx, cancel := context.WithTimeout(a.ctx, a.cfg.Timeout)
		defer cancel()
		addr, err := a.coordinatorAddr(ctx)
		if err == nil && addr == "" {
			a.coord.Load().gone(g)
			return
		}
		if err == nil {
			_, err = a.pool.Call(ctx, addr, wire.OpPeerGone, g.Encode)
		}
		if err != nil && a.ctx.Err() == nil {
			a.log.Warn("could not tell the coordinator that a client went", "pid", p.pid, "rank", g.Rank, "err", err)
		}
	})
}

// watchLeave returns a context for a collective of session s that ends,
// with cause errClientLeft, when the client closes the connection (or
// resets it) while the collective waits; stop ends the watch, and must be
// called before the session reads its next request. A client sends
// nothing on a connection while its request waits; bytes it does send
// (a request pipelined behind) end the watch and stay unread.
func (a *Agent) watchLeave(s *session) (ctx context.Context, stop func()) {
	raw, err := s.conn.SyscallConn()
	if err != nil {
		return a.ctx, func() {}
	}
	ctx, cancel := context.WithCancelCause(a.ctx)
	done := make(chan struct{})
	go func() { // owned: stop waits for it
		defer close(done)
		var b [1]byte
		left := false
		raw.Read(func(fd uintptr) bool {
			n, _, err := unix.Recvfrom(int(fd), b[:], unix.MSG_PEEK|unix.MSG_DONTWAIT)
			switch {
			case err == unix.EAGAIN || err == unix.EINTR:
				return false // nothing yet: wait until the socket is readable
			case err == nil && n == 0, err == unix.ECONNRESET:
				left = true
			}
			return true
		})
		if left {
			cancel(errClientLeft)
		}
	}()
	return ctx, func() {
		s.conn.SetReadDeadline(time.Unix(1, 0)) // wakes the watch
		<-done
		s.conn.SetReadDeadline(time.Time{})
		cancel(nil)
	}
}

package agent

import (
	"net"
	"sync"

	"golang.org/x/sys/unix"

	"github.com/ddstore-go/ddstore/internal/naming"
	"github.com/ddstore-go/ddstore/internal/shm"
)

// Shards orphaned by a dead client. Add is two requests, Create (the agent
// makes the segment, the client fills it) and Publish (the round); a client
// killed between them leaves a segment that nothing will publish, in
// /dev/shm until the agent stops, and its rank's next Add of the name would
// be refused. So an unpublished shard belongs to the client process that
// created it (its pid as the kernel tells it, SO_PEERCRED): when the last
// connection of that process closes, the agent takes the shard back
// (segment removed, memory budget returned). A shard whose Publish is under
// way is left to it: the round completes (the variable is then the job's,
// and stays) or fails (publish takes the shard back itself).
//
// A live client whose connections all close between its Create and
// Publish (its control lane redialed while no other lane is open) loses
// its shard: its Publish fails with ErrUnknown and a retry creates it anew.

// creators are the client processes of a variable's unpublished local
// shards, by rank. The zero value is ready to use.
type creators struct {
	mu sync.Mutex // guards m, owners and each creator's publishing; a leaf (lock order: internal/LOCKS.md)
	m  map[int]*creator
	// owners are the processes of a store-scoped variable's published
	// local shards, by rank (naming.StoreScoped): each rank's share is
	// freed when its process is gone.
	owners map[int]int32
}

type creator struct {
	pid        int32
	seg        *shm.Segment
	publishing int // Publish requests of the shard in flight
}

// peerPid is the pid of the process at the other end of a client
// connection; 0 if the kernel cannot tell (then nothing is reclaimed).
func peerPid(c *net.UnixConn) int32 {
	raw, err := c.SyscallConn()
	if err != nil {
		return 0
	}
	var pid int32
	raw.Control(func(fd uintptr) {
		if cred, err := unix.GetsockoptUcred(int(fd), unix.SOL_SOCKET, unix.SO_PEERCRED); err == nil {
			pid = cred.Pid
		}
	})
	return pid
}

// noteCreator records that the process of s created rank's shard of name
// (after a successful Create).
func (a *Agent) noteCreator(s *session, name string, rank int64) {
	if s.pid <= 0 {
		return
	}
	a.mu.Lock()
	v := a.mu.vars[name]
	a.mu.Unlock()
	if v == nil {
		return
	}
	v.mu.RLock()
	seg := v.segs[int(rank)]
	v.mu.RUnlock()
	if seg == nil {
		return
	}
	v.creators.mu.Lock()
	if v.creators.m == nil {
		v.creators.m = make(map[int]*creator)
	}
	v.creators.m[int(rank)] = &creator{pid: s.pid, seg: seg}
	v.creators.mu.Unlock()
}

// publishing marks rank's shard of name as being published until the
// returned function is called; the record of its creator goes then (the
// round either made the variable or took the shard back).
func (a *Agent) publishing(name string, rank int64) (done func()) {
	a.mu.Lock()
	v := a.mu.vars[name]
	a.mu.Unlock()
	if v == nil {
		return func() {}
	}
	v.creators.mu.Lock()
	defer v.creators.mu.Unlock()
	c := v.creators.m[int(rank)]
	if c == nil {
		return func() {}
	}
	c.publishing++
	return func() {
		v.creators.mu.Lock()
		defer v.creators.mu.Unlock()
		c.publishing--
		if c.publishing == 0 && v.creators.m[int(rank)] == c {
			delete(v.creators.m, int(rank))
			if v.published.Load() && naming.StoreScoped(v.name) {
				if v.creators.owners == nil {
					v.creators.owners = make(map[int]int32)
				}
				v.creators.owners[int(rank)] = c.pid
			}
		}
	}
}

// reclaimOrphans takes back the unpublished shards created by the process
// of s if s was its last connection. It runs once s is out of
// a.mu.sessions: of two connections of a process closing at once, at least
// one sees the other gone (both may reclaim; takeBack is idempotent).
func (a *Agent) reclaimOrphans(s *session) {
	if s.pid <= 0 {
		return
	}
	a.mu.Lock()
	for o := range a.mu.sessions {
		if o.pid == s.pid {
			a.mu.Unlock()
			return
		}
	}
	var vars, owned []*variable
	for _, v := range a.mu.vars {
		if !v.published.Load() {
			vars = append(vars, v)
		} else {
			owned = append(owned, v)
		}
	}
	a.mu.Unlock()
	a.freeOwned(owned, s.pid)
	for _, v := range vars {
		type orphan struct {
			rank int
			seg  *shm.Segment
		}
		var gone []orphan
		v.creators.mu.Lock()
		for r, c := range v.creators.m {
			if c.pid == s.pid && c.publishing == 0 {
				delete(v.creators.m, r)
				gone = append(gone, orphan{r, c.seg})
			}
		}
		v.creators.mu.Unlock()
		for _, o := range gone {
			a.log.Info("client gone before publishing its shard; removing it", "variable", v.name, "rank", o.rank, "pid", s.pid)
			a.takeBack(v, o.rank, o.seg)
		}
	}
}

// freeOwned frees, for each store-scoped variable of vars, the shares of
// the ranks whose process pid is gone: as if each had called Free, so the
// variable goes once every rank's process has (on every node, by the
// coordinator). A job that died without freeing so leaves nothing behind;
// variables of the namespace's scope (split mode, restarts) stay. The
// frees run on goroutines the agent owns: they wait on the coordinator.
func (a *Agent) freeOwned(vars []*variable, pid int32) {
	for _, v := range vars {
		var ranks []int
		v.creators.mu.Lock()
		for r, p := range v.creators.owners {
			if p == pid {
				delete(v.creators.owners, r)
				ranks = append(ranks, r)
			}
		}
		v.creators.mu.Unlock()
		for _, r := range ranks {
			name := v.name
			a.log.Info("client gone without freeing its share of a store's variable; freeing it", "variable", name, "rank", r, "pid", pid)
			a.go_(func() {
				if err := a.free(a.ctx, name, r); err != nil && a.ctx.Err() == nil {
					a.log.Warn("could not free the share of a gone client", "variable", name, "rank", r, "err", err)
				}
			})
		}
	}
}

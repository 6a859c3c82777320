package agent

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/ddstore-go/ddstore/internal/auth"
	"github.com/ddstore-go/ddstore/internal/base"
	"github.com/ddstore-go/ddstore/internal/layout"
	"github.com/ddstore-go/ddstore/internal/naming"
	"github.com/ddstore-go/ddstore/internal/shm"
	"github.com/ddstore-go/ddstore/internal/tier"
	"github.com/ddstore-go/ddstore/internal/wire"
)

// session is one client connection. A client process may hold several (one
// per thread reading at once); each is served by its own goroutine, one
// request at a time.
type session struct {
	conn *net.UnixConn
	// hello and said are written by the session's goroutine under
	// Agent.mu (other sessions' publishes read them: localRanks).
	hello wire.Hello
	said  bool
	fds   []int // descriptors received and not yet claimed by a Register
	oob   []byte
	out   []byte
	read  wire.Read
	fan   fanout
	// ranges is a ReadRange's pieces, reused.
	ranges []rangePiece
	// prefetch is the last Prefetch request, its slice reused.
	prefetch wire.Fetch
	// decodeFailed says the current request itself was malformed.
	decodeFailed bool
	// pid is the client's process (SO_PEERCRED), which owns the shards it
	// created until they are published (orphans.go); 0 if unknown.
	pid int32
	// proc is the client process, as the coordinator knows it
	// (clients.go); set at accept, its fields guarded by Agent.mu.
	proc *clientProc
}

func (a *Agent) acceptLoop() {
	for {
		c, err := a.ln.AcceptUnix()
		if err != nil {
			if a.ctx.Err() == nil && !errors.Is(err, net.ErrClosed) {
				a.log.Error("client accept", "err", err)
			}
			return
		}
		s := &session{conn: c, oob: make([]byte, unix.CmsgSpace(4*4)), pid: peerPid(c)}
		a.mu.Lock()
		if a.ctx.Err() != nil {
			a.mu.Unlock()
			c.Close()
			return
		}
		a.mu.sessions[s] = struct{}{}
		a.attachLocked(s)
		a.mu.Unlock()
		a.go_(func() { a.serveSession(s) })
	}
}

func (a *Agent) serveSession(s *session) {
	defer func() {
		a.regions.removeOwned(s)
		for _, fd := range s.fds {
			unix.Close(fd)
		}
		s.conn.Close()
		a.mu.Lock()
		delete(a.mu.sessions, s)
		if len(a.mu.sessions) == 0 {
			a.mu.idleFrom = time.Now()
		}
		last := a.detachLocked(s)
		a.mu.Unlock()
		a.reclaimOrphans(s)
		if last != nil {
			a.procGone(last)
		}
	}()
	if !a.admitClient(s) {
		return
	}
	var buf []byte
	for {
		h, body, err := wire.ReadFrame(s, buf)
		buf = body[:0]
		if err != nil {
			if errors.Is(err, base.ErrProtocol) {
				a.stats.badFrames.Add(1)
				a.log.Warn("client sent a malformed frame; dropping its connection", "err", err)
			}
			return
		}
		if h.Payload != 0 || h.Status != 0 {
			a.stats.badFrames.Add(1)
			a.log.Warn("client request with payload or status; dropping its connection", "op", h.Op)
			return
		}
		// In flight from here to the reply: a stopping agent finishes it.
		// Not so a collective, which may wait minutes for other ranks: a
		// stop cancels it, as the other ranks' errors then say.
		counted := int64(1)
		if h.Op == wire.OpPublish || h.Op == wire.OpFree || h.Op == wire.OpBarrier {
			counted = 0
		}
		a.inflight.Add(counted)
		if a.draining.Load() {
			a.inflight.Add(-counted)
			return // stopping: no new request is taken
		}
		a.stats.clientRequests.Add(1)
		fill, err := a.handleClient(s, h.Op, body)
		if err != nil {
			a.stats.errors.Add(1)
			a.stats.errorKinds.add(err)
			var bad *badRequest
			if errors.As(err, &bad) {
				a.inflight.Add(-counted)
				a.stats.badFrames.Add(1)
				a.log.Warn("client sent a malformed request; dropping its connection", "op", h.Op, "err", err)
				return
			}
			s.out = wire.AppendError(s.out[:0], h.Op, h.ID, err)
		} else {
			s.out = wire.AppendFrame(s.out[:0], h.Op, 0, h.ID, 0, fill)
		}
		_, err = s.conn.Write(s.out)
		a.inflight.Add(-counted)
		if err != nil {
			return
		}
	}
}

// Read reads the connection for wire.ReadFrame, keeping the descriptors
// a client passes beside a frame (Register) for the request that claims
// them.
func (s *session) Read(b []byte) (int, error) {
	n, oobn, _, _, err := s.conn.ReadMsgUnix(b, s.oob)
	if oobn > 0 {
		s.takeFds(s.oob[:oobn])
	}
	return n, err
}

func (s *session) takeFds(oob []byte) {
	msgs, err := unix.ParseSocketControlMessage(oob)
	if err != nil {
		return
	}
	for _, m := range msgs {
		if fds, err := unix.ParseUnixRights(&m); err == nil {
			s.fds = append(s.fds, fds...)
		}
	}
}

// badRequest marks a request the client framed wrongly; the agent drops
// that connection (a protocol error from a peer, met while serving a
// well-formed request, is only answered).
type badRequest struct{ err error }

func (b *badRequest) Error() string { return b.err.Error() }
func (b *badRequest) Unwrap() error { return b.err }

func (a *Agent) handleClient(s *session, op wire.Op, body []byte) (func(*wire.Encoder), error) {
	fill, err := a.handleClientOp(s, op, body)
	if err != nil && errors.Is(err, base.ErrProtocol) && s.decodeFailed {
		err = &badRequest{err}
	}
	s.decodeFailed = false
	return fill, err
}

func (a *Agent) handleClientOp(s *session, op wire.Op, body []byte) (func(*wire.Encoder), error) {
	if op != wire.OpHello && !s.said {
		s.decodeFailed = true
		return nil, base.Errorf(base.ErrProtocol, "%s before hello", op)
	}
	ctx := a.ctx
	switch op {
	case wire.OpHello:
		m, err := wire.DecodeHello(body)
		if err != nil {
			s.decodeFailed = true
			return nil, err
		}
		if m.Namespace != a.cfg.Namespace || m.Node != a.cfg.Node {
			return nil, base.Errorf(base.ErrArgument, "client of namespace %q node %q reached the agent of namespace %q node %q", m.Namespace, m.Node, a.cfg.Namespace, a.cfg.Node)
		}
		if m.Rank == 0 {
			if err := a.becomeCoordinator(); err != nil {
				return nil, err
			}
		}
		a.mu.Lock() // localRanks reads it from other sessions
		s.hello, s.said = m, true
		a.mu.Unlock()
		a.noteRank(s, m)
		r := wire.HelloReply{Node: a.cfg.Node, AgentPid: int64(os.Getpid())}
		return r.Encode, nil
	case wire.OpCreate:
		m, err := wire.DecodeShard(body)
		if err != nil {
			s.decodeFailed = true
			return nil, err
		}
		a.noteRanked(s)
		p, err := a.createShard(m)
		if err != nil {
			return nil, err
		}
		a.noteCreator(s, m.Name, m.Rank)
		r := wire.Path{Path: p}
		return r.Encode, nil
	case wire.OpPublish:
		m, err := wire.DecodeShard(body)
		if err != nil {
			s.decodeFailed = true
			return nil, err
		}
		m.Client, m.ClientAgeMs = s.client()
		a.noteRanked(s)
		done := a.publishing(m.Name, m.Rank)
		ctx, stop := a.watchLeave(s)
		b, change, err := a.publish(ctx, m, a.localRanks(m))
		stop()
		done()
		if err != nil {
			return nil, err
		}
		a.saveManifestOf(change)
		return func(e *wire.Encoder) { e.Raw(b) }, nil
	case wire.OpBarrier:
		m, err := wire.DecodeBarrier(body)
		if err != nil {
			s.decodeFailed = true
			return nil, err
		}
		if s.hello.Rank < 0 {
			return nil, base.Errorf(base.ErrArgument, "a reader (rank -1) takes part in no fence")
		}
		m.Client, m.ClientAgeMs = s.client()
		a.noteRanked(s)
		ctx, stop := a.watchLeave(s)
		defer stop()
		return nil, a.coordBarrier(ctx, m)
	case wire.OpLookup:
		m, err := wire.DecodeName(body)
		if err != nil {
			s.decodeFailed = true
			return nil, err
		}
		v, err := a.lookup(ctx, m.Name)
		if err != nil {
			return nil, err
		}
		if err := a.ensureIndex(ctx, v); err != nil {
			return nil, err
		}
		v.mu.RLock()
		b := v.clientTable()
		v.mu.RUnlock()
		return func(e *wire.Encoder) { e.Raw(b) }, nil
	case wire.OpRead:
		if err := wire.DecodeRead(body, &s.read); err != nil {
			s.decodeFailed = true
			return nil, err
		}
		defer a.observeRead(time.Now())
		return nil, a.read(ctx, s, &s.read)
	case wire.OpReadRange:
		m, err := wire.DecodeReadRange(body)
		if err != nil {
			s.decodeFailed = true
			return nil, err
		}
		defer a.observeRead(time.Now())
		return nil, a.readRange(ctx, s, m)
	case wire.OpPrefetch:
		if err := wire.DecodeFetch(body, &s.prefetch); err != nil {
			s.decodeFailed = true
			return nil, err
		}
		return nil, a.prefetch(ctx, &s.prefetch)
	case wire.OpRegister:
		m, err := wire.DecodeRegion(body)
		if err != nil {
			s.decodeFailed = true
			return nil, err
		}
		if len(s.fds) == 0 {
			return nil, base.Errorf(base.ErrArgument, "register without a descriptor")
		}
		fd := s.fds[0]
		s.fds = s.fds[1:]
		defer unix.Close(fd)
		if err := shm.CheckSealed(fd); err != nil {
			return nil, err
		}
		size, err := shm.FdSize(fd)
		if err != nil || m.Size <= 0 || size < m.Size {
			return nil, base.Errorf(base.ErrArgument, "receive region of %d bytes, descriptor has %d", m.Size, size)
		}
		done, err := a.admit(m.Size, false, func(size string) string { return "a receive region of " + size })
		if err != nil {
			return nil, err
		}
		defer done()
		mem, err := shm.MapFd(fd, int(m.Size))
		if err != nil {
			return nil, err
		}
		r := wire.Region{ID: a.regions.add(mem, s), Size: m.Size}
		return r.Encode, nil
	case wire.OpUnregister:
		m, err := wire.DecodeRegion(body)
		if err != nil {
			s.decodeFailed = true
			return nil, err
		}
		return nil, a.regions.remove(m.ID, s)
	case wire.OpFree:
		m, err := wire.DecodeName(body)
		if err != nil {
			s.decodeFailed = true
			return nil, err
		}
		return nil, a.free(ctx, m.Name, int(m.Rank))
	case wire.OpInfo:
		t := wire.Text{Text: a.infoJSON()}
		return t.Encode, nil
	case wire.OpDirectKey:
		if len(body) != 0 {
			s.decodeFailed = true
			return nil, base.Errorf(base.ErrProtocol, "direct-key request with a body of %d bytes: want none", len(body))
		}
		if tr := a.transportName(); tr != TransportTCP {
			// Rows move over the job's interconnect (MPI gets, libfabric):
			// a client's TCP connection to another node would bypass it.
			return nil, base.Errorf(base.ErrArgument, "no direct reads in a job whose agents move rows over %s: reads of other nodes' rows go through this node's agent", tr)
		}
		k, err := a.peerKey()
		if err != nil {
			return nil, err
		}
		m := wire.DirectKey{Key: auth.DirectKeyOf(k).Bytes()}
		return m.Encode, nil
	}
	s.decodeFailed = true
	return nil, base.Errorf(base.ErrProtocol, "unknown client op %d", op)
}

// createShard makes the segment of one rank's shard, for its client to fill.
// The segment is created, its pages reserved (a time that grows with its
// size), with no lock held: checked and charged to the budget first, then
// made under a name nobody else has (its nonce), then installed after the
// checks again.
func (a *Agent) createShard(m wire.Shard) (string, error) {
	if err := checkShard(m); err != nil {
		return "", err
	}
	h := shardHeader(m)
	n := shm.DataBytes(h)
	err := a.mayCreate(m)
	if err == nil {
		// Charge the budget before the segment exists: a shard beyond it
		// is refused with nothing allocated (the client then fails the
		// round for every rank).
		var done func()
		done, err = a.admit(n, true, func(size string) string {
			return fmt.Sprintf("variable %q: rank %d's shard of %s", m.Name, m.Rank, size)
		})
		if err == nil {
			done()
			var seg *shm.Segment
			path := shm.SegmentPath(a.cfg.Namespace, a.cfg.Node, m.Name, int(m.Rank), shm.NewNonce())
			if seg, err = shm.Create(path, h); err == nil {
				if err = a.installShard(m, seg); err == nil {
					return path, nil
				}
				seg.Close()
				shm.Remove(path)
			} else {
				err = fmt.Errorf("variable %q: rank %d's shard: %w", m.Name, m.Rank, err)
			}
			a.shardBytes.Add(-n)
		}
	}
	if errors.Is(err, base.ErrClosed) {
		return "", err
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.mu.vars == nil {
		return "", err
	}
	if len(a.mu.createErrs) >= maxCreateErrs {
		clear(a.mu.createErrs) // clients that never sent their failed Publish
	}
	a.mu.createErrs[createKey{m.Name, m.Rank, m.Attempt}] = err.Error()
	return "", err
}

// mayCreate says whether rank's shard of m may be created now: the agent
// is not stopping, the variable is not published, the rank has none.
func (a *Agent) mayCreate(m wire.Shard) error {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.mu.vars == nil {
		return base.Errorf(base.ErrClosed, "agent stopping")
	}
	v := a.mu.vars[m.Name]
	if v == nil {
		return nil
	}
	v.mu.RLock()
	defer v.mu.RUnlock()
	return v.canTake(m)
}

// canTake is mayCreate's check of the variable; the caller holds v.mu.
func (v *variable) canTake(m wire.Shard) error {
	if v.published.Load() || v.table != nil {
		return base.Errorf(base.ErrExists, "variable %q already exists", m.Name)
	}
	if _, ok := v.segs[int(m.Rank)]; ok {
		return base.Errorf(base.ErrExists, "variable %q: rank %d has already created its shard", m.Name, m.Rank)
	}
	return nil
}

// installShard adds the segment made for rank's shard of m to its
// variable (made if it has none), after the checks of mayCreate again:
// meanwhile the agent may have begun to stop, or another client claimed
// the rank. Its bytes are charged already.
func (a *Agent) installShard(m wire.Shard, seg *shm.Segment) error {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.mu.vars == nil {
		return base.Errorf(base.ErrClosed, "agent stopping")
	}
	v, made := a.mu.vars[m.Name], false
	if v == nil {
		v, made = newVariable(m.Name), true
		a.mu.vars[m.Name] = v
	}
	// Written only while unpublished (rule 2 of internal/LOCKS.md): a
	// published variable fails canTake without waiting for v.mu.
	if v.published.Load() {
		return base.Errorf(base.ErrExists, "variable %q already exists", m.Name)
	}
	v.mu.Lock()
	defer v.mu.Unlock()
	if err := v.canTake(m); err != nil {
		if made {
			delete(a.mu.vars, m.Name)
		}
		return err
	}
	v.segs[int(m.Rank)] = seg
	return nil
}

// createKey names one rank's Create of a variable: its client's failed
// Publish of the same attempt takes the reason the Create failed.
type createKey struct {
	name          string
	rank, attempt int64
}

// maxCreateErrs bounds the reasons kept for failed Publishes to come.
const maxCreateErrs = 1024

// createErr takes the reason rank's Create of m failed here, "" if none.
func (a *Agent) createErr(m wire.Shard) string {
	a.mu.Lock()
	defer a.mu.Unlock()
	k := createKey{m.Name, m.Rank, m.Attempt}
	why := a.mu.createErrs[k]
	delete(a.mu.createErrs, k)
	return why
}

// heldBytes is the data of the shards v holds on this node.
func (v *variable) heldBytes() int64 {
	v.mu.RLock()
	defer v.mu.RUnlock()
	var n int64
	for _, seg := range v.segs {
		n += seg.Bytes()
	}
	if v.index != nil {
		n += v.index.Bytes()
	}
	return n
}

func checkShard(m wire.Shard) error {
	if err := naming.CheckVariable(m.Name); err != nil {
		return err
	}
	if m.Size < 1 || m.Rank < 0 || m.Rank >= m.Size {
		return base.Errorf(base.ErrArgument, "rank %d of %d: want 0 <= rank < size", m.Rank, m.Size)
	}
	if m.Rows < 0 {
		return base.Errorf(base.ErrGeometry, "variable %q: %d rows: want >= 0", m.Name, m.Rows)
	}
	if err := (layout.Row{Disp: m.Disp, ItemSize: m.ItemSize}).Validate(); err != nil {
		return fmt.Errorf("variable %q: %w", m.Name, err)
	}
	if err := checkKind(m); err != nil {
		return err
	}
	if m.Kind == wire.KindRows && m.Rows > 0 && m.Disp*m.ItemSize > (1<<46)/m.Rows {
		return base.Errorf(base.ErrGeometry, "variable %q: %d rows of %d bytes is too large for one shard", m.Name, m.Rows, m.Disp*m.ItemSize)
	}
	switch {
	case m.Backing == "" && m.Total != 0:
		return base.Errorf(base.ErrGeometry, "variable %q: %d rows in all but no backing file", m.Name, m.Total)
	case m.Backing != "" && (m.Total < 1 || m.Total > 1<<62):
		return base.Errorf(base.ErrGeometry, "variable %q: backing file %s of %d rows: want at least 1", m.Name, m.Backing, m.Total)
	case len(m.Backing) > maxPath && !naming.IsPair(m.Backing) || len(m.Backing) > 2*maxPath+1:
		return base.Errorf(base.ErrArgument, "variable %q: backing file name of %d bytes: want at most %d (each of a pair)", m.Name, len(m.Backing), maxPath)
	case m.Kind == wire.KindRows && naming.IsPair(m.Backing):
		return base.Errorf(base.ErrArgument, "variable %q: fixed rows with a pair of values and offsets datasets as backing file: want one dataset", m.Name)
	}
	return nil
}

// maxPath bounds a backing file's name (with its dataset).
const maxPath = 4096

// localRanks is how many ranks of this node can take part in m's round:
// the distinct ranks of the clients connected now whose job size is the
// round's, when the round is the whole job's (0 otherwise: not known).
func (a *Agent) localRanks(m wire.Shard) int64 {
	if m.Group != "" {
		return 0
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	ranks := make(map[int64]struct{}, 8)
	for s := range a.mu.sessions {
		if s.said && s.hello.Rank >= 0 && s.hello.Size == m.Size {
			ranks[s.hello.Rank] = struct{}{}
		}
	}
	return int64(len(ranks))
}

// publish declares a created shard complete and waits for the variable to
// exist on every rank, then returns its table as a client of this node
// gets it, encoded (clientTable); local is how many ranks of this node
// take part in the round (0: unknown), so that their shards go together.
// It returns too the number of the manifest change that set the table
// (the caller saves up to it before it replies).
func (a *Agent) publish(ctx context.Context, m wire.Shard, local int64) ([]byte, uint64, error) {
	if err := checkShard(m); err != nil || m.Failed {
		// This rank cannot take part: fail the round for every rank now
		// rather than let the others wait for it until their timeout, and
		// take back a shard it created before failing (a retry creates it
		// again).
		if m.Size >= 1 && m.Rank >= 0 && m.Rank < m.Size && naming.CheckVariable(m.Name) == nil {
			a.mu.Lock()
			v := a.mu.vars[m.Name]
			a.mu.Unlock()
			if v != nil {
				v.mu.RLock()
				seg := v.segs[int(m.Rank)]
				v.mu.RUnlock()
				if seg != nil {
					a.takeBack(v, int(m.Rank), seg)
				}
			}
			if m.Why == "" {
				m.Why = a.createErr(m)
			}
			m.Failed, m.Node = true, a.cfg.Node
			pctx, cancel := context.WithTimeout(ctx, a.cfg.JoinTimeout)
			_, cerr := a.coordPublish(pctx, m)
			cancel()
			if err == nil {
				err = cerr
			}
		}
		if err == nil {
			err = base.Errorf(base.ErrGeometry, "variable %q: rank %d could not create its shard", m.Name, m.Rank)
		}
		return nil, 0, err
	}
	a.mu.Lock()
	v := a.mu.vars[m.Name]
	a.mu.Unlock()
	var seg *shm.Segment
	if v != nil {
		v.mu.RLock()
		seg = v.segs[int(m.Rank)]
		v.mu.RUnlock()
	}
	var bad error
	if seg == nil {
		bad = base.Errorf(base.ErrUnknown, "variable %q: rank %d publishes a shard it never created", m.Name, m.Rank)
	} else if h := seg.Header; h.Rows != m.Rows || h.Disp != m.Disp || h.ItemSize != m.ItemSize {
		bad = base.Errorf(base.ErrGeometry, "variable %q: rank %d created %d rows of disp %d, itemsize %d but publishes %d rows of disp %d, itemsize %d",
			m.Name, m.Rank, h.Rows, h.Disp, h.ItemSize, m.Rows, m.Disp, m.ItemSize)
	} else if h != shardHeader(m) {
		bad = base.Errorf(base.ErrGeometry, "variable %q: rank %d created %s rows of %d units but publishes %s rows of %d units",
			m.Name, m.Rank, h.Kind, h.Items, m.Kind, m.Items)
	} else if h.Kind == shm.KindRagged {
		// What the client wrote: checked before any rank can read by it.
		if err := seg.CheckOffsets(0); err != nil {
			bad = fmt.Errorf("variable %q: rank %d's offsets: %w", m.Name, m.Rank, err)
		}
	}
	if bad == nil && m.Backing != "" && m.Kind == wire.KindRagged {
		// The same for a ragged pair, whose offsets are all read here to
		// be checked (a rank's agent reads them again into the index).
		values, offsets, err := tier.OpenRagged(m.Backing, m.Dtype, m.Disp*m.ItemSize, m.Total)
		if err != nil {
			bad = fmt.Errorf("variable %q: %w", m.Name, err)
		} else {
			values.Close()
			offsets.Close()
		}
	} else if bad == nil && m.Backing != "" {
		// Open the backing file now, so that a wrong name, shape or type
		// fails the Add on every rank rather than a read later.
		src, err := tier.Open(m.Backing, m.Dtype, m.Disp*m.ItemSize, m.Total)
		if err != nil {
			bad = fmt.Errorf("variable %q: %w", m.Name, err)
		} else {
			src.Close()
		}
	}
	if bad != nil {
		if seg != nil {
			a.takeBack(v, int(m.Rank), seg)
		}
		m.Failed, m.Why = true, bad.Error()
		a.publish(ctx, m, 0) // fails the round for every rank
		return nil, 0, bad
	}
	m.Node = a.cfg.Node
	timeout := a.roundTimeout(m)
	// The coordinator's clock decides the round (it starts when the shard
	// arrives there); this agent waits a margin longer, so that it never
	// gives up on a round the coordinator completes.
	pctx, cancel := context.WithTimeout(ctx, timeout+a.cfg.Timeout)
	defer cancel()
	t, err := a.coordRound(pctx, v, m, local)
	if err != nil {
		// The variable does not exist (or this node could not get its
		// table): take this rank's shard back so that a corrected retry
		// can create it again.
		a.takeBack(v, int(m.Rank), seg)
		return nil, 0, err
	}
	v.mu.Lock()
	err = v.setTable(a, t)
	v.mu.Unlock()
	if err != nil {
		return nil, 0, err
	}
	// Outside v.mu: the index of a ragged variable waits on other nodes.
	if err := a.ensureIndex(ctx, v); err != nil {
		if t.Backing != "" {
			// Shards that are not the backing file's rows: each node
			// finds the ranks' units differ from the file's alike (and
			// its own ranks' rows one by one), so each rank gives its
			// share back, and once all have the name is free again.
			if ferr := a.free(ctx, m.Name, int(m.Rank)); ferr != nil {
				err = errors.Join(err, ferr)
			}
		}
		return nil, 0, err
	}
	v.mu.RLock()
	defer v.mu.RUnlock()
	return v.clientTable(), v.change, nil
}

// takeBack removes a rank's shard of a variable that was never published,
// and the variable itself once it holds no shard.
func (a *Agent) takeBack(v *variable, rank int, seg *shm.Segment) {
	a.mu.Lock()
	defer a.mu.Unlock()
	v.mu.Lock()
	defer v.mu.Unlock()
	if v.table == nil && v.segs[rank] == seg {
		delete(v.segs, rank)
		// Whoever takes v out of a.mu.vars gives back the bytes of the
		// shards it holds then (drop, shutdown, both under a.mu); a shard
		// taken back before that gives back its own.
		if a.mu.vars[v.name] == v {
			a.shardBytes.Add(-seg.Bytes())
		}
		seg.Close()
		shm.Remove(seg.Path)
	}
	if v.table == nil && len(v.segs) == 0 {
		v.gone = true
		v.wake()
		if a.mu.vars[v.name] == v {
			delete(a.mu.vars, v.name)
		}
	}
}

// lookup returns a published variable, asking the coordinator for its table
// if no client of this node has used it yet.
func (a *Agent) lookup(ctx context.Context, name string) (*variable, error) {
	a.mu.Lock()
	v := a.mu.vars[name]
	a.mu.Unlock()
	if v != nil {
		v.mu.RLock()
		ok := v.table != nil
		v.mu.RUnlock()
		if ok {
			return v, nil
		}
	}
	var t *wire.Table
	ctx, cancel := context.WithTimeout(ctx, a.cfg.Timeout)
	defer cancel()
	addr, err := a.coordinatorAddr(ctx)
	if err != nil {
		return nil, err
	}
	m := wire.Name{Name: name}
	if addr == "" {
		t, err = a.coord.Load().lookup(name)
	} else {
		var body []byte
		if body, err = a.pool.Call(ctx, addr, wire.OpPeerLookup, m.Encode); err == nil {
			var tt wire.Table
			tt, err = wire.DecodeTable(body)
			t = &tt
		}
	}
	if err != nil {
		return nil, err
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.mu.vars == nil {
		return nil, base.Errorf(base.ErrClosed, "agent stopping")
	}
	v = a.mu.vars[name]
	if v == nil {
		v = newVariable(name)
		a.mu.vars[name] = v
	}
	// Published meanwhile (its Publish ended while the table was asked
	// for): the table is installed already, and v.mu may be read-locked by
	// a peer transfer for as long as a read's timeout, which must not be
	// waited out holding a.mu (internal/LOCKS.md).
	if v.published.Load() {
		return v, nil
	}
	v.mu.Lock()
	defer v.mu.Unlock()
	if err := v.setTable(a, t); err != nil {
		return nil, err
	}
	return v, nil
}

// free tells the coordinator that a rank is done with a variable; the
// shards stay until every rank is (then the coordinator drops them on every
// node that holds one).
func (a *Agent) free(ctx context.Context, name string, rank int) error {
	a.mu.Lock()
	v := a.mu.vars[name]
	a.mu.Unlock()
	if v == nil {
		return base.Errorf(base.ErrUnknown, "no variable %q on node %q", name, a.cfg.Node)
	}
	v.creators.mu.Lock()
	delete(v.creators.owners, rank) // freed: nothing left for freeOwned
	v.creators.mu.Unlock()
	v.mu.RLock()
	published := v.table != nil
	nodes := 0
	if published {
		nodes = len(v.table.Nodes)
	}
	v.mu.RUnlock()
	if !published || rank < 0 {
		return nil
	}
	// The last rank's Free waits for the coordinator to drop the shards
	// everywhere, each hop of the drops' tree bounded by the timeout, and
	// the nodes below one that fails dropped from above (dropAlong).
	ctx, cancel := context.WithTimeout(ctx, time.Duration(2+dropLevels(nodes, a.dropFanout()))*a.cfg.Timeout)
	defer cancel()
	addr, err := a.coordinatorAddr(ctx)
	if err != nil {
		return err
	}
	if addr == "" {
		if t := a.coord.Load().free(name, int64(rank)); t != nil {
			a.dropEverywhere(t)
		}
		a.saveManifest()
		return nil
	}
	// With the node's other ranks' frees (PeerFrees).
	m := wire.Name{Name: name, Node: a.cfg.Node, Rank: int64(rank)}
	return a.gatherFree(ctx, v, addr, m)
}

// dropEverywhere tells every node of a freed variable to drop its shards
// and returns when they have (or failed: a node that is down is only
// logged, its segments go when its agent stops). It runs on the
// coordinator while answering the last rank's Free, so once every rank's
// Free has returned the name can be created again everywhere. The drops
// go down a tree (dropAlong): the coordinator sends at most the relay
// fanout of them whatever the job's size.
func (a *Agent) dropEverywhere(t *wire.Table) {
	nodes := make([]string, 0, len(t.Nodes))
	addrs := make([]string, 0, len(t.Nodes))
	for i, node := range t.Nodes {
		if node == a.cfg.Node {
			a.drop(t.Name, t.ID)
			continue
		}
		nodes, addrs = append(nodes, node), append(addrs, t.Addrs[i])
	}
	a.dropAlong(t.Name, t.ID, nodes, addrs)
}

// dropFanout is how many nodes an agent passes a drop on to at most.
func (a *Agent) dropFanout() int {
	if a.cfg.RelayFanout > 0 {
		return a.cfg.RelayFanout
	}
	return relayFanout
}

// chunkSize is how many consecutive nodes each chunk holds when a relay
// tree (a Free's drops, dropAlong; a round's requests, gatherPlace) cuts
// n nodes into at most f chunks, the last one maybe shorter.
func chunkSize(n, f int) int {
	f = max(1, f)
	return (n + f - 1) / f
}

// dropLevels is how many hops below a node a drop it passes on to n others
// takes at most, each node passing it on to f (dropAlong).
func dropLevels(n, f int) int {
	levels := 0
	for n > 0 {
		levels++
		n = chunkSize(n, f) - 1 // a chunk's nodes after its first
	}
	return levels
}

// dropAlong tells nodes (at addrs) to drop a freed variable's shards, in
// at most f (dropFanout) chunks of consecutive nodes: the first of each
// gets the drop with the rest of its chunk, which it passes on likewise
// (PeerDrop with nodes), and answers once they have. A chunk's first
// node that fails (down, or no answer in time, or an agent that does not
// know PeerDropTree) is logged, and every node of its chunk, the first
// too, gets a plain drop from here, each by itself and all at once. Each call waits a
// timeout per level of the subtree below it, so that a node further down
// that hangs makes its relay's call, not its relay's caller's, time out.
func (a *Agent) dropAlong(name string, id int64, nodes, addrs []string) {
	if len(nodes) == 0 {
		return
	}
	size := chunkSize(len(nodes), a.dropFanout())
	isCoord := a.coord.Load() != nil
	var wg sync.WaitGroup
	for s := 0; s < len(nodes); s += size {
		e := min(s+size, len(nodes))
		wg.Go(func() {
			err := a.sendDrop(wire.DropTree{Drop: wire.Drop{Name: name, ID: id}, Nodes: nodes[s+1 : e], Addrs: addrs[s+1 : e]}, addrs[s], isCoord)
			if err == nil {
				return
			}
			a.log.Warn("could not drop a freed variable on a node", "variable", name, "node", nodes[s], "passing it on to", e-s-1, "err", err)
			var each sync.WaitGroup
			for k := s; k < e; k++ { // the first again: it may have answered, not known the op
				each.Go(func() {
					if err := a.sendDrop(wire.DropTree{Drop: wire.Drop{Name: name, ID: id}}, addrs[k], isCoord); err != nil {
						a.log.Warn("could not drop a freed variable on a node", "variable", name, "node", nodes[k], "err", err)
					}
				})
			}
			each.Wait()
		})
	}
	wg.Wait()
}

// sendDrop sends m to the node at addr (PeerDrop, or PeerDropTree when it
// has nodes to pass it on to), counted among the coordinator's messages
// when this agent is the coordinator.
func (a *Agent) sendDrop(m wire.DropTree, addr string, isCoord bool) error {
	op, enc := wire.OpPeerDrop, m.Drop.Encode
	if len(m.Nodes) > 0 {
		op, enc = wire.OpPeerDropTree, m.Encode
	}
	ctx, cancel := context.WithTimeout(a.ctx, time.Duration(1+dropLevels(len(m.Nodes), a.dropFanout()))*a.cfg.Timeout)
	defer cancel()
	if !isCoord {
		a.stats.dropsRelayed.Add(1)
	} else {
		var e wire.Encoder
		enc(&e)
		cc := &a.stats.coord
		cc.out.Add(1)
		cc.outBytes.Add(int64(wire.HeaderSize + len(e.Bytes())))
		defer func() {
			cc.in.Add(1)
			cc.inBytes.Add(wire.HeaderSize)
		}()
	}
	_, err := a.pool.Call(ctx, addr, op, enc)
	return err
}

// drop removes a freed variable's shards from this node, if they are of
// that variable (id) and not of a newer one of the same name.
func (a *Agent) drop(name string, id int64) {
	a.mu.Lock()
	v := a.mu.vars[name]
	var held int64
	if v != nil {
		v.mu.RLock()
		same := v.table == nil || v.table.ID == id
		v.mu.RUnlock()
		if !same {
			v = nil
		} else {
			held = v.heldBytes() // no shard is added once v is out of a.mu.vars
			delete(a.mu.vars, name)
		}
	}
	a.mu.Unlock()
	if v != nil {
		v.drop()
		a.shardBytes.Add(-held)
		a.saveManifest()
	}
}

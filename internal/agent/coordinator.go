package agent

// The coordinator's driver: coord.Coordinator is the deterministic core
// (rounds, tables, joins); here are the goroutines, the clock and the
// connections around it — a rank's Publish waiting for its round, finding
// the coordinator and joining it, and the coordinator's peer ops.

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"slices"
	"sync"
	"time"

	"github.com/ddstore-go/ddstore/internal/base"
	"github.com/ddstore-go/ddstore/internal/coord"
	"github.com/ddstore-go/ddstore/internal/rendezvous"
	"github.com/ddstore-go/ddstore/internal/transport"
	"github.com/ddstore-go/ddstore/internal/wire"
)

// coordinator drives a coord.Coordinator: calls into it are serialized by
// mu, and the replies it returns reach the requests waiting for them.
type coordinator struct {
	// mu is a leaf: nothing blocks under it and it never calls the agent
	// (lock order: internal/LOCKS.md).
	mu struct {
		sync.Mutex
		core    *coord.Coordinator
		next    uint64             // the last request id
		waiting map[uint64]*waiter // requests whose reply is due
		// watches are the nodes' watching Joins by their numbers (the
		// last one of each node): a watch's connection closing says
		// the node's agent went only while no later one speaks for it.
		watches  map[string]uint64
		watchSeq uint64
	}
	fanout int // relayFanout, unless configured
	// saves numbers a round's completion as a change of the manifest
	// (manifestSaves.change) before its replies go; nil in the core's
	// tests, which keep no manifest.
	saves *manifestSaves
}

// waiter is a request waiting for its reply.
type waiter struct {
	ch chan reply
	// tree: a PeerRound request that wants the table (wire.RoundTable)
	// from node; it is given the table itself or a node to fetch it from.
	tree bool
	node string
	// from is the node that sent the request when not node (a relay of
	// the gather tree carrying its children's shards, wire.Round.From):
	// the one named when its connection closes.
	from string
}

// reply is the core's reply, and for a tree request the node to fetch the
// table from ("": the table itself).
type reply struct {
	coord.Reply
	relay string
}

// relayFanout is how many nodes of a round get its table from the
// coordinator, and from each of those nodes, by default (Config.RelayFanout): the coordinator sends a
// round's table relayFanout times whatever the job's size, and a node at
// most relayFanout times more than it receives it; the table reaches the
// K nodes of a round in log_relayFanout(K) steps.
const relayFanout = 8

func newCoordinator() *coordinator {
	c := &coordinator{fanout: relayFanout}
	c.mu.core = coord.New()
	c.mu.waiting = make(map[uint64]*waiter)
	c.mu.watches = make(map[string]uint64)
	return c
}

// deliverLocked hands replies to their requests; the caller holds c.mu.
func (c *coordinator) deliverLocked(replies []coord.Reply) {
	relays := c.relaysLocked(replies)
	if c.saves != nil && slices.ContainsFunc(replies, func(r coord.Reply) bool { return r.Err == nil && r.Table != nil }) {
		// A round completed: its table is in the core's state, which the
		// requests answered now save before they reply (a number read
		// once the reply came is at least this one).
		c.saves.change()
	}
	for _, r := range replies {
		if w, ok := c.mu.waiting[r.Req]; ok {
			delete(c.mu.waiting, r.Req)
			w.ch <- reply{Reply: r, relay: relays[r.Req]}
		}
	}
}

// relaysLocked arranges the tree requests among replies that carry a
// table — one per node of a round, as PeerRound asks — in a tree of
// fanout c.fanout (f), in node order: the first f get the table, and the
// one at place p after them fetches it from the node at place p/f - 1,
// which got it (or fetches it) a step earlier. It
// returns the relay node by request; nil when no request needs one.
func (c *coordinator) relaysLocked(replies []coord.Reply) map[uint64]string {
	type member struct {
		req  uint64
		node string
	}
	var rounds map[*wire.Table][]member
	for _, r := range replies {
		if w := c.mu.waiting[r.Req]; w != nil && w.tree && r.Err == nil && r.Table != nil {
			if rounds == nil {
				rounds = make(map[*wire.Table][]member)
			}
			rounds[r.Table] = append(rounds[r.Table], member{r.Req, w.node})
		}
	}
	var relays map[uint64]string
	for _, ms := range rounds {
		f := max(1, c.fanout)
		if len(ms) <= f {
			continue
		}
		slices.SortFunc(ms, func(x, y member) int { return cmp.Or(cmp.Compare(x.node, y.node), cmp.Compare(x.req, y.req)) })
		if relays == nil {
			relays = make(map[uint64]string)
		}
		for p := f; p < len(ms); p++ {
			relays[ms[p].req] = ms[p/f-1].node
		}
	}
	return relays
}

// publish adds one rank's shard and waits until every rank's is there (the
// table), a rank disagrees (an error for all), or timeout has passed or ctx
// ended (the round fails with ErrTimeout for every rank).
func (c *coordinator) publish(ctx context.Context, sh wire.Shard, timeout time.Duration) (*wire.Table, error) {
	r := c.await(ctx, timeout, &waiter{node: sh.Node}, func(now time.Time, req uint64) []coord.Reply {
		return c.mu.core.Publish(now, req, sh, now.Add(timeout))
	})
	return r.Table, r.Err
}

// publishRound is publish for a PeerRound request: with tree (the request
// wants the table), it also returns the node to fetch the table from, ""
// when the table is for this request itself (relaysLocked). The shards of
// the node's other ranks of the round (others) are recorded with sh, each
// as a request of its own that nobody waits for (deliverLocked skips its
// reply): the round's outcome, this request's, answers them all. They
// need no deadline of their own: this request waits for their round, and
// when it gives up the round fails (await), which ends theirs. from is
// the node that sent the request when not sh's ("": sh's node).
func (c *coordinator) publishRound(ctx context.Context, sh wire.Shard, others []wire.Shard, from string, tree bool, timeout time.Duration) (*wire.Table, string, error) {
	r := c.await(ctx, timeout, &waiter{tree: tree, node: sh.Node, from: from}, func(now time.Time, req uint64) []coord.Reply {
		replies := c.mu.core.Publish(now, req, sh, now.Add(timeout))
		for _, o := range others {
			c.deliverLocked(replies)
			c.mu.next++
			replies = c.mu.core.Publish(now, c.mu.next, o, now.Add(timeout))
		}
		return replies
	})
	return r.Table, r.relay, r.Err
}

// submit adds shards to their rounds without waiting for the rounds: the
// node's ranks other than the one whose PeerRound waits for each round
// (and brings its table). It returns per shard nil (recorded, or its
// round complete) or the error its round failed with. A shard recorded
// in a round that never completes is expired at its deadline, as a
// waiting request would be (the round fails for every rank).
func (c *coordinator) submit(shards []wire.Shard, timeout func(wire.Shard) time.Duration) []error {
	errs := make([]error, len(shards))
	now := time.Now()
	var reqs []uint64
	var longest time.Duration
	c.mu.Lock()
	for i, sh := range shards {
		c.mu.next++
		req := c.mu.next
		c.mu.waiting[req] = &waiter{ch: make(chan reply, 1)} // its reply is nobody's
		d := timeout(sh)
		replies := c.mu.core.Publish(now, req, sh, now.Add(d))
		for _, r := range replies {
			if r.Req == req && r.Err != nil {
				errs[i] = r.Err
			}
		}
		c.deliverLocked(replies)
		if _, waits := c.mu.waiting[req]; waits {
			reqs = append(reqs, req)
			longest = max(longest, d)
		}
	}
	c.mu.Unlock()
	if len(reqs) > 0 {
		time.AfterFunc(longest, func() {
			c.mu.Lock()
			defer c.mu.Unlock()
			for _, req := range reqs {
				c.deliverLocked(c.mu.core.Expire(time.Now(), req))
			}
		})
	}
	return errs
}

// barrier adds one rank's arrival at a fence and waits until every rank of
// it has come, the ranks disagree (an error for all), or timeout has
// passed or ctx ended (the fence fails with ErrTimeout for every rank).
func (c *coordinator) barrier(ctx context.Context, m wire.Barrier, timeout time.Duration) error {
	return c.await(ctx, timeout, &waiter{}, func(now time.Time, req uint64) []coord.Reply {
		return c.mu.core.Barrier(now, req, m, now.Add(timeout))
	}).Err
}

// await files one request with the core through enter (called under c.mu
// with the time and the request's id) and waits for its reply. When
// timeout passes or ctx ends first, the core expires the request, so its
// round fails for every rank rather than leaving the others waiting.
func (c *coordinator) await(ctx context.Context, timeout time.Duration, w *waiter, enter func(now time.Time, req uint64) []coord.Reply) reply {
	ch := make(chan reply, 1)
	w.ch = ch
	now := time.Now()
	c.mu.Lock()
	c.mu.next++
	req := c.mu.next
	c.mu.waiting[req] = w
	c.deliverLocked(enter(now, req))
	c.mu.Unlock()
	t := time.NewTimer(timeout)
	defer t.Stop()
	why := ""
	select {
	case r := <-ch:
		return r
	case <-t.C:
	case <-ctx.Done():
		switch cause := context.Cause(ctx); {
		case errors.Is(cause, errClientLeft):
			why = "went away before it ended: its client closed the connection that waited (the process exited or was killed?)"
		case errors.Is(cause, transport.ErrConnClosed):
			on := ""
			if n := cmp.Or(w.from, w.node); n != "" {
				on = fmt.Sprintf(" on node %q", n)
			}
			why = fmt.Sprintf("is out of it: the connection from its agent%s to the coordinator closed while it waited (the agent was killed or stopped?)", on)
		}
	}
	c.mu.Lock()
	if why != "" {
		c.deliverLocked(c.mu.core.Leave(time.Now(), req, base.ErrPeer, why))
	} else {
		c.deliverLocked(c.mu.core.Expire(time.Now(), req))
	}
	c.mu.Unlock()
	// Expire answered req, or its round had answered it already.
	return <-ch
}

// gone is coord.Coordinator.Gone: a client process went away.
func (c *coordinator) gone(g wire.Gone) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.deliverLocked(c.mu.core.Gone(time.Now(), g))
}

// nodeGone is coord.Coordinator.NodeGone: a node's agent went away. It
// returns how many waiting requests failed with it.
func (c *coordinator) nodeGone(node, why string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	replies := c.mu.core.NodeGone(time.Now(), node, why)
	c.deliverLocked(replies)
	return len(replies)
}

// watch numbers a new watching Join of node, which speaks for the node
// from now on.
func (c *coordinator) watch(node string) uint64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.mu.watchSeq++
	c.mu.watches[node] = c.mu.watchSeq
	return c.mu.watchSeq
}

// unwatch ends node's watch number seq and says whether it was the last
// one of the node (no later watch speaks for it).
func (c *coordinator) unwatch(node string, seq uint64) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.mu.watches[node] != seq {
		return false
	}
	delete(c.mu.watches, node)
	return true
}

func (c *coordinator) join(node, addr string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.mu.core.Join(node, addr)
}

func (c *coordinator) lookup(name string) (*wire.Table, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.mu.core.Lookup(name)
}

func (c *coordinator) free(name string, rank int64) *wire.Table {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.mu.core.Free(name, rank)
}

func (c *coordinator) nodes() (ids, addrs []string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.mu.core.Nodes()
}

func (c *coordinator) addr(node string) string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.mu.core.Addr(node)
}

func (c *coordinator) collectives() []wire.AgentCollective {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.mu.core.Collectives()
}

// round is coord.Coordinator.Round.
func (c *coordinator) round(name string, attempt int64) (ranks int, failed, ok bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.mu.core.Round(name, attempt)
}

func (c *coordinator) snapshot() *coord.State {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.mu.core.Snapshot()
}

func (c *coordinator) restore(s *coord.State) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.mu.core.Restore(s)
}

// roundChange is the number of the manifest change a round completed on
// this coordinator must be saved up to before its replies go: its table in
// the coordinator's state (numbered by deliverLocked before the reply came,
// so at most the last number now) and, when this node holds shards of it,
// on this node's variable, which it sets first. The node's own ranks would
// set it as their requests get the table; set by the first of the round's
// requests to be answered, one write holds both. A table that does not fit
// the node (setTable fails) is left for its ranks, which get the error.
func (a *Agent) roundChange(t *wire.Table) uint64 {
	if i := slices.Index(t.Nodes, a.cfg.Node); i >= 0 && slices.Contains(t.RankNode, int64(i)) {
		a.mu.Lock()
		v := a.mu.vars[t.Name]
		a.mu.Unlock()
		if v != nil {
			v.mu.Lock()
			v.setTable(a, t)
			v.mu.Unlock()
		}
	}
	return a.saves.changes.Load()
}

// newCoordinator makes this agent's coordinator, with the state a previous
// coordinator of the job left on this node, if any.
func (a *Agent) newCoordinator() *coordinator {
	c := newCoordinator()
	c.saves = &a.saves
	if a.cfg.RelayFanout > 0 {
		c.fanout = a.cfg.RelayFanout
	}
	c.restore(a.restored)
	return c
}

// becomeCoordinator is called when rank 0 says hello in handshake mode.
func (a *Agent) becomeCoordinator() error {
	// With a rendezvous address too, the rendezvous decides (whoever could
	// listen there coordinates): never two coordinators.
	if a.cfg.HandshakeDir == "" || a.cfg.Rendezvous != "" || a.coord.Load() != nil {
		return nil
	}
	c := a.newCoordinator()
	if !a.coord.CompareAndSwap(nil, c) {
		return nil
	}
	c.join(a.cfg.Node, a.addr)
	rec := nodeRecord{Node: a.cfg.Node, Addr: a.addr, Pid: os.Getpid(), Key: a.coordinatorKey()}
	return rendezvous.WriteRecord(a.cfg.HandshakeDir, a.recordName("coordinator"), rec)
}

// coordinatorAddr finds the coordinator and joins it once; "" means this
// agent is the coordinator.
func (a *Agent) coordinatorAddr(ctx context.Context) (string, error) {
	if a.coord.Load() != nil {
		return "", nil
	}
	a.joinMu.Lock()
	defer a.joinMu.Unlock()
	if a.joined != "" {
		return a.joined, nil
	}
	addr := a.coordAddr
	if addr == "" {
		var rec nodeRecord
		err := rendezvous.WaitRecord(ctx, a.cfg.HandshakeDir, a.recordName("coordinator"), a.cfg.JoinTimeout, &rec)
		if err != nil {
			return "", fmt.Errorf("%w: waiting for the coordinator (the agent of rank 0) in %s: %w", base.ErrTimeout, a.cfg.HandshakeDir, err)
		}
		if a.coord.Load() != nil { // rank 0 said hello here meanwhile
			return "", nil
		}
		if err := a.takeRecordKey(rec); err != nil {
			return "", err
		}
		addr = rec.Addr
	}
	j := wire.Join{Node: a.cfg.Node, Addr: a.addr, Namespace: a.cfg.Namespace}
	if _, err := a.callUntil(ctx, addr, wire.OpJoin, j.Encode); err != nil {
		return "", err
	}
	a.joined = addr
	a.go_(func() { a.watchCoordinator(addr) })
	return addr, nil
}

// callUntil retries a control call while the coordinator is not up yet, so
// that agents may start in any order.
func (a *Agent) callUntil(ctx context.Context, addr string, op wire.Op, fill func(*wire.Encoder)) ([]byte, error) {
	ctx, cancel := context.WithTimeout(ctx, a.cfg.JoinTimeout)
	defer cancel()
	wait := 5 * time.Millisecond
	for {
		body, err := a.pool.Call(ctx, addr, op, fill)
		if err == nil || !errors.Is(err, base.ErrPeer) || !isConnectError(err) {
			return body, err
		}
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("%w: coordinator %s unreachable: %w", base.ErrTimeout, addr, err)
		case <-time.After(wait):
		}
		wait = min(2*wait, 200*time.Millisecond)
	}
}

func isConnectError(err error) bool {
	var op *net.OpError
	return errors.As(err, &op) && op.Op == "dial"
}

// roundTimeout is how long the coordinator waits for a round's ranks: the
// shard's own timeout, bounded by the agent's join timeout.
func (a *Agent) roundTimeout(m wire.Shard) time.Duration {
	if m.TimeoutMs > 0 {
		return min(a.cfg.JoinTimeout, msDuration(m.TimeoutMs))
	}
	return a.cfg.JoinTimeout
}

// coordPublish hands a rank's shard to the coordinator, here or over the
// peer protocol, and waits for its round.
func (a *Agent) coordPublish(ctx context.Context, m wire.Shard) (*wire.Table, error) {
	addr, err := a.coordinatorAddr(ctx)
	if err != nil {
		return nil, err
	}
	if addr == "" {
		// Here the round's own timeout, as the coordinator applies it to
		// shards arriving from other agents (coordinatorOp).
		return a.coord.Load().publish(ctx, m, a.roundTimeout(m))
	}
	body, err := a.pool.Call(ctx, addr, wire.OpPeerPublish, m.Encode)
	if err != nil {
		return nil, err
	}
	t, err := wire.DecodeTable(body)
	return &t, err
}

// barrierTimeout is how long the coordinator waits for a fence's ranks: the
// rank's own timeout, bounded by the agent's join timeout.
func (a *Agent) barrierTimeout(m wire.Barrier) time.Duration {
	if m.TimeoutMs > 0 {
		return min(a.cfg.JoinTimeout, msDuration(m.TimeoutMs))
	}
	return a.cfg.JoinTimeout
}

// coordBarrier hands a rank's arrival at a fence to the coordinator, here
// or over the peer protocol, and waits for the fence's other ranks.
func (a *Agent) coordBarrier(ctx context.Context, m wire.Barrier) error {
	addr, err := a.coordinatorAddr(ctx)
	if err != nil {
		return err
	}
	if addr == "" {
		return a.coord.Load().barrier(ctx, m, a.barrierTimeout(m))
	}
	_, err = a.pool.Call(ctx, addr, wire.OpPeerBarrier, m.Encode)
	return err
}

// watchCoordinator holds a watching Join (wire.Join.Watch) on the
// coordinator at addr while the agent runs: the coordinator learns from
// its connection closing that this agent went — a killed process's
// sockets close with it — and fails at once the collectives that wait
// on this node's ranks (holdWatch). A watch that ends while the agent
// runs (the coordinator restarted, the connection dropped) is made
// again, which joins a restarted coordinator too.
func (a *Agent) watchCoordinator(addr string) {
	j := wire.Join{Node: a.cfg.Node, Addr: a.addr, Namespace: a.cfg.Namespace, Watch: true}
	const first, most = 50 * time.Millisecond, 2 * time.Second
	wait := first
	for {
		start := time.Now()
		_, err := a.pool.Call(a.ctx, addr, wire.OpJoin, j.Encode)
		if a.ctx.Err() != nil {
			return
		}
		if time.Since(start) > most {
			wait = first // it held a while: not a coordinator that refuses it
		}
		a.log.Debug("the watch on the coordinator ended; watching again", "coordinator", addr, "err", err, "in", wait)
		select {
		case <-a.ctx.Done():
			return
		case <-time.After(wait):
		}
		wait = min(2*wait, most)
	}
}

// holdWatch answers a node's watching Join m only when ctx ends. When its
// connection closed (the node's agent went, or only the connection did),
// no later watch of the node speaks for it, and the node's address does
// not answer either, the node's agent is gone: every collective waiting
// on a rank of the node fails at once (coord.Coordinator.NodeGone).
func (a *Agent) holdWatch(ctx context.Context, c *coordinator, m wire.Join) error {
	seq := c.watch(m.Node)
	<-ctx.Done()
	last := c.unwatch(m.Node, seq)
	if last && errors.Is(context.Cause(ctx), transport.ErrConnClosed) && a.ctx.Err() == nil {
		pctx, cancel := context.WithTimeout(a.ctx, min(a.cfg.Timeout, probeTimeout))
		_, err := a.pool.Call(pctx, m.Addr, wire.OpPeerInfo, nil)
		cancel()
		if err != nil && !base.IsRemote(err) && a.ctx.Err() == nil {
			a.stats.nodesGone.Add(1)
			n := c.nodeGone(m.Node, fmt.Sprintf("its connection to the coordinator closed, and its address %s does not answer: %v", m.Addr, err))
			// A node stopped at the end of a job fails nothing: no warning.
			log := a.log.Info
			if n > 0 {
				log = a.log.Warn
			}
			log("a node's agent went away: the collectives waiting on its ranks fail", "node", m.Node, "addr", m.Addr, "failed_requests", n, "err", err)
		}
	}
	return base.Errorf(base.ErrClosed, "the watch of node %q on the coordinator ended", m.Node)
}

// probeTimeout bounds how long the coordinator waits for a node whose
// watch closed to answer at its address before it takes it for gone (a
// killed agent's port refuses at once).
const probeTimeout = 2 * time.Second

// isCoordinatorOp says whether only the coordinator answers op.
func isCoordinatorOp(op wire.Op) bool {
	switch op {
	case wire.OpJoin, wire.OpPeerPublish, wire.OpPeerRound, wire.OpPeerShards, wire.OpPeerFrees, wire.OpPeerLookup, wire.OpPeerFree, wire.OpPeerNodes, wire.OpPeerBarrier, wire.OpPeerGone:
		return true
	}
	return false
}

// coordinatorOp answers the peer ops only the coordinator answers
// (isCoordinatorOp), from other agents.
func (a *Agent) coordinatorOp(ctx context.Context, op wire.Op, body []byte) (func(*wire.Encoder), error) {
	c := a.coord.Load()
	if c == nil {
		return nil, base.Errorf(base.ErrArgument, "node %q is not the coordinator of namespace %q", a.cfg.Node, a.cfg.Namespace)
	}
	switch op {
	case wire.OpJoin:
		m, err := wire.DecodeJoin(body)
		if err != nil {
			return nil, err
		}
		if m.Namespace != a.cfg.Namespace {
			return nil, base.Errorf(base.ErrArgument, "agent of node %q in namespace %q reached the coordinator of namespace %q: give each job its own rendezvous address or handshake directory",
				m.Node, m.Namespace, a.cfg.Namespace)
		}
		c.join(m.Node, m.Addr)
		if !m.Watch {
			return nil, nil
		}
		return nil, a.holdWatch(ctx, c, m)
	case wire.OpPeerPublish:
		m, err := wire.DecodeShard(body)
		if err != nil {
			return nil, err
		}
		t, err := c.publish(ctx, m, a.roundTimeout(m))
		if err != nil {
			return nil, err
		}
		a.saveManifestOf(a.roundChange(t))
		return t.Encode, nil
	case wire.OpPeerRound:
		m, err := wire.DecodeRound(body)
		if err != nil {
			return nil, err
		}
		t, relay, err := c.publishRound(ctx, m.Shard, m.Others, m.From, m.Want == wire.RoundTable, a.roundTimeout(m.Shard))
		if err != nil {
			return nil, err
		}
		a.saveManifestOf(a.roundChange(t))
		rep := wire.RoundReply{Kind: wire.RoundReplyAck}
		switch {
		case m.Want == wire.RoundAck:
		case relay != "":
			rep = wire.RoundReply{Kind: wire.RoundReplyRelay, Node: relay, ID: t.ID}
			if i := slices.Index(t.Nodes, relay); i >= 0 {
				rep.Addr = t.Addrs[i]
			}
		default:
			rep = wire.RoundReply{Kind: wire.RoundReplyTable, Table: *t}
		}
		return rep.Encode, nil
	case wire.OpPeerShards:
		m, err := wire.DecodeShards(body)
		if err != nil {
			return nil, err
		}
		res := wire.Results{Errs: c.submit(m.Shards, a.roundTimeout)}
		return res.Encode, nil
	case wire.OpPeerFrees:
		m, err := wire.DecodeNames(body)
		if err != nil {
			return nil, err
		}
		for _, n := range m.Names {
			if t := c.free(n.Name, n.Rank); t != nil {
				a.dropEverywhere(t)
			}
		}
		a.saveManifest()
		res := wire.Results{Errs: make([]error, len(m.Names))}
		return res.Encode, nil
	case wire.OpPeerBarrier:
		m, err := wire.DecodeBarrier(body)
		if err != nil {
			return nil, err
		}
		return nil, c.barrier(ctx, m, a.barrierTimeout(m))
	case wire.OpPeerGone:
		m, err := wire.DecodeGone(body)
		if err != nil {
			return nil, err
		}
		c.gone(m)
		return nil, nil
	case wire.OpPeerLookup:
		m, err := wire.DecodeName(body)
		if err != nil {
			return nil, err
		}
		t, err := c.lookup(m.Name)
		if err != nil {
			return nil, err
		}
		return t.Encode, nil
	case wire.OpPeerFree:
		m, err := wire.DecodeName(body)
		if err != nil {
			return nil, err
		}
		if t := c.free(m.Name, m.Rank); t != nil {
			a.dropEverywhere(t)
		}
		a.saveManifest()
		return nil, nil
	case wire.OpPeerNodes:
		m, err := wire.DecodePeerNodes(body)
		if err != nil {
			return nil, err
		}
		ids, addrs := c.nodes()
		t := wire.Table{Nodes: ids, Addrs: addrs}
		if m.Node != "" {
			t.Nodes, t.Addrs = nil, nil
			if addr := c.addr(m.Node); addr != "" {
				t.Nodes, t.Addrs = []string{m.Node}, []string{addr}
			}
		}
		return t.Encode, nil
	}
	return nil, base.Errorf(base.ErrProtocol, "peer op %s is not the coordinator's", op)
}

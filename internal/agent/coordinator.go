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
	}
	fanout int // relayFanout, unless configured
}

// waiter is a request waiting for its reply.
type waiter struct {
	ch chan reply
	// tree: a PeerRound request that wants the table (wire.RoundTable)
	// from node; it is given the table itself or a node to fetch it from.
	tree bool
	node string
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
	return c
}

// deliverLocked hands replies to their requests; the caller holds c.mu.
func (c *coordinator) deliverLocked(replies []coord.Reply) {
	relays := c.relaysLocked(replies)
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
	r := c.await(ctx, timeout, &waiter{}, func(now time.Time, req uint64) []coord.Reply {
		return c.mu.core.Publish(now, req, sh, now.Add(timeout))
	})
	return r.Table, r.Err
}

// publishRound is publish for a PeerRound request: with tree (the request
// wants the table), it also returns the node to fetch the table from, ""
// when the table is for this request itself (relaysLocked).
func (c *coordinator) publishRound(ctx context.Context, sh wire.Shard, tree bool, timeout time.Duration) (*wire.Table, string, error) {
	r := c.await(ctx, timeout, &waiter{tree: tree, node: sh.Node}, func(now time.Time, req uint64) []coord.Reply {
		return c.mu.core.Publish(now, req, sh, now.Add(timeout))
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
	select {
	case r := <-ch:
		return r
	case <-t.C:
	case <-ctx.Done():
	}
	c.mu.Lock()
	c.deliverLocked(c.mu.core.Expire(time.Now(), req))
	c.mu.Unlock()
	// Expire answered req, or its round had answered it already.
	return <-ch
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

// newCoordinator makes this agent's coordinator, with the state a previous
// coordinator of the job left on this node, if any.
func (a *Agent) newCoordinator() *coordinator {
	c := newCoordinator()
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

// roundLeads are the rounds in which a rank of this node waits for the
// coordinator's table (PeerRound): the node's other ranks of the round
// hand their shards over in batches (PeerShards) and take the table, or
// the error, that it brings.
type roundLeads struct {
	mu sync.Mutex // a leaf (lock order: internal/LOCKS.md)
	m  map[roundLead]*lead
}

type roundLead struct {
	name    string
	attempt int64
}

// lead is one round's leading request on this node: done is closed once
// it has set the table on the variable, or failed with err.
type lead struct {
	done chan struct{}
	err  error // set before done is closed
}

// lead makes the caller the rank of this node that brings round k's
// table, unless one does already; finish (the leader's) records its error
// and releases the others.
func (l *roundLeads) lead(k roundLead) (leader bool, ld *lead, finish func(error)) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if ld, ok := l.m[k]; ok {
		return false, ld, func(error) {}
	}
	if l.m == nil {
		l.m = make(map[roundLead]*lead)
	}
	ld = &lead{done: make(chan struct{})}
	l.m[k] = ld
	return true, ld, func(err error) {
		l.mu.Lock()
		delete(l.m, k)
		l.mu.Unlock()
		ld.err = err
		close(ld.done)
	}
}

// coordRound hands a rank's shard of v to the coordinator and waits for
// its round's table, which the caller sets on v. On the coordinator's
// node it is coordPublish. Elsewhere only the node's first rank of a
// round sends its shard with PeerRound, which waits for the round and
// brings the table — or the node to fetch it from: the coordinator
// passes a round's table on along a tree of nodes (PeerTable); the
// node's other ranks hand their shards over in batches (PeerShards,
// answered at once) and take the table from v, or the leader's error
// (docs/design.md, Publish rounds at scale).
func (a *Agent) coordRound(ctx context.Context, v *variable, m wire.Shard) (*wire.Table, error) {
	addr, err := a.coordinatorAddr(ctx)
	if err != nil {
		return nil, err
	}
	if addr == "" {
		return a.coord.Load().publish(ctx, m, a.roundTimeout(m))
	}
	leader, ld, finish := a.leads.lead(roundLead{m.Name, m.Attempt})
	if !leader {
		if err := a.shardBatch.submit(ctx, a, addr, m); err != nil {
			return nil, err // the round's error names the variable, a transport's the peer
		}
		select {
		case <-ld.done:
		case <-ctx.Done():
			return nil, fmt.Errorf("%w: variable %q: waiting for the table another rank of node %q fetches: %w", base.ErrTimeout, m.Name, a.cfg.Node, ctx.Err())
		}
		if ld.err != nil {
			return nil, ld.err
		}
		v.mu.RLock()
		t := v.table
		v.mu.RUnlock()
		if t == nil { // the leader's table did not fit this node (setTable failed): the caller says why
			return a.coordTable(ctx, addr, m.Name, 0)
		}
		return t, nil
	}
	t, err := a.leadRound(ctx, addr, m)
	if err == nil {
		// Before finish: the node's other ranks take it from v. An error
		// is the caller's to report (setTable gives it again).
		v.mu.Lock()
		v.setTable(a, t)
		v.mu.Unlock()
	}
	finish(err)
	return t, err
}

// leadRound sends the leader's shard (PeerRound) and returns the round's
// table: in the reply, or from the node it names.
func (a *Agent) leadRound(ctx context.Context, addr string, m wire.Shard) (*wire.Table, error) {
	r := wire.Round{Shard: m, Want: wire.RoundTable}
	body, err := a.pool.Call(ctx, addr, wire.OpPeerRound, r.Encode)
	if err != nil {
		return nil, err
	}
	rep, err := wire.DecodeRoundReply(body)
	if err != nil {
		return nil, err
	}
	switch rep.Kind {
	case wire.RoundReplyTable:
		return &rep.Table, nil
	case wire.RoundReplyRelay:
		return a.relayedTable(ctx, addr, m.Name, rep)
	}
	// Only a request that wants no table is answered so.
	return a.coordTable(ctx, addr, m.Name, 0)
}

// batcher sends this node's ranks' requests to the coordinator in
// batches: one request at a time carries every item that came while the
// previous one was on its way, so a node of many ranks sends few
// messages per round. The shards of ranks that wait for another rank's
// PeerRound go so (PeerShards), and the ranks' frees (PeerFrees).
type batcher[T any] struct {
	mu      sync.Mutex // a leaf (lock order: internal/LOCKS.md)
	queue   []*batchItem[T]
	sending bool
	// send sends one batch to addr and returns each item's error.
	send func(ctx context.Context, addr string, items []T) []error
}

type batchItem[T any] struct {
	v    T
	addr string
	done chan error // one slot: the coordinator's answer
}

// submit queues v for the coordinator at addr and returns its answer.
func (b *batcher[T]) submit(ctx context.Context, a *Agent, addr string, v T) error {
	p := &batchItem[T]{v: v, addr: addr, done: make(chan error, 1)}
	b.mu.Lock()
	b.queue = append(b.queue, p)
	start := !b.sending
	b.sending = true
	b.mu.Unlock()
	if start {
		a.go_(func() { b.run(a) })
	}
	select {
	case err := <-p.done:
		return err
	case <-ctx.Done():
		return fmt.Errorf("%w: waiting for the coordinator's answer: %w", base.ErrTimeout, ctx.Err())
	}
}

// run sends what is queued until the queue is empty, a batch per
// coordinator address (one, unless the coordinator changed meanwhile).
func (b *batcher[T]) run(a *Agent) {
	for {
		b.mu.Lock()
		batch := b.queue
		b.queue = nil
		if len(batch) == 0 {
			b.sending = false
			b.mu.Unlock()
			return
		}
		b.mu.Unlock()
		for len(batch) > 0 {
			addr := batch[0].addr
			var now, later []*batchItem[T]
			for _, p := range batch {
				if p.addr == addr {
					now = append(now, p)
				} else {
					later = append(later, p)
				}
			}
			batch = later
			items := make([]T, len(now))
			for i, p := range now {
				items[i] = p.v
			}
			// A free that completes a variable waits for its drop on every
			// node, each bounded by the timeout.
			ctx, cancel := context.WithTimeout(a.ctx, 2*a.cfg.Timeout)
			errs := b.send(ctx, addr, items)
			cancel()
			for i, p := range now {
				p.done <- errs[i]
			}
		}
	}
}

// callBatch sends one batch request and returns each item's result: the
// request's error for all when it failed as a whole.
func (a *Agent) callBatch(ctx context.Context, addr string, op wire.Op, fill func(*wire.Encoder), n int) []error {
	errs := make([]error, n)
	body, err := a.pool.Call(ctx, addr, op, fill)
	var res wire.Results
	if err == nil {
		if res, err = wire.DecodeResults(body); err == nil && len(res.Errs) != n {
			err = base.Errorf(base.ErrProtocol, "coordinator answered %d of %d items of a %s", len(res.Errs), n, op)
		}
	}
	for i := range errs {
		if err != nil {
			errs[i] = err
		} else {
			errs[i] = res.Errs[i]
		}
	}
	return errs
}

// initBatchers sets what the agent's batchers send.
func (a *Agent) initBatchers() {
	a.shardBatch.send = func(ctx context.Context, addr string, items []wire.Shard) []error {
		m := wire.Shards{Shards: items}
		return a.callBatch(ctx, addr, wire.OpPeerShards, m.Encode, len(items))
	}
	a.freeBatch.send = func(ctx context.Context, addr string, items []wire.Name) []error {
		m := wire.Names{Names: items}
		return a.callBatch(ctx, addr, wire.OpPeerFrees, m.Encode, len(items))
	}
}

// relayedTable fetches a round's table from the node the coordinator
// named, or from the coordinator when that node cannot give it.
func (a *Agent) relayedTable(ctx context.Context, coordAddr, name string, rep wire.RoundReply) (*wire.Table, error) {
	m := wire.Drop{Name: name, ID: rep.ID}
	body, err := a.pool.Call(ctx, rep.Addr, wire.OpPeerTable, m.Encode)
	if err == nil {
		var t wire.Table
		if t, err = wire.DecodeTable(body); err == nil && t.ID == rep.ID {
			return &t, nil
		}
		if err == nil {
			err = fmt.Errorf("table id %d, want %d", t.ID, rep.ID)
		}
	}
	a.log.Info("could not fetch a table from the node relaying it; asking the coordinator", "variable", name, "node", rep.Node, "err", err)
	return a.coordTable(ctx, coordAddr, name, rep.ID)
}

// coordTable asks the coordinator for a variable's table (PeerLookup);
// with id != 0 it must be that table.
func (a *Agent) coordTable(ctx context.Context, addr, name string, id int64) (*wire.Table, error) {
	m := wire.Name{Name: name}
	body, err := a.pool.Call(ctx, addr, wire.OpPeerLookup, m.Encode)
	if err != nil {
		return nil, err
	}
	t, err := wire.DecodeTable(body)
	if err != nil {
		return nil, err
	}
	if id != 0 && t.ID != id {
		return nil, base.Errorf(base.ErrFreed, "variable %q: the coordinator has table %d, the round made %d", name, t.ID, id)
	}
	return &t, nil
}

// peerTable answers PeerTable: the table of a variable this node holds,
// waiting (boundedly) for it while this node's own round's reply is on
// its way.
func (a *Agent) peerTable(ctx context.Context, m wire.Drop) (func(*wire.Encoder), error) {
	a.mu.Lock()
	v := a.mu.vars[m.Name]
	a.mu.Unlock()
	if v == nil {
		return nil, base.Errorf(base.ErrUnknown, "node %q holds no variable %q", a.cfg.Node, m.Name)
	}
	t := time.NewTimer(a.cfg.Timeout)
	defer t.Stop()
	select {
	case <-v.ready:
	case <-t.C:
		return nil, base.Errorf(base.ErrTimeout, "node %q: variable %q has no table after %v", a.cfg.Node, m.Name, a.cfg.Timeout)
	case <-ctx.Done():
		return nil, base.Errorf(base.ErrClosed, "node %q stopping", a.cfg.Node)
	}
	v.mu.RLock()
	tab := v.table
	v.mu.RUnlock()
	if tab == nil || tab.ID != m.ID {
		return nil, base.Errorf(base.ErrUnknown, "node %q holds no table %d of variable %q", a.cfg.Node, m.ID, m.Name)
	}
	a.stats.tablesRelayed.Add(1)
	return tab.Encode, nil // a set table is never changed
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

// isCoordinatorOp says whether only the coordinator answers op.
func isCoordinatorOp(op wire.Op) bool {
	switch op {
	case wire.OpJoin, wire.OpPeerPublish, wire.OpPeerRound, wire.OpPeerShards, wire.OpPeerFrees, wire.OpPeerLookup, wire.OpPeerFree, wire.OpPeerNodes, wire.OpPeerBarrier:
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
		return nil, nil
	case wire.OpPeerPublish:
		m, err := wire.DecodeShard(body)
		if err != nil {
			return nil, err
		}
		t, err := c.publish(ctx, m, a.roundTimeout(m))
		if err != nil {
			return nil, err
		}
		a.saveManifest()
		return t.Encode, nil
	case wire.OpPeerRound:
		m, err := wire.DecodeRound(body)
		if err != nil {
			return nil, err
		}
		t, relay, err := c.publishRound(ctx, m.Shard, m.Want == wire.RoundTable, a.roundTimeout(m.Shard))
		if err != nil {
			return nil, err
		}
		a.saveManifest()
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

// countCoordinatorOp is coordinatorOp, with the request and its reply
// counted in the coordinator's counters (a.stats.coord).
func (a *Agent) countCoordinatorOp(ctx context.Context, op wire.Op, body []byte) (func(*wire.Encoder), error) {
	cc := &a.stats.coord
	cc.in.Add(1)
	cc.inBytes.Add(int64(wire.HeaderSize + len(body)))
	cc.out.Add(1)
	fill, err := a.coordinatorOp(ctx, op, body)
	if err != nil {
		cc.outBytes.Add(int64(len(wire.AppendError(nil, op, 0, err))))
		return nil, err
	}
	if fill == nil {
		cc.outBytes.Add(wire.HeaderSize)
		return nil, nil
	}
	return func(e *wire.Encoder) {
		n := len(e.Bytes())
		fill(e)
		cc.outBytes.Add(int64(wire.HeaderSize + len(e.Bytes()) - n))
	}, nil
}

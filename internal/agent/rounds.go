package agent

// Publish rounds at scale, on the requesting side (docs/design.md): a
// node's first rank of a round waits for it and brings the table, or
// fetches it from the node the coordinator names; the node's other ranks
// hand their shards, and all ranks their frees, over in batches; any
// agent gives a table it holds to the nodes below it in the tree. And the
// coordinator's counters of what it receives and sends.

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/ddstore-go/ddstore/internal/base"
	"github.com/ddstore-go/ddstore/internal/wire"
)

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
	// fold gathers the shards of the node's other ranks of the round for
	// the leader's PeerRound, which carries them (Round.Others): one
	// request and one reply per node and round.
	fold fold
}

// fold holds the shards of a node's ranks other than the leader's until
// the leader takes them into its PeerRound: once want are in, or none
// has come for gatherHold (a tenth of the round's timeout in all). A
// shard that comes after (a late rank) goes alone, in PeerShards.
type fold struct {
	mu    sync.Mutex // a leaf (lock order: internal/LOCKS.md)
	want  int
	items []*batchItem[wire.Shard]
	last  time.Time     // when the last shard came
	full  chan struct{} // closed once want are in
	taken bool
}

// add folds p into the leader's request, unless the leader took the
// shards already (false: p goes alone).
func (f *fold) add(p *batchItem[wire.Shard]) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.taken {
		return false
	}
	f.items = append(f.items, p)
	f.last = time.Now()
	if len(f.items) == f.want {
		close(f.full)
	}
	return true
}

// lastCame is when the last shard came (zero: none yet).
func (f *fold) lastCame() time.Time {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.last
}

// waitQuiet waits until full is closed, or ctx ends, or nothing has come
// for hold (last: when the last thing came, or the time it counts from)
// or most has passed since start.
func waitQuiet(ctx context.Context, full <-chan struct{}, last func() time.Time, start time.Time, hold, most time.Duration) {
	for {
		wait := min(time.Until(last().Add(hold)), time.Until(start.Add(most)))
		if wait <= 0 {
			return
		}
		t := time.NewTimer(wait)
		select {
		case <-full:
		case <-ctx.Done():
		case <-t.C:
			continue
		}
		t.Stop()
		return
	}
}

// take returns the shards folded so far; later ones go alone.
func (f *fold) take() []*batchItem[wire.Shard] {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.taken = true
	items := f.items
	f.items = nil
	return items
}

// errLeaderLeft answers the folded shards of a leader whose own request
// ended with its client (or its deadline) rather than in the transport:
// its ranks then take the leader's error, as they do when its round fails.
var errLeaderLeft = errors.New("the node's leading rank of the round left before its request was answered")

// gatherHold bounds how long the shards of a node's ranks wait for the
// rest of the node's ranks of their round before they go anyway: a round
// ends only once every rank's shard is in, so waiting for the node's last
// rank delays nothing; the bound (at most a tenth of the round's timeout,
// so that a rank missing past it is named by the coordinator among the
// right ones) only matters when a connected rank of the job is not in
// the round, or is late. The ranks' frees of a variable are held alike.
const gatherHold = time.Second

// gathering holds items of a node's ranks for a batcher until as many as
// wanted are in, or the hold passes, so that they go in one request.
type gathering[T any] struct {
	mu      sync.Mutex // a leaf (lock order: internal/LOCKS.md)
	items   []*batchItem[T]
	flushed bool
}

// add gathers p unless the gathering went already (false: p goes alone),
// and returns the items to send when want are in.
func (g *gathering[T]) add(p *batchItem[T], want int) (added bool, flush []*batchItem[T]) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.flushed {
		return false, nil
	}
	g.items = append(g.items, p)
	return true, g.take(len(g.items) >= want)
}

// take returns the gathered items to send, once, when all is true; g.mu
// is held.
func (g *gathering[T]) take(all bool) []*batchItem[T] {
	if !all || g.flushed {
		return nil
	}
	g.flushed = true
	items := g.items
	g.items = nil
	return items
}

// wait waits for the answer to p, gathered in g: once hold passes, what
// g holds goes at once.
func (g *gathering[T]) wait(ctx context.Context, a *Agent, b *batcher[T], p *batchItem[T], hold time.Duration) error {
	t := time.NewTimer(hold)
	defer t.Stop()
	for {
		select {
		case err := <-p.done:
			return err
		case <-t.C:
		case <-ctx.Done():
			return fmt.Errorf("%w: waiting for the coordinator's answer: %w", base.ErrTimeout, ctx.Err())
		}
		g.mu.Lock()
		flush := g.take(true)
		g.mu.Unlock()
		if flush != nil {
			b.queue(a, flush)
		}
	}
}

// foldShard hands a follower's shard to the leader of its round, whose
// PeerRound carries it (fold), and waits for the round's outcome; a
// shard that comes after the leader sent its request goes alone.
func (a *Agent) foldShard(ctx context.Context, ld *lead, addr string, m wire.Shard) error {
	p := &batchItem[wire.Shard]{v: m, addr: addr, done: make(chan error, 1)}
	if !ld.fold.add(p) {
		return a.shardBatch.submit(ctx, a, addr, m)
	}
	select {
	case err := <-p.done:
		return err
	case <-ctx.Done():
		// The leader still sends the shard: a client that left is then
		// reported lost (coordRound), which fails the round either way.
		return fmt.Errorf("%w: waiting for the coordinator's answer: %w", base.ErrTimeout, ctx.Err())
	}
}

// gatherFree hands rank m's free of v over with the node's other ranks'
// frees of it: held until every rank of the node in v's table has freed
// it, or gatherHold passes, so that they go in one PeerFrees.
func (a *Agent) gatherFree(ctx context.Context, v *variable, addr string, m wire.Name) error {
	p := &batchItem[wire.Name]{v: m, addr: addr, done: make(chan error, 1)}
	v.mu.RLock()
	local := 0
	for _, seg := range v.byRank {
		if seg != nil {
			local++
		}
	}
	v.mu.RUnlock()
	f := &v.frees
	f.mu.Lock()
	if f.ranks == nil {
		f.ranks = make(map[int64]bool)
	}
	if f.ranks[m.Rank] || local <= 1 { // freed again, or nothing to gather
		f.mu.Unlock()
		return a.freeBatch.submit(ctx, a, addr, m)
	}
	f.ranks[m.Rank] = true
	g := f.g
	if g == nil || g.flushed {
		// The first free, or one after the others went: it waits for
		// the ranks that have not freed yet.
		g = &gathering[wire.Name]{}
		f.g, f.want = g, local-(len(f.ranks)-1)
	}
	want := f.want
	f.mu.Unlock()
	added, flush := g.add(p, want)
	if !added {
		return a.freeBatch.submit(ctx, a, addr, m)
	}
	if flush != nil {
		a.freeBatch.queue(a, flush)
	}
	return g.wait(ctx, a, &a.freeBatch, p, min(gatherHold, a.cfg.Timeout/10))
}

// lead makes the caller the rank of this node that brings round k's
// table, unless one does already; finish (the leader's) records its error
// and releases the others. A new leader's request waits for the shards of
// others more ranks of the node (fold).
func (l *roundLeads) lead(k roundLead, others int) (leader bool, ld *lead, finish func(error)) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if ld, ok := l.m[k]; ok {
		return false, ld, func(error) {}
	}
	if l.m == nil {
		l.m = make(map[roundLead]*lead)
	}
	ld = &lead{done: make(chan struct{})}
	ld.fold.want, ld.fold.full = others, make(chan struct{})
	if others <= 0 {
		close(ld.fold.full)
	}
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
// (docs/design.md, Publish rounds at scale); with local (the node's ranks
// in the round, 0: unknown) above 1 the leader waits for those shards and
// its PeerRound carries them (foldShard): one request per node.
func (a *Agent) coordRound(ctx context.Context, v *variable, m wire.Shard, local int64) (*wire.Table, error) {
	addr, err := a.coordinatorAddr(ctx)
	if err != nil {
		return nil, err
	}
	if addr == "" {
		return a.coord.Load().publish(ctx, m, a.roundTimeout(m))
	}
	leader, ld, finish := a.leads.lead(roundLead{m.Name, m.Attempt}, int(local)-1)
	if !leader {
		err := a.foldShard(ctx, ld, addr, m)
		if errors.Is(err, errLeaderLeft) {
			err = nil // the leader's outcome, below
		}
		if err != nil {
			if why := a.lostRound(ctx, err); why != "" {
				if t := a.reportLost(addr, m, why); t != nil {
					return t, nil
				}
			}
			return nil, err // the round's error names the variable, a transport's the peer
		}
		select {
		case <-ld.done:
		case <-ctx.Done():
			err := fmt.Errorf("%w: variable %q: waiting for the table another rank of node %q fetches: %w", base.ErrTimeout, m.Name, a.cfg.Node, ctx.Err())
			if why := a.lostRound(ctx, err); why != "" { // its client left
				if t := a.reportLost(addr, m, why); t != nil {
					return t, nil
				}
			}
			return nil, err
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
	t, err := a.leadRound(ctx, addr, m, &ld.fold)
	if why := a.lostRound(ctx, err); why != "" {
		// Before finish: the node's other ranks get the leader's error
		// once the round has failed everywhere — or the table, when the
		// round had completed.
		if done := a.reportLost(addr, m, why); done != nil {
			t, err = done, nil
		}
	}
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

// lostRound says why err, which ended a rank's wait for its round on the
// coordinator of another node, leaves the coordinator unaware that the
// rank is out of the round, or "" when it does not: the request failed in
// the transport (no answer came), or the rank's client left while it
// waited. Not an answer of the coordinator's (the round's own error, or
// the table), nor the round's timeout, which the coordinator keeps too.
func (a *Agent) lostRound(ctx context.Context, err error) string {
	switch {
	case err == nil, base.IsRemote(err), a.ctx.Err() != nil:
		return ""
	case errors.Is(context.Cause(ctx), errClientLeft):
		return "went away before it ended: its client closed the connection that waited (the process exited or was killed?)"
	case ctx.Err() != nil:
		return ""
	}
	return fmt.Sprintf("is out of the round: its agent's request to the coordinator failed: %v", err)
}

// reportLost tells the coordinator at addr that rank m is out of its round
// (why, lostRound), as a failed shard (Lost), so that the round fails for
// every rank at once rather than wait for this one until its timeout. It
// tries again while the transport fails (a fresh connection may get
// through), for up to the agent's timeout.
//
// The round may have completed before the report came — the answer the
// transport lost was the table: the coordinator then answers that the
// variable exists, and every other rank holds a table that points to
// this rank's shard. The rank keeps its shard then: reportLost returns
// the round's table (from the coordinator), for the caller to set as if
// its answer had come; nil when the round failed, or when neither the
// report nor the table got through (the caller takes the shard back).
func (a *Agent) reportLost(addr string, m wire.Shard, why string) *wire.Table {
	rows := m.Rows
	m.Failed, m.Lost, m.Node, m.Why = true, true, a.cfg.Node, why
	ctx, cancel := context.WithTimeout(a.ctx, a.cfg.Timeout)
	defer cancel()
	a.stats.roundsLost.Add(1)
	wait := 10 * time.Millisecond
	for {
		// The coordinator answers with the round's error, or an error of
		// its own: either way it knows.
		err := a.shardBatch.submit(ctx, a, addr, m)
		if err == nil || base.IsRemote(err) && !errors.Is(err, base.ErrExists) {
			return nil
		}
		if base.IsRemote(err) { // it exists: the round completed
			t, err := a.coordTable(ctx, addr, m.Name, 0)
			if err == nil && m.Rank < int64(len(t.ShardRows)) && t.ShardRows[m.Rank] == rows && t.Nodes[t.RankNode[m.Rank]] == a.cfg.Node {
				a.stats.roundsLost.Add(-1)
				a.stats.roundsKept.Add(1)
				a.log.Info("a rank's answer from the coordinator was lost after its round completed: the rank keeps its shard", "variable", m.Name, "rank", m.Rank)
				return t
			}
			a.log.Warn("a rank's round completed, but this node could not get its table: the rank's shard is taken back", "variable", m.Name, "rank", m.Rank, "err", err)
			return nil
		}
		select {
		case <-ctx.Done():
			a.log.Warn("could not tell the coordinator that a rank is out of its round", "variable", m.Name, "rank", m.Rank, "err", err)
			return nil
		case <-time.After(wait):
		}
		wait = min(2*wait, 200*time.Millisecond)
	}
}

// leadRound sends the leader's shard (PeerRound), with the shards of the
// node's other ranks that f gathers (once all are in, or the hold has
// passed), and returns the round's table: in the reply, or from the node
// it names. Each folded shard is answered with the request's outcome.
func (a *Agent) leadRound(ctx context.Context, addr string, m wire.Shard, f *fold) (*wire.Table, error) {
	g, view := a.ownGather(addr, m)
	hold, most := a.gatherHoldOf(m)
	start := time.Now()
	// While the node's ranks keep coming: a round ends only once its
	// last shard is in.
	waitQuiet(ctx, f.full, func() time.Time { return later(start, f.lastCame()) }, start, hold, most)
	items := f.take()
	r := wire.Round{Shard: m, Want: wire.RoundTable}
	if len(items) > 0 {
		r.Others = make([]wire.Shard, len(items))
		for i, p := range items {
			r.Others[i] = p.v
		}
	}
	t, err := a.sendRound(ctx, addr, r, g, view)
	for _, p := range items {
		switch {
		case err == nil, base.IsRemote(err):
			p.done <- err // recorded, or the round's error
		case ctx.Err() != nil:
			p.done <- errLeaderLeft
		default:
			p.done <- err // lost in the transport: each rank reports itself lost
		}
	}
	if err != nil {
		return nil, err
	}
	a.noteTree(addr, t)
	return t, nil
}

// batcher sends this node's ranks' requests to the coordinator in
// batches: one request at a time carries every item that came while the
// previous one was on its way, so a node of many ranks sends few
// messages per round. The shards of ranks that wait for another rank's
// PeerRound go so (PeerShards), and the ranks' frees (PeerFrees).
type batcher[T any] struct {
	mu      sync.Mutex // a leaf (lock order: internal/LOCKS.md)
	pending []*batchItem[T]
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
	b.queue(a, []*batchItem[T]{p})
	select {
	case err := <-p.done:
		return err
	case <-ctx.Done():
		return fmt.Errorf("%w: waiting for the coordinator's answer: %w", base.ErrTimeout, ctx.Err())
	}
}

// queue adds items, whose answers go to their done, to what the next
// batch carries.
func (b *batcher[T]) queue(a *Agent, items []*batchItem[T]) {
	b.mu.Lock()
	b.pending = append(b.pending, items...)
	start := !b.sending
	b.sending = true
	b.mu.Unlock()
	if start {
		a.go_(func() { b.run(a) })
	}
}

// run sends what is queued until the queue is empty, a batch per
// coordinator address (one, unless the coordinator changed meanwhile).
func (b *batcher[T]) run(a *Agent) {
	for {
		b.mu.Lock()
		batch := b.pending
		b.pending = nil
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
		// A free is idempotent: one the transport lost (no answer came)
		// is sent again, a few times, rather than leave the variable's
		// shards on every node.
		wait := 10 * time.Millisecond
		for try := 1; ; try++ {
			errs := a.callBatch(ctx, addr, wire.OpPeerFrees, m.Encode, len(items))
			if errs[0] == nil || base.IsRemote(errs[0]) || try == 4 || ctx.Err() != nil {
				return errs
			}
			select {
			case <-ctx.Done():
				return errs
			case <-time.After(wait):
			}
			wait *= 2
		}
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

// later is the later of two times.
func later(a, b time.Time) time.Time {
	if b.After(a) {
		return b
	}
	return a
}

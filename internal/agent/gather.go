package agent

// The round's requests up a tree (docs/design.md, Publish rounds at
// scale): a node's leader of a round sends its PeerRound not to the
// coordinator but to its relay in a gather tree, which carries its
// subtree's shards up in one request, so that the coordinator hears about
// fanout requests per round, not one per node. The tree is the drop
// tree's (dropAlong) over the nodes of the last table this node got, the
// coordinator left out: every node of that round derives the same one
// from the same table, before the next round, with no message.

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/ddstore-go/ddstore/internal/base"
	"github.com/ddstore-go/ddstore/internal/wire"
)

// gatherView is this node's place in the gather tree.
type gatherView struct {
	coord string // the coordinator's address the tree is for
	// parent is the relay this node's requests go to ("": the
	// coordinator itself); below the nodes of its subtree, whose shards
	// come here (from its children, each carrying its own subtree's).
	parent, parentNode string
	below              []string
}

// gatherPlace finds self among members, the nodes of a tree rooted
// outside them (the coordinator), chunked as dropAlong chunks them: the
// root's children are the first nodes of the at most f chunks of
// consecutive members, each one the root of the rest of its chunk
// alike. It returns the index of self's parent (-1: the root), how many
// children self has and the nodes below it (the rest of its chunk); ok
// is false when self is not a member.
func gatherPlace(members []string, self string, f int) (parent, children int, below []string, ok bool) {
	idx := slices.Index(members, self)
	if idx < 0 {
		return 0, 0, nil, false
	}
	chunks := func(n int) int { // how many chunks dropAlong makes of n nodes
		if n == 0 {
			return 0
		}
		size := chunkSize(n, f)
		return (n + size - 1) / size
	}
	lo, hi, parent := 0, len(members), -1
	for {
		size := chunkSize(hi-lo, f)
		s := lo + (idx-lo)/size*size
		e := min(s+size, hi)
		if s == idx {
			return parent, chunks(e - s - 1), slices.Clone(members[s+1 : e]), true
		}
		parent, lo, hi = s, s+1, e
	}
}

// noteTree takes this node's place in the gather tree from t, a round's
// table from the coordinator at coordAddr: its nodes but the
// coordinator's, in the table's order.
func (a *Agent) noteTree(coordAddr string, t *wire.Table) {
	members := make([]string, 0, len(t.Nodes))
	addrs := make([]string, 0, len(t.Nodes))
	for i, n := range t.Nodes {
		if t.Addrs[i] != coordAddr {
			members, addrs = append(members, n), append(addrs, t.Addrs[i])
		}
	}
	parent, _, below, ok := gatherPlace(members, a.cfg.Node, a.dropFanout())
	if !ok {
		return // not in this round: the tree of an earlier one stays
	}
	v := &gatherView{coord: coordAddr, below: below}
	if parent >= 0 {
		v.parent, v.parentNode = addrs[parent], members[parent]
	}
	a.tree.Store(v)
}

// gathers are the rounds whose requests this node, a relay of the
// gather tree, carries up: its own node's and its subtree's.
type gathers struct {
	mu sync.Mutex // a leaf (lock order: internal/LOCKS.md)
	m  map[roundLead]*gather
}

// gather is one round at a relay. Its shards, the own node's and those
// its children carry from their subtrees, go up in batches: the first
// takes every request that comes until each node of the subtree (and
// this one) has a shard in, when it goes at once, or none has come for
// the hold; a request that comes once it went starts the next batch,
// which goes likewise once every node still missing is in or the hold
// has passed. A round ends only once every shard is in, so a relay that
// has its whole subtree delays nothing; the hold bounds the wait for
// nodes that do not come (not in the round, gone, or far behind), and a
// late one is carried in a later batch rather than sent to the
// coordinator by itself.
type gather struct {
	view *gatherView
	// guarded by gathers.mu
	missing map[string]bool // the nodes of the subtree (and this one) with no shard in yet
	open    *batch          // the batch taking requests; nil: none
	// leading: this node's leader leads the round and its request is not
	// in yet (ownGather to sendRound): the open batch waits for it.
	leading bool
	// over: a batch has its outcome (the round's table or error, or a
	// failed request): a request that comes after goes to the
	// coordinator itself, as does a later batch's when its own fails.
	over bool
}

// batch is one request up the tree, carrying the shards of the requests
// that came while it was open; its outcome answers them all.
type batch struct {
	start time.Time
	// guarded by gathers.mu
	last   time.Time // when the last request came, or the own leader began
	shards []wire.Shard
	own    bool          // the own leader's shards are in (first)
	full   chan struct{} // closed once no node is missing: it goes at once
	// done is closed once the outcome below is set.
	done  chan struct{}
	table *wire.Table
	err   error
	// direct: the batch's request failed on its way, with upErr; whether
	// its shards got through is not known, and each child sends its own.
	direct bool
	upErr  error
}

// get returns round k's gather, made from view v when there is none (or,
// for own, only one that is over).
func (gs *gathers) get(k roundLead, v *gatherView, self string, own bool) *gather {
	g := gs.m[k]
	if g == nil || own && g.over {
		if gs.m == nil {
			gs.m = make(map[roundLead]*gather)
		}
		g = &gather{view: v, missing: make(map[string]bool, len(v.below)+1)}
		g.missing[self] = true
		for _, n := range v.below {
			g.missing[n] = true
		}
		gs.m[k] = g
	}
	return g
}

// addGather enters shards (own: this node's leader's, which go first)
// into g's open batch, starting one (and the goroutine that sends it,
// with round m's timeouts) when none is open, and returns it; gs.mu is
// held.
func (a *Agent) addGather(k roundLead, g *gather, m wire.Shard, shards []wire.Shard, own bool) *batch {
	b := g.open
	now := time.Now()
	if b == nil {
		b = &batch{start: now, full: make(chan struct{}), done: make(chan struct{})}
		g.open = b
		a.go_(func() { a.sendBatch(k, g, b, m) })
	}
	if own {
		b.shards = append(slices.Clip(shards), b.shards...)
		b.own, g.leading = true, false
	} else {
		b.shards = append(b.shards, shards...)
	}
	b.last = now
	for _, sh := range shards {
		delete(g.missing, sh.Node)
	}
	if len(g.missing) == 0 && b == g.open {
		g.open = nil // full: what comes after goes in the next batch
		close(b.full)
	}
	return b
}

// sendBatch sends b up once it is full, or none has come for the hold,
// or the most a batch waits has passed (round m's, gatherHoldOf), and
// sets its outcome. Once a batch has its outcome, g is forgotten after
// the hold.
func (a *Agent) sendBatch(k roundLead, g *gather, b *batch, m wire.Shard) {
	gs := &a.gathers
	hold, most := a.gatherHoldOf(m)
	ctx, cancel := context.WithTimeout(a.ctx, a.roundTimeout(m)+most+a.cfg.Timeout)
	defer cancel()
	waitQuiet(ctx, b.full, func() time.Time {
		gs.mu.Lock()
		defer gs.mu.Unlock()
		if g.leading {
			// The own leader's request comes within the fold's wait.
			return time.Now()
		}
		return b.last
	}, b.start, hold, most)
	gs.mu.Lock()
	if g.open == b {
		g.open = nil
	}
	r := wire.Round{Shard: b.shards[0], Others: slices.Clone(b.shards[1:]), Want: wire.RoundTable}
	if !b.own {
		r.From = a.cfg.Node // the children's shards, without this node's
	}
	gs.mu.Unlock()
	tab, err := a.upRound(ctx, g.view.coord, g.view, r)
	b.table, b.err = tab, err
	if err != nil && !base.IsRemote(err) {
		// Not the round's answer: whether the shards got through is not
		// known, and the children send theirs to the coordinator, which
		// takes a shard it has already as sent again (coord.again).
		b.direct, b.upErr, b.err = true, err, nil
	}
	gs.mu.Lock()
	g.over = true
	gs.mu.Unlock()
	close(b.done)
	time.AfterFunc(hold, func() {
		gs.mu.Lock()
		if gs.m[k] == g {
			delete(gs.m, k)
		}
		gs.mu.Unlock()
	})
}

// gatherHoldOf is the hold of round m's gathering, as the fold's, and the
// most a batch waits in all (a tenth of the round's timeout).
func (a *Agent) gatherHoldOf(m wire.Shard) (hold, most time.Duration) {
	return min(gatherHold, a.roundTimeout(m)/10), a.roundTimeout(m) / 10
}

// peerGather answers a child's PeerGather: its subtree's shards go up
// with this node's in the round's open batch (gather). Answered with the
// round's table, its error, or RoundReplyDirect when they are not
// carried (no tree here, the round's outcome came already, or the
// batch's request failed on its way).
func (a *Agent) peerGather(ctx context.Context, r wire.Round) (func(*wire.Encoder), error) {
	v := a.tree.Load()
	if v == nil {
		return directReply, nil
	}
	k := roundLead{r.Shard.Name, r.Shard.Attempt}
	gs := &a.gathers
	gs.mu.Lock()
	g := gs.get(k, v, a.cfg.Node, false)
	if g.over {
		gs.mu.Unlock()
		return directReply, nil
	}
	b := a.addGather(k, g, r.Shard, append([]wire.Shard{r.Shard}, r.Others...), false)
	gs.mu.Unlock()
	select {
	case <-b.done:
	case <-ctx.Done():
		// This agent stops (or the child left): not the round's
		// answer, the child sends its shards to the coordinator itself.
		return directReply, nil
	}
	switch {
	case b.direct:
		return directReply, nil
	case b.err != nil:
		return nil, b.err
	}
	a.stats.gathersRelayed.Add(1)
	rep := wire.RoundReply{Kind: wire.RoundReplyTable, Table: *b.table}
	return rep.Encode, nil
}

func directReply(e *wire.Encoder) {
	rep := wire.RoundReply{Kind: wire.RoundReplyDirect}
	rep.Encode(e)
}

// ownGather tells round m's gather that this node's leader leads, as
// soon as it does (before its node's other ranks are in), so that the
// open batch waits for its request (sendRound) while it folds them; nil
// with no tree yet (the job's first round) or one of another
// coordinator.
func (a *Agent) ownGather(addr string, m wire.Shard) (*gather, *gatherView) {
	v := a.tree.Load()
	if v == nil || v.coord != addr {
		return nil, nil
	}
	gs := &a.gathers
	gs.mu.Lock()
	defer gs.mu.Unlock()
	g := gs.get(roundLead{m.Name, m.Attempt}, v, a.cfg.Node, true)
	g.leading = !g.over
	if g.open != nil {
		g.open.last = time.Now()
	}
	return g, v
}

// sendRound sends the leader's round r (its node's shards) towards the
// coordinator at addr and returns the round's table: up the gather tree
// in g's open batch (v: the view g was made with), with the shards of
// this node's subtree that came meanwhile, or, with no g, straight to
// the coordinator.
func (a *Agent) sendRound(ctx context.Context, addr string, r wire.Round, g *gather, v *gatherView) (*wire.Table, error) {
	if g == nil {
		return a.directRound(ctx, addr, r, false)
	}
	k := roundLead{r.Shard.Name, r.Shard.Attempt}
	gs := &a.gathers
	gs.mu.Lock()
	if g.over {
		g.leading = false
		gs.mu.Unlock()
		return a.upRound(ctx, addr, v, r)
	}
	b := a.addGather(k, g, r.Shard, append([]wire.Shard{r.Shard}, r.Others...), true)
	gs.mu.Unlock()
	select {
	case <-b.done:
	case <-ctx.Done():
		return nil, fmt.Errorf("%w: variable %q: waiting for the round's request up the gather tree: %w", base.ErrTimeout, r.Shard.Name, ctx.Err())
	}
	if b.direct {
		return nil, b.upErr
	}
	return b.table, b.err
}

// upRound sends r to this node's relay in the gather tree (PeerGather),
// or to the coordinator at addr when the relay is the coordinator, does
// not carry it (RoundReplyDirect), does not know the op (an older agent)
// or failed in the transport.
func (a *Agent) upRound(ctx context.Context, addr string, v *gatherView, r wire.Round) (*wire.Table, error) {
	if v.parent == "" {
		return a.directRound(ctx, addr, r, false)
	}
	body, err := a.pool.Call(ctx, v.parent, wire.OpPeerGather, r.Encode)
	if err == nil {
		var rep wire.RoundReply
		if rep, err = wire.DecodeRoundReply(body); err == nil {
			switch rep.Kind {
			case wire.RoundReplyTable:
				return &rep.Table, nil
			case wire.RoundReplyRelay:
				return a.relayedTable(ctx, addr, r.Shard.Name, rep)
			case wire.RoundReplyDirect:
				a.stats.gathersDirect.Add(1)
				return a.directRound(ctx, addr, r, false)
			}
			err = base.Errorf(base.ErrProtocol, "relay %q answered a gather with a round reply of kind %d", v.parentNode, rep.Kind)
		}
	}
	if base.IsRemote(err) && !errors.Is(err, base.ErrProtocol) {
		return nil, err // the round's error
	}
	if ctx.Err() != nil {
		return nil, err
	}
	a.stats.gathersDirect.Add(1)
	a.log.Info("the relay of this node's round did not carry it up; sending it to the coordinator", "variable", r.Shard.Name, "relay", v.parentNode, "err", err)
	return a.directRound(ctx, addr, r, !base.IsRemote(err))
}

// directRound sends r to the coordinator at addr (PeerRound) and returns
// the round's table, from the reply or the node it names. After a relay
// that failed in the transport (again), the coordinator may have the
// shards already: a round they completed answers that the variable
// exists, and its table is this round's when it holds every shard of r
// as sent.
func (a *Agent) directRound(ctx context.Context, addr string, r wire.Round, again bool) (*wire.Table, error) {
	body, err := a.pool.Call(ctx, addr, wire.OpPeerRound, r.Encode)
	if err != nil {
		if again && base.IsRemote(err) && errors.Is(err, base.ErrExists) {
			if t, terr := a.coordTable(ctx, addr, r.Shard.Name, 0); terr == nil && holdsShards(t, r) {
				return t, nil
			}
		}
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
		return a.relayedTable(ctx, addr, r.Shard.Name, rep)
	}
	// Only a request that wants no table is answered so.
	return a.coordTable(ctx, addr, r.Shard.Name, 0)
}

// holdsShards says whether table t has every shard of r where r put it.
func holdsShards(t *wire.Table, r wire.Round) bool {
	for _, sh := range append([]wire.Shard{r.Shard}, r.Others...) {
		if sh.Rank < 0 || sh.Rank >= int64(len(t.ShardRows)) || t.ShardRows[sh.Rank] != sh.Rows || t.Nodes[t.RankNode[sh.Rank]] != sh.Node {
			return false
		}
	}
	return true
}

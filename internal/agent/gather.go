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
	// coordinator itself); children how many nodes send theirs here.
	parent, parentNode string
	children           int
}

// gatherPlace finds self among members, the nodes of a tree rooted
// outside them (the coordinator), chunked as dropAlong chunks them: the
// root's children are the first nodes of the at most f chunks of
// consecutive members, each one the root of the rest of its chunk
// alike. It returns the index of self's parent (-1: the root) and how
// many children self has; ok is false when self is not a member.
func gatherPlace(members []string, self string, f int) (parent, children int, ok bool) {
	idx := slices.Index(members, self)
	if idx < 0 {
		return 0, 0, false
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
			return parent, chunks(e - s - 1), true
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
	parent, children, ok := gatherPlace(members, a.cfg.Node, a.dropFanout())
	if !ok {
		return // not in this round: the tree of an earlier one stays
	}
	v := &gatherView{coord: coordAddr, children: children}
	if parent >= 0 {
		v.parent, v.parentNode = addrs[parent], members[parent]
	}
	a.tree.Store(v)
}

// gathers are the rounds whose requests this node, a relay of the
// gather tree, carries up: its own node's and its children's.
type gathers struct {
	mu sync.Mutex // a leaf (lock order: internal/LOCKS.md)
	m  map[roundLead]*gather
}

// gather is one round at a relay: the children's shards wait for the
// node's own leader, which sends them up with its own request once every
// child is in or none has come for the hold, and its outcome answers them
// all. A round ends only once every shard is in, so waiting for the last
// child delays nothing while they keep coming; the hold bounds the wait
// for one that does not (not in the round, gone, or far behind).
type gather struct {
	start time.Time
	want  int // the children this node expects (its gatherView)
	// guarded by gathers.mu
	last   time.Time // when the last child, or the own leader, came
	came   int
	shards []wire.Shard
	own    bool // the node's own leader is in
	state  int  // gatherOpen, gatherSent or gatherRefused
	ready  chan struct{}
	// done is closed once the outcome is set (or the gather refused).
	done  chan struct{}
	table *wire.Table
	err   error
	// direct: the shards were not carried up (refused, or the relay's
	// own request failed on its way): each child sends its own.
	direct bool
}

const (
	gatherOpen = iota
	gatherSent
	gatherRefused
)

// get returns round k's gather, made with want children when there is
// none (or only a finished one, for own).
func (gs *gathers) get(k roundLead, want int, own bool) *gather {
	g := gs.m[k]
	if g == nil || own && g.state == gatherSent && g.own {
		if gs.m == nil {
			gs.m = make(map[roundLead]*gather)
		}
		now := time.Now()
		g = &gather{start: now, last: now, want: want, ready: make(chan struct{}), done: make(chan struct{})}
		if want == 0 {
			close(g.ready)
		}
		gs.m[k] = g
	}
	return g
}

// finish closes g's done once its outcome is set (or it is refused) and
// forgets g after hold: a child's request that comes meanwhile is told at
// once to go to the coordinator, and so is this node's own leader when g
// was refused.
func (gs *gathers) finish(k roundLead, g *gather, hold time.Duration) {
	close(g.done)
	time.AfterFunc(hold, func() {
		gs.mu.Lock()
		if gs.m[k] == g {
			delete(gs.m, k)
		}
		gs.mu.Unlock()
	})
}

// gatherHoldOf is the hold of round m's gathering, as the fold's, and the
// most a relay waits in all (a tenth of the round's timeout).
func (a *Agent) gatherHoldOf(m wire.Shard) (hold, most time.Duration) {
	return min(gatherHold, a.roundTimeout(m)/10), a.roundTimeout(m) / 10
}

// quiet waits until ch is closed (true), or g has had no arrival for
// hold, or most has passed since it began, or ctx ends (false).
func (gs *gathers) quiet(ctx context.Context, g *gather, ch <-chan struct{}, hold, most time.Duration) bool {
	for {
		gs.mu.Lock()
		wait := min(time.Until(g.last.Add(hold)), time.Until(g.start.Add(most)))
		gs.mu.Unlock()
		if wait <= 0 {
			select {
			case <-ch:
				return true
			default:
				return false
			}
		}
		t := time.NewTimer(wait)
		select {
		case <-ch:
			t.Stop()
			return true
		case <-ctx.Done():
			t.Stop()
			return false
		case <-t.C:
		}
	}
}

// peerGather answers a child's PeerGather: its subtree's shards wait here
// for this node's leader of the round, which carries them up. Answered
// with the round's table, its error, or RoundReplyDirect when they are
// not carried (this node's own rank did not come within the hold, or its
// request went already).
func (a *Agent) peerGather(ctx context.Context, r wire.Round) (func(*wire.Encoder), error) {
	k := roundLead{r.Shard.Name, r.Shard.Attempt}
	hold, most := a.gatherHoldOf(r.Shard)
	want := 0
	if v := a.tree.Load(); v != nil {
		want = v.children
	}
	gs := &a.gathers
	gs.mu.Lock()
	g := gs.get(k, want, false)
	if g.state != gatherOpen {
		gs.mu.Unlock()
		return directReply, nil
	}
	g.shards = append(g.shards, r.Shard)
	g.shards = append(g.shards, r.Others...)
	g.came++
	g.last = time.Now()
	if g.came == g.want {
		close(g.ready)
	}
	gs.mu.Unlock()
	if !gs.quiet(ctx, g, g.done, hold, most) {
		if ctx.Err() != nil {
			// This agent stops (or the child left): not the round's
			// answer, the child sends its shards to the coordinator itself.
			return directReply, nil
		}
		gs.mu.Lock()
		refuse := g.state == gatherOpen && !g.own
		if refuse {
			// This node's own ranks are not in the round (or late): the
			// children go to the coordinator themselves.
			g.state, g.direct = gatherRefused, true
		}
		gs.mu.Unlock()
		if refuse {
			gs.finish(k, g, hold)
		}
		select {
		case <-g.done:
		case <-ctx.Done():
			return directReply, nil
		}
	}
	switch {
	case g.direct:
		return directReply, nil
	case g.err != nil:
		return nil, g.err
	}
	a.stats.gathersRelayed.Add(1)
	rep := wire.RoundReply{Kind: wire.RoundReplyTable, Table: *g.table}
	return rep.Encode, nil
}

func directReply(e *wire.Encoder) {
	rep := wire.RoundReply{Kind: wire.RoundReplyDirect}
	rep.Encode(e)
}

// ownGather enters this node's leader of round m into the round's
// gather, as soon as it leads (before its node's other ranks are in), so
// that the children's requests that come meanwhile wait for it; nil with
// no tree yet (the job's first round) or one of another coordinator, and
// a refused gather when the children went to the coordinator already.
func (a *Agent) ownGather(addr string, m wire.Shard) (*gather, *gatherView) {
	v := a.tree.Load()
	if v == nil || v.coord != addr {
		return nil, nil
	}
	gs := &a.gathers
	gs.mu.Lock()
	defer gs.mu.Unlock()
	g := gs.get(roundLead{m.Name, m.Attempt}, v.children, true)
	if g.state == gatherOpen {
		g.own, g.last = true, time.Now()
	}
	return g, v
}

// sendRound sends the leader's round r (its node's shards) towards the
// coordinator at addr and returns the round's table: up the gather tree
// (v: the view g was made with), with the shards of this node's children
// that g gathered once all are in or none has come for the hold, or, with
// no g, straight to the coordinator. The outcome answers the children.
func (a *Agent) sendRound(ctx context.Context, addr string, r wire.Round, g *gather, v *gatherView) (*wire.Table, error) {
	if g == nil {
		return a.directRound(ctx, addr, r, false)
	}
	gs := &a.gathers
	gs.mu.Lock()
	open := g.state == gatherOpen
	gs.mu.Unlock()
	if !open {
		// Refused: the children sent theirs to the coordinator.
		return a.upRound(ctx, addr, v, r)
	}
	k := roundLead{r.Shard.Name, r.Shard.Attempt}
	hold, most := a.gatherHoldOf(r.Shard)
	gs.quiet(ctx, g, g.ready, hold, most)
	gs.mu.Lock()
	g.state = gatherSent
	children := g.shards
	g.shards = nil
	gs.mu.Unlock()
	if len(children) > 0 {
		r.Others = append(slices.Clip(r.Others), children...)
	}
	tab, err := a.upRound(ctx, addr, v, r)
	g.table, g.err = tab, err
	if err != nil && !base.IsRemote(err) {
		// Not the round's answer: whether the shards got through is not
		// known, and the children send theirs to the coordinator, which
		// takes a shard it has already as sent again (coord.again).
		g.direct, g.err = true, nil
	}
	gs.finish(k, g, hold)
	return tab, err
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

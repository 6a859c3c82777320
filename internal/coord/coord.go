// Package coord is the job-wide part one agent plays, the coordinator: it
// learns every node's address and turns the ranks' shard declarations into
// a variable's table. A variable exists once every rank has published;
// until then nobody can read it, and a geometry that ranks disagree on
// fails every rank. It also holds the ranks' fences (Barrier): a fence
// ends once every rank of its group has reached it, or fails for all.
//
// Coordinator is a deterministic state machine, like raft's RawNode: no
// goroutine, no socket, no clock, no blocking. Each call carries what
// happened (a rank's shard, a node joining, the time now) and returns what
// to answer (Replies, to the ranks whose round ended); a rank that must
// wait is given a deadline, at which its driver calls Expire (or Tick at
// NextDeadline). The agent's driver owns the goroutines, the connections
// and the real clock, and serializes the calls.
//
// A collective belongs to the client processes that joined it (each
// shard and barrier names its sender, Shard.Client, as its agent numbers
// the process). When a process goes (Gone: its connections closed, the
// process exited or was killed), every collective it joined or is a rank
// of fails for the others at once, naming the rank. A failed one that
// none of its processes outlived answers only the job's other ranks
// (processes known as ranks of its group from collectives before) with
// its error; any other process starts afresh there. So a job started
// afterwards in the namespace, whose processes are all new, never meets a
// dead job's round or fence (or its error).
package coord

import (
	"cmp"
	"fmt"
	"maps"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/ddstore-go/ddstore/internal/base"
	"github.com/ddstore-go/ddstore/internal/layout"
	"github.com/ddstore-go/ddstore/internal/wire"
)

// DefaultLateGrace is how long after a round timed out its late ranks
// still get its error at once, rather than starting a round of their own.
const DefaultLateGrace = 10 * time.Second

// Coordinator is the coordinator's state. It is not safe for concurrent
// use: its driver serializes the calls.
type Coordinator struct {
	nodes   map[string]string // node id → peer address
	pending map[roundKey]*round
	tables  map[string]*wire.Table
	freed   map[string]map[int64]bool // variable → ranks done with it
	lastID  int64
	waits   map[uint64]*wait // by request
	fences  map[fenceKey]*fence
	// members are the client processes known to be the ranks of each
	// group (a round's Shard.Group, a fence's Key), from the collectives
	// they joined: a process that goes fails its group's collectives
	// also before it reached them.
	members map[string]map[int64]uint64
	// procNodes is the node of each live client process whose shards
	// said it (Shard.Node): a node that goes takes its processes along.
	procNodes map[uint64]string

	// ended are the failed rounds every rank of which came, for
	// LateGrace after.
	ended map[roundKey]endedRound

	// LateGrace: see DefaultLateGrace.
	LateGrace time.Duration
}

type endedRound struct {
	err     error
	at      time.Time
	clients map[int64]uint64 // the process of each rank that came
}

// Reply answers one waiting request (a rank's Publish): the variable's
// table, or the round's error.
type Reply struct {
	Req   uint64
	Table *wire.Table
	Err   error
}

// roundKey names one round of a publish: the ranks' n-th Add of a name.
type roundKey struct {
	name    string
	attempt int64
}

// round gathers one variable's shards from all ranks.
type round struct {
	key  roundKey
	size int64
	// seen and want decide when a failed round can be forgotten: once
	// every rank of the largest world any of them believes in has come.
	seen    map[int64]bool
	want    int64
	first   wire.Shard // the first shard to arrive sets the geometry
	shards  map[int64]wire.Shard
	waiters []uint64 // requests waiting for the round, in arrival order
	table   *wire.Table
	err     error
	// timedOut is when the round failed for missing ranks; see LateGrace.
	timedOut time.Time
	// clients are the processes of the ranks that came (0: unknown), less
	// those gone since. Once a failed round has none left (at orphaned),
	// orphan holds the processes then known as the ranks of its group (its
	// job's; see ofJob); nil before.
	clients  map[int64]uint64
	orphan   map[int64]uint64
	orphaned time.Time
}

// wait is one request waiting for its round or its fence (one of them).
type wait struct {
	round    *round
	fence    *fence
	rank     int64
	deadline time.Time
}

// fenceKey names one fence: the ranks' n-th Barrier under one key (one
// group of ranks).
type fenceKey struct {
	key string
	seq int64
}

// fence gathers the ranks of one fence.
type fence struct {
	key     fenceKey
	size    int64
	first   int64            // the rank that set size
	arrived map[int64]uint64 // rank → its request
	seen    map[int64]bool   // ranks that came, in time or late
	err     error
	// timedOut: as round's, for LateGrace.
	timedOut time.Time
	clients  map[int64]uint64 // as round's
	orphan   map[int64]uint64 // as round's
	orphaned time.Time
}

// New makes an empty coordinator.
func New() *Coordinator {
	return &Coordinator{nodes: make(map[string]string), pending: make(map[roundKey]*round), tables: make(map[string]*wire.Table),
		freed: make(map[string]map[int64]bool), waits: make(map[uint64]*wait), fences: make(map[fenceKey]*fence),
		members: make(map[string]map[int64]uint64), procNodes: make(map[uint64]string), ended: make(map[roundKey]endedRound), LateGrace: DefaultLateGrace}
}

// Join notes a node's agent address; a node that joins again (its agent
// restarted) replaces it, also in the tables, which other agents fetch
// again when its old address fails.
func (c *Coordinator) Join(node, addr string) {
	if old, ok := c.nodes[node]; ok && old != addr {
		c.nodes[node] = addr
		c.refreshAddrs()
		return
	}
	c.nodes[node] = addr
}

// Publish adds request req's shard to its round at now. It returns the
// replies of the requests whose round ended with it (req's own among
// them), or none when req waits for more ranks: until then its round
// fails when req's deadline passes (Expire, Tick).
func (c *Coordinator) Publish(now time.Time, req uint64, sh wire.Shard, deadline time.Time) []Reply {
	if _, ok := c.tables[sh.Name]; ok {
		return []Reply{{Req: req, Err: base.Errorf(base.ErrExists, "variable %q already exists", sh.Name)}}
	}
	// Ranks that never came may never come (a crashed job, a killed
	// client): a round that timed out long ago is forgotten, so that a
	// later job's first Add is not refused with its error and rounds of
	// names never used again do not pile up for the agent's life.
	for k, p := range c.pending {
		if !p.timedOut.IsZero() && now.Sub(p.timedOut) > c.LateGrace {
			delete(c.pending, k)
		}
	}
	for k, e := range c.ended {
		if now.Sub(e.at) > c.LateGrace {
			delete(c.ended, k)
		}
	}
	key := roundKey{sh.Name, sh.Attempt}
	r := c.pending[key]
	if e, ok := c.ended[key]; ok && r == nil {
		if cl, ok := e.clients[sh.Rank]; ok && cl == sh.Client {
			return []Reply{{Req: req, Err: e.err}}
		}
	}
	if r != nil && r.orphan != nil && !ofJob(r.orphan, r.orphaned, now, sh.Rank, sh.Client, sh.ClientAgeMs) {
		// A dead job's round, and a process that was none of its
		// ranks: a new job's, which starts afresh.
		delete(c.pending, key)
		r = nil
	}
	if r == nil {
		r = &round{key: key, size: sh.Size, first: sh, shards: make(map[int64]wire.Shard), seen: make(map[int64]bool),
			clients: make(map[int64]uint64)}
		c.pending[key] = r
	}
	r.want = max(r.want, sh.Size, r.size)
	if sh.Rank >= 0 {
		r.seen[sh.Rank] = true
		if _, dup := r.clients[sh.Rank]; !dup {
			r.clients[sh.Rank] = sh.Client
		}
		c.member(sh.Group, sh.Rank, sh.Client)
		if sh.Client != 0 && sh.Node != "" {
			c.procNodes[sh.Client] = sh.Node
		}
	}
	var out []Reply
	err := r.check(sh)
	if prev, dup := r.shards[sh.Rank]; dup && err == nil && !again(prev, sh) {
		err = base.Errorf(base.ErrExists, "variable %q: rank %d published twice", sh.Name, sh.Rank)
	}
	if err != nil {
		out = c.fail(r, err, out)
	}
	if sh.Rank >= 0 && sh.Rank < r.size {
		r.shards[sh.Rank] = sh
	}
	if r.err != nil {
		if r.allSeen() {
			delete(c.pending, key)
			// Its error stays for LateGrace all the same, so that shards
			// sent again (those a relay of the gather tree carried, sent
			// straight here once it failed on the way) get it rather than
			// start a round nobody else joins.
			at := now
			if !r.timedOut.IsZero() {
				at = r.timedOut // a late rank's: the grace counts from the timeout
			}
			c.ended[key] = endedRound{err: r.err, at: at, clients: r.clients}
		}
		return append(out, Reply{Req: req, Err: r.err})
	}
	if int64(len(r.shards)) < r.size {
		r.waiters = append(r.waiters, req)
		c.waits[req] = &wait{round: r, rank: sh.Rank, deadline: deadline}
		return out
	}
	delete(c.pending, key)
	t, err := c.table(r)
	if err != nil {
		out = c.fail(r, err, out)
		return append(out, Reply{Req: req, Err: r.err})
	}
	r.table = t
	c.tables[sh.Name] = t
	for _, w := range r.waiters {
		delete(c.waits, w)
		out = append(out, Reply{Req: w, Table: t})
	}
	r.waiters = nil
	return append(out, Reply{Req: req, Table: t})
}

// Expire ends request req's wait at now (its deadline passed, or its asker
// gave up): its round fails for missing ranks, and every request waiting
// for it gets that error. Nothing happens for a request not waiting.
func (c *Coordinator) Expire(now time.Time, req uint64) []Reply {
	w := c.waits[req]
	if w == nil {
		return nil
	}
	if f := w.fence; f != nil {
		out := c.failFence(f, base.Errorf(base.ErrTimeout, "%s: %s", f.what(), f.missing()), nil)
		f.timedOut = now
		return out
	}
	r := w.round
	out := c.fail(r, base.Errorf(base.ErrTimeout, "variable %q: %s", r.first.Name, r.missing()), nil)
	r.timedOut = now
	return out
}

// Leave ends request req's wait at now because its rank gave up on it
// (its client closed the connection that waited): its round or fence
// fails for every rank with an error of kind, "rank N " and why (what
// happened, as the driver saw it). Nothing happens for a request not
// waiting.
func (c *Coordinator) Leave(now time.Time, req uint64, kind error, why string) []Reply {
	w := c.waits[req]
	if w == nil {
		return nil
	}
	if f := w.fence; f != nil {
		out := c.failFence(f, base.Errorf(kind, "%s: rank %d %s", f.what(), w.rank, why), nil)
		f.timedOut = now
		return out
	}
	r := w.round
	out := c.fail(r, base.Errorf(kind, "variable %q: rank %d %s", r.first.Name, w.rank, why), nil)
	r.timedOut = now
	return out
}

// Gone notes at now that a client process went away: every pending round
// and fence it came to, or of a group it is a rank of (members; for the
// whole job also the world rank it said hello with), fails for every rank
// at once with ErrPeer naming the rank; and a failed one that no live
// process came to any more is orphaned: it answers a late rank of its job
// (known) with its error, for LateGrace, and any other arrival, a new
// job's, starts afresh.
func (c *Coordinator) Gone(now time.Time, g wire.Gone) []Reply {
	if g.Client == 0 {
		return nil
	}
	why := func(what string, rank int64) error {
		return base.Errorf(base.ErrPeer, "%s: rank %d (process %d on node %q) went away before it ended: its connection to its agent closed (the process exited or was killed)",
			what, rank, g.Pid, g.Node)
	}
	var out []Reply
	for _, k := range slices.SortedFunc(maps.Keys(c.pending), func(x, y roundKey) int {
		return cmp.Or(cmp.Compare(x.name, y.name), cmp.Compare(x.attempt, y.attempt))
	}) {
		r := c.pending[k]
		if rank, lost := c.lost(g, r.first.Group, r.size, r.clients); lost && r.err == nil {
			out = c.fail(r, why(fmt.Sprintf("variable %q", r.first.Name), rank), out)
			r.timedOut = now
		}
		if forget(r.clients, g.Client) && r.err != nil && r.orphan == nil {
			r.orphan, r.orphaned = c.ranksOf(r.first.Group), now
			if r.timedOut.IsZero() {
				r.timedOut = now // forgotten LateGrace from now in any case
			}
		}
	}
	for _, k := range slices.SortedFunc(maps.Keys(c.fences), func(x, y fenceKey) int {
		return cmp.Or(cmp.Compare(x.key, y.key), cmp.Compare(x.seq, y.seq))
	}) {
		f := c.fences[k]
		if rank, lost := c.lost(g, f.key.key, f.size, f.clients); lost && f.err == nil {
			out = c.failFence(f, why(f.what(), rank), out)
			f.timedOut = now
		}
		if forget(f.clients, g.Client) && f.err != nil && f.orphan == nil {
			f.orphan, f.orphaned = c.ranksOf(f.key.key), now
			if f.timedOut.IsZero() {
				f.timedOut = now
			}
		}
	}
	for group, ranks := range c.members {
		maps.DeleteFunc(ranks, func(_ int64, cl uint64) bool { return cl == g.Client })
		if len(ranks) == 0 {
			delete(c.members, group)
		}
	}
	delete(c.procNodes, g.Client)
	return out
}

// NodeGone notes at now that node's agent went away (why: how its driver
// knows): every pending round and fence with a rank of that node — its
// shard in, or a process of the node known as one of its ranks, come or
// not — fails for every rank at once with ErrPeer naming the rank and the
// node; then each of the node's processes known here is Gone, so that the
// failed collectives no live process came to are orphaned as Gone says.
// A rank of the node that never published here is not known to be of it:
// its collectives wait for it (their deadline). The node's address stays:
// a restarted agent of the node joins again.
func (c *Coordinator) NodeGone(now time.Time, node, why string) []Reply {
	onNode := func(cl uint64) bool { return cl != 0 && c.procNodes[cl] == node }
	rankOf := func(group string, size int64, came map[int64]uint64, shards map[int64]wire.Shard) (int64, bool) {
		for _, k := range slices.Sorted(maps.Keys(shards)) {
			if shards[k].Node == node {
				return k, true
			}
		}
		for _, k := range slices.Sorted(maps.Keys(came)) {
			if onNode(came[k]) {
				return k, true
			}
		}
		ranks := c.members[group]
		for _, k := range slices.Sorted(maps.Keys(ranks)) {
			if _, in := came[k]; !in && k < size && onNode(ranks[k]) {
				return k, true
			}
		}
		return 0, false
	}
	fail := func(what string, rank int64) error {
		return base.Errorf(base.ErrPeer, "%s: rank %d is out of it: the agent of its node %q went away before it ended (%s)", what, rank, node, why)
	}
	var out []Reply
	for _, k := range slices.SortedFunc(maps.Keys(c.pending), func(x, y roundKey) int {
		return cmp.Or(cmp.Compare(x.name, y.name), cmp.Compare(x.attempt, y.attempt))
	}) {
		r := c.pending[k]
		if rank, ok := rankOf(r.first.Group, r.size, r.clients, r.shards); ok && r.err == nil {
			out = c.fail(r, fail(fmt.Sprintf("variable %q", r.first.Name), rank), out)
			r.timedOut = now
		}
	}
	for _, k := range slices.SortedFunc(maps.Keys(c.fences), func(x, y fenceKey) int {
		return cmp.Or(cmp.Compare(x.key, y.key), cmp.Compare(x.seq, y.seq))
	}) {
		f := c.fences[k]
		if rank, ok := rankOf(f.key.key, f.size, f.clients, nil); ok && f.err == nil {
			out = c.failFence(f, fail(f.what(), rank), out)
			f.timedOut = now
		}
	}
	var procs []uint64
	for cl, n := range c.procNodes {
		if n == node {
			procs = append(procs, cl)
		}
	}
	slices.Sort(procs)
	for _, cl := range procs {
		out = append(out, c.Gone(now, wire.Gone{Node: node, Client: cl, Rank: -1})...)
	}
	return out
}

// lost says whether a collective of group and size ranks, which the
// processes came have reached (by rank), is lost with process g, and the
// rank g was in it.
func (c *Coordinator) lost(g wire.Gone, group string, size int64, came map[int64]uint64) (int64, bool) {
	for _, k := range slices.Sorted(maps.Keys(came)) {
		if came[k] == g.Client {
			return k, true
		}
	}
	ranks := c.members[group]
	for _, k := range slices.Sorted(maps.Keys(ranks)) {
		if _, in := came[k]; !in && k < size && ranks[k] == g.Client {
			return k, true
		}
	}
	if _, in := came[g.Rank]; group == "" && g.Size == size && g.Rank >= 0 && g.Rank < size && !in {
		return g.Rank, true
	}
	return 0, false
}

// forget takes client out of came and says whether no process that came
// is known to live any more.
func forget(came map[int64]uint64, client uint64) bool {
	maps.DeleteFunc(came, func(_ int64, cl uint64) bool { return cl == client })
	return len(came) == 0
}

// ranksOf are the processes known as the ranks of group now (never nil).
func (c *Coordinator) ranksOf(group string) map[int64]uint64 {
	m := maps.Clone(c.members[group])
	if m == nil {
		m = map[int64]uint64{}
	}
	return m
}

// ofJob says whether rank's process client, which had run ageMs at now,
// is of the job of a collective orphaned at orphaned, whose group's ranks
// were then ranks: a late rank of that job, which gets the collective's
// error. It is if it was known as that rank (it came to an earlier
// collective of the group), or if it started more than JobStartSlack
// before the collective's last process went (a job's ranks start
// together, and a job started after one died starts its processes after
// that one's exited). Any other process is a new job's rank, and starts
// afresh. A process of no number (0) is taken for one of the job, as
// before numbers.
func ofJob(ranks map[int64]uint64, orphaned, now time.Time, rank int64, client uint64, ageMs int64) bool {
	if client == 0 || ranks[rank] == client {
		return true
	}
	started := now.Add(-time.Duration(ageMs) * time.Millisecond)
	return started.Before(orphaned.Add(-JobStartSlack))
}

// JobStartSlack is how long before a dead job's last process went a
// process must have started to be taken for one of its ranks (ofJob): more
// than the time the agents take to tell the coordinator a process went,
// less than a rank takes to start and fail.
const JobStartSlack = 500 * time.Millisecond

// member notes that client is rank of group (the last process to say so).
func (c *Coordinator) member(group string, rank int64, client uint64) {
	if client == 0 {
		return
	}
	m := c.members[group]
	if m == nil {
		m = make(map[int64]uint64)
		c.members[group] = m
	}
	m[rank] = client
}

// Barrier adds rank m.Rank's arrival at fence (m.Key, m.Seq), request req,
// at now. It returns the replies of the requests whose fence ended with it
// (req's own among them: no error, or the fence's), or none when req waits
// for more ranks: until then its fence fails when req's deadline passes
// (Expire, Tick). A failed fence answers its late ranks with its error, for
// LateGrace after it timed out, rather than start a fence no one else
// comes to.
func (c *Coordinator) Barrier(now time.Time, req uint64, m wire.Barrier, deadline time.Time) []Reply {
	if m.Size < 1 || m.Rank < 0 || m.Rank >= m.Size || m.Seq < 1 {
		return []Reply{{Req: req, Err: base.Errorf(base.ErrArgument, "fence %d of rank %d of %d ranks: want seq >= 1 and 0 <= rank < ranks", m.Seq, m.Rank, m.Size)}}
	}
	for k, f := range c.fences {
		if !f.timedOut.IsZero() && now.Sub(f.timedOut) > c.LateGrace {
			delete(c.fences, k)
		}
	}
	key := fenceKey{m.Key, m.Seq}
	f := c.fences[key]
	if f != nil && f.orphan != nil && !ofJob(f.orphan, f.orphaned, now, m.Rank, m.Client, m.ClientAgeMs) {
		delete(c.fences, key) // as a round's
		f = nil
	}
	if f == nil {
		f = &fence{key: key, size: m.Size, first: m.Rank, arrived: make(map[int64]uint64), seen: make(map[int64]bool),
			clients: make(map[int64]uint64)}
		c.fences[key] = f
	}
	f.seen[m.Rank] = true
	if _, dup := f.clients[m.Rank]; !dup {
		f.clients[m.Rank] = m.Client
	}
	c.member(m.Key, m.Rank, m.Client)
	var out []Reply
	switch _, twice := f.arrived[m.Rank]; {
	case f.err != nil:
	case m.Size != f.size:
		out = c.failFence(f, base.Errorf(base.ErrArgument, "%s: rank %d says the group has %d ranks, rank %d says %d", f.what(), m.Rank, m.Size, f.first, f.size), out)
	case twice:
		out = c.failFence(f, base.Errorf(base.ErrArgument, "%s: rank %d reached it twice (two stores of one rank fencing under one key?)", f.what(), m.Rank), out)
	}
	if f.err != nil {
		if f.timedOut.IsZero() {
			f.timedOut = now // forgotten LateGrace from now, whoever never comes
		}
		if f.allSeen() {
			delete(c.fences, key)
		}
		return append(out, Reply{Req: req, Err: f.err})
	}
	f.arrived[m.Rank] = req
	if int64(len(f.arrived)) < f.size {
		c.waits[req] = &wait{fence: f, rank: m.Rank, deadline: deadline}
		return out
	}
	delete(c.fences, key)
	for _, w := range f.arrived {
		delete(c.waits, w)
		out = append(out, Reply{Req: w})
	}
	return out
}

// Fences is how many fences are pending (waiting for ranks, or failed and
// still answering late ones).
func (c *Coordinator) Fences() int { return len(c.fences) }

// failFence sets a fence's error, unless it has one, and appends the
// replies of its waiting requests.
func (c *Coordinator) failFence(f *fence, err error, out []Reply) []Reply {
	if f.err != nil {
		return out
	}
	f.err = err
	for _, w := range slices.Sorted(maps.Values(f.arrived)) {
		delete(c.waits, w)
		out = append(out, Reply{Req: w, Err: err})
	}
	return out
}

func (f *fence) what() string {
	if f.key.key == "" {
		return fmt.Sprintf("fence %d", f.key.seq)
	}
	return fmt.Sprintf("fence %d of group %q", f.key.seq, f.key.key)
}

func (f *fence) allSeen() bool {
	for k := range f.size {
		if !f.seen[k] {
			return false
		}
	}
	return true
}

func (f *fence) missing() string {
	var miss []string
	for k := int64(0); k < f.size && len(miss) < 16; k++ {
		if _, ok := f.arrived[k]; !ok {
			miss = append(miss, fmt.Sprint(k))
		}
	}
	return fmt.Sprintf("%d of %d ranks reached it before the timeout; missing ranks %s", len(f.arrived), f.size, strings.Join(miss, ", "))
}

// Tick expires every wait whose deadline is not after now, earliest first.
func (c *Coordinator) Tick(now time.Time) []Reply {
	var due []uint64
	for req, w := range c.waits {
		if !w.deadline.After(now) {
			due = append(due, req)
		}
	}
	slices.SortFunc(due, func(x, y uint64) int {
		if d := c.waits[x].deadline.Compare(c.waits[y].deadline); d != 0 {
			return d
		}
		return cmp.Compare(x, y)
	})
	var out []Reply
	for _, req := range due {
		out = append(out, c.Expire(now, req)...)
	}
	return out
}

// NextDeadline is the earliest deadline of a waiting request: when the
// driver must call Tick next; false when nothing waits.
func (c *Coordinator) NextDeadline() (time.Time, bool) {
	var next time.Time
	for _, w := range c.waits {
		if next.IsZero() || w.deadline.Before(next) {
			next = w.deadline
		}
	}
	return next, !next.IsZero()
}

// Round says how many ranks the pending round of (name, attempt) holds and
// whether it failed; ok is false when there is no such round (never
// started, completed, or forgotten).
func (c *Coordinator) Round(name string, attempt int64) (ranks int, failed, ok bool) {
	r := c.pending[roundKey{name, attempt}]
	if r == nil {
		return 0, false, false
	}
	return len(r.shards), r.err != nil, true
}

// Collectives are the pending rounds and fences, sorted (kind, name, seq):
// what Info shows.
func (c *Coordinator) Collectives() []wire.AgentCollective {
	var out []wire.AgentCollective
	errText := func(err error) string {
		if err == nil {
			return ""
		}
		return err.Error()
	}
	for _, r := range c.pending {
		out = append(out, wire.AgentCollective{Kind: "publish", Name: r.key.name, Seq: r.key.attempt, Size: r.size,
			Ranks: slices.Sorted(maps.Keys(r.seen)), Error: errText(r.err)})
	}
	for _, f := range c.fences {
		out = append(out, wire.AgentCollective{Kind: "fence", Name: f.key.key, Seq: f.key.seq, Size: f.size,
			Ranks: slices.Sorted(maps.Keys(f.seen)), Error: errText(f.err)})
	}
	slices.SortFunc(out, func(x, y wire.AgentCollective) int {
		return cmp.Or(cmp.Compare(x.Kind, y.Kind), cmp.Compare(x.Name, y.Name), cmp.Compare(x.Seq, y.Seq))
	})
	return out
}

// Rounds is how many rounds are pending.
func (c *Coordinator) Rounds() int { return len(c.pending) }

// fail sets a round's error, unless it ended already, and appends the
// replies of its waiting requests.
func (c *Coordinator) fail(r *round, err error, out []Reply) []Reply {
	if r.err != nil || r.table != nil {
		return out
	}
	r.err = err
	for _, w := range r.waiters {
		delete(c.waits, w)
		out = append(out, Reply{Req: w, Err: err})
	}
	r.waiters = nil
	return out
}

// again says whether sh is prev sent again — by its node, whose relay of
// the gather tree failed on the way after it had carried prev here — not
// another process claiming the same rank: the same process's shard.
func again(prev, sh wire.Shard) bool {
	return sh.Client != 0 && prev.Client == sh.Client && prev.Node == sh.Node && prev.Rows == sh.Rows && prev.Items == sh.Items
}

// check compares a shard with the round's first: every rank must agree
// on the world size and the row shape.
func (r *round) check(sh wire.Shard) error {
	f := r.first
	switch {
	case sh.Failed:
		return failedShard(sh)
	case f.Failed:
		return failedShard(f)
	case sh.Rank < 0 || sh.Rank >= r.size:
		return base.Errorf(base.ErrArgument, "variable %q: rank %d not in [0, %d)", sh.Name, sh.Rank, r.size)
	case sh.Size != f.Size:
		return base.Errorf(base.ErrGeometry, "variable %q: rank %d says the world has %d ranks, rank %d says %d", sh.Name, sh.Rank, sh.Size, f.Rank, f.Size)
	case sh.Kind != f.Kind:
		return base.Errorf(base.ErrGeometry, "variable %q: rank %d has %s rows but rank %d has %s rows", sh.Name, sh.Rank, sh.Kind, f.Rank, f.Kind)
	case sh.Dtype != f.Dtype:
		return base.Errorf(base.ErrGeometry, "variable %q: rank %d has items of type %q but rank %d has %q", sh.Name, sh.Rank, sh.Dtype, f.Rank, f.Dtype)
	case sh.Backing != f.Backing || sh.Total != f.Total:
		return base.Errorf(base.ErrGeometry, "variable %q: rank %d has backing file %q of %d rows but rank %d has %q of %d rows",
			sh.Name, sh.Rank, sh.Backing, sh.Total, f.Rank, f.Backing, f.Total)
	case !slices.Equal(sh.Shape, f.Shape):
		return base.Errorf(base.ErrGeometry, "variable %q: rank %d has rows of trailing shape %v but rank %d has %v", sh.Name, sh.Rank, sh.Shape, f.Rank, f.Shape)
	case sh.Disp != f.Disp || sh.ItemSize != f.ItemSize:
		return base.Errorf(base.ErrGeometry, "variable %q: rank %d has rows of disp %d, itemsize %d but rank %d has disp %d, itemsize %d",
			sh.Name, sh.Rank, sh.Disp, sh.ItemSize, f.Rank, f.Disp, f.ItemSize)
	}
	return nil
}

func (r *round) allSeen() bool {
	for k := range r.want {
		if !r.seen[k] {
			return false
		}
	}
	return true
}

func (r *round) missing() string {
	var miss []string
	for k := int64(0); k < r.size && len(miss) < 16; k++ {
		if _, ok := r.shards[k]; !ok {
			miss = append(miss, fmt.Sprint(k))
		}
	}
	return fmt.Sprintf("%d of %d ranks published before the timeout; missing ranks %s (on several nodes, set a handshake directory or a rendezvous address so that agents meet)",
		len(r.shards), r.size, strings.Join(miss, ", "))
}

func (c *Coordinator) table(r *round) (*wire.Table, error) {
	f := r.first
	c.lastID++
	t := &wire.Table{Name: f.Name, Disp: f.Disp, ItemSize: f.ItemSize, Dtype: f.Dtype, ID: c.lastID, Backing: f.Backing, Total: f.Total,
		ShardRows: make([]int64, r.size), RankNode: make([]int64, r.size), Kind: f.Kind}
	if f.Kind == wire.KindRagged {
		// Per rank, not per row: each node builds the index of every row
		// from the shards themselves (PeerOffsets), so the table stays P
		// entries long whatever the rows.
		t.ShardItems, t.Shape = make([]int64, r.size), slices.Clone(f.Shape)
		if t.Shape == nil {
			t.Shape = []int64{}
		}
	}
	nodeIndex := map[string]int64{}
	for k := int64(0); k < r.size; k++ {
		sh := r.shards[k]
		t.ShardRows[k] = sh.Rows
		if t.ShardItems != nil {
			t.ShardItems[k] = sh.Items
		}
		i, ok := nodeIndex[sh.Node]
		if !ok {
			i = int64(len(t.Nodes))
			nodeIndex[sh.Node] = i
			addr, known := c.nodes[sh.Node]
			if !known {
				return nil, base.Errorf(base.ErrInternal, "variable %q: node %q of rank %d never joined", f.Name, sh.Node, k)
			}
			t.Nodes = append(t.Nodes, sh.Node)
			t.Addrs = append(t.Addrs, addr)
		}
		t.RankNode[k] = i
	}
	if _, err := layout.NewBacked(layout.Row{Disp: t.Disp, ItemSize: t.ItemSize}, t.ShardRows, t.Total); err != nil {
		return nil, fmt.Errorf("variable %q: %w", f.Name, err)
	}
	if err := t.Check(); err != nil {
		return nil, fmt.Errorf("variable %q: %w", f.Name, err)
	}
	return t, nil
}

// Lookup is a published variable's table.
func (c *Coordinator) Lookup(name string) (*wire.Table, error) {
	if t, ok := c.tables[name]; ok {
		return t, nil
	}
	names := slices.Sorted(maps.Keys(c.tables))
	if len(names) > 20 {
		names = append(names[:20], "...")
	}
	return nil, base.Errorf(base.ErrUnknown, "no variable %q (variables: %s)", name, strings.Join(names, ", "))
}

// Free notes that a rank is done with a variable. Once every rank is, the
// variable is gone: Free returns its table, whose nodes must drop their
// shards, and the name can be used again. Until then every shard stays, so
// a rank that frees early never takes rows from under the others.
func (c *Coordinator) Free(name string, rank int64) *wire.Table {
	t, ok := c.tables[name]
	if !ok || rank < 0 || rank >= int64(len(t.ShardRows)) {
		return nil
	}
	f := c.freed[name]
	if f == nil {
		f = map[int64]bool{}
		c.freed[name] = f
	}
	f[rank] = true
	if len(f) < len(t.ShardRows) {
		return nil
	}
	delete(c.tables, name)
	delete(c.freed, name)
	return t
}

// Nodes are the nodes that have joined, sorted, and their addresses.
func (c *Coordinator) Nodes() (ids, addrs []string) {
	ids = slices.Sorted(maps.Keys(c.nodes))
	for _, id := range ids {
		addrs = append(addrs, c.nodes[id])
	}
	return ids, addrs
}

// Addr is a node's address, "" if it never joined.
func (c *Coordinator) Addr(node string) string { return c.nodes[node] }

// State is the coordinator's state that outlives a restart, as the
// agent's manifest keeps it: the nodes' addresses, the tables, which ranks
// freed what, the last table id.
type State struct {
	Nodes  map[string]string         `json:"nodes"`
	Tables []*wire.Table             `json:"tables"`
	Freed  map[string]map[int64]bool `json:"freed,omitempty"`
	LastID int64                     `json:"last_id"`
}

// Snapshot is the state for the manifest.
func (c *Coordinator) Snapshot() *State {
	s := &State{Nodes: maps.Clone(c.nodes), LastID: c.lastID, Freed: make(map[string]map[int64]bool, len(c.freed))}
	for _, t := range c.tables {
		s.Tables = append(s.Tables, t)
	}
	sort.Slice(s.Tables, func(i, j int) bool { return s.Tables[i].ID < s.Tables[j].ID })
	for name, ranks := range c.freed {
		s.Freed[name] = maps.Clone(ranks)
	}
	return s
}

// Restore takes back a previous coordinator's state; nodes that joined
// already keep their addresses.
func (c *Coordinator) Restore(s *State) {
	if s == nil {
		return
	}
	for node, addr := range s.Nodes {
		if _, ok := c.nodes[node]; !ok {
			c.nodes[node] = addr
		}
	}
	for _, t := range s.Tables {
		if t != nil && t.Check() == nil {
			c.tables[t.Name] = t
		}
	}
	for name, ranks := range s.Freed {
		c.freed[name] = maps.Clone(ranks)
	}
	c.lastID = max(c.lastID, s.LastID)
	c.refreshAddrs()
}

// refreshAddrs gives every table the nodes' current addresses, as new
// tables (readers may hold the old ones).
func (c *Coordinator) refreshAddrs() {
	for name, t := range c.tables {
		var nt *wire.Table
		for i, node := range t.Nodes {
			if addr, ok := c.nodes[node]; ok && addr != t.Addrs[i] {
				if nt == nil {
					cp := *t
					cp.Addrs = slices.Clone(t.Addrs)
					nt = &cp
				}
				nt.Addrs[i] = addr
			}
		}
		if nt != nil {
			c.tables[name] = nt
		}
	}
}

// failedShard is the round's error for a rank that could not create its
// shard, with its agent's reason when it sent one.
func failedShard(sh wire.Shard) error {
	if sh.Lost {
		return base.Errorf(base.ErrPeer, "variable %q: rank %d on node %q %s", sh.Name, sh.Rank, sh.Node, sh.Why)
	}
	if sh.Why != "" {
		return base.Errorf(base.ErrGeometry, "variable %q: rank %d could not create its shard (%d rows of disp %d, itemsize %d) on node %q: %s",
			sh.Name, sh.Rank, sh.Rows, sh.Disp, sh.ItemSize, sh.Node, sh.Why)
	}
	return base.Errorf(base.ErrGeometry, "variable %q: rank %d could not create its shard (%d rows of disp %d, itemsize %d)", sh.Name, sh.Rank, sh.Rows, sh.Disp, sh.ItemSize)
}

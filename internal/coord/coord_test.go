package coord

import (
	"errors"
	"fmt"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/ddstore-go/ddstore/internal/base"
	"github.com/ddstore-go/ddstore/internal/testutil"
	"github.com/ddstore-go/ddstore/internal/wire"
)

// The tests drive the state machine by hand: ranks arrive in the order the
// test calls Publish, and time passes only when the test advances the
// clock, so every interleaving a test names is the one that runs.

// longWait is the deadline of a rank that must not time out.
const longWait = time.Hour

// run is a coordinator with a clock of its own and the replies so far.
type run struct {
	t    *testing.T
	c    *Coordinator
	now  time.Time
	next uint64
	got  map[uint64]Reply
}

func newRun(t *testing.T) *run {
	c := New()
	for _, n := range []string{"a", "b", "c"} {
		c.Join(n, "addr-"+n)
	}
	return &run{t: t, c: c, now: time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC), got: map[uint64]Reply{}}
}

func (r *run) take(replies []Reply) {
	r.t.Helper()
	for _, x := range replies {
		if _, dup := r.got[x.Req]; dup {
			r.t.Fatalf("request %d answered twice", x.Req)
		}
		r.got[x.Req] = x
	}
}

// publish sends a rank's shard with a deadline wait from now; its request.
func (r *run) publish(sh wire.Shard, wait time.Duration) uint64 {
	r.t.Helper()
	r.next++
	r.take(r.c.Publish(r.now, r.next, sh, r.now.Add(wait)))
	return r.next
}

// reply is request req's reply; ok false while it waits.
func (r *run) reply(req uint64) (Reply, bool) {
	x, ok := r.got[req]
	return x, ok
}

// mustReply is req's reply, failing the test if it still waits.
func (r *run) mustReply(req uint64, who string) Reply {
	r.t.Helper()
	x, ok := r.got[req]
	if !ok {
		r.t.Fatalf("%s: still waiting, want a reply now", who)
	}
	return x
}

// advance moves the clock on and lets the coordinator expire what is due.
func (r *run) advance(d time.Duration) {
	r.t.Helper()
	r.now = r.now.Add(d)
	r.take(r.c.Tick(r.now))
}

// shard builds rank r's shard of variable name in a world of size ranks,
// rows of disp 4, itemsize 8, attempt 1.
func shard(name string, r, size int64, node string) wire.Shard {
	return wire.Shard{Name: name, Node: node, Rank: r, Size: size, Rows: 10 + r, Disp: 4, ItemSize: 8, Attempt: 1}
}

// publishAll publishes the shards in order with long deadlines; every
// rank but the last must wait, and all get a reply with the last. It
// returns the replies in shard order.
func (r *run) publishAll(shards []wire.Shard) []Reply {
	r.t.Helper()
	reqs := make([]uint64, len(shards))
	for i, sh := range shards {
		reqs[i] = r.publish(sh, longWait)
		if _, ok := r.reply(reqs[i]); ok && i < len(shards)-1 {
			if x := r.got[reqs[i]]; x.Err == nil {
				r.t.Fatalf("rank %d got a table before every rank came", sh.Rank)
			}
		}
	}
	out := make([]Reply, len(reqs))
	for i, q := range reqs {
		out[i] = r.mustReply(q, fmt.Sprintf("rank %d", shards[i].Rank))
	}
	return out
}

// permutations of 0..n-1.
func permutations(n int) [][]int {
	if n == 1 {
		return [][]int{{0}}
	}
	var out [][]int
	for _, p := range permutations(n - 1) {
		for i := 0; i <= len(p); i++ {
			q := append(append(append([]int{}, p[:i]...), n-1), p[i:]...)
			out = append(out, q)
		}
	}
	return out
}

func TestPublishAnyOrder(t *testing.T) {
	// Four ranks on nodes b, a, b, c: nodes are listed in order of their
	// first rank, whatever order the ranks arrive in.
	nodes := []string{"b", "a", "b", "c"}
	want := &wire.Table{
		Name: "v", Disp: 4, ItemSize: 8,
		ShardRows: []int64{10, 11, 12, 13},
		RankNode:  []int64{0, 1, 0, 2},
		Nodes:     []string{"b", "a", "c"},
		Addrs:     []string{"addr-b", "addr-a", "addr-c"},
		ID:        1, // the coordinator's first variable
	}
	for _, perm := range permutations(len(nodes)) {
		t.Run(fmt.Sprint(perm), func(t *testing.T) {
			r := newRun(t)
			shards := make([]wire.Shard, len(perm))
			for i, k := range perm {
				shards[i] = shard("v", int64(k), int64(len(nodes)), nodes[k])
			}
			for i, sh := range shards[:len(shards)-1] {
				q := r.publish(sh, longWait)
				if _, ok := r.reply(q); ok {
					t.Fatalf("rank %d answered before every rank came", perm[i])
				}
				if n, _, ok := r.c.Round("v", 1); !ok || n != i+1 {
					t.Fatalf("round holds %d ranks (%v), want %d", n, ok, i+1)
				}
			}
			r.publish(shards[len(shards)-1], longWait)
			for q := uint64(1); q <= r.next; q++ {
				x := r.mustReply(q, fmt.Sprintf("rank %d", perm[q-1]))
				if x.Err != nil {
					t.Fatalf("rank %d: %v", perm[q-1], x.Err)
				}
				if !reflect.DeepEqual(x.Table, want) {
					t.Fatalf("rank %d got table %+v, want %+v", perm[q-1], x.Table, want)
				}
				if x.Table != r.got[1].Table {
					t.Errorf("rank %d got another table than rank %d", perm[q-1], perm[0])
				}
			}
			if _, _, ok := r.c.Round("v", 1); ok {
				t.Error("round still pending after success")
			}
			if _, ok := r.c.NextDeadline(); ok {
				t.Error("a request still waits after success")
			}
			got, err := r.c.Lookup("v")
			if err != nil || !reflect.DeepEqual(got, want) {
				t.Errorf("lookup after publish = %+v, %v", got, err)
			}
		})
	}
}

func TestDtype(t *testing.T) {
	// The table carries the dtype every rank declared.
	r := newRun(t)
	var shards []wire.Shard
	for k := range int64(2) {
		sh := shard("t", k, 2, "a")
		sh.Dtype = "float64"
		shards = append(shards, sh)
	}
	for i, x := range r.publishAll(shards) {
		if x.Err != nil || x.Table.Dtype != "float64" {
			t.Fatalf("rank %d: %+v, %v", i, x.Table, x.Err)
		}
	}
}

func TestManyRanks(t *testing.T) {
	// Sixteen ranks over three nodes: one table for all, rank r on node
	// r%3.
	r := newRun(t)
	const size = 16
	var shards []wire.Shard
	for k := range int64(size) {
		shards = append(shards, shard("w", k, size, []string{"a", "b", "c"}[k%3]))
	}
	res := r.publishAll(shards)
	for k, x := range res {
		if x.Err != nil || x.Table != res[0].Table {
			t.Fatalf("rank %d: %+v, %v", k, x.Table, x.Err)
		}
	}
	tab := res[0].Table
	if !reflect.DeepEqual(tab.Nodes, []string{"a", "b", "c"}) || !reflect.DeepEqual(tab.Addrs, []string{"addr-a", "addr-b", "addr-c"}) {
		t.Errorf("nodes %v addrs %v", tab.Nodes, tab.Addrs)
	}
	for k, n := range tab.RankNode {
		if n != int64(k%3) {
			t.Errorf("RankNode[%d] = %d, want %d", k, n, k%3)
		}
	}
}

func checkErr(t *testing.T, who string, err, sentinel error, want []string) {
	t.Helper()
	if e := testutil.CheckErr(err, sentinel, want...); e != nil {
		t.Errorf("%s: %v", who, e)
	}
}

func TestRoundFails(t *testing.T) {
	// Each case: the ranks of `before` arrive and wait; then `bad` arrives
	// and fails the round. Every one of them gets the same error, which wraps
	// `sentinel` and whose message holds every string of `want`; then the
	// ranks of `late` arrive and get that error at once.
	s := func(r, size int64) wire.Shard { return shard("v", r, size, "a") }
	withDisp := func(sh wire.Shard, disp, itemsize int64) wire.Shard {
		sh.Disp, sh.ItemSize = disp, itemsize
		return sh
	}
	failed := func(sh wire.Shard) wire.Shard { sh.Failed = true; return sh }
	lost := func(sh wire.Shard) wire.Shard {
		sh.Failed, sh.Lost, sh.Why = true, true, "is out of the round: its agent's request to the coordinator failed: connection reset"
		return sh
	}
	withDtype := func(sh wire.Shard, dtype string) wire.Shard { sh.Dtype = dtype; return sh }
	cases := []struct {
		name     string
		before   []wire.Shard
		bad      wire.Shard
		late     []wire.Shard
		sentinel error
		want     []string
	}{
		{"world size", []wire.Shard{s(0, 3)}, s(1, 4), []wire.Shard{s(2, 3)}, base.ErrGeometry,
			[]string{"rank 1 says the world has 4 ranks", "rank 0 says 3"}},
		{"disp", []wire.Shard{s(0, 3), s(2, 3)}, withDisp(s(1, 3), 5, 8), nil, base.ErrGeometry,
			[]string{"disp 5", "disp 4"}},
		{"dtype", []wire.Shard{withDtype(s(0, 3), "float32")}, withDtype(s(1, 3), "int32"), []wire.Shard{withDtype(s(2, 3), "float32")}, base.ErrGeometry,
			[]string{`rank 1 has items of type "int32"`, `rank 0 has "float32"`}},
		{"dtype vs untyped", []wire.Shard{s(0, 2)}, withDtype(s(1, 2), "uint8"), nil, base.ErrGeometry,
			[]string{`"uint8"`, `""`}},
		{"itemsize", []wire.Shard{s(1, 3)}, withDisp(s(0, 3), 4, 2), []wire.Shard{s(2, 3)}, base.ErrGeometry,
			[]string{"itemsize 2", "itemsize 8"}},
		{"rank too large", []wire.Shard{s(0, 2)}, s(2, 2), []wire.Shard{s(1, 2)}, base.ErrArgument,
			[]string{"rank 2", "[0, 2)"}},
		{"rank negative", []wire.Shard{s(1, 2)}, s(-1, 2), []wire.Shard{s(0, 2)}, base.ErrArgument,
			[]string{"rank -1", "[0, 2)"}},
		{"duplicate rank", []wire.Shard{s(0, 3), s(1, 3)}, s(1, 3), []wire.Shard{s(2, 3)}, base.ErrExists,
			[]string{"rank 1 published twice"}},
		{"failed shard", []wire.Shard{s(0, 3)}, failed(s(2, 3)), []wire.Shard{s(1, 3)}, base.ErrGeometry,
			[]string{"rank 2 could not create its shard"}},
		{"failed shard first", nil, failed(s(1, 2)), []wire.Shard{s(0, 2)}, base.ErrGeometry,
			[]string{"rank 1 could not create its shard"}},
		{"lost rank, its shard in", []wire.Shard{s(0, 3), s(1, 3)}, lost(s(1, 3)), []wire.Shard{s(2, 3)}, base.ErrPeer,
			[]string{`rank 1 on node "a" is out of the round`, "connection reset"}},
		{"lost rank first", nil, lost(s(0, 2)), []wire.Shard{s(1, 2)}, base.ErrPeer,
			[]string{`rank 0 on node "a" is out of the round`}},
		{"node never joined", []wire.Shard{s(0, 2)}, shard("v", 1, 2, "nowhere"), nil, base.ErrInternal,
			[]string{`node "nowhere"`, "never joined"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			r := newRun(t)
			var before []uint64
			for i, sh := range tc.before {
				before = append(before, r.publish(sh, longWait))
				if n, _, _ := r.c.Round("v", 1); n != i+1 {
					t.Fatalf("round holds %d ranks, want %d", n, i+1)
				}
			}
			badErr := r.mustReply(r.publish(tc.bad, longWait), "the rank that failed the round").Err
			checkErr(t, "the rank that failed the round", badErr, tc.sentinel, tc.want)
			for i, q := range before {
				x := r.mustReply(q, fmt.Sprintf("waiting rank %d", tc.before[i].Rank))
				checkErr(t, fmt.Sprintf("waiting rank %d", tc.before[i].Rank), x.Err, tc.sentinel, tc.want)
				if x.Err != nil && badErr != nil && x.Err.Error() != badErr.Error() {
					t.Errorf("waiting rank %d got %q, the failing rank %q", tc.before[i].Rank, x.Err, badErr)
				}
			}
			for _, sh := range tc.late {
				x := r.mustReply(r.publish(sh, longWait), fmt.Sprintf("late rank %d", sh.Rank))
				checkErr(t, fmt.Sprintf("late rank %d", sh.Rank), x.Err, tc.sentinel, tc.want)
			}
			if _, err := r.c.Lookup("v"); !errors.Is(err, base.ErrUnknown) {
				t.Errorf("lookup after a failed round: %v, want ErrUnknown", err)
			}
		})
	}
}

func TestRetryAfterFailedRound(t *testing.T) {
	// Attempt 1 fails (disp mismatch between ranks 0 and 1) before rank 2
	// arrives. Rank 2's attempt 1 gets the old error at once; a fresh round
	// (attempt 2) by all three succeeds whatever the arrival order, even with
	// rank 2, which is one step behind, arriving first.
	for _, perm := range permutations(3) {
		t.Run(fmt.Sprint(perm), func(t *testing.T) {
			r := newRun(t)
			q0 := r.publish(shard("v", 0, 3, "a"), longWait)
			s1 := shard("v", 1, 3, "a")
			s1.Disp = 7
			if x := r.mustReply(r.publish(s1, longWait), "rank 1, attempt 1"); !errors.Is(x.Err, base.ErrGeometry) {
				t.Fatalf("rank 1, attempt 1: %v", x.Err)
			}
			if x := r.mustReply(q0, "rank 0, attempt 1"); !errors.Is(x.Err, base.ErrGeometry) {
				t.Fatalf("rank 0, attempt 1: %v", x.Err)
			}
			// Rank 2 is late for attempt 1.
			x := r.mustReply(r.publish(shard("v", 2, 3, "b"), longWait), "late rank 2, attempt 1")
			if !errors.Is(x.Err, base.ErrGeometry) || !strings.Contains(x.Err.Error(), "disp 7") {
				t.Fatalf("late rank 2, attempt 1: %v, want the round's ErrGeometry", x.Err)
			}
			if _, _, ok := r.c.Round("v", 1); ok {
				t.Error("failed round still pending once every rank came")
			}
			var shards []wire.Shard
			for _, k := range perm {
				sh := shard("v", int64(k), 3, []string{"a", "a", "b"}[k])
				sh.Attempt = 2
				shards = append(shards, sh)
			}
			for i, x := range r.publishAll(shards) {
				if x.Err != nil {
					t.Fatalf("rank %d, attempt 2: %v", perm[i], x.Err)
				}
				if !reflect.DeepEqual(x.Table.ShardRows, []int64{10, 11, 12}) || !reflect.DeepEqual(x.Table.Nodes, []string{"a", "b"}) {
					t.Fatalf("rank %d, attempt 2: table %+v", perm[i], x.Table)
				}
			}
		})
	}
}

func TestLateRankOfSmallerWorld(t *testing.T) {
	// Three ranks; rank 0 wrongly believes the world has 2. It arrives
	// first, rank 1 (size 3) fails the round with ErrGeometry. Rank 2
	// (size 3) is a late rank of that failed round: it gets the round's
	// error at once, not a round of its own to wait in (the failed round
	// is kept until every rank of the largest world believed in came).
	r := newRun(t)
	q0 := r.publish(shard("v", 0, 2, "a"), longWait)
	if x := r.mustReply(r.publish(shard("v", 1, 3, "a"), longWait), "rank 1"); !errors.Is(x.Err, base.ErrGeometry) {
		t.Fatalf("rank 1: %v, want ErrGeometry", x.Err)
	}
	if x := r.mustReply(q0, "rank 0"); !errors.Is(x.Err, base.ErrGeometry) {
		t.Fatalf("rank 0: %v, want ErrGeometry", x.Err)
	}
	x, ok := r.reply(r.publish(shard("v", 2, 3, "a"), longWait))
	if !ok || !errors.Is(x.Err, base.ErrGeometry) {
		t.Fatalf("late rank 2 (size 3): %+v (answered %v), want the round's ErrGeometry at once", x, ok)
	}
}

func TestTimeout(t *testing.T) {
	r := newRun(t)
	// Ranks 1 and 3 of 4 arrive; rank 3's deadline is short.
	q1 := r.publish(shard("v", 1, 4, "a"), longWait)
	q3 := r.publish(shard("v", 3, 4, "b"), 50*time.Millisecond)
	if at, ok := r.c.NextDeadline(); !ok || !at.Equal(r.now.Add(50*time.Millisecond)) {
		t.Fatalf("next deadline %v, %v: want rank 3's", at, ok)
	}
	r.advance(49 * time.Millisecond)
	if _, ok := r.reply(q3); ok {
		t.Fatal("rank 3 answered before its deadline")
	}
	r.advance(time.Millisecond)
	want := []string{"2 of 4 ranks", "missing ranks 0, 2"}
	checkErr(t, "rank 3 (short deadline)", r.mustReply(q3, "rank 3").Err, base.ErrTimeout, want)
	checkErr(t, "rank 1 (waiting)", r.mustReply(q1, "rank 1").Err, base.ErrTimeout, want)
	if _, ok := r.c.NextDeadline(); ok {
		t.Error("a request still waits after the round timed out")
	}
	// A rank arriving after the timeout gets the round's error at once, even
	// with a long deadline.
	checkErr(t, "rank 0 (after the timeout)", r.mustReply(r.publish(shard("v", 0, 4, "a"), longWait), "rank 0").Err, base.ErrTimeout, want)
	// A fresh round works.
	var shards []wire.Shard
	for k := range int64(4) {
		sh := shard("v", k, 4, "c")
		sh.Attempt = 2
		shards = append(shards, sh)
	}
	for i, x := range r.publishAll(shards) {
		if x.Err != nil {
			t.Fatalf("rank %d of attempt 2: %v", i, x.Err)
		}
	}
}

func TestExpire(t *testing.T) {
	// A rank whose asker gives up (Expire before its deadline: the agent
	// stops) fails its round for the others too; Expire of a request that
	// does not wait changes nothing.
	r := newRun(t)
	q0 := r.publish(shard("v", 0, 3, "a"), longWait)
	q1 := r.publish(shard("v", 1, 3, "a"), longWait)
	r.take(r.c.Expire(r.now, 99))
	if _, ok := r.reply(q0); ok {
		t.Fatal("Expire of an unknown request answered rank 0")
	}
	r.take(r.c.Expire(r.now, q1))
	want := []string{"2 of 3 ranks", "missing ranks 2"}
	checkErr(t, "rank 1 (gave up)", r.mustReply(q1, "rank 1").Err, base.ErrTimeout, want)
	checkErr(t, "rank 0 (waiting)", r.mustReply(q0, "rank 0").Err, base.ErrTimeout, want)
	if got := r.c.Expire(r.now, q1); got != nil {
		t.Errorf("a second Expire answered %+v", got)
	}
}

func TestLookupAndFree(t *testing.T) {
	r := newRun(t)
	publish := func(name string, attempt int64, nodes ...string) error {
		var shards []wire.Shard
		for k, n := range nodes {
			sh := shard(name, int64(k), int64(len(nodes)), n)
			sh.Attempt = attempt
			shards = append(shards, sh)
		}
		for _, x := range r.publishAll(shards) {
			if x.Err != nil {
				return x.Err
			}
		}
		return nil
	}
	if err := publish("y", 1, "a"); err != nil {
		t.Fatal(err)
	}
	if err := publish("x", 1, "a", "b", "a"); err != nil {
		t.Fatal(err)
	}
	_, err := r.c.Lookup("nope")
	checkErr(t, "lookup of an unknown name", err, base.ErrUnknown, []string{`"nope"`, "x, y"})

	// Publishing an existing name fails at once with ErrExists.
	x := r.mustReply(r.publish(shard("x", 0, 1, "a"), longWait), "publish of an existing name")
	checkErr(t, "publish of an existing name", x.Err, base.ErrExists, []string{`"x"`})

	// Free by only some ranks (twice, and by ranks out of range) keeps
	// the variable: nothing is dropped while a rank may still read.
	for _, k := range []int64{0, 7, -1, 0, 2} {
		if tab := r.c.Free("x", k); tab != nil {
			t.Fatalf("free by rank %d dropped x while rank 1 holds it", k)
		}
	}
	if r.c.Free("unknown", 0) != nil {
		t.Fatal("free of an unknown name returned a table")
	}
	if _, err := r.c.Lookup("x"); err != nil {
		t.Fatalf("x gone before rank 1 freed it: %v", err)
	}
	if err := publish("x", 2, "a"); !errors.Is(err, base.ErrExists) {
		t.Fatalf("publish of x while rank 1 holds it: %v, want ErrExists", err)
	}
	tab := r.c.Free("x", 1)
	if tab == nil || tab.Name != "x" || !reflect.DeepEqual(tab.Nodes, []string{"a", "b"}) {
		t.Fatalf("the last free returns the table whose nodes must drop their shards: %+v", tab)
	}
	if _, err := r.c.Lookup("x"); !errors.Is(err, base.ErrUnknown) {
		t.Fatalf("lookup after every rank freed x: %v, want ErrUnknown", err)
	}
	// The name is reusable, with any geometry, by a new round.
	if err := publish("x", 3, "c", "c"); err != nil {
		t.Fatalf("publish of x after free: %v", err)
	}
	if tab, err := r.c.Lookup("x"); err != nil || !reflect.DeepEqual(tab.Nodes, []string{"c"}) {
		t.Fatalf("lookup of the new x: %+v, %v", tab, err)
	}
	// y was never touched.
	if _, err := r.c.Lookup("y"); err != nil {
		t.Fatal(err)
	}
}

func TestNodes(t *testing.T) {
	c := New()
	c.Join("z", "1")
	c.Join("m", "2")
	c.Join("z", "3") // a later join replaces the address
	ids, addrs := c.Nodes()
	if !reflect.DeepEqual(ids, []string{"m", "z"}) || !reflect.DeepEqual(addrs, []string{"2", "3"}) {
		t.Fatalf("Nodes() = %v, %v", ids, addrs)
	}
	if c.Addr("z") != "3" || c.Addr("nowhere") != "" {
		t.Fatalf("Addr: %q, %q", c.Addr("z"), c.Addr("nowhere"))
	}
}

// A node that joins again at a new address (its agent restarted) moves in
// every table, as a new table: readers may hold the old one.
func TestRejoinRefreshesTables(t *testing.T) {
	r := newRun(t)
	res := r.publishAll([]wire.Shard{shard("v", 0, 2, "a"), shard("v", 1, 2, "b")})
	old := res[0].Table
	r.c.Join("b", "addr-b2")
	tab, err := r.c.Lookup("v")
	if err != nil || !reflect.DeepEqual(tab.Addrs, []string{"addr-a", "addr-b2"}) {
		t.Fatalf("after b rejoined: %+v, %v", tab, err)
	}
	if !reflect.DeepEqual(old.Addrs, []string{"addr-a", "addr-b"}) {
		t.Fatalf("the table readers hold changed: %v", old.Addrs)
	}
}

// Snapshot and Restore carry the tables, the frees, the nodes and the last
// id over to a new coordinator; a node that joined it already keeps its
// new address, in the tables too.
func TestSnapshotRestore(t *testing.T) {
	r := newRun(t)
	r.publishAll([]wire.Shard{shard("v", 0, 2, "a"), shard("v", 1, 2, "b")})
	r.c.Free("v", 0)
	s := r.c.Snapshot()
	c := New()
	c.Join("b", "addr-b2")
	c.Restore(s)
	tab, err := c.Lookup("v")
	if err != nil || !reflect.DeepEqual(tab.Addrs, []string{"addr-a", "addr-b2"}) || tab.ID != 1 {
		t.Fatalf("restored table: %+v, %v", tab, err)
	}
	if c.Free("v", 0) != nil || c.Free("v", 1) == nil {
		t.Fatal("rank 0's free was not restored")
	}
	r2 := &run{t: t, c: c, now: r.now, got: map[uint64]Reply{}}
	if x := r2.publishAll([]wire.Shard{shard("w", 0, 1, "a")})[0]; x.Err != nil || x.Table.ID != 2 {
		t.Fatalf("the next table after a restore: %+v, %v (want id 2)", x.Table, x.Err)
	}
	c.Restore(nil) // nothing to restore: nothing changes
}

// A round that timed out because a rank never came does not refuse a later
// job's first round with its old error once LateGrace has passed.
func TestTimedOutRoundForgotten(t *testing.T) {
	r := newRun(t)
	q := r.publish(shard("v", 0, 2, "a"), 30*time.Millisecond)
	r.advance(30 * time.Millisecond)
	if x := r.mustReply(q, "lonely rank"); !errors.Is(x.Err, base.ErrTimeout) {
		t.Fatalf("lonely rank: %v, want ErrTimeout", x.Err)
	}
	// Within LateGrace, a rank of the same round gets its error.
	r.advance(r.c.LateGrace)
	if x := r.mustReply(r.publish(shard("v", 1, 2, "a"), longWait), "late rank"); !errors.Is(x.Err, base.ErrTimeout) {
		t.Fatalf("late rank within the grace: %v, want the round's ErrTimeout", x.Err)
	}
	// Past it, the crashed job is gone; a new one starts.
	r.advance(time.Millisecond)
	for i, x := range r.publishAll([]wire.Shard{shard("v", 0, 2, "a"), shard("v", 1, 2, "a")}) {
		if x.Err != nil {
			t.Fatalf("rank %d of the new job's round: %v", i, x.Err)
		}
	}
}

// The round of a rank killed while it waited for the others times out and
// is forgotten once LateGrace has passed, whatever its name: a name never
// used again leaves nothing in the coordinator.
func TestForgetsAbandonedRounds(t *testing.T) {
	r := newRun(t)
	for _, name := range []string{"p.1", "p.2"} {
		q := r.publish(shard(name, 1, 2, "a"), 20*time.Millisecond)
		r.advance(20 * time.Millisecond)
		if x := r.mustReply(q, "lonely rank of "+name); !errors.Is(x.Err, base.ErrTimeout) {
			t.Fatalf("lonely rank of %s: %v, want ErrTimeout", name, x.Err)
		}
	}
	if n := r.c.Rounds(); n != 2 {
		t.Fatalf("%d rounds pending right after their timeout, want 2 (late ranks still get the error)", n)
	}
	r.advance(r.c.LateGrace + time.Millisecond)
	if x := r.publishAll([]wire.Shard{shard("other", 0, 1, "a")})[0]; x.Err != nil {
		t.Fatal(x.Err)
	}
	if n := r.c.Rounds(); n != 0 {
		t.Fatalf("%d rounds pending after LateGrace, want 0", n)
	}
}

// A shard sent again by the process that sent it (its node's relay of
// the gather tree failed after carrying it here) is that rank's, not a
// second claim: both requests get the table. The same rank from another
// process is one published twice. Once a failed round's ranks have all
// come, shards sent again get its error for LateGrace, not a new round.
func TestShardSentAgain(t *testing.T) {
	r := newRun(t)
	s0, s1 := shard("v", 0, 2, "a"), shard("v", 1, 2, "b")
	s0.Client, s1.Client = 7, 8
	q0 := r.publish(s0, longWait)
	again := r.publish(s0, longWait)
	q1 := r.publish(s1, longWait)
	for _, q := range []uint64{q0, again, q1} {
		if x := r.mustReply(q, fmt.Sprint("request ", q)); x.Err != nil || !reflect.DeepEqual(x.Table.ShardRows, []int64{10, 11}) {
			t.Fatalf("request %d: %+v, %v", q, x.Table, x.Err)
		}
	}

	other := s0
	other.Name, other.Client = "w", 9
	w0 := s0
	w0.Name = "w"
	r.publish(w0, longWait)
	if x := r.mustReply(r.publish(other, longWait), "rank 0 from another process"); !errors.Is(x.Err, base.ErrExists) || !strings.Contains(x.Err.Error(), "published twice") {
		t.Fatalf("rank 0 from another process: %v, want published twice", x.Err)
	}
	w1 := s1
	w1.Name = "w"
	r.mustReply(r.publish(w1, longWait), "rank 1 of the failed round")
	if _, _, ok := r.c.Round("w", 1); ok {
		t.Error("failed round still pending once every rank came")
	}
	if x := r.mustReply(r.publish(w1, longWait), "rank 1 sent again"); !errors.Is(x.Err, base.ErrExists) {
		t.Fatalf("rank 1 sent again after its round failed: %v, want the round's error", x.Err)
	}
	r.advance(r.c.LateGrace + time.Millisecond)
	if _, ok := r.reply(r.publish(w1, longWait)); ok {
		t.Error("past the grace, a shard of the failed round's name and attempt was answered, want a fresh round waiting")
	}
}

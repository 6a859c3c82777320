package agent

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/ddstore-go/ddstore/internal/base"
	"github.com/ddstore-go/ddstore/internal/wire"
)

// Coordinator tests drive coordinator.publish directly: each rank is a
// goroutine, and arrival order is made deterministic by waiting (polling the
// coordinator's state, never sleeping) until the previous rank is recorded.

// longWait is the context a rank that must not time out publishes with; a
// rank that should return at once but blocks shows up as ErrTimeout.
const longWait = 5 * time.Second

// pubResult is what one rank's publish returned.
type pubResult struct {
	t   *wire.Table
	err error
}

// newTestCoordinator makes a coordinator that knows nodes a, b and c.
func newTestCoordinator() *coordinator {
	c := newCoordinator()
	for _, n := range []string{"a", "b", "c"} {
		c.join(n, "addr-"+n)
	}
	return c
}

// shard builds rank r's shard of variable name in a world of size ranks,
// rows of disp 4, itemsize 8, attempt 1.
func shard(name string, r, size int64, node string) wire.Shard {
	return wire.Shard{Name: name, Node: node, Rank: r, Size: size, Rows: 10 + r, Disp: 4, ItemSize: 8, Attempt: 1}
}

// recorded is how many distinct ranks of round (name, attempt) the
// coordinator holds, and whether the round has failed; -1 if there is no
// such pending round.
func recorded(c *coordinator, name string, attempt int64) (n int, failed bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	col := c.mu.pending[collKey{name, attempt}]
	if col == nil {
		return -1, false
	}
	return len(col.shards), col.err != nil
}

// waitRecorded polls until the round holds n ranks.
func waitRecorded(t *testing.T, c *coordinator, name string, attempt int64, n int) {
	t.Helper()
	deadline := time.Now().Add(longWait)
	for {
		if got, _ := recorded(c, name, attempt); got == n {
			return
		}
		if time.Now().After(deadline) {
			got, _ := recorded(c, name, attempt)
			t.Fatalf("round %q attempt %d: %d ranks recorded, want %d", name, attempt, got, n)
		}
		time.Sleep(time.Millisecond)
	}
}

// publishAsync starts one rank's publish and returns where its result comes.
func publishAsync(ctx context.Context, c *coordinator, sh wire.Shard) <-chan pubResult {
	ch := make(chan pubResult, 1)
	go func() {
		t, err := c.publish(ctx, sh)
		ch <- pubResult{t, err}
	}()
	return ch
}

// publishInOrder publishes the shards one after another: each rank (except
// the last) waits in its own goroutine, and the next is sent only once the
// coordinator has recorded it. It returns the results in shard order.
func publishInOrder(t *testing.T, c *coordinator, shards []wire.Shard) []pubResult {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), longWait)
	defer cancel()
	chans := make([]<-chan pubResult, len(shards))
	for i, sh := range shards {
		chans[i] = publishAsync(ctx, c, sh)
		if i < len(shards)-1 {
			waitRecorded(t, c, sh.Name, sh.Attempt, i+1)
		}
	}
	return collect(t, chans)
}

func collect(t *testing.T, chans []<-chan pubResult) []pubResult {
	t.Helper()
	out := make([]pubResult, len(chans))
	for i, ch := range chans {
		select {
		case out[i] = <-ch:
		case <-time.After(2 * longWait):
			t.Fatalf("rank %d of the round never returned", i)
		}
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

func TestCoordinatorPublishAnyOrder(t *testing.T) {
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
			c := newTestCoordinator()
			shards := make([]wire.Shard, len(perm))
			for i, r := range perm {
				shards[i] = shard("v", int64(r), int64(len(nodes)), nodes[r])
			}
			res := publishInOrder(t, c, shards)
			for i, r := range res {
				if r.err != nil {
					t.Fatalf("rank %d: %v", perm[i], r.err)
				}
				if !reflect.DeepEqual(r.t, want) {
					t.Fatalf("rank %d got table %+v, want %+v", perm[i], r.t, want)
				}
				if r.t != res[0].t {
					t.Errorf("rank %d got another table than rank %d", perm[i], perm[0])
				}
			}
			if n, _ := recorded(c, "v", 1); n != -1 {
				t.Errorf("round still pending after success (%d ranks)", n)
			}
			got, err := c.lookup("v")
			if err != nil || !reflect.DeepEqual(got, want) {
				t.Errorf("lookup after publish = %+v, %v", got, err)
			}
		})
	}
}

func TestCoordinatorDtype(t *testing.T) {
	// The table carries the dtype every rank declared.
	c := newTestCoordinator()
	var shards []wire.Shard
	for r := range int64(2) {
		sh := shard("t", r, 2, "a")
		sh.Dtype = "float64"
		shards = append(shards, sh)
	}
	for i, r := range publishInOrder(t, c, shards) {
		if r.err != nil || r.t.Dtype != "float64" {
			t.Fatalf("rank %d: %+v, %v", i, r.t, r.err)
		}
	}
}

func TestCoordinatorPublishConcurrent(t *testing.T) {
	// All ranks at once, no ordering: same table for all.
	c := newTestCoordinator()
	const size = 16
	ctx, cancel := context.WithTimeout(context.Background(), longWait)
	defer cancel()
	chans := make([]<-chan pubResult, size)
	for r := range int64(size) {
		chans[r] = publishAsync(ctx, c, shard("w", r, size, []string{"a", "b", "c"}[r%3]))
	}
	res := collect(t, chans)
	for r, x := range res {
		if x.err != nil {
			t.Fatalf("rank %d: %v", r, x.err)
		}
		if x.t != res[0].t {
			t.Fatalf("rank %d got another table", r)
		}
	}
	tab := res[0].t
	if !reflect.DeepEqual(tab.Nodes, []string{"a", "b", "c"}) || !reflect.DeepEqual(tab.Addrs, []string{"addr-a", "addr-b", "addr-c"}) {
		t.Errorf("nodes %v addrs %v", tab.Nodes, tab.Addrs)
	}
	for r, n := range tab.RankNode {
		if n != int64(r%3) {
			t.Errorf("RankNode[%d] = %d, want %d", r, n, r%3)
		}
	}
}

func TestCoordinatorRoundFails(t *testing.T) {
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
		{"node never joined", []wire.Shard{s(0, 2)}, shard("v", 1, 2, "nowhere"), nil, base.ErrInternal,
			[]string{`node "nowhere"`, "never joined"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			c := newTestCoordinator()
			ctx, cancel := context.WithTimeout(context.Background(), longWait)
			defer cancel()
			var chans []<-chan pubResult
			for i, sh := range tc.before {
				chans = append(chans, publishAsync(ctx, c, sh))
				waitRecorded(t, c, sh.Name, sh.Attempt, i+1)
			}
			_, badErr := c.publish(ctx, tc.bad)
			checkErr(t, "the rank that failed the round", badErr, tc.sentinel, tc.want)
			for i, r := range collect(t, chans) {
				checkErr(t, fmt.Sprintf("waiting rank %d", tc.before[i].Rank), r.err, tc.sentinel, tc.want)
				if r.err != nil && r.err.Error() != badErr.Error() {
					t.Errorf("waiting rank %d got %q, the failing rank %q", tc.before[i].Rank, r.err, badErr)
				}
			}
			for _, sh := range tc.late {
				t0 := time.Now()
				_, err := c.publish(ctx, sh)
				checkErr(t, fmt.Sprintf("late rank %d", sh.Rank), err, tc.sentinel, tc.want)
				if d := time.Since(t0); d > longWait/2 {
					t.Errorf("late rank %d waited %v for an error it should get at once", sh.Rank, d)
				}
			}
			if _, err := c.lookup("v"); !errors.Is(err, base.ErrUnknown) {
				t.Errorf("lookup after a failed round: %v, want ErrUnknown", err)
			}
		})
	}
}

func checkErr(t *testing.T, who string, err, sentinel error, want []string) {
	t.Helper()
	if !errors.Is(err, sentinel) {
		t.Errorf("%s: error %v, want %v", who, err, sentinel)
		return
	}
	for _, w := range want {
		if !strings.Contains(err.Error(), w) {
			t.Errorf("%s: error %q does not name %q", who, err, w)
		}
	}
}

func TestCoordinatorRetryAfterFailedRound(t *testing.T) {
	// Attempt 1 fails (disp mismatch between ranks 0 and 1) before rank 2
	// arrives. Rank 2's attempt 1 gets the old error at once; a fresh round
	// (attempt 2) by all three succeeds whatever the arrival order, even with
	// rank 2, which is one step behind, arriving first.
	for _, perm := range permutations(3) {
		t.Run(fmt.Sprint(perm), func(t *testing.T) {
			c := newTestCoordinator()
			ctx, cancel := context.WithTimeout(context.Background(), longWait)
			defer cancel()
			s0 := shard("v", 0, 3, "a")
			ch := publishAsync(ctx, c, s0)
			waitRecorded(t, c, "v", 1, 1)
			s1 := shard("v", 1, 3, "a")
			s1.Disp = 7
			if _, err := c.publish(ctx, s1); !errors.Is(err, base.ErrGeometry) {
				t.Fatalf("rank 1, attempt 1: %v", err)
			}
			if r := collect(t, []<-chan pubResult{ch})[0]; !errors.Is(r.err, base.ErrGeometry) {
				t.Fatalf("rank 0, attempt 1: %v", r.err)
			}
			// Rank 2 is late for attempt 1.
			if _, err := c.publish(ctx, shard("v", 2, 3, "b")); !errors.Is(err, base.ErrGeometry) || !strings.Contains(err.Error(), "disp 7") {
				t.Fatalf("late rank 2, attempt 1: %v, want the round's ErrGeometry", err)
			}
			if n, _ := recorded(c, "v", 1); n != -1 {
				t.Errorf("failed round still pending once every rank came (%d)", n)
			}
			var shards []wire.Shard
			for _, r := range perm {
				sh := shard("v", int64(r), 3, []string{"a", "a", "b"}[r])
				sh.Attempt = 2
				shards = append(shards, sh)
			}
			for i, r := range publishInOrder(t, c, shards) {
				if r.err != nil {
					t.Fatalf("rank %d, attempt 2: %v", perm[i], r.err)
				}
				if !reflect.DeepEqual(r.t.ShardRows, []int64{10, 11, 12}) || !reflect.DeepEqual(r.t.Nodes, []string{"a", "b"}) {
					t.Fatalf("rank %d, attempt 2: table %+v", perm[i], r.t)
				}
			}
		})
	}
}

func TestCoordinatorLateRankOfSmallerWorld(t *testing.T) {
	// Three ranks; rank 0 wrongly believes the world has 2. It arrives
	// first, rank 1 (size 3) fails the round with ErrGeometry. Rank 2
	// (size 3) is a late rank of that failed round: it should get the
	// round's error at once.
	c := newTestCoordinator()
	ctx, cancel := context.WithTimeout(context.Background(), longWait)
	defer cancel()
	ch := publishAsync(ctx, c, shard("v", 0, 2, "a"))
	waitRecorded(t, c, "v", 1, 1)
	if _, err := c.publish(ctx, shard("v", 1, 3, "a")); !errors.Is(err, base.ErrGeometry) {
		t.Fatalf("rank 1: %v, want ErrGeometry", err)
	}
	if r := collect(t, []<-chan pubResult{ch})[0]; !errors.Is(r.err, base.ErrGeometry) {
		t.Fatalf("rank 0: %v, want ErrGeometry", r.err)
	}
	short, cancel2 := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel2()
	_, err := c.publish(short, shard("v", 2, 3, "a"))
	if !errors.Is(err, base.ErrGeometry) {
		t.Fatalf("coordinator.publish: the failed round was dropped from pending once len(shards) reached the FIRST rank's size (2), "+
			"so late rank 2 (size 3) opened a new round and waited for its deadline: got %v, want the round's ErrGeometry at once", err)
	}
}

func TestCoordinatorTimeout(t *testing.T) {
	c := newTestCoordinator()
	long, cancel := context.WithTimeout(context.Background(), longWait)
	defer cancel()
	short, cancel2 := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel2()
	// Ranks 1 and 3 of 4 arrive; rank 3's deadline is short.
	ch1 := publishAsync(long, c, shard("v", 1, 4, "a"))
	waitRecorded(t, c, "v", 1, 1)
	_, err := c.publish(short, shard("v", 3, 4, "b"))
	want := []string{"2 of 4 ranks", "missing ranks 0, 2"}
	checkErr(t, "rank 3 (short deadline)", err, base.ErrTimeout, want)
	r1 := collect(t, []<-chan pubResult{ch1})[0]
	checkErr(t, "rank 1 (waiting)", r1.err, base.ErrTimeout, want)
	// A rank arriving after the timeout gets the round's error at once, even
	// with a long deadline.
	t0 := time.Now()
	_, err = c.publish(long, shard("v", 0, 4, "a"))
	checkErr(t, "rank 0 (after the timeout)", err, base.ErrTimeout, want)
	if d := time.Since(t0); d > longWait/2 {
		t.Errorf("rank 0 waited %v", d)
	}
	// A fresh round works.
	var shards []wire.Shard
	for r := range int64(4) {
		sh := shard("v", r, 4, "c")
		sh.Attempt = 2
		shards = append(shards, sh)
	}
	for i, r := range publishInOrder(t, c, shards) {
		if r.err != nil {
			t.Fatalf("rank %d of attempt 2: %v", i, r.err)
		}
	}
}

func TestCoordinatorLookupAndFree(t *testing.T) {
	c := newTestCoordinator()
	publish := func(name string, attempt int64, nodes ...string) error {
		var shards []wire.Shard
		for r, n := range nodes {
			sh := shard(name, int64(r), int64(len(nodes)), n)
			sh.Attempt = attempt
			shards = append(shards, sh)
		}
		for _, r := range publishInOrder(t, c, shards) {
			if r.err != nil {
				return r.err
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
	_, err := c.lookup("nope")
	checkErr(t, "lookup of an unknown name", err, base.ErrUnknown, []string{`"nope"`, "x, y"})

	// Publishing an existing name fails at once with ErrExists.
	_, err = c.publish(context.Background(), shard("x", 0, 1, "a"))
	checkErr(t, "publish of an existing name", err, base.ErrExists, []string{`"x"`})

	// Free by only some ranks (twice, and by ranks out of range) keeps
	// the variable: nothing is dropped while a rank may still read.
	for _, r := range []int64{0, 7, -1, 0, 2} {
		if tab := c.free("x", r); tab != nil {
			t.Fatalf("free by rank %d dropped x while rank 1 holds it", r)
		}
	}
	if c.free("unknown", 0) != nil {
		t.Fatal("free of an unknown name returned a table")
	}
	if _, err := c.lookup("x"); err != nil {
		t.Fatalf("x gone before rank 1 freed it: %v", err)
	}
	if err := publish("x", 2, "a"); !errors.Is(err, base.ErrExists) {
		t.Fatalf("publish of x while rank 1 holds it: %v, want ErrExists", err)
	}
	tab := c.free("x", 1)
	if tab == nil || tab.Name != "x" || !reflect.DeepEqual(tab.Nodes, []string{"a", "b"}) {
		t.Fatalf("the last free returns the table whose nodes must drop their shards: %+v", tab)
	}
	if _, err := c.lookup("x"); !errors.Is(err, base.ErrUnknown) {
		t.Fatalf("lookup after every rank freed x: %v, want ErrUnknown", err)
	}
	// The name is reusable, with any geometry, by a new round.
	if err := publish("x", 3, "c", "c"); err != nil {
		t.Fatalf("publish of x after free: %v", err)
	}
	if tab, err := c.lookup("x"); err != nil || !reflect.DeepEqual(tab.Nodes, []string{"c"}) {
		t.Fatalf("lookup of the new x: %+v, %v", tab, err)
	}
	// y was never touched.
	if _, err := c.lookup("y"); err != nil {
		t.Fatal(err)
	}
}

func TestCoordinatorNodes(t *testing.T) {
	c := newCoordinator()
	c.join("z", "1")
	c.join("m", "2")
	c.join("z", "3") // a later join replaces the address
	ids, addrs := c.nodes()
	if !reflect.DeepEqual(ids, []string{"m", "z"}) || !reflect.DeepEqual(addrs, []string{"2", "3"}) {
		t.Fatalf("nodes() = %v, %v", ids, addrs)
	}
}

// A round that timed out because a rank never came does not refuse a later
// job's first round with its old error once lateGrace has passed.
func TestCoordinatorTimedOutRoundForgotten(t *testing.T) {
	old := lateGrace
	lateGrace = 50 * time.Millisecond
	defer func() { lateGrace = old }()
	c := newTestCoordinator()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Millisecond)
	_, err := c.publish(ctx, shard("v", 0, 2, "a"))
	cancel()
	if !errors.Is(err, base.ErrTimeout) {
		t.Fatalf("lonely rank: %v, want ErrTimeout", err)
	}
	time.Sleep(2 * lateGrace) // the crashed job is gone; a new one starts
	errs := make(chan error, 2)
	for r := range int64(2) {
		go func() {
			_, err := c.publish(context.Background(), shard("v", r, 2, "a"))
			errs <- err
		}()
	}
	for range 2 {
		if err := <-errs; err != nil {
			t.Fatalf("new job's round: %v", err)
		}
	}
}

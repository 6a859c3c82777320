package agent

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/ddstore-go/ddstore/internal/base"
	"github.com/ddstore-go/ddstore/internal/testutil"
	"github.com/ddstore-go/ddstore/internal/wire"
)

// The coordinator's rounds are tested on the state machine itself
// (internal/coord, with its own clock); these tests drive its driver:
// ranks publishing at once from goroutines, and a round ended by the real
// clock or by the asker giving up.

// longWait is the timeout of a rank that must not time out.
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
	n, failed, ok := c.round(name, attempt)
	if !ok {
		return -1, false
	}
	return n, failed
}

// waitRecorded polls until the round holds n ranks.
func waitRecorded(t *testing.T, c *coordinator, name string, attempt int64, n int) {
	t.Helper()
	testutil.WaitFor(t, longWait, func() error {
		if got, _ := recorded(c, name, attempt); got != n {
			return fmt.Errorf("round %q attempt %d: %d ranks recorded, want %d", name, attempt, got, n)
		}
		return nil
	})
}

// publishAsync starts one rank's publish and returns where its result comes.
func publishAsync(ctx context.Context, c *coordinator, sh wire.Shard, timeout time.Duration) <-chan pubResult {
	ch := make(chan pubResult, 1)
	go func() {
		t, err := c.publish(ctx, sh, timeout)
		ch <- pubResult{t, err}
	}()
	return ch
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

func TestCoordinatorPublishConcurrent(t *testing.T) {
	// All ranks at once, no ordering: same table for all.
	c := newTestCoordinator()
	const size = 16
	chans := make([]<-chan pubResult, size)
	for r := range int64(size) {
		chans[r] = publishAsync(context.Background(), c, shard("w", r, size, []string{"a", "b", "c"}[r%3]), longWait)
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
	if tab, err := c.lookup("w"); err != nil || tab != res[0].t {
		t.Fatalf("lookup: %+v, %v", tab, err)
	}
	c.mu.Lock()
	waiting := len(c.mu.waiting)
	c.mu.Unlock()
	if waiting != 0 {
		t.Errorf("%d requests still wait for a reply", waiting)
	}
}

func checkErr(t *testing.T, who string, err, sentinel error, want []string) {
	t.Helper()
	if e := testutil.CheckErr(err, sentinel, want...); e != nil {
		t.Errorf("%s: %v", who, e)
	}
}

func TestCoordinatorTimeout(t *testing.T) {
	// Ranks 1 and 3 of 4 arrive; rank 3's timeout is short: when the
	// clock passes it, the round fails for both.
	c := newTestCoordinator()
	ch1 := publishAsync(context.Background(), c, shard("v", 1, 4, "a"), longWait)
	waitRecorded(t, c, "v", 1, 1)
	_, err := c.publish(context.Background(), shard("v", 3, 4, "b"), 50*time.Millisecond)
	want := []string{"2 of 4 ranks", "missing ranks 0, 2"}
	checkErr(t, "rank 3 (short timeout)", err, base.ErrTimeout, want)
	checkErr(t, "rank 1 (waiting)", collect(t, []<-chan pubResult{ch1})[0].err, base.ErrTimeout, want)
	// A rank arriving after the timeout gets the round's error, even with
	// a long timeout.
	_, err = c.publish(context.Background(), shard("v", 0, 4, "a"), longWait)
	checkErr(t, "rank 0 (after the timeout)", err, base.ErrTimeout, want)
}

func TestCoordinatorAskerGivesUp(t *testing.T) {
	// A rank whose context ends (its agent stopping) fails the round for
	// the ranks waiting with it.
	c := newTestCoordinator()
	ch0 := publishAsync(context.Background(), c, shard("v", 0, 3, "a"), longWait)
	waitRecorded(t, c, "v", 1, 1)
	ctx, cancel := context.WithCancel(context.Background())
	ch1 := publishAsync(ctx, c, shard("v", 1, 3, "a"), longWait)
	waitRecorded(t, c, "v", 1, 2)
	cancel()
	want := []string{"2 of 3 ranks", "missing ranks 2"}
	for i, r := range collect(t, []<-chan pubResult{ch0, ch1}) {
		checkErr(t, []string{"rank 0 (waiting)", "rank 1 (gave up)"}[i], r.err, base.ErrTimeout, want)
	}
}

// PeerNodes answers every node that joined, or the one asked for (none if
// it never joined); PeerWindow of an agent of the tcp transport is refused.
func TestCoordinatorPeerNodes(t *testing.T) {
	a := startAgent(t, Config{})
	a.coord.Load().join("n0", "10.0.0.9:7")
	h := (*peerHandler)(a)
	ask := func(node string) wire.Table {
		t.Helper()
		m := wire.PeerNodes{Node: node}
		var e wire.Encoder
		m.Encode(&e)
		fill, err := h.Control(context.Background(), wire.OpPeerNodes, e.Bytes())
		if err != nil {
			t.Fatalf("PeerNodes %q: %v", node, err)
		}
		var r wire.Encoder
		fill(&r)
		tab, err := wire.DecodeTable(r.Bytes())
		if err != nil {
			t.Fatalf("PeerNodes %q reply: %v", node, err)
		}
		return tab
	}
	if tab := ask(""); strings.Join(tab.Nodes, ",") != "n0,n1" || strings.Join(tab.Addrs, ",") != "10.0.0.9:7,"+a.PeerAddr() {
		t.Errorf("every node: %v at %v", tab.Nodes, tab.Addrs)
	}
	if tab := ask("n0"); strings.Join(tab.Nodes, ",") != "n0" || strings.Join(tab.Addrs, ",") != "10.0.0.9:7" {
		t.Errorf("node n0: %v at %v", tab.Nodes, tab.Addrs)
	}
	if tab := ask("nowhere"); len(tab.Nodes) != 0 || len(tab.Addrs) != 0 {
		t.Errorf("a node that never joined: %v at %v", tab.Nodes, tab.Addrs)
	}
	if _, err := h.Control(context.Background(), wire.OpPeerNodes, []byte{1}); !errors.Is(err, base.ErrProtocol) {
		t.Errorf("a PeerNodes body that does not decode: %v, want ErrProtocol", err)
	}
	m := wire.PeerWindow{Name: "x", ID: 1}
	var e wire.Encoder
	m.Encode(&e)
	if _, err := h.Control(context.Background(), wire.OpPeerWindow, e.Bytes()); !errors.Is(err, base.ErrUnknown) {
		t.Errorf("PeerWindow of an unknown variable: %v, want ErrUnknown", err)
	}
}

// TestCoordinatorRelayTree: a round's requests that want the table (one
// per node) are arranged in a tree of the coordinator's fanout, in node
// order: the first nodes get the table, each later one the node to fetch
// it from; requests that want no table, and rounds of few nodes, get no
// relay.
func TestCoordinatorRelayTree(t *testing.T) {
	c := newCoordinator()
	c.fanout = 3
	const nodes = 10
	for i := range nodes {
		c.join(fmt.Sprintf("n%d", i), fmt.Sprintf("addr-%d", i))
	}
	type result struct {
		node  string
		tree  bool
		t     *wire.Table
		relay string
		err   error
	}
	out := make(chan result, 2*nodes)
	// Nodes arrive in reverse order: the tree follows node ids, not
	// arrival.
	for i := nodes - 1; i >= 0; i-- {
		for l := range 2 {
			node := fmt.Sprintf("n%d", i)
			sh := shard("v", int64(2*i+l), 2*nodes, node)
			go func() {
				tb, relay, err := c.publishRound(context.Background(), sh, nil, "", l == 0, longWait)
				out <- result{node, l == 0, tb, relay, err}
			}()
		}
	}
	want := map[string]string{"n0": "", "n1": "", "n2": "", "n3": "n0", "n4": "n0", "n5": "n0", "n6": "n1", "n7": "n1", "n8": "n1", "n9": "n2"}
	var table *wire.Table
	for range 2 * nodes {
		r := <-out
		if r.err != nil {
			t.Fatalf("node %s: %v", r.node, r.err)
		}
		if table == nil {
			table = r.t
		}
		if r.t != table {
			t.Errorf("node %s got another table", r.node)
		}
		switch {
		case !r.tree && r.relay != "":
			t.Errorf("node %s: a request wanting no table was told to fetch it from %s", r.node, r.relay)
		case r.tree && r.relay != want[r.node]:
			t.Errorf("node %s: fetch the table from %q, want %q", r.node, r.relay, want[r.node])
		}
	}

	// A round of no more nodes than the fanout: the table for each.
	for i := range 3 {
		go func() {
			node := fmt.Sprintf("n%d", i)
			tb, relay, err := c.publishRound(context.Background(), shard("w", int64(i), 3, node), nil, "", true, longWait)
			out <- result{node, true, tb, relay, err}
		}()
	}
	for range 3 {
		if r := <-out; r.err != nil || r.relay != "" || r.t == nil {
			t.Errorf("node %s of a small round: table %v, relay %q, err %v", r.node, r.t != nil, r.relay, r.err)
		}
	}
}

// A PeerRound that carries the shards of its node's other ranks (Others)
// records them with its own: one request per node completes the round,
// and a disagreeing shard among them fails it for every rank, the
// request that carried it too.
func TestCoordinatorRoundOthers(t *testing.T) {
	c := newTestCoordinator()
	out := make(chan pubResult, 2)
	for _, node := range []string{"a", "b"} {
		first := int64(0)
		if node == "b" {
			first = 3
		}
		go func() {
			others := []wire.Shard{shard("v", first+1, 6, node), shard("v", first+2, 6, node)}
			tb, _, err := c.publishRound(context.Background(), shard("v", first, 6, node), others, "", true, longWait)
			out <- pubResult{tb, err}
		}()
	}
	var table *wire.Table
	for range 2 {
		r := <-out
		if r.err != nil {
			t.Fatal(r.err)
		}
		if table != nil && r.t != table {
			t.Error("the two nodes got different tables")
		}
		table = r.t
	}
	if got := table.ShardRows; len(got) != 6 || got[1] != 11 || got[5] != 15 {
		t.Errorf("table's rows per rank %v, want 10..15", got)
	}
	c.mu.Lock()
	n := len(c.mu.waiting)
	c.mu.Unlock()
	if n != 0 {
		t.Errorf("%d requests still wait after the round", n)
	}

	// Node b's rank 4 disagrees on the rows' disp: every rank fails.
	go func() {
		_, _, err := c.publishRound(context.Background(), shard("w", 0, 4, "a"), []wire.Shard{shard("w", 1, 4, "a")}, "", true, longWait)
		out <- pubResult{nil, err}
	}()
	waitRecorded(t, c, "w", 1, 2)
	bad := shard("w", 3, 4, "b")
	bad.Disp = 5
	_, _, err := c.publishRound(context.Background(), shard("w", 2, 4, "b"), []wire.Shard{bad}, "", true, longWait)
	if !errors.Is(err, base.ErrGeometry) || !strings.Contains(err.Error(), "disp") {
		t.Errorf("node b, whose request carried the bad shard: %v, want ErrGeometry naming the disp", err)
	}
	if r := <-out; !errors.Is(r.err, base.ErrGeometry) {
		t.Errorf("node a: %v, want ErrGeometry", r.err)
	}
	c.mu.Lock()
	n = len(c.mu.waiting)
	c.mu.Unlock()
	if n != 0 {
		t.Errorf("%d requests still wait after the failed round", n)
	}
}

// BenchmarkCoordinatorRound: the coordinator's own work for one Add
// round of K nodes of 8 ranks, each node's ranks in one PeerRound
// (Others), with no sockets: the core's and its driver's CPU, which the
// scale driver's figures hold beside the messages' and the manifest's.
func BenchmarkCoordinatorRound(b *testing.B) {
	for _, k := range []int{8, 32, 128} {
		b.Run(fmt.Sprintf("K=%d", k), func(b *testing.B) {
			const rpn = 8
			c := newCoordinator()
			for n := range k {
				c.join(fmt.Sprintf("n%03d", n), fmt.Sprintf("addr-%d", n))
			}
			size := int64(k * rpn)
			errs := make(chan error, k)
			for i := 0; b.Loop(); i++ {
				name := fmt.Sprintf("v%d", i)
				for n := range k {
					node := fmt.Sprintf("n%03d", n)
					first := int64(n * rpn)
					others := make([]wire.Shard, rpn-1)
					for l := range others {
						others[l] = shard(name, first+1+int64(l), size, node)
					}
					go func() {
						_, _, err := c.publishRound(context.Background(), shard(name, first, size, node), others, "", true, longWait)
						errs <- err
					}()
				}
				for range k {
					if err := <-errs; err != nil {
						b.Fatal(err)
					}
				}
				b.StopTimer()
				for r := range size { // tables would pile up, and the heap with them
					c.free(name, r)
				}
				b.StartTimer()
			}
		})
	}
}

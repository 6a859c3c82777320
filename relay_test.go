package ddstore_test

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ddstore-go/ddstore"
	"github.com/ddstore-go/ddstore/agent"
	"github.com/ddstore-go/ddstore/internal/testutil"
	"github.com/ddstore-go/ddstore/internal/wire"
)

// TestClusterTableRelay: with a relay fanout of 1 the coordinator gives a
// round's table to one node and each node to the next, so the tables of
// a five-node job pass along a chain of relays (PeerTable; from the
// second round on, down the gather tree); every rank
// still gets the variable, reads every row, frees it and adds it again.
func TestClusterTableRelay(t *testing.T) {
	c := startCluster(t, []int{2, 2, 2, 2, 2}, viaRendezvous, func(cfg *agent.Config) { cfg.RelayFanout = 1 })
	rows := []int64{3, 1, 4, 1, 5, 9, 2, 6, 5, 3}
	var total int64
	for _, n := range rows {
		total += n
	}
	for round := 1; round <= 2; round++ {
		c.addPattern(t, "relay", rows, 2, 8)
		readAllRanks(t, c, "relay", total, 16)
		if clusterTransport != "mpi" { // the mpirun agents take their flags, not this Config
			relayed := 0
			for i, a := range c.agents {
				in, err := ddstore.QueryAgent(a.Socket(), c.ns, fmt.Sprintf("node%d", i))
				if err != nil {
					t.Fatal(err)
				}
				relayed += in.Counters["tables_relayed"] + in.Counters["gathers_relayed"]
			}
			// Four nodes off the coordinator's: one gets the table from
			// it, three from the node before them — in the first round
			// by asking it (PeerTable), in the second as its answer to
			// their requests, which went up the same chain (PeerGather).
			if relayed != 3*round {
				t.Errorf("round %d: %d tables relayed by the nodes, want %d", round, relayed, 3*round)
			}
		}
		c.mustEach(t, func(_ int, s *ddstore.Store) error { return s.Free("relay") })
	}
}

// TestClusterFreeDropTree: with a relay fanout of 2 the coordinator of a
// five-node job sends a Free's drops to two nodes, each of which passes
// it on to the next; every node drops its shards before the last Free
// returns. When a node that passes it on is down, the coordinator sends
// the drop to the node below it itself.
func TestClusterFreeDropTree(t *testing.T) {
	if clusterTransport == "mpi" {
		t.Skip("the mpirun agents take their flags, not this Config")
	}
	c := startCluster(t, []int{1, 1, 1, 1, 1}, viaRendezvous, func(cfg *agent.Config) { cfg.RelayFanout = 2 })
	coord := -1
	info := func(i int) ddstore.AgentInfo {
		in, err := ddstore.QueryAgent(c.agents[i].Socket(), c.ns, fmt.Sprintf("node%d", i))
		if err != nil {
			t.Fatal(err)
		}
		return in
	}
	rows := []int64{3, 1, 4, 1, 5}
	c.addPattern(t, "v", rows, 2, 8)
	for i := range c.agents {
		if info(i).Coordinator {
			coord = i
		}
	}
	if coord < 0 {
		t.Fatal("no agent coordinates")
	}
	holds := func(i int, name string) bool {
		for _, v := range info(i).Variables {
			if v.Name == name {
				return true
			}
		}
		return false
	}
	counters := func() (coordOut, relayed int) {
		for i := range c.agents {
			in := info(i)
			relayed += in.Counters["drops_relayed"]
			if i == coord {
				coordOut = in.Counters["coord_messages_out"]
			}
		}
		return coordOut, relayed
	}
	out0, rel0 := counters()
	c.mustEach(t, func(_ int, s *ddstore.Store) error { return s.Free("v") })
	out1, rel1 := counters()
	// The four other nodes in two chunks of two (the table's order, a
	// rank per node): the coordinator sends two drops, their first nodes
	// one each.
	if got := out1 - out0; got != 6 {
		t.Errorf("the coordinator sent %d messages for a Free, want 6 (its answers to the four nodes' frees, its drops to the first node of each half)", got)
	}
	if got := rel1 - rel0; got != 2 {
		t.Errorf("the nodes passed on %d drops, want 2", got)
	}
	for i := range c.agents {
		if holds(i, "v") {
			t.Errorf("node%d still holds v after every rank's Free returned", i)
		}
	}

	// A node that passes the drop on, down: the first one of a half
	// without the coordinator (node order is rank order here).
	c.addPattern(t, "w", rows, 2, 8)
	others := make([]int, 0, 4)
	for i := range c.agents {
		if i != coord {
			others = append(others, i)
		}
	}
	down, last := others[0], others[3]
	errs := c.each(func(r int, s *ddstore.Store) error {
		if r == last {
			return nil
		}
		return s.Free("w")
	})
	for r, err := range errs {
		if r != last && err != nil {
			t.Fatalf("rank %d: %v", r, err)
		}
	}
	c.agents[down].Close()
	if err := c.stores[last].Free("w"); err != nil {
		t.Fatalf("the last rank's Free with node%d down: %v", down, err)
	}
	for i := range c.agents {
		if i != down && holds(i, "w") {
			t.Errorf("node%d still holds w after the last Free, node%d (which would pass it on to it) down", i, down)
		}
	}
}

// TestClusterRoundFollowerMismatch: a node's ranks other than the one
// that waits for the round hand their shards over in batches; when one
// of them declares another geometry, the round fails for every rank of
// every node with the coordinator's error naming both, and a corrected
// retry by all ranks works.
func TestClusterRoundFollowerMismatch(t *testing.T) {
	c := startCluster(t, []int{4, 4, 4}, viaRendezvous)
	// The coordinator is whichever agent took the rendezvous (under
	// mpirun, any of them); the node of the batched shards is another.
	coord, coordMsgs := c.coordinatorMessages(t)
	node := (coord + 1) % 3
	first := 4 * node
	bad := first + 1 // the node's local rank 1
	errs := make([]error, len(c.stores))
	var wg sync.WaitGroup
	add := func(r int) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			disp := int64(2)
			if r == bad {
				disp = 1
			}
			errs[r] = c.stores[r].Add("mismatch", make([]byte, 16*disp), disp, 8)
		}()
	}
	// That node's other ranks first: once the coordinator has heard from
	// the node, one of them leads its round there, so the bad rank's shard
	// goes in a batch (PeerShards).
	before := coordMsgs()
	for _, r := range []int{first, first + 2, first + 3} {
		add(r)
	}
	testutil.WaitFor(t, 10*time.Second, func() error {
		if n := coordMsgs(); n <= before {
			return fmt.Errorf("the coordinator has %d messages, none from node%d yet", n, node)
		}
		return nil
	})
	for r := range c.stores {
		if r < first || r >= first+4 || r == bad {
			add(r)
		}
	}
	wg.Wait()
	for r, err := range errs {
		wantErr(t, fmt.Sprintf("rank %d", r), err, ddstore.ErrGeometry, "disp")
	}
	// All of the node's ranks at once: the bad rank's shard goes in its
	// leader's PeerRound (Others), and the round fails for every rank.
	for r := range c.stores {
		add(r)
	}
	wg.Wait()
	for r, err := range errs {
		wantErr(t, fmt.Sprintf("rank %d, all at once", r), err, ddstore.ErrGeometry, "disp")
	}
	// All ranks again, each with the same geometry.
	rows := []int64{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12}
	c.addPattern(t, "mismatch", rows, 2, 8)
	readAllRanks(t, c, "mismatch", 78, 16)
}

// TestClusterRoundGather: the shards of a node's ranks other than the one
// that leads its round are held until all of the node's connected ranks
// are in and go in the leader's request — one message from the node per
// round — and when one rank is late they go without it once the hold
// passes, the late one after them, and the round still completes.
func TestClusterRoundGather(t *testing.T) {
	c := startCluster(t, []int{4, 4}, viaRendezvous)
	coord, coordMsgs := c.coordinatorMessages(t)
	node := 1 - coord
	first := 4 * node
	rows := []int64{1, 2, 3, 4, 5, 6, 7, 8}
	c.addPattern(t, "warm", rows, 2, 8) // the other node joins the coordinator
	readAllRanks(t, c, "warm", 36, 16)

	errs := make([]error, len(c.stores))
	var wg sync.WaitGroup
	add := func(name string, r int) {
		buf := make([]byte, 16*rows[r])
		for i := range rows[r] {
			pattern(buf[16*i:16*(i+1)], int64(r*(r+1)/2)+i) // rank r's first row is 1+2+…+r
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[r] = c.stores[r].Add(name, buf, 2, 8)
		}()
	}
	// Every rank at once: the leader's PeerRound carries the others'
	// shards: one message.
	before := coordMsgs()
	for r := range c.stores {
		add("all", r)
	}
	wg.Wait()
	for r, err := range errs {
		if err != nil {
			t.Fatalf("rank %d: %v", r, err)
		}
	}
	if got := coordMsgs() - before; got != 1 {
		t.Errorf("node%d sent the coordinator %d messages in a round of its 4 ranks, want 1 (its leader's round, the others' shards in it)", node, got)
	}

	// The node's last rank late: the leader's round goes with the others'
	// shards once the hold passes, without it; it goes alone after.
	before = coordMsgs()
	for r := range c.stores {
		if r != first+3 {
			add("late", r)
		}
	}
	testutil.WaitFor(t, 10*time.Second, func() error {
		if n := coordMsgs() - before; n < 1 {
			return fmt.Errorf("the coordinator has %d messages of node%d's round, want 1 before its last rank publishes", n, node)
		}
		return nil
	})
	add("late", first+3)
	wg.Wait()
	for r, err := range errs {
		if err != nil {
			t.Fatalf("rank %d: %v", r, err)
		}
	}
	if got := coordMsgs() - before; got != 2 {
		t.Errorf("node%d sent the coordinator %d messages in a round whose last rank was late, want 2", node, got)
	}
	readAllRanks(t, c, "late", 36, 16)
}

// TestClusterRoundManifestWrites: an Add writes each node's manifest
// once — the coordinator's too, whose state (the round's table) and own
// shards one write holds — however many of its requests and ranks ask for
// the save as the round completes.
func TestClusterRoundManifestWrites(t *testing.T) {
	c := startCluster(t, []int{4, 4}, viaRendezvous)
	rows := []int64{1, 2, 3, 4, 5, 6, 7, 8}
	c.addPattern(t, "warm", rows, 2, 8) // the other node joins the coordinator
	writes := func() []int {
		n := make([]int, len(c.agents))
		for i, a := range c.agents {
			in, err := ddstore.QueryAgent(a.Socket(), c.ns, fmt.Sprintf("node%d", i))
			if err != nil {
				t.Fatal(err)
			}
			n[i] = in.Counters["manifest_writes"]
		}
		return n
	}
	for _, name := range []string{"x", "y", "z"} {
		before := writes()
		c.addPattern(t, name, rows, 2, 8)
		after := writes()
		for i := range after {
			if got := after[i] - before[i]; got != 1 {
				t.Errorf("Add of %q: node%d wrote its manifest %d times, want 1", name, i, got)
			}
		}
	}
	readAllRanks(t, c, "z", 36, 16)
}

// coordinatorMessages finds the agent that coordinates c (whichever took
// the rendezvous: under mpirun, any of them) and returns its index and a
// reader of the messages it has received (coord_messages_in).
func (c *cluster) coordinatorMessages(t *testing.T) (int, func() int) {
	t.Helper()
	coord := -1
	for i, a := range c.agents {
		in, err := ddstore.QueryAgent(a.Socket(), c.ns, fmt.Sprintf("node%d", i))
		if err != nil {
			t.Fatal(err)
		}
		if in.Coordinator {
			coord = i
		}
	}
	if coord < 0 {
		t.Fatal("no agent coordinates")
	}
	return coord, func() int {
		in, err := ddstore.QueryAgent(c.agents[coord].Socket(), c.ns, fmt.Sprintf("node%d", coord))
		if err != nil {
			t.Fatal(err)
		}
		return in.Counters["coord_messages_in"]
	}
}

// TestClusterFreeGather: a node's ranks' frees of a variable go to the
// coordinator in one PeerFrees once all of them are in: with the drop the
// last free makes (its answer counted), two messages in from the other
// node per Free; when its last rank is late, the others' frees go after
// the hold, and it alone after: three.
func TestClusterFreeGather(t *testing.T) {
	c := startCluster(t, []int{4, 4}, viaRendezvous)
	coord, coordMsgs := c.coordinatorMessages(t)
	node := 1 - coord
	last := 4*node + 3
	rows := []int64{1, 2, 3, 4, 5, 6, 7, 8}
	for _, name := range []string{"all", "late"} {
		c.addPattern(t, name, rows, 2, 8)
		readAllRanks(t, c, name, 36, 16)
	}
	free := func(name string, skip int) []error {
		return c.each(func(r int, s *ddstore.Store) error {
			if r == skip {
				return nil
			}
			return s.Free(name)
		})
	}
	check := func(errs []error) {
		t.Helper()
		for r, err := range errs {
			if err != nil {
				t.Fatalf("rank %d: %v", r, err)
			}
		}
	}

	before := coordMsgs()
	check(free("all", -1))
	if got := coordMsgs() - before; got != 2 {
		t.Errorf("the coordinator got %d messages of a Free by every rank, want 2 (node%d's frees in one batch, its drop's answer)", got, node)
	}

	before = coordMsgs()
	check(free("late", last))
	if got := coordMsgs() - before; got != 1 {
		t.Errorf("the coordinator got %d messages of a Free before node%d's last rank's, want 1 (its other ranks' frees, after the hold)", got, node)
	}
	check([]error{c.stores[last].Free("late")})
	if got := coordMsgs() - before; got != 3 {
		t.Errorf("the coordinator got %d messages of a Free whose last rank was late, want 3", got)
	}
	// Freed everywhere: the names can be added again.
	c.addPattern(t, "late", rows, 2, 8)
	readAllRanks(t, c, "late", 36, 16)
}

// TestClusterRoundGatherTree: with a relay fanout of 2, the four nodes
// other than the coordinator's form a gather tree of two relays of one
// child each (the drop tree's chunks, over the last table's nodes): from
// the second Add on, the coordinator receives the relays' two requests
// per round, each carrying its child's shards, instead of four. Then a
// relay whose own ranks are not in the round stops while its child's
// request waits there: every other rank's Add fails, naming the relay's
// node, rather than wait.
func TestClusterRoundGatherTree(t *testing.T) {
	if clusterTransport == "mpi" {
		t.Skip("the mpirun agents take their flags, not this Config")
	}
	c := startCluster(t, []int{2, 2, 2, 2, 2}, viaRendezvous, func(cfg *agent.Config) { cfg.RelayFanout = 2 })
	coord, coordMsgs := c.coordinatorMessages(t)
	rows := []int64{1, 2, 3, 4, 5, 6, 7, 8, 9, 10}
	c.addPattern(t, "warm", rows, 2, 8) // every node joins; the tree is this table's
	counter := func(i int, name string) int {
		in, err := ddstore.QueryAgent(c.agents[i].Socket(), c.ns, fmt.Sprintf("node%d", i))
		if err != nil {
			t.Fatal(err)
		}
		return in.Counters[name]
	}
	relayed := func() (n int) {
		for i := range c.agents {
			if i != coord {
				n += counter(i, "gathers_relayed")
			}
		}
		return n
	}
	for _, name := range []string{"up", "up2"} {
		before, rel := coordMsgs(), relayed()
		c.addPattern(t, name, rows, 2, 8)
		if got := coordMsgs() - before; got != 2 {
			t.Errorf("Add of %q: the coordinator received %d messages, want 2 (one from each relay, its child's shards in it)", name, got)
		}
		if got := relayed() - rel; got != 2 {
			t.Errorf("Add of %q: the relays carried %d children's requests, want 2", name, got)
		}
		readAllRanks(t, c, name, 55, 16)
	}

	// A rank of the coordinator's node declares another geometry: the
	// round's error reaches every rank, those whose shards a relay
	// carried too, the same from both.
	bad := 2 * coord
	errs := c.each(func(r int, s *ddstore.Store) error {
		disp := int64(2)
		if r == bad {
			disp = 1
		}
		return s.Add("bad", make([]byte, 16*rows[r]), disp, 8)
	})
	for r, err := range errs {
		msg := ""
		if err != nil {
			msg = err.Error()
		}
		// Whichever shard the coordinator had first: "rank B has rows of
		// disp 1 ... but rank K has disp 2", or "rank K ... but rank B has disp 1".
		if !errors.Is(err, ddstore.ErrGeometry) || !strings.Contains(msg, fmt.Sprintf("rank %d has rows of disp 1", bad)) && !strings.Contains(msg, fmt.Sprintf("rank %d has disp 1", bad)) {
			t.Errorf("rank %d (node%d) in a round of a bad rank: %v, want the round's ErrGeometry naming rank %d", r, r/2, err, bad)
		}
	}

	// Node order is rank order: the first node of the others relays the
	// second.
	others := make([]int, 0, 4)
	for i := range c.agents {
		if i != coord {
			others = append(others, i)
		}
	}
	relay := others[0]
	errs = make([]error, len(c.stores))
	var wg sync.WaitGroup
	add := func(name string, r int) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[r] = addRankPattern(c, name, rows, r)
		}()
	}
	// waitRound waits up to within for the coordinator's round of name
	// to be as ok says of its record (want: what is awaited).
	waitRound := func(name string, within time.Duration, want string, ok func(col wire.AgentCollective) bool) {
		t.Helper()
		testutil.WaitFor(t, within, func() error {
			in, err := ddstore.QueryAgent(c.agents[coord].Socket(), c.ns, fmt.Sprintf("node%d", coord))
			if err != nil {
				return err
			}
			for _, col := range in.Collectives {
				if col.Name == name && ok(col) {
					return nil
				}
			}
			return fmt.Errorf("the coordinator's collectives: %+v, want %s of %q", in.Collectives, want, name)
		})
	}
	// failedNaming waits for the ranks' Adds (wg) to end, each but those
	// skip leaves out failed with an error naming the node of agent lost.
	failedNaming := func(lost int, skip func(r int) bool) {
		t.Helper()
		done := make(chan struct{})
		go func() { wg.Wait(); close(done) }()
		testutil.WaitFor(t, 60*time.Second, func() error {
			select {
			case <-done:
				return nil
			default:
				return fmt.Errorf("ranks still wait in the round their relay left")
			}
		})
		want := fmt.Sprintf("node%d", lost)
		for r, err := range errs {
			if skip(r) {
				continue
			}
			if err == nil || !strings.Contains(err.Error(), want) {
				t.Errorf("rank %d (node%d): %v, want an error naming %s", r, r/2, err, want)
			}
		}
	}

	// The relay's own ranks late: once the hold has passed, its child is
	// told to send its request to the coordinator itself; the relay's
	// goes when its ranks come, and the round completes: three messages.
	before := coordMsgs()
	for r := range c.stores {
		if r/2 != relay {
			add("late", r)
		}
	}
	waitRound("late", 10*time.Second, "8 ranks (the relay's child's among them)", func(col wire.AgentCollective) bool { return len(col.Ranks) >= 8 })
	add("late", 2*relay)
	add("late", 2*relay+1)
	wg.Wait()
	for r, err := range errs {
		if err != nil {
			t.Fatalf("rank %d: %v", r, err)
		}
	}
	if got := coordMsgs() - before; got != 3 {
		t.Errorf("the coordinator received %d messages in a round whose relay's ranks were late, want 3", got)
	}
	readAllRanks(t, c, "late", 55, 16)

	errs = make([]error, len(c.stores))
	for r := range c.stores {
		if r/2 == relay {
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[r] = c.stores[r].Add("cut", make([]byte, 16*rows[r]), 2, 8)
		}()
	}
	// The coordinator holds the ranks of its own node and of the other
	// relay's subtree; the relay's child waits at the relay.
	waitRound("cut", 10*time.Second, "6 ranks", func(col wire.AgentCollective) bool { return len(col.Ranks) >= 6 })
	c.agents[relay].Close()
	failedNaming(relay, func(r int) bool { return r/2 == relay })

	// The other relay stops once its request, its child's shards in it,
	// is at the coordinator, whose own second rank is late: the round
	// fails, naming the relay's node, for every rank left — the child's
	// too, whose request the relay no longer answers.
	relay = others[2]
	late := 2*coord + 1
	errs = make([]error, len(c.stores))
	for r := range c.stores {
		if r/2 == others[0] || r == late {
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[r] = c.stores[r].Add("cut2", make([]byte, 16*rows[r]), 2, 8)
		}()
	}
	waitRound("cut2", 10*time.Second, fmt.Sprintf("node%d's and node%d's ranks", relay, others[3]), func(col wire.AgentCollective) bool {
		return slices.Contains(col.Ranks, int64(2*relay)) && slices.Contains(col.Ranks, int64(2*others[3]))
	})
	c.agents[relay].Close()
	waitRound("cut2", 60*time.Second, "a failed round", func(col wire.AgentCollective) bool { return col.Error != "" })
	wg.Add(1)
	go func() {
		defer wg.Done()
		errs[late] = c.stores[late].Add("cut2", make([]byte, 16*rows[late]), 2, 8)
	}()
	failedNaming(relay, func(r int) bool { return r/2 == others[0] || r/2 == relay })
}

// addRankPattern adds rank r's shard of name, rows[r] = r+1 rows of 16
// bytes (disp 2, itemsize 8) in pattern, as addPattern would.
func addRankPattern(c *cluster, name string, rows []int64, r int) error {
	buf := make([]byte, 16*rows[r])
	for i := range rows[r] {
		pattern(buf[16*i:16*(i+1)], int64(r*(r+1)/2)+i)
	}
	return c.stores[r].Add(name, buf, 2, 8)
}

// TestClusterRoundGatherLate: with a relay fanout of 2, the six nodes
// other than the coordinator's form a gather tree of two relays of two
// children each. A relay's children whose requests come after it sent
// its own up are carried up together in a second request of the same
// round, not each sent to the coordinator by itself; and a relay whose
// own ranks are not in the round yet carries its children's shards up
// without its own: three messages at the coordinator, not four, and no
// request goes direct.
func TestClusterRoundGatherLate(t *testing.T) {
	if clusterTransport == "mpi" {
		t.Skip("the mpirun agents take their flags, not this Config")
	}
	c := startCluster(t, []int{2, 2, 2, 2, 2, 2, 2}, viaRendezvous, func(cfg *agent.Config) { cfg.RelayFanout = 2 })
	coord, coordMsgs := c.coordinatorMessages(t)
	rows := []int64{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14}
	const total = 105
	c.addPattern(t, "warm", rows, 2, 8) // every node joins; the tree is this table's
	counters := func(name string) (n int) {
		for i := range c.agents {
			if i == coord {
				continue
			}
			in, err := ddstore.QueryAgent(c.agents[i].Socket(), c.ns, fmt.Sprintf("node%d", i))
			if err != nil {
				t.Fatal(err)
			}
			n += in.Counters[name]
		}
		return n
	}
	// Node order is rank order: the first of the others relays the next
	// two, the fourth the last two.
	others := make([]int, 0, 6)
	for i := range c.agents {
		if i != coord {
			others = append(others, i)
		}
	}
	relay, children := others[0], others[1:3]
	errs := make([]error, len(c.stores))
	var wg sync.WaitGroup
	add := func(name string, node int) {
		for r := 2 * node; r < 2*node+2; r++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				errs[r] = addRankPattern(c, name, rows, r)
			}()
		}
	}
	// round runs an Add of name whose late nodes start once the
	// coordinator has received sent messages, and checks what it
	// received in all and that no request went to it direct.
	round := func(name string, late []int, sent, want int, what string) {
		t.Helper()
		before, direct, relayed := coordMsgs(), counters("gathers_direct"), counters("gathers_relayed")
		errs = make([]error, len(c.stores))
		for i := range c.agents {
			if !slices.Contains(late, i) {
				add(name, i)
			}
		}
		testutil.WaitFor(t, 30*time.Second, func() error {
			if got := coordMsgs() - before; got < sent {
				return fmt.Errorf("the coordinator received %d messages of %q, want %d before the late nodes start", got, name, sent)
			}
			return nil
		})
		for _, i := range late {
			add(name, i)
		}
		wg.Wait()
		for r, err := range errs {
			if err != nil {
				t.Fatalf("%s: rank %d: %v", what, r, err)
			}
		}
		if got := coordMsgs() - before; got != want {
			t.Errorf("%s: the coordinator received %d messages, want %d", what, got, want)
		}
		if got := counters("gathers_direct") - direct; got != 0 {
			t.Errorf("%s: %d requests went to the coordinator direct, want none (the relays carry them)", what, got)
		}
		if got := counters("gathers_relayed") - relayed; got != 4 {
			t.Errorf("%s: the relays carried %d children's requests, want 4", what, got)
		}
		readAllRanks(t, c, name, total, 16)
	}
	round("up", nil, 0, 2, "every node in time")
	// The relay's children start once both relays' requests are at the
	// coordinator: the first relay sends theirs in a second request.
	round("late", children, 2, 3, "a relay's children late")
	// The relay's own ranks start once its children's shards and the
	// other relay's are at the coordinator.
	round("own", []int{relay}, 2, 3, "a relay's own ranks late")
}

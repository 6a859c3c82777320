package agent

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/ddstore-go/ddstore/internal/shm"
	"github.com/ddstore-go/ddstore/internal/testutil"
	"github.com/ddstore-go/ddstore/internal/wire"
)

// waitGone polls until the agent holds no segment and no variable.
func waitGone(t *testing.T, a *Agent, what string) {
	t.Helper()
	testutil.WaitFor(t, 5*time.Second, func() error {
		segs, in := segmentsOf(t, a), a.info()
		if len(segs) != 0 || len(in.Variables) != 0 || a.shardBytes.Load() != 0 {
			return fmt.Errorf("%s: segments %v, variables %+v, %d shard bytes charged", what, segs, in.Variables, a.shardBytes.Load())
		}
		return nil
	})
}

// A client process that dies between Create and Publish leaves nothing: the
// shard goes with its last connection (all connections here are of this
// test's process, as a client's lanes are of one process), the budget is
// given back, and the name can be created again.
func TestAgentReclaimsUnpublishedShard(t *testing.T) {
	a := startAgent(t, Config{MemoryBytes: 1 << 20})
	r1, r2 := dialRaw(t, a), dialRaw(t, a)
	r1.hello(a, 0, 1)
	r2.hello(a, 0, 1)
	sh := shardOf("v", 512)
	r1.must(wire.OpCreate, sh.Encode)
	r1.c.Close()
	// Another connection of the process remains: the shard is still its.
	waitClients(t, a, 1)
	if segs := segmentsOf(t, a); len(segs) != 1 {
		t.Fatalf("segments with a connection of the creator open: %v", segs)
	}
	r2.c.Close()
	waitGone(t, a, "after the creator's last connection closed")

	r3 := dialRaw(t, a)
	r3.hello(a, 0, 1)
	sh.Attempt = 2
	addShard(t, r3, sh)
	if in := r3.info(); len(in.Variables) != 1 || !in.Variables[0].Published {
		t.Fatalf("the name created again: %+v", in.Variables)
	}
	// Published, the variable is the job's: it outlives its creator.
	r3.c.Close()
	waitClients(t, a, 0)
	r4 := dialRaw(t, a)
	r4.hello(a, 0, 1)
	if in := r4.info(); len(in.Variables) != 1 {
		t.Fatalf("a published variable went with its creator: %+v", in.Variables)
	}
}

// A shard whose Publish waits for other ranks when its creator goes is left
// to the round; the creator closing the connection that waits fails the
// round at once (not at its timeout, 5 minutes here), which takes the
// shard back.
func TestAgentKeepsShardBeingPublished(t *testing.T) {
	a := startAgent(t, Config{})
	r := dialRaw(t, a)
	r.hello(a, 1, 2)
	sh := wire.Shard{Name: "p", Rank: 1, Size: 2, Rows: 4, Disp: 8, ItemSize: 8, TimeoutMs: 300000, Attempt: 1}
	r.must(wire.OpCreate, sh.Encode)
	publishPending(t, a, r, sh)
	if segs := segmentsOf(t, a); len(segs) != 1 {
		t.Fatalf("segments while the round waits: %v", segs)
	}
	r.c.Close()
	waitGone(t, a, "after its creator closed the connection its Publish waited on")
	// The round failed for every rank, naming the one that went (a new
	// job's processes start afresh there: TestClusterRankKilledMidCollective).
	cs := a.coord.Load().collectives()
	if len(cs) != 1 || cs[0].Name != "p" || !strings.Contains(cs[0].Error, "rank 1 went away") {
		t.Fatalf("the coordinator's collectives: %+v, want the failed round of p naming rank 1", cs)
	}
}

// TestAgentFreesGoneOwnersScopedVariables: a store-scoped variable
// (NAME@s<12 hex>) goes once the process that published its shards has no
// connection left; a variable of the namespace's scope stays.
func TestAgentFreesGoneOwnersScopedVariables(t *testing.T) {
	a := startAgent(t, Config{})
	r := dialRaw(t, a)
	r.hello(a, 0, 1)
	for _, name := range []string{"x@s0123456789ab", "y", "z@s0123456789ab@r0"} {
		sh := wire.Shard{Name: name, Rank: 0, Size: 1, Rows: 4, Disp: 2, ItemSize: 4, TimeoutMs: 5000, Attempt: 1, Dtype: "int32"}
		p, err := wire.DecodePath(r.must(wire.OpCreate, sh.Encode))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { shm.Remove(p.Path) })
		r.must(wire.OpPublish, sh.Encode)
	}
	names := func() []string {
		var out []string
		for _, v := range a.info().Variables {
			out = append(out, v.Name)
		}
		return out
	}
	if got := names(); len(got) != 3 {
		t.Fatalf("variables before the client goes: %v", got)
	}
	r.c.Close()
	testutil.WaitFor(t, 10*time.Second, func() error {
		if got := names(); len(got) != 1 || got[0] != "y" {
			return fmt.Errorf("variables after the client went: %v, want [y]", got)
		}
		return nil
	})
}

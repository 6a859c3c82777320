package coord

import (
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/ddstore-go/ddstore/internal/base"
	"github.com/ddstore-go/ddstore/internal/wire"
)

// Client processes going away (Gone) and ranks giving up (Leave), on the
// injected clock: no time passes in these tests unless they advance it,
// so a reply here comes at once or never.

// of is sh sent by client process client.
func of(sh wire.Shard, client uint64) wire.Shard {
	sh.Client = client
	return sh
}

// barrierOf sends rank's arrival at fence seq of key (group of size), sent
// by client, with a long deadline; its request.
func (r *run) barrierOf(key string, seq, rank, size int64, client uint64) uint64 {
	r.t.Helper()
	r.next++
	r.take(r.c.Barrier(r.now, r.next, wire.Barrier{Key: key, Rank: rank, Size: size, Seq: seq, Client: client}, r.now.Add(longWait)))
	return r.next
}

func (r *run) gone(client uint64, rank, size int64) {
	r.t.Helper()
	r.take(r.c.Gone(r.now, wire.Gone{Node: "b", Client: client, Pid: 77, Rank: rank, Size: size}))
}

// A process killed while it waits in a round fails the round for the
// others at once, naming its rank, process and node.
func TestGoneWhileWaiting(t *testing.T) {
	r := newRun(t)
	q0 := r.publish(of(shard("v", 0, 3, "a"), 10), longWait)
	q1 := r.publish(of(shard("v", 1, 3, "b"), 11), longWait)
	r.gone(11, 1, 3)
	for _, q := range []uint64{q0, q1} {
		checkErr(t, "a rank of the round", r.mustReply(q, "a rank of the round").Err, base.ErrPeer,
			[]string{`variable "v"`, "rank 1 (process 77 on node \"b\")", "went away"})
	}
	// What Info shows of it, and of a fence waiting.
	r.barrierOf("", 4, 0, 3, 10)
	got := r.c.Collectives()
	if len(got) != 2 || got[0].Kind != "fence" || got[0].Seq != 4 || !slices.Equal(got[0].Ranks, []int64{0}) || got[0].Error != "" ||
		got[1].Kind != "publish" || got[1].Name != "v" || got[1].Seq != 1 || got[1].Size != 3 ||
		!slices.Equal(got[1].Ranks, []int64{0, 1}) || !strings.Contains(got[1].Error, "rank 1 (process 77") {
		t.Fatalf("Collectives: %+v", got)
	}
	// Rank 0's process lives: the failed round still answers the job's
	// late rank with its error.
	q2 := r.publish(of(shard("v", 2, 3, "c"), 12), longWait)
	checkErr(t, "the late rank", r.mustReply(q2, "the late rank").Err, base.ErrPeer, []string{"rank 1 (process 77"})
}

// A process that goes before it reaches a round of its group fails it
// too: known as the group's rank from an earlier collective (a fence
// here, a round of a replica group), or, for the whole job, by the world
// rank it said hello with.
func TestGoneBeforeItCame(t *testing.T) {
	t.Run("member of the group", func(t *testing.T) {
		r := newRun(t)
		sh := func(name string, rank int64, client uint64) wire.Shard {
			s := of(shard(name+"@r2", rank, 2, "a"), client)
			s.Group = "@r2"
			return s
		}
		r.publishAll([]wire.Shard{sh("first", 0, 20), sh("first", 1, 21)})
		q := r.publish(sh("second", 0, 20), longWait)
		f := r.barrierOf("@r2", 1, 0, 2, 20)
		other := r.barrierOf("@r0", 1, 0, 2, 30) // another group: untouched
		r.gone(21, -1, 0)                        // rank 1 of @r2, not the world's
		checkErr(t, "the round of its group", r.mustReply(q, "round").Err, base.ErrPeer, []string{`"second@r2"`, "rank 1 (process 77"})
		checkErr(t, "the fence of its group", r.mustReply(f, "fence").Err, base.ErrPeer, []string{`fence 1 of group "@r2"`, "rank 1 (process 77"})
		if _, ok := r.reply(other); ok {
			t.Fatal("a fence of another group failed with the process")
		}
	})
	t.Run("world rank of its hello", func(t *testing.T) {
		r := newRun(t)
		q := r.publish(of(shard("v", 0, 2, "a"), 10), longWait)
		f := r.barrierOf("", 1, 0, 2, 10)
		bigger := r.publish(of(shard("w", 0, 3, "a"), 10), longWait) // a world of 3: another job's
		r.gone(11, 1, 2)
		checkErr(t, "the round", r.mustReply(q, "round").Err, base.ErrPeer, []string{`variable "v"`, "rank 1"})
		checkErr(t, "the fence", r.mustReply(f, "fence").Err, base.ErrPeer, []string{"fence 1", "rank 1"})
		if _, ok := r.reply(bigger); ok {
			t.Fatal("a round of another world size failed with the process")
		}
	})
	t.Run("a process of no collective", func(t *testing.T) {
		r := newRun(t)
		q := r.publish(of(shard("v", 0, 2, "a"), 10), longWait)
		r.gone(0, 1, 2)   // no number: nothing known of it
		r.gone(12, -1, 0) // a reader
		if _, ok := r.reply(q); ok {
			t.Fatal("a round failed with a process that was none of its ranks")
		}
	})
}

// A job started right after one that died never meets the dead job's
// round or fence: once no process that came to a failed one lives, it
// answers only a late rank of its own job (a process known as that rank
// from an earlier collective) with its error; the new job's ranks (new
// processes), well within LateGrace, start afresh and succeed.
func TestNewJobNeverMeetsADeadJobsRound(t *testing.T) {
	r := newRun(t)
	// The job: ranks 0, 1, 2 (processes 10, 11, 12) met at fence 1.
	for k := range int64(3) {
		r.barrierOf("", 1, k, 3, 10+uint64(k))
	}
	q0 := r.publish(of(shard("v", 0, 3, "a"), 10), longWait)
	f0 := r.barrierOf("", 2, 0, 3, 10)
	r.gone(12, 2, 3) // rank 2 killed before it came
	for _, q := range []uint64{q0, f0} {
		if x := r.mustReply(q, "rank 0"); !errors.Is(x.Err, base.ErrPeer) {
			t.Fatalf("rank 0: %v, want ErrPeer", x.Err)
		}
	}
	r.advance(time.Second)
	r.gone(10, 0, 3) // rank 0 exits on its error
	// Rank 1 of the job, late, alive: it gets the error at once, though
	// every process that came has gone.
	late := r.barrierOf("", 2, 1, 3, 11)
	checkErr(t, "the job's late rank", r.mustReply(late, "the job's late rank").Err, base.ErrPeer, []string{"rank 2 (process 77"})
	r.gone(11, 1, 3)
	r.advance(time.Second) // the new job starts at once: far within LateGrace
	var sh []wire.Shard
	for k := range int64(3) {
		sh = append(sh, of(shard("v", k, 3, "b"), 20+uint64(k)))
	}
	for i, x := range r.publishAll(sh) {
		if x.Err != nil || x.Table == nil {
			t.Fatalf("rank %d of the new job: %+v", i, x)
		}
	}
	for seq := int64(1); seq <= 2; seq++ {
		var qs []uint64
		for k := range int64(3) {
			qs = append(qs, r.barrierOf("", seq, k, 3, 20+uint64(k)))
		}
		for _, q := range qs {
			if x := r.mustReply(q, "the new job's fence"); x.Err != nil {
				t.Fatalf("the new job's fence %d: %v", seq, x.Err)
			}
		}
	}
}

// A round that timed out, its processes gone (the job's survivors exiting
// on the timeout), is a new job's to start afresh, not only LateGrace
// later; and it is forgotten LateGrace later.
func TestTimedOutRoundForgottenWithItsProcesses(t *testing.T) {
	r := newRun(t)
	q := r.publish(of(shard("v", 0, 2, "a"), 10), 20*time.Millisecond)
	r.advance(20 * time.Millisecond)
	if x := r.mustReply(q, "rank 0"); !errors.Is(x.Err, base.ErrTimeout) {
		t.Fatalf("rank 0: %v, want ErrTimeout", x.Err)
	}
	r.gone(10, 0, 2)
	n1 := r.publish(of(shard("v", 1, 2, "b"), 21), longWait)
	if x, ok := r.reply(n1); ok {
		t.Fatalf("a new job's rank got a reply at once: %+v (the dead job's error?)", x)
	}
	n0 := r.publish(of(shard("v", 0, 2, "a"), 20), longWait)
	for _, q := range []uint64{n0, n1} {
		if x := r.mustReply(q, "the new job"); x.Err != nil {
			t.Fatalf("the new job: %v", x.Err)
		}
	}
	q = r.publish(of(shard("w", 0, 2, "a"), 30), 20*time.Millisecond)
	r.advance(20 * time.Millisecond)
	r.gone(30, 0, 2)
	r.advance(r.c.LateGrace + time.Millisecond)
	r.publishAll([]wire.Shard{of(shard("other", 0, 1, "a"), 40)})
	if n := r.c.Rounds(); n != 0 {
		t.Fatalf("%d rounds pending LateGrace after, want 0", n)
	}
}

// A rank whose client gave up on its wait (closed the connection) fails
// its round or fence for the others at once, with the driver's words.
func TestLeave(t *testing.T) {
	r2 := newRun(t)
	a := r2.publish(of(shard("v", 0, 3, "a"), 10), longWait)
	b := r2.publish(of(shard("v", 2, 3, "c"), 12), longWait)
	f0 := r2.barrierOf("", 1, 0, 2, 10)
	f1 := r2.barrierOf("", 2, 1, 2, 11) // waits for fence 2
	r2.take(r2.c.Leave(r2.now, b, base.ErrPeer, "closed its connection"))
	for _, q := range []uint64{a, b} {
		checkErr(t, "a rank", r2.mustReply(q, "a rank").Err, base.ErrPeer, []string{`variable "v": rank 2 closed its connection`})
	}
	r2.take(r2.c.Leave(r2.now, f1, base.ErrPeer, "closed its connection"))
	checkErr(t, "fence 2", r2.mustReply(f1, "fence 2").Err, base.ErrPeer, []string{"fence 2: rank 1 closed its connection"})
	if _, ok := r2.reply(f0); ok {
		t.Fatal("fence 1 answered by fence 2's rank leaving")
	}
	r2.take(r2.c.Leave(r2.now, 999, base.ErrPeer, "x")) // waits for nothing: nothing happens
}

// A rank of the job whose first collective it is, late: its peers failed
// the round (one could not make its shard) and exited before it came, so
// no process of the round lives and none knew it as a rank. It was
// connected before they went (its age says so): of the job, it gets the
// round's error at once, rather than wait in a round of its own. A
// process that connected after they went is a new job's, and starts
// afresh.
func TestLateRankOfAFirstRoundWhosePeersWent(t *testing.T) {
	for _, kind := range []string{"publish", "fence"} {
		t.Run(kind, func(t *testing.T) {
			r := newRun(t)
			var q uint64
			if kind == "publish" {
				bad := of(shard("v", 1, 2, "b"), 11)
				bad.Failed = true
				q = r.publish(bad, longWait)
			} else {
				q = r.barrierOf("", 1, 1, 2, 11)
				r.advance(longWait) // it times out
			}
			if x := r.mustReply(q, "rank 1"); x.Err == nil {
				t.Fatal("rank 1's collective did not fail")
			}
			r.gone(11, 1, 2)
			r.advance(2 * time.Second)
			arrive := func(rank int64, client uint64, age time.Duration) uint64 {
				if kind == "publish" {
					sh := of(shard("v", rank, 2, "a"), client)
					sh.ClientAgeMs = age.Milliseconds()
					return r.publish(sh, longWait)
				}
				r.next++
				r.take(r.c.Barrier(r.now, r.next, wire.Barrier{Rank: rank, Size: 2, Seq: 1, Client: client, ClientAgeMs: age.Milliseconds()}, r.now.Add(longWait)))
				return r.next
			}
			late := arrive(0, 10, 5*time.Second) // connected 3 s before rank 1 went
			if x := r.mustReply(late, "the job's late rank 0"); x.Err == nil {
				t.Fatal("the job's late rank 0 passed")
			}
			n0 := arrive(0, 20, time.Second) // connected 1 s after: a new job's
			if x, ok := r.reply(n0); ok {
				t.Fatalf("a new job's rank 0 answered at once: %+v", x)
			}
			n1 := arrive(1, 21, time.Second)
			for _, q := range []uint64{n0, n1} {
				if x := r.mustReply(q, "the new job"); x.Err != nil {
					t.Fatalf("the new job: %v", x.Err)
				}
			}
		})
	}
}

// A node's agent that goes (NodeGone) fails at once every collective
// waiting on a rank of the node — its shard in, or a process of the node
// known as one of its ranks that has not come yet — naming the rank and
// the node; collectives of other nodes' ranks go on; and a restarted
// agent of the node joins again and its ranks' rounds complete.
func TestNodeGone(t *testing.T) {
	r := newRun(t)
	for _, n := range []string{"a", "b", "c"} {
		r.c.Join(n, n+":1")
	}
	grouped := func(sh wire.Shard, group string) wire.Shard { sh.Group = group; return sh }
	// v: rank 1 of node b is in, rank 2 missing.
	v0 := r.publish(of(shard("v", 0, 3, "a"), 10), longWait)
	v1 := r.publish(of(shard("v", 1, 3, "b"), 11), longWait)
	// w: rank 1, known (from v) as node b's process 11, has not come.
	w0 := r.publish(of(shard("w", 0, 3, "a"), 10), longWait)
	// A fence rank 1 has not reached.
	f0 := r.barrierOf("", 1, 0, 3, 10)
	// z: another group's round, of nodes a and c only.
	z0 := r.publish(of(grouped(shard("z", 0, 2, "a"), "g2"), 20), longWait)
	r.take(r.c.NodeGone(r.now, "b", "killed, say"))
	for _, c := range []struct {
		req  uint64
		what string
	}{{v0, `variable "v"`}, {v1, `variable "v"`}, {w0, `variable "w"`}, {f0, "fence 1"}} {
		checkErr(t, c.what, r.mustReply(c.req, c.what).Err, base.ErrPeer,
			[]string{c.what, "rank 1 is out of it", `node "b"`, "killed, say"})
	}
	if _, ok := r.reply(z0); ok {
		t.Fatal("a round of other nodes' ranks failed with node b")
	}
	// The node's process is gone: nothing more fails with the node.
	r.take(r.c.NodeGone(r.now, "b", "again"))
	if _, ok := r.reply(z0); ok {
		t.Fatal("a round of other nodes' ranks failed when node b went again")
	}
	z1 := r.publish(of(grouped(shard("z", 1, 2, "c"), "g2"), 21), longWait)
	for _, q := range []uint64{z0, z1} {
		if x := r.mustReply(q, "a rank of z"); x.Err != nil {
			t.Fatalf("round z: %v", x.Err)
		}
	}
	// The node's agent, restarted on a new port, joins; a new round of its
	// ranks (a new name) completes and points at the new address.
	r.c.Join("b", "b:2")
	var reqs []uint64
	for k, n := range []string{"a", "b", "c"} {
		reqs = append(reqs, r.publish(of(shard("u", int64(k), 3, n), uint64(30+k)), longWait))
	}
	for _, q := range reqs {
		x := r.mustReply(q, "a rank of u")
		if x.Err != nil {
			t.Fatalf("round u after the node came back: %v", x.Err)
		}
		if i := slices.Index(x.Table.Nodes, "b"); i < 0 || x.Table.Addrs[i] != "b:2" {
			t.Fatalf("round u's table: nodes %v at %v, want b at b:2", x.Table.Nodes, x.Table.Addrs)
		}
	}
}

package coord

import (
	"fmt"
	"testing"
	"time"

	"github.com/ddstore-go/ddstore/internal/base"
	"github.com/ddstore-go/ddstore/internal/wire"
)

// The fences (Barrier), driven by hand as the rounds are: ranks arrive in
// the order the test calls Barrier, and time passes only when it advances
// the clock.

// barrier sends rank rank's arrival at fence seq of key in a group of size
// ranks, with a deadline wait from now; its request.
func (r *run) barrier(key string, seq, rank, size int64, wait time.Duration) uint64 {
	r.t.Helper()
	r.next++
	r.take(r.c.Barrier(r.now, r.next, wire.Barrier{Key: key, Rank: rank, Size: size, Seq: seq}, r.now.Add(wait)))
	return r.next
}

// TestFenceAnyOrder: in every order of arrival, no rank passes the fence
// before the last arrives, and then all do, with no error; the fence is
// then gone.
func TestFenceAnyOrder(t *testing.T) {
	for _, order := range permutations(4) {
		r := newRun(t)
		reqs := make([]uint64, len(order))
		for i, k := range order {
			reqs[i] = r.barrier("", 1, int64(k), 4, longWait)
			for j := range i + 1 {
				if _, ok := r.reply(reqs[j]); ok != (i == len(order)-1) {
					t.Fatalf("order %v: after %d arrivals, rank %d answered %v", order, i+1, order[j], ok)
				}
			}
		}
		for i, q := range reqs {
			if x := r.mustReply(q, fmt.Sprintf("rank %d", order[i])); x.Err != nil || x.Table != nil {
				t.Fatalf("order %v: rank %d: %+v", order, order[i], x)
			}
		}
		if r.c.Fences() != 0 {
			t.Fatalf("order %v: %d fences left", order, r.c.Fences())
		}
		if _, ok := r.c.NextDeadline(); ok {
			t.Fatalf("order %v: a request still waits", order)
		}
	}
}

// TestFencesApart: fences of other keys (groups) and other sequence numbers
// never complete one another, and a fence is not a publish round.
func TestFencesApart(t *testing.T) {
	r := newRun(t)
	a0 := r.barrier("@r0", 1, 0, 2, longWait)
	b0 := r.barrier("@r2", 1, 0, 2, longWait)
	a1next := r.barrier("@r0", 2, 1, 2, longWait)
	p := r.publish(shard("v", 0, 2, "a"), longWait)
	for _, q := range []uint64{a0, b0, a1next, p} {
		if _, ok := r.reply(q); ok {
			t.Fatalf("request %d answered by another group's or fence's arrival", q)
		}
	}
	a1 := r.barrier("@r0", 1, 1, 2, longWait)
	for _, q := range []uint64{a0, a1} {
		if x := r.mustReply(q, "group @r0"); x.Err != nil {
			t.Fatal(x.Err)
		}
	}
	if _, ok := r.reply(b0); ok {
		t.Fatal("group @r2 answered by group @r0's fence")
	}
	if r.c.Fences() != 2 || r.c.Rounds() != 1 {
		t.Fatalf("%d fences, %d rounds pending: want 2 and 1", r.c.Fences(), r.c.Rounds())
	}
}

// TestFenceTimeout: a fence whose ranks do not all come fails at the first
// deadline for every rank there, naming the missing ones; a late rank gets
// that error at once for LateGrace, after which the fence is forgotten (a
// rank arriving then waits for a fence of its own).
func TestFenceTimeout(t *testing.T) {
	r := newRun(t)
	q1 := r.barrier("", 1, 1, 4, longWait)
	q3 := r.barrier("", 1, 3, 4, 50*time.Millisecond)
	r.advance(49 * time.Millisecond)
	if _, ok := r.reply(q3); ok {
		t.Fatal("rank 3 answered before its deadline")
	}
	r.advance(time.Millisecond)
	want := []string{"fence 1", "2 of 4 ranks", "missing ranks 0, 2"}
	checkErr(t, "rank 3 (short deadline)", r.mustReply(q3, "rank 3").Err, base.ErrTimeout, want)
	checkErr(t, "rank 1 (waiting)", r.mustReply(q1, "rank 1").Err, base.ErrTimeout, want)
	checkErr(t, "rank 0 (late)", r.mustReply(r.barrier("", 1, 0, 4, longWait), "rank 0").Err, base.ErrTimeout, want)
	r.advance(r.c.LateGrace + time.Millisecond)
	q2 := r.barrier("", 1, 2, 4, longWait)
	if _, ok := r.reply(q2); ok {
		t.Fatal("a rank arriving after LateGrace got the forgotten fence's error")
	}
	// The ranks' next fence meets as usual.
	var next []uint64
	for k := range int64(4) {
		next = append(next, r.barrier("", 2, k, 4, longWait))
	}
	for k, q := range next {
		if x := r.mustReply(q, fmt.Sprintf("rank %d, fence 2", k)); x.Err != nil {
			t.Fatal(x.Err)
		}
	}
}

// TestFenceExpire: a rank whose asker gives up (the agent stops, the
// client's request ends) fails the fence for the ranks waiting with it.
func TestFenceExpire(t *testing.T) {
	r := newRun(t)
	q0 := r.barrier("", 1, 0, 3, longWait)
	q1 := r.barrier("", 1, 1, 3, longWait)
	r.take(r.c.Expire(r.now, q1))
	want := []string{"2 of 3 ranks", "missing ranks 2"}
	checkErr(t, "rank 1 (gave up)", r.mustReply(q1, "rank 1").Err, base.ErrTimeout, want)
	checkErr(t, "rank 0 (waiting)", r.mustReply(q0, "rank 0").Err, base.ErrTimeout, want)
}

// TestFenceDisagreement: ranks that disagree on the group's size, or a rank
// that comes twice, fail the fence for every rank at once; bad arrivals are
// refused alone.
func TestFenceDisagreement(t *testing.T) {
	r := newRun(t)
	q0 := r.barrier("g", 1, 0, 3, longWait)
	q1 := r.barrier("g", 1, 1, 4, longWait)
	want := []string{`fence 1 of group "g"`, "rank 1 says the group has 4 ranks, rank 0 says 3"}
	checkErr(t, "rank 0", r.mustReply(q0, "rank 0").Err, base.ErrArgument, want)
	checkErr(t, "rank 1", r.mustReply(q1, "rank 1").Err, base.ErrArgument, want)
	checkErr(t, "rank 2 (late)", r.mustReply(r.barrier("g", 1, 2, 3, longWait), "rank 2").Err, base.ErrArgument, want)
	if r.c.Fences() != 0 {
		t.Fatalf("%d fences left once every rank came to the failed one", r.c.Fences())
	}

	a := r.barrier("g", 2, 0, 2, longWait)
	b := r.barrier("g", 2, 0, 2, longWait)
	want = []string{"rank 0 reached it twice"}
	checkErr(t, "first", r.mustReply(a, "first").Err, base.ErrArgument, want)
	checkErr(t, "second", r.mustReply(b, "second").Err, base.ErrArgument, want)
	// Nobody else comes: the failed fence is forgotten after LateGrace.
	r.advance(r.c.LateGrace + time.Millisecond)
	r.barrier("other", 1, 0, 2, longWait)
	if r.c.Fences() != 1 {
		t.Fatalf("%d fences: want only the new one", r.c.Fences())
	}

	for _, m := range []wire.Barrier{{Rank: 0, Size: 0, Seq: 1}, {Rank: 2, Size: 2, Seq: 1}, {Rank: -1, Size: 2, Seq: 1}, {Rank: 0, Size: 2, Seq: 0}} {
		r.next++
		out := r.c.Barrier(r.now, r.next, m, r.now.Add(longWait))
		if len(out) != 1 || out[0].Req != r.next {
			t.Fatalf("%+v: replies %+v, want one to its request", m, out)
		}
		checkErr(t, fmt.Sprintf("%+v", m), out[0].Err, base.ErrArgument, []string{"want seq >= 1 and 0 <= rank < ranks"})
	}
}

package transport

// The conformance suite: the promises every Engine keeps, written once
// (testEngine) and run for each engine: TestConformanceTCP here,
// TestConformanceMPI in the ranks of an mpirun launch (mpi_test.go, tag
// mpi), TestConformanceFabric on loopback (fabric_test.go, tag fabric).
//
// A reader engine fetches rows from two owner nodes (confOwner,
// conformance_owner_test.go), which the suite drives with control ops of
// its own over the reader's pool, so that an owner may live in this
// process or in another (an MPI rank) alike.

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"runtime"
	"sort"
	"sync"
	"testing"
	"time"

	"github.com/ddstore-go/ddstore/internal/base"
	"github.com/ddstore-go/ddstore/internal/testutil"
	"github.com/ddstore-go/ddstore/internal/wire"
)

// confGrace is how long a one-sided engine keeps a withdrawn shard mapped:
// long enough that a read right after a withdraw meets the shard still
// mapped (and, for fabric, its region still open).
const confGrace = 5 * time.Second

// confBase is the first row an owner holds: rows below it are on no owner.
const confBase = 10

// confNet is what the suite runs on: a reader engine, its pool (which
// also carries the suite's control ops) and two owner nodes.
type confNet struct {
	reader Engine
	pool   *Pool
	owners [2]string // the owners' addresses
	// specific, if set, runs the engine's own checks while the net is up.
	specific func(t *testing.T)
	// done waits for owners of this process to stop once told to close.
	done func() error
}

// confLocalNet is a confNet whose reader and owners are all in this
// process, each an engine open opens over a pool of its own (or skips the
// test).
func confLocalNet(t *testing.T, open func(*testing.T, *Pool) Engine) confNet {
	t.Helper()
	var n confNet
	var serving []chan error
	for i := range n.owners {
		p := NewPool(Options{})
		o, err := startConfOwner(open(t, p), p)
		if err != nil {
			t.Fatal(err)
		}
		n.owners[i] = o.Addr()
		// A test that ends early (a skip, a failure) stops the owner too.
		t.Cleanup(func() { o.once.Do(func() { close(o.stop) }) })
		ch := make(chan error, 1)
		go func() { ch <- o.serve() }()
		serving = append(serving, ch)
	}
	n.pool = NewPool(Options{})
	n.reader = open(t, n.pool)
	n.done = func() error {
		var errs []error
		for _, ch := range serving {
			select {
			case err := <-ch:
				errs = append(errs, err)
			case <-time.After(time.Minute):
				errs = append(errs, errors.New("an owner node did not stop within a minute of the close op"))
			}
		}
		return errors.Join(errs...)
	}
	return n
}

// call sends a control op of the suite to owner k and decodes its reply
// into reply (nil: none wanted).
func (n *confNet) call(k int, op wire.Op, req, reply any) error {
	b, err := json.Marshal(req)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	body, err := n.pool.Call(ctx, n.owners[k], op, (&wire.Text{Text: string(b)}).Encode)
	if err != nil {
		return err
	}
	m, err := wire.DecodeText(body)
	if err != nil || reply == nil {
		return err
	}
	return json.Unmarshal([]byte(m.Text), reply)
}

func (n *confNet) mustCall(t *testing.T, k int, op wire.Op, req, reply any) {
	t.Helper()
	if err := n.call(k, op, req, reply); err != nil {
		t.Fatalf("owner %d, op %v: %v", k, op, err)
	}
}

// confSpread is a variable spread over both owners: owner 0 holds two
// adjacent shards from confBase, owner 1 one after them.
type confSpread struct {
	name   string
	id, rb int64
	rows   [3]int64 // of each shard
}

func (s confSpread) parts() [2]confVar {
	a, b := int64(confBase), confBase+s.rows[0]
	c := b + s.rows[1]
	return [2]confVar{
		{Name: s.name, ID: s.id, RowBytes: s.rb, Shards: []confShard{{a, s.rows[0]}, {b, s.rows[1]}}},
		{Name: s.name, ID: s.id, RowBytes: s.rb, Shards: []confShard{{c, s.rows[2]}}},
	}
}

func (s confSpread) end() int64 { return confBase + s.rows[0] + s.rows[1] + s.rows[2] }

// owner is the owner node of row g.
func (s confSpread) owner(g int64) int {
	if g < confBase+s.rows[0]+s.rows[1] {
		return 0
	}
	return 1
}

func (n *confNet) publish(t *testing.T, s confSpread) {
	t.Helper()
	for k, v := range s.parts() {
		n.mustCall(t, k, opConfPublish, v, nil)
	}
}

// confDst is a batch's destination: contiguous rows, or rows with a guard
// byte after each, so that a write past a row's end shows.
type confDst struct {
	buf    []byte
	rows   [][]byte
	stride int64
	rb     int64
}

const confGuard = 0xA5

func newConfDst(n int, rb int64, guarded bool) *confDst {
	d := &confDst{rb: rb, stride: rb}
	if guarded {
		d.stride++
	}
	d.buf = bytes.Repeat([]byte{0xEE}, n*int(d.stride))
	for i := range n {
		off := int64(i) * d.stride
		d.rows = append(d.rows, d.buf[off:off+rb:off+rb])
		if guarded {
			d.buf[off+rb] = confGuard
		}
	}
	return d
}

// check says where dst differs from rows globals of variable (name, id).
func (d *confDst) check(name string, id int64, globals []int64) error {
	want := make([]byte, d.rb)
	for i, g := range globals {
		confFill(want, name, id, g)
		if !bytes.Equal(d.rows[i], want) {
			return fmt.Errorf("row %d (position %d) of %q (id %d) read wrong: % x..., want % x...", g, i, name, id, head(d.rows[i]), head(want))
		}
		if d.stride > d.rb && d.buf[int64(i)*d.stride+d.rb] != confGuard {
			return fmt.Errorf("the guard byte after position %d was overwritten", i)
		}
	}
	return nil
}

// untouched says whether nothing was written into dst.
func (d *confDst) untouched() bool {
	for i := range d.rows {
		if !bytes.Equal(d.rows[i], bytes.Repeat([]byte{0xEE}, int(d.rb))) {
			return false
		}
	}
	return true
}

func confFetch(ctx context.Context, e Engine, addr, name string, id int64, globals []int64, dst [][]byte) error {
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	return e.Fetch(ctx, addr, name, id, globals, dst)
}

// spanning fetches a batch of rows of both owners, each owner's part in a
// Fetch of its own, both at once, into one destination.
func (n *confNet) spanning(s confSpread, globals []int64, dst [][]byte) error {
	var part [2][]int64
	var into [2][][]byte
	for i, g := range globals {
		k := s.owner(g)
		part[k], into[k] = append(part[k], g), append(into[k], dst[i])
	}
	var wg sync.WaitGroup
	var errs [2]error
	for k := range part {
		wg.Go(func() {
			errs[k] = confFetch(context.Background(), n.reader, n.owners[k], s.name, s.id, part[k], into[k])
		})
	}
	wg.Wait()
	return errors.Join(errs[:]...)
}

func wantErr(t *testing.T, what string, err, sentinel error) {
	t.Helper()
	if e := testutil.CheckErr(err, sentinel); e != nil {
		t.Errorf("%s: %v", what, e)
	}
}

// testEngine is the conformance suite: kind's engine, opened by open (a
// reader and two owner nodes), keeps every promise of an Engine:
//   - rows: the rows asked for land exactly in dst, in its order, whatever
//     the row size (a byte to a MiB), the batch (in order into contiguous
//     buffers, permuted, repeated, at shard edges, more rows than an iovec
//     holds) and the shard (offsets, two adjacent shards of one owner);
//     a batch spanning both owners, fetched from each at once; no rows;
//   - not held: a variable the node does not hold is ErrUnknown, a row on
//     no shard of the node ErrArgument, and the node answers on after;
//   - concurrent: fetches from many goroutines at once;
//   - freed: a freed table's rows never come back: ErrFreed once its name
//     was taken again (maybe at the same addresses), ErrUnknown once gone;
//   - withdrawn: a withdrawn shard's rows never come back (ErrArgument
//     once the owner no longer lists it, ErrFreed while a window racing
//     the withdraw still does) and the other shards stay readable; an
//     unexposed shard is unmapped at once, an exposed one a grace period
//     later, and every one in the end;
//   - silent: a peer that does not answer fails the fetch with ErrTimeout
//     when its ctx ends, and nothing is written into dst after;
//   - close: a fetch after Close is ErrClosed, Close twice is fine, and no
//     goroutine the net started is left.
func testEngine(t *testing.T, kind string, open func(*testing.T) confNet) {
	goroutines := runtime.NumGoroutine()
	n := open(t)
	ctx := context.Background()
	if n.reader.Kind() != kind {
		t.Errorf("Kind() = %q, want %q", n.reader.Kind(), kind)
	}

	// Row sizes from a byte to a MiB; owner 0's shards are adjacent in
	// the rows (and maybe in memory) but are two exposures.
	sizes := []confSpread{
		{name: "b1", id: 1, rb: 1, rows: [3]int64{1500, 700, 1100}},
		{name: "b3", id: 2, rb: 3, rows: [3]int64{900, 300, 400}},
		{name: "b4k", id: 3, rb: 4096, rows: [3]int64{150, 50, 100}},
		{name: "b65k", id: 4, rb: 65536 + 8, rows: [3]int64{20, 7, 12}},
		{name: "b1m", id: 5, rb: 1 << 20, rows: [3]int64{2, 1, 3}},
	}
	t.Run("rows", func(t *testing.T) {
		for _, s := range sizes {
			n.publish(t, s)
		}
		for _, s := range sizes {
			t.Run(s.name, func(t *testing.T) {
				rng := rand.New(rand.NewPCG(uint64(s.rb), 1))
				own0 := s.rows[0] + s.rows[1]
				// At most 8 MiB a batch.
				most := min(max(1, (8<<20)/s.rb), 4000)
				batches := map[string][]int64{}
				var inOrder, perm, random []int64
				for g := range min(own0, most) {
					inOrder = append(inOrder, confBase+g)
				}
				for _, g := range rng.Perm(int(min(own0, most))) {
					perm = append(perm, confBase+int64(g))
				}
				for range min(2*own0, most) {
					random = append(random, confBase+rng.Int64N(own0))
				}
				batches["in order, contiguous"] = inOrder
				batches["permuted"] = perm
				batches["random with repeats"] = random
				batches["shard edges"] = []int64{confBase + own0 - 1, confBase, confBase + s.rows[0], confBase + s.rows[0] - 1, confBase + own0 - 1}
				for what, globals := range batches {
					dst := newConfDst(len(globals), s.rb, what != "in order, contiguous")
					if err := confFetch(ctx, n.reader, n.owners[0], s.name, s.id, globals, dst.rows); err != nil {
						t.Fatalf("%s: %v", what, err)
					}
					if err := dst.check(s.name, s.id, globals); err != nil {
						t.Fatalf("%s: %v", what, err)
					}
				}
				var span []int64
				for range min(s.end()-confBase, most) {
					span = append(span, confBase+rng.Int64N(s.end()-confBase))
				}
				span = append(span, confBase, s.end()-1)
				dst := newConfDst(len(span), s.rb, true)
				if err := n.spanning(s, span, dst.rows); err != nil {
					t.Fatalf("a batch of both owners: %v", err)
				}
				if err := dst.check(s.name, s.id, span); err != nil {
					t.Fatalf("a batch of both owners: %v", err)
				}
			})
		}
		if err := n.reader.Fetch(ctx, n.owners[0], "b4k", 3, nil, nil); err != nil {
			t.Errorf("a batch of no rows: %v", err)
		}
	})

	t.Run("not held", func(t *testing.T) {
		one := make([][]byte, 1)
		one[0] = make([]byte, 4096)
		n.mustCall(t, 1, opConfPublish, confVar{Name: "only1", ID: 20, RowBytes: 4096, Shards: []confShard{{0, 4}}}, nil)
		err := confFetch(ctx, n.reader, n.owners[0], "only1", 20, []int64{0}, one)
		wantErr(t, "a variable the node does not hold", err, base.ErrUnknown)
		err = confFetch(ctx, n.reader, n.owners[0], "nowhere", 21, []int64{0}, one)
		wantErr(t, "a variable no node holds", err, base.ErrUnknown)
		for _, g := range []int64{confBase - 1, sizes[2].end() - 1, sizes[2].end()} {
			dst := newConfDst(2, 4096, true)
			err := confFetch(ctx, n.reader, n.owners[0], "b4k", 3, []int64{confBase, g}, dst.rows)
			wantErr(t, fmt.Sprintf("row %d, on no shard of the node", g), err, base.ErrArgument)
		}
		// The owner still answers after refusing.
		dst := newConfDst(1, 4096, true)
		if err := confFetch(ctx, n.reader, n.owners[1], "only1", 20, []int64{3}, dst.rows); err != nil {
			t.Fatal(err)
		}
		if err := dst.check("only1", 20, []int64{3}); err != nil {
			t.Fatal(err)
		}
	})

	t.Run("concurrent", func(t *testing.T) {
		var wg sync.WaitGroup
		errs := make([]error, 8)
		for w := range errs {
			wg.Go(func() {
				rng := rand.New(rand.NewPCG(uint64(w), 7))
				for it := range 12 {
					s := sizes[rng.IntN(len(sizes))]
					k := rng.IntN(int(min(s.end()-confBase, max(1, (1<<20)/s.rb), 300))) + 1
					globals := make([]int64, k)
					for i := range globals {
						globals[i] = confBase + rng.Int64N(s.end()-confBase)
					}
					dst := newConfDst(k, s.rb, it%2 == 0)
					err := n.spanning(s, globals, dst.rows)
					if err == nil {
						err = dst.check(s.name, s.id, globals)
					}
					if err != nil {
						errs[w] = fmt.Errorf("goroutine %d, batch %d of %q: %w", w, it, s.name, err)
						return
					}
				}
			})
		}
		wg.Wait()
		if err := errors.Join(errs...); err != nil {
			t.Fatal(err)
		}
	})

	// A freed variable's rows never come back, whether another table of
	// its name took its place (maybe at the same addresses) or none did.
	t.Run("freed", func(t *testing.T) {
		s := confSpread{name: "freed", id: 30, rb: 512, rows: [3]int64{40, 20, 10}}
		n.publish(t, s)
		globals := []int64{confBase, confBase + 45, confBase + 59}
		dst := newConfDst(len(globals), s.rb, true)
		if err := confFetch(ctx, n.reader, n.owners[0], s.name, s.id, globals, dst.rows); err != nil {
			t.Fatal(err) // the reader now knows the owner's window
		}
		var w confWithdrawn
		n.mustCall(t, 0, opConfFree, confName{s.name}, &w)
		checkUnmapAtOnce(t, w)
		next := s
		next.id = 31
		n.mustCall(t, 0, opConfPublish, next.parts()[0], nil)
		dst = newConfDst(len(globals), s.rb, true)
		err := confFetch(ctx, n.reader, n.owners[0], s.name, s.id, globals, dst.rows)
		wantErr(t, "rows of a freed table whose name was taken again", err, base.ErrFreed)
		if err := confFetch(ctx, n.reader, n.owners[0], next.name, next.id, globals, dst.rows); err != nil {
			t.Fatalf("rows of the new table: %v", err)
		}
		if err := dst.check(next.name, next.id, globals); err != nil {
			t.Fatal(err)
		}
		n.mustCall(t, 0, opConfFree, confName{s.name}, &w)
		checkUnmapAtOnce(t, w)
		err = confFetch(ctx, n.reader, n.owners[0], next.name, next.id, globals, dst.rows)
		wantErr(t, "rows of a freed table", err, base.ErrUnknown)
	})

	// A withdrawn shard's rows are never returned; the variable's other
	// shards stay readable.
	t.Run("withdrawn", func(t *testing.T) {
		s := confSpread{name: "withdrawn", id: 40, rb: 256, rows: [3]int64{30, 30, 5}}
		n.publish(t, s)
		first, second := []int64{confBase + 3, confBase + 29}, []int64{confBase + 30, confBase + 59}
		both := append(append([]int64(nil), first...), second...)
		dst := newConfDst(len(both), s.rb, true)
		if err := confFetch(ctx, n.reader, n.owners[0], s.name, s.id, both, dst.rows); err != nil {
			t.Fatal(err)
		}
		var w confWithdrawn
		n.mustCall(t, 0, opConfWithdraw, confWithdraw{Name: s.name, Shard: 1}, &w)
		checkUnmapAtOnce(t, w)
		err := confFetch(ctx, n.reader, n.owners[0], s.name, s.id, second, dst.rows[:2])
		wantErr(t, "rows of a shard withdrawn (and no longer described)", err, base.ErrArgument)
		err = confFetch(ctx, n.reader, n.owners[0], s.name, s.id, both, dst.rows)
		wantErr(t, "a batch with rows of a withdrawn shard", err, base.ErrArgument)
		dst = newConfDst(len(first), s.rb, true)
		if err := confFetch(ctx, n.reader, n.owners[0], s.name, s.id, first, dst.rows); err != nil {
			t.Fatalf("the shard left: %v", err)
		}
		if err := dst.check(s.name, s.id, first); err != nil {
			t.Fatal(err)
		}

		// The owner described its window just before the shard was
		// withdrawn (a reply racing the withdraw): the reader, which reads
		// where the window says, must notice the shard left. Over tcp
		// nothing is exposed, nothing is described.
		s = confSpread{name: "raced", id: 41, rb: 256, rows: [3]int64{30, 30, 5}}
		n.publish(t, s)
		if err := confFetch(ctx, n.reader, n.owners[0], s.name, s.id, both, newConfDst(len(both), s.rb, true).rows); err != nil {
			t.Fatal(err)
		}
		n.mustCall(t, 0, opConfWithdraw, confWithdraw{Name: s.name, Shard: 1, Described: true}, &w)
		checkUnmapAtOnce(t, w)
		if w.Exposed == 0 {
			return
		}
		err = confFetch(ctx, n.reader, n.owners[0], s.name, s.id, second, newConfDst(len(second), s.rb, true).rows)
		wantErr(t, "rows of a withdrawn shard still described", err, base.ErrFreed)
		dst = newConfDst(len(first), s.rb, true)
		if err := confFetch(ctx, n.reader, n.owners[0], s.name, s.id, first, dst.rows); err != nil {
			t.Fatalf("the shard left, beside one withdrawn but described: %v", err)
		}
		if err := dst.check(s.name, s.id, first); err != nil {
			t.Fatal(err)
		}
	})

	// A peer that does not answer fails the fetch with ErrTimeout when its
	// ctx ends; nothing is written into dst after the fetch returned.
	t.Run("silent", func(t *testing.T) {
		v := confVar{Name: "silent", ID: 50, RowBytes: 128, Shards: []confShard{{0, 8}}, Silent: true}
		n.mustCall(t, 1, opConfPublish, v, nil)
		globals := []int64{1, 7, 3}
		dst := newConfDst(len(globals), v.RowBytes, true)
		tctx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
		done := make(chan error, 1)
		go func() { done <- n.reader.Fetch(tctx, n.owners[1], v.Name, v.ID, globals, dst.rows) }()
		var err error
		select {
		case err = <-done:
		case <-time.After(time.Minute):
			t.Fatal("a fetch from a silent peer did not return within a minute of its ctx's end")
		}
		cancel()
		wantErr(t, "a fetch from a silent peer", err, base.ErrTimeout)
		n.mustCall(t, 1, opConfRelease, confName{v.Name}, nil)
		testutil.WaitFor(t, time.Minute, func() error {
			var st confState
			if err := n.call(1, opConfState, nil, &st); err != nil {
				return err
			}
			if st.Answered == 0 {
				return errors.New("the silent owner has not answered the request it held")
			}
			return nil
		})
		again := newConfDst(len(globals), v.RowBytes, true)
		if err := confFetch(ctx, n.reader, n.owners[1], v.Name, v.ID, globals, again.rows); err != nil {
			t.Fatalf("once the peer answers: %v", err)
		}
		if err := again.check(v.Name, v.ID, globals); err != nil {
			t.Fatal(err)
		}
		if !dst.untouched() {
			t.Error("rows were written into the destination of the timed-out fetch after it returned")
		}
	})

	// Every withdrawn shard is unmapped, a grace period later at most.
	t.Run("unmapped", func(t *testing.T) {
		for k := range n.owners {
			testutil.WaitFor(t, time.Minute, func() error {
				var st confState
				if err := n.call(k, opConfState, nil, &st); err != nil {
					return err
				}
				if st.Pending != 0 {
					return fmt.Errorf("owner %d: %d withdrawn shards not unmapped", k, st.Pending)
				}
				return nil
			})
		}
	})

	if n.specific != nil {
		t.Run("specific", n.specific)
	}

	// Close ends the engine (with the owners', where it is collective);
	// a fetch after it fails with ErrClosed, and nothing the net started
	// is left running.
	t.Run("close", func(t *testing.T) {
		for k := range n.owners {
			// Not fatal: the reader closes whatever happens (with MPI, the
			// owners wait for it).
			if err := n.call(k, opConfClose, nil, nil); err != nil {
				t.Errorf("owner %d, close: %v", k, err)
			}
		}
		if err := n.reader.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
		err := n.reader.Fetch(ctx, n.owners[0], "b4k", 3, []int64{confBase}, [][]byte{make([]byte, 4096)})
		wantErr(t, "a fetch after Close", err, base.ErrClosed)
		if err := n.reader.Close(); err != nil {
			t.Errorf("a second Close: %v", err)
		}
		// Hanging up lets the owners stop (confOwner.serve).
		if err := n.pool.Close(); err != nil {
			t.Errorf("closing the reader's pool: %v", err)
		}
		if n.done != nil {
			if err := n.done(); err != nil {
				t.Errorf("owner nodes: %v", err)
			}
		}
	})
	// Counted here, where the count before was taken: a subtest's own
	// goroutine would count.
	testutil.WaitFor(t, time.Minute, func() error {
		if g := runtime.NumGoroutine(); g > goroutines {
			return fmt.Errorf("%d goroutines running after Close, %d before the engines opened:\n%s", g, goroutines, stacks())
		}
		return nil
	})
}

// checkUnmapAtOnce: a shard nothing exposed is unmapped as it is
// withdrawn; an exposed one not before a read in flight can no longer
// touch it (a grace period, of confGrace here).
func checkUnmapAtOnce(t *testing.T, w confWithdrawn) {
	t.Helper()
	if w.Withdrawn == 0 || w.UnmappedAtOnce != w.Withdrawn-w.Exposed {
		t.Errorf("of %d withdrawn shards (%d exposed), %d were unmapped as Withdraw returned: want the unexposed ones at once, the exposed ones a grace period later",
			w.Withdrawn, w.Exposed, w.UnmappedAtOnce)
	}
}

// stacks are every goroutine's stack, sorted, for a leak's message.
func stacks() string {
	buf := make([]byte, 1<<20)
	n := runtime.Stack(buf, true)
	parts := bytes.Split(buf[:n], []byte("\n\n"))
	sort.Slice(parts, func(i, j int) bool { return bytes.Compare(parts[i], parts[j]) < 0 })
	return string(bytes.Join(parts, []byte("\n\n")))
}

// openEngine opens kind's engine over pool as an agent does.
func openEngine(t *testing.T, kind string, pool *Pool) Engine {
	t.Helper()
	e, err := Open(kind, EngineOptions{Pool: pool, Timeout: 30 * time.Second, Grace: confGrace, Logger: discardLog()})
	if err != nil {
		t.Skipf("no %s engine here: %v", kind, err)
	}
	return e
}

func TestConformanceTCP(t *testing.T) {
	testEngine(t, KindTCP, func(t *testing.T) confNet {
		return confLocalNet(t, func(t *testing.T, p *Pool) Engine { return openEngine(t, KindTCP, p) })
	})
}

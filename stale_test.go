package ddstore_test

// A reader of another job (split mode) while the job frees a variable and
// adds it again with new content: its mappings of the old segments stay
// readable after the agents unlink them, and it takes no part in the Free.

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ddstore-go/ddstore"
	"github.com/ddstore-go/ddstore/internal/testutil"
)

// genBase offsets the global index a row's pattern is of, by the
// generation of the variable it belongs to: a row of the freed variable
// never passes for one of its successor.
const genBase = 1 << 30

// staleReader reads every row of a variable in a loop from one reader store
// and checks each batch: all its rows are of one generation of the
// variable, and a read begun after generation 2 was added never returns
// generation 1's rows nor fails.
type staleReader struct {
	read func() (gen int, err error)
	// added is set once the second Add has returned on every rank.
	added             atomic.Bool
	calls, afterAdded atomic.Int64 // reads; reads of generation 2 begun after added
	mu                sync.Mutex
	bad               []string
	stop              chan struct{}
	done              sync.WaitGroup
}

func (sr *staleReader) start() {
	sr.stop = make(chan struct{})
	sr.done.Add(1)
	go func() {
		defer sr.done.Done()
		for {
			select {
			case <-sr.stop:
				return
			default:
			}
			after := sr.added.Load()
			gen, err := sr.read()
			sr.calls.Add(1)
			switch {
			case after && err != nil:
				sr.fail(fmt.Sprintf("a read begun after the new Add returned failed: %v", err))
			case after && gen != 2:
				sr.fail(fmt.Sprintf("a read begun after the new Add returned got rows of generation %d", gen))
			case after:
				sr.afterAdded.Add(1)
			case err != nil && !errors.Is(err, ddstore.ErrFreed) && !errors.Is(err, ddstore.ErrUnknown):
				sr.fail(fmt.Sprintf("a read while the variable was freed: %v, want its rows, ErrFreed or ErrUnknown", err))
			case err == nil && gen != 1 && gen != 2:
				sr.fail(fmt.Sprintf("a read got rows of no generation (%d)", gen))
			}
		}
	}()
}

func (sr *staleReader) fail(msg string) {
	sr.mu.Lock()
	defer sr.mu.Unlock()
	if len(sr.bad) < 10 {
		sr.bad = append(sr.bad, msg)
	}
}

// run reads while the job frees the variable and adds it again: the reads
// of generation 1 first, then free, then add generation 2, then reads of
// it, never reopening the reader.
func (sr *staleReader) run(t *testing.T, c *cluster, name string, add2 func()) {
	t.Helper()
	sr.start()
	var once sync.Once
	stop := func() {
		once.Do(func() {
			close(sr.stop)
			sr.done.Wait()
		})
	}
	defer stop() // on a failed wait too
	testutil.WaitFor(t, 20*time.Second, func() error {
		if n := sr.calls.Load(); n < 20 {
			return fmt.Errorf("the reader made %d reads of the first variable", n)
		}
		return nil
	})
	c.mustEach(t, func(r int, s *ddstore.Store) error { return s.Free(name) })
	add2()
	sr.added.Store(true)
	testutil.WaitFor(t, 20*time.Second, func() error {
		if n := sr.afterAdded.Load(); n < 20 && len(sr.failures()) == 0 {
			return fmt.Errorf("the reader made %d reads of the new variable (%d in all)", n, sr.calls.Load())
		}
		return nil
	})
	stop()
	if bad := sr.failures(); len(bad) > 0 {
		t.Fatalf("%d reads in all:\n%s", sr.calls.Load(), strings.Join(bad, "\n"))
	}
}

func (sr *staleReader) failures() []string {
	sr.mu.Lock()
	defer sr.mu.Unlock()
	return slices.Clone(sr.bad)
}

// genOf is the generation a batch of rows read of globals holds: want(gen)
// is generation gen's bytes; 0 for neither.
func genOf(got []byte, want func(gen int) []byte) int {
	for gen := 1; gen <= 2; gen++ {
		if string(got) == string(want(gen)) {
			return gen
		}
	}
	return 0
}

// TestClusterReaderAfterFreeAndAdd: a reader store (split mode) on a node
// holding shards reads its node's rows from shared memory and the other
// node's through its agent, fixed and ragged, while every rank frees the
// variable and adds it again with new content. No read returns a row of
// the freed variable once the new Add has returned; reads fail with ErrFreed
// (or ErrUnknown) only in between; and the same reader, never reopened,
// reads the new rows.
func TestClusterReaderAfterFreeAndAdd(t *testing.T) {
	c := startCluster(t, []int{1, 1}, viaRendezvous)
	reader := func() *ddstore.Store {
		r, err := ddstore.Open(ddstore.Config{Namespace: c.ns, Rank: 0, Size: 1, Node: "node0",
			Socket: c.agents[0].Socket(), NoSpawn: true, Reader: true, Timeout: 10 * time.Second})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { r.Close() })
		return r
	}

	t.Run("fixed", func(t *testing.T) {
		const disp, itemsize = 3, 8
		const rb = disp * itemsize
		rows := []int64{6, 5} // rank 0's on node0, the reader's; rank 1's on node1
		var total int64 = 11
		add := func(gen int) {
			c.mustEach(t, func(r int, s *ddstore.Store) error {
				buf := make([]byte, rows[r]*rb)
				for i := range rows[r] {
					pattern(buf[i*rb:(i+1)*rb], int64(gen)*genBase+int64(r)*rows[0]+i)
				}
				return s.Add("x", buf, disp, itemsize)
			})
		}
		want := func(gen int, idx []int64) []byte {
			b := make([]byte, len(idx)*rb)
			for i, g := range idx {
				pattern(b[i*rb:(i+1)*rb], int64(gen)*genBase+g)
			}
			return b
		}
		add(1)
		r := reader()
		local, remote, both := []int64{0, 5, 2}, []int64{6, 10}, []int64{10, 1, 7, 0}
		k := 0
		sr := &staleReader{read: func() (int, error) {
			k++
			switch k % 4 {
			case 0, 1:
				idx := [][]int64{local, both}[k%4]
				dst := make([]byte, len(idx)*rb)
				if err := r.GetBatch("x", dst, idx); err != nil {
					return 0, err
				}
				return genOf(dst, func(gen int) []byte { return want(gen, idx) }), nil
			case 2:
				dst := make([]byte, 2*rb) // rows 3 and 4: node-local, Get's one-shard path
				if err := r.Get("x", dst, 3); err != nil {
					return 0, err
				}
				return genOf(dst, func(gen int) []byte { return want(gen, []int64{3, 4}) }), nil
			}
			dst := make([]byte, len(remote)*rb)
			if err := r.GetBatch("x", dst, remote); err != nil {
				return 0, err
			}
			return genOf(dst, func(gen int) []byte { return want(gen, remote) }), nil
		}}
		if gen, err := sr.read(); err != nil || gen != 1 {
			t.Fatalf("first read: generation %d, %v", gen, err)
		}
		sr.run(t, c, "x", func() { add(2) })
		in, err := r.Info("x")
		if err != nil || in.TotalRows != total {
			t.Fatalf("Info after: %+v, %v", in, err)
		}
	})

	t.Run("ragged", func(t *testing.T) {
		j := newRaggedJob(31, []int64{7, 6}, 8, 4)
		add := func(gen int) {
			c.mustEach(t, func(r int, s *ddstore.Store) error {
				var b []byte
				for i, n := range j.lengths[r] {
					row := make([]byte, n*j.ub)
					pattern(row, int64(gen)*genBase+j.first[r]+int64(i))
					b = append(b, row...)
				}
				return s.AddRagged("rg", b, j.lengths[r], ddstore.Float64)
			})
		}
		want := func(gen int, idx []int64) []byte {
			var b []byte
			for _, g := range idx {
				row := make([]byte, j.length(g)*j.ub)
				pattern(row, int64(gen)*genBase+g)
				b = append(b, row...)
			}
			return b
		}
		// Rows of some length on both nodes: an empty row reads the same in
		// every generation.
		var local, remote []int64
		for g := range j.total() {
			if j.length(g) == 0 {
				continue
			}
			if g < j.first[1] {
				local = append(local, g)
			} else {
				remote = append(remote, g)
			}
		}
		if len(local) == 0 || len(remote) == 0 {
			t.Fatal("the job has no row of some length on a node")
		}
		add(1)
		r := reader()
		k := 0
		sr := &staleReader{read: func() (int, error) {
			k++
			idx := [][]int64{local, remote, append(slices.Clone(remote), local...)}[k%3]
			w := want(1, idx)
			dst := make([]byte, len(w))
			n, err := r.GetRagged("rg", dst, idx, nil)
			if err != nil {
				return 0, err
			}
			return genOf(dst[:n], func(gen int) []byte { return want(gen, idx) }), nil
		}}
		if gen, err := sr.read(); err != nil || gen != 1 {
			t.Fatalf("first read: generation %d, %v", gen, err)
		}
		sr.run(t, c, "rg", func() { add(2) })
	})
}

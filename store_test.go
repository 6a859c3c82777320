package ddstore_test

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"github.com/ddstore-go/ddstore"
)

func TestClusterGetBatchEveryRank(t *testing.T) {
	for _, mode := range []meetMode{viaRendezvous, viaHandshakeDir} {
		c := startCluster(t, []int{2, 1, 3}, mode)
		rows := []int64{5, 0, 7, 3, 1, 9}
		c.addPattern(t, "x", rows, 3, 8)
		var total int64
		for _, n := range rows {
			total += n
		}
		c.mustEach(t, func(r int, s *ddstore.Store) error {
			rng := rand.New(rand.NewPCG(uint64(r), 7))
			idx := make([]int64, 200)
			for i := range idx {
				idx[i] = rng.Int64N(total)
			}
			dst := make([]byte, len(idx)*24)
			if err := s.GetBatch("x", dst, idx); err != nil {
				return err
			}
			for i, g := range idx {
				checkRow(t, dst[i*24:(i+1)*24], g)
			}
			all := make([]byte, total*24)
			if err := s.Get("x", all, 0); err != nil {
				return err
			}
			for g := range total {
				checkRow(t, all[g*24:(g+1)*24], g)
			}
			return nil
		})
	}
}

// TestClusterReaderStore: a store of another job (split mode) holds no shard,
// reads every row of a variable published by the job, and cannot add.
func TestClusterReaderStore(t *testing.T) {
	c := startCluster(t, []int{2, 1}, viaRendezvous)
	c.addPattern(t, "pub", []int64{4, 0, 9}, 2, 4)
	for node, a := range c.agents {
		r, err := ddstore.Open(ddstore.Config{Namespace: c.ns, Rank: 0, Size: 1, Node: fmt.Sprintf("node%d", node),
			Socket: a.Socket(), NoSpawn: true, Reader: true, Timeout: 10 * time.Second})
		if err != nil {
			t.Fatal(err)
		}
		all := make([]byte, 13*8)
		if err := r.Get("pub", all, 0); err != nil {
			t.Fatal(err)
		}
		for g := range int64(13) {
			checkRow(t, all[g*8:(g+1)*8], g)
		}
		if err := r.Add("mine", make([]byte, 8), 2, 4); !errors.Is(err, ddstore.ErrArgument) {
			t.Errorf("reader Add: %v, want ErrArgument", err)
		}
		if err := r.Free("pub"); err != nil {
			t.Error(err)
		}
		r.Close()
	}
	// The readers' Free gave nothing back: the job's variable is whole.
	dst := make([]byte, 8)
	if err := c.stores[2].Get("pub", dst, 12); err != nil {
		t.Fatal(err)
	}
	checkRow(t, dst, 12)
}

// TestClusterReaderWaitsForPublication: a reader (split mode) that starts first
// waits for the variable to be published, up to WaitPublished; a name that
// never comes fails with ErrUnknown saying how long it waited.
func TestClusterReaderWaitsForPublication(t *testing.T) {
	c := startCluster(t, []int{1, 1}, viaRendezvous)
	r, err := ddstore.Open(ddstore.Config{Namespace: c.ns, Rank: 0, Size: 1, Node: "node1", Socket: c.agents[1].Socket(),
		NoSpawn: true, Reader: true, Timeout: 10 * time.Second, WaitPublished: 20 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	got := make(chan error, 1)
	all := make([]byte, 9*8)
	go func() { got <- r.Get("late", all, 0) }()
	// A window in which a reader that did not wait would fail: nothing to
	// poll for, since a waiting reader shows nothing until the publication.
	time.Sleep(300 * time.Millisecond)
	select {
	case err := <-got:
		t.Fatalf("the reader did not wait: %v", err)
	default:
	}
	c.addPattern(t, "late", []int64{4, 5}, 2, 4)
	if err := <-got; err != nil {
		t.Fatal(err)
	}
	for g := range int64(9) {
		checkRow(t, all[g*8:(g+1)*8], g)
	}
	q, err := ddstore.Open(ddstore.Config{Namespace: c.ns, Rank: 0, Size: 1, Node: "node0", Socket: c.agents[0].Socket(),
		NoSpawn: true, Reader: true, Timeout: 10 * time.Second, WaitPublished: 200 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer q.Close()
	if err := q.Get("never", all[:8], 0); !errors.Is(err, ddstore.ErrUnknown) || !strings.Contains(err.Error(), "after waiting 200ms") {
		t.Fatalf("a name never published: %v", err)
	}
}

// TestClusterShard: rows written into the own shard are what every rank reads.
func TestClusterShard(t *testing.T) {
	c := startCluster(t, []int{1, 1}, viaRendezvous)
	c.mustEach(t, func(r int, s *ddstore.Store) error { return s.Init("direct", 3, 1, 8) })
	c.mustEach(t, func(r int, s *ddstore.Store) error {
		sh, err := s.Shard("direct")
		if err != nil {
			return err
		}
		for i := range int64(3) {
			pattern(sh[i*8:(i+1)*8], int64(r)*3+i)
		}
		return nil
	})
	dst := make([]byte, 6*8)
	if err := c.stores[0].Get("direct", dst, 0); err != nil {
		t.Fatal(err)
	}
	for g := range int64(6) {
		checkRow(t, dst[g*8:(g+1)*8], g)
	}
	r, err := ddstore.Open(ddstore.Config{Namespace: c.ns, Rank: 0, Size: 1, Node: "node0", Socket: c.agents[0].Socket(), NoSpawn: true, Reader: true})
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	if _, err := r.Shard("direct"); !errors.Is(err, ddstore.ErrArgument) {
		t.Errorf("reader Shard: %v, want ErrArgument", err)
	}
}

// TestClusterTyped: a typed variable carries its dtype to every rank; ranks that
// disagree on it all fail; an unknown dtype names the valid ones.
func TestClusterTyped(t *testing.T) {
	c := startCluster(t, []int{1, 1}, viaRendezvous)
	c.mustEach(t, func(r int, s *ddstore.Store) error { return s.InitAs("f", 2, 3, ddstore.Float32) })
	in, err := c.stores[1].Info("f")
	if err != nil || in.Dtype != "float32" || in.ItemSize != 4 || in.Disp != 3 || in.TotalRows != 4 {
		t.Fatalf("Info: %+v, %v", in, err)
	}
	errs := c.each(func(r int, s *ddstore.Store) error {
		return s.AddAs("g", make([]byte, 8), 1, map[int]ddstore.Dtype{0: ddstore.Int64, 1: ddstore.Float64}[r])
	})
	for r, err := range errs {
		if !errors.Is(err, ddstore.ErrGeometry) || !strings.Contains(err.Error(), "float64") {
			t.Errorf("rank %d: %v, want ErrGeometry naming the types", r, err)
		}
	}
	errs = c.each(func(r int, s *ddstore.Store) error { return s.InitAs("h", 1, 1, "complex64") })
	for r, err := range errs {
		if err == nil || !strings.Contains(err.Error(), "complex64") {
			t.Errorf("rank %d: %v, want an error naming complex64", r, err)
		}
	}
}

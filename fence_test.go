package ddstore_test

import (
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ddstore-go/ddstore"
	"github.com/ddstore-go/ddstore/internal/testutil"
)

// The fence (Store.Fence, DDStore's epoch_begin/epoch_end): a barrier of
// the rank's replica group, through the agents.

// fenceRows is rank r's rows in round k of the fence tests: patterned rows
// of a global index no other rank or round uses.
func fenceRows(r, k, rows, rb int) []byte {
	buf := make([]byte, rows*rb)
	for i := range rows {
		pattern(buf[i*rb:(i+1)*rb], int64(k*1000+r*rows+i))
	}
	return buf
}

// TestClusterFence: every round, every rank updates its shard, fences, reads
// every rank's rows (its node's from shared memory, the other's through
// the agents) and fences again before the next update. The last rank
// updates a little later than the others, so a fence that let anyone
// through early would show as old rows and as a count of ranks that
// reached it short of the group.
func TestClusterFence(t *testing.T) {
	const rows, rb, rounds = 3, 32, 20
	c := startCluster(t, []int{2, 2}, viaRendezvous)
	size := len(c.stores)
	c.mustEach(t, func(r int, s *ddstore.Store) error { return s.Init("v", rows, rb, 1) })
	var reached atomic.Int64
	c.mustEach(t, func(r int, s *ddstore.Store) error {
		dst := make([]byte, size*rows*rb)
		for k := range rounds {
			if r == size-1 {
				time.Sleep(time.Millisecond) // widens the race the fence closes; no rank waits on it
			}
			if err := s.Update("v", fenceRows(r, k, rows, rb), 0); err != nil {
				return err
			}
			reached.Add(1)
			if err := s.EpochBegin(); err != nil {
				return err
			}
			if n := reached.Load(); n < int64((k+1)*size) {
				return fmt.Errorf("round %d: through the fence when %d of %d ranks had reached it", k, n-int64(k*size), size)
			}
			if err := s.Get("v", dst, 0); err != nil {
				return err
			}
			for q := range size {
				if want := fenceRows(q, k, rows, rb); string(dst[q*rows*rb:(q+1)*rows*rb]) != string(want) {
					return fmt.Errorf("round %d: rank %d's rows are not its round's", k, q)
				}
			}
			if err := s.EpochEnd(); err != nil {
				return err
			}
		}
		p, err := s.Profile("v")
		if err == nil && p.RemoteRows == 0 {
			err = fmt.Errorf("no row came from the other node")
		}
		return err
	})
}

// TestClusterFenceOfAGroup: with Width, a fence is its group's: group 0
// fences while group 1 never does, and ranks of one group that disagree on
// which fence they are at never pass each other.
func TestClusterFenceOfAGroup(t *testing.T) {
	c := startCluster(t, []int{2, 2}, viaRendezvous, func(cfg *ddstore.Config) {
		cfg.Width = 2
		cfg.PublishTimeout = time.Second
	})
	c.mustEach(t, func(r int, s *ddstore.Store) error {
		if r >= 2 {
			return nil
		}
		for range 5 {
			if err := s.Fence(); err != nil {
				return err
			}
		}
		return nil
	})
	// Group 1: rank 3 never comes; rank 2's fence fails, naming it, and
	// group 0 is not involved.
	errs := c.each(func(r int, s *ddstore.Store) error {
		if r == 2 {
			return s.Fence()
		}
		return nil
	})
	wantErr(t, "rank 2", errs[2], ddstore.ErrTimeout, "fence 1", `group "@r2"`, "1 of 2 ranks", "missing ranks 1")
}

// TestClusterFenceMissingRank: a rank that never reaches a fence fails it
// for every other rank, with an error naming it, once PublishTimeout has
// passed; a late rank of the failed fence gets the same error at once.
func TestClusterFenceMissingRank(t *testing.T) {
	c := startCluster(t, []int{2, 2}, viaRendezvous, func(cfg *ddstore.Config) { cfg.PublishTimeout = time.Second })
	errs := c.each(func(r int, s *ddstore.Store) error {
		if r == 3 {
			return nil
		}
		return s.Fence()
	})
	for r, err := range errs[:3] {
		wantErr(t, fmt.Sprintf("rank %d", r), err, ddstore.ErrTimeout, "fence 1", "3 of 4 ranks", "missing ranks 3")
	}
	wantErr(t, "rank 3, late", c.stores[3].Fence(), ddstore.ErrTimeout, "fence 1", "missing ranks 3")
	// The ranks' next fences meet again.
	c.mustEach(t, func(r int, s *ddstore.Store) error { return s.Fence() })
}

// TestClusterFenceAlone: a job of one rank, and a reader, fence at once; a closed
// store's fence is ErrClosed.
func TestClusterFenceAlone(t *testing.T) {
	c := startCluster(t, []int{1}, viaRendezvous)
	s := c.stores[0]
	if err := s.Fence(); err != nil {
		t.Fatal(err)
	}
	rd, err := ddstore.Open(ddstore.Config{Namespace: c.ns, Rank: 0, Size: 1, Node: "node0", Socket: c.agents[0].Socket(),
		NoSpawn: true, Reader: true})
	if err != nil {
		t.Fatal(err)
	}
	defer rd.Close()
	if err := rd.Fence(); err != nil {
		t.Fatal(err)
	}
	s.Close()
	if err := testutil.CheckErr(s.EpochBegin(), ddstore.ErrClosed); err != nil {
		t.Fatal(err)
	}
}

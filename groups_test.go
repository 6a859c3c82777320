package ddstore_test

import (
	"errors"
	"fmt"
	"testing"

	"github.com/ddstore-go/ddstore"
)

// TestClusterReplicaGroups: with width 2, ranks {0,1} and {2,3} each hold a whole
// copy of the variable; every rank reads every row from its own group —
// here its own node, so nothing crosses nodes — and groups free their copies
// independently.
func TestClusterReplicaGroups(t *testing.T) {
	const n, rb = 90, 64
	c := startCluster(t, []int{2, 2}, viaRendezvous, func(cfg *ddstore.Config) { cfg.Width = 2 })
	c.mustEach(t, func(r int, s *ddstore.Store) error {
		g, gr, gs := s.Group()
		if g != r/2 || gr != r%2 || gs != 2 {
			return fmt.Errorf("Group() = %d, %d, %d", g, gr, gs)
		}
		lo, hi := int64(gr)*n/int64(gs), int64(gr+1)*n/int64(gs)
		buf := make([]byte, (hi-lo)*rb)
		for i := lo; i < hi; i++ {
			pattern(buf[(i-lo)*rb:(i-lo+1)*rb], i)
		}
		return s.Add("x", buf, rb, 1)
	})
	c.mustEach(t, func(r int, s *ddstore.Store) error {
		in, err := s.Info("x")
		if err != nil {
			return err
		}
		want := fmt.Sprintf("node%d", r/2)
		if in.TotalRows != n || len(in.ShardRows) != 2 || in.Nodes[0] != want || in.Nodes[1] != want {
			return fmt.Errorf("info: %d rows, shards %v on %v", in.TotalRows, in.ShardRows, in.Nodes)
		}
		dst := make([]byte, n*rb)
		if err := s.Get("x", dst, 0); err != nil {
			return err
		}
		for g := range int64(n) {
			if err := samePattern(dst[g*rb:(g+1)*rb], g); err != nil {
				return err
			}
		}
		p, err := s.Profile("x")
		if err != nil {
			return err
		}
		if p.RemoteRows != 0 {
			return fmt.Errorf("%d rows crossed nodes", p.RemoteRows)
		}
		return nil
	})
	// Group 0 frees its copy; group 1 still reads its own.
	c.mustEach(t, func(r int, s *ddstore.Store) error {
		if r < 2 {
			return s.Free("x")
		}
		return nil
	})
	row := make([]byte, rb)
	if err := c.stores[3].Get("x", row, n-1); err != nil {
		t.Fatal(err)
	}
	if err := c.stores[0].Get("x", row, 0); !errors.Is(err, ddstore.ErrFreed) {
		t.Fatalf("group 0 after its free: %v", err)
	}
}

func TestReplicaGroupWidthErrors(t *testing.T) {
	_, err := ddstore.Open(ddstore.Config{Rank: 0, Size: 2, Width: -1, NoSpawn: true})
	if !errors.Is(err, ddstore.ErrArgument) {
		t.Fatalf("width -1: %v", err)
	}
}

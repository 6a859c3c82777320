package ddstore_test

import (
	"math/rand/v2"
	"testing"

	"github.com/ddstore-go/ddstore"
)

func TestGetBatchEveryRank(t *testing.T) {
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

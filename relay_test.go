package ddstore_test

import (
	"fmt"
	"testing"

	"github.com/ddstore-go/ddstore"
	"github.com/ddstore-go/ddstore/agent"
)

// TestClusterTableRelay: with a relay fanout of 1 the coordinator gives a
// round's table to one node and each node to the next, so the tables of
// a five-node job pass along a chain of relays (PeerTable); every rank
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
				relayed += in.Counters["tables_relayed"]
			}
			// Four nodes off the coordinator's: one gets the table from
			// it, three from the node before them.
			if relayed != 3*round {
				t.Errorf("round %d: %d tables relayed by the nodes, want %d", round, relayed, 3*round)
			}
		}
		c.mustEach(t, func(_ int, s *ddstore.Store) error { return s.Free("relay") })
	}
}

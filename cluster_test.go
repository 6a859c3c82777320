package ddstore_test

import (
	"encoding/binary"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/ddstore-go/ddstore"
	"github.com/ddstore-go/ddstore/agent"
)

// The cluster tests: a job of several nodes on loopback (startCluster),
// whose bodies hold over every transport between agents. A test named
// TestCluster... is one of them, and so runs again over MPI
// (mpicluster_test.go) and over libfabric (fabriccluster_test.go): the CI
// script selects them by that prefix (-run '^TestCluster'), so a new one is
// picked up by its name. TestClusterTestsNamed holds every test that
// starts a cluster to that name.

// cluster is a job on loopback: one in-process agent per node, each a
// different node id, and one Store per rank, ranks dealt to nodes in blocks.
type cluster struct {
	ns     string
	agents []testAgent
	stores []*ddstore.Store
}

// testAgent is a node's agent as the tests see it: in this process (tcp),
// or a rank of an mpirun launch (mpi; mpicluster_test.go).
type testAgent interface {
	Socket() string
	Close() error
}

type meetMode int

const (
	viaRendezvous meetMode = iota
	viaHandshakeDir
)

func freeAddr(t testing.TB) string {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

// startCluster starts the agents and opens the stores; opts are
// func(*agent.Config) and func(*ddstore.Config), applied to every
// agent's and every store's configuration. The agents run the transport
// DDSTORE_TEST_TRANSPORT names (clusterTransport): tcp, in this process,
// or mpi, as the ranks of one mpirun launch of the ddstore binary.
func startCluster(t testing.TB, ranksPerNode []int, mode meetMode, opts ...any) *cluster {
	t.Helper()
	dir := t.TempDir()
	c := &cluster{ns: fmt.Sprintf("t%d-%s", os.Getpid(), filepath.Base(dir))}
	rdv := ""
	hs := ""
	if len(ranksPerNode) > 1 {
		if mode == viaRendezvous {
			rdv = freeAddr(t)
		} else {
			hs = filepath.Join(dir, "handshake")
		}
	}
	size := 0
	for _, n := range ranksPerNode {
		size += n
	}
	var cfgs []agent.Config
	for i := range ranksPerNode {
		node := fmt.Sprintf("node%d", i)
		cfg := agent.Config{
			Namespace: c.ns, Node: node, Socket: ddstore.SocketPath(filepath.Join(dir, "run"), c.ns, node),
			Rendezvous: rdv, HandshakeDir: hs, Timeout: 5 * time.Second, JoinTimeout: 10 * time.Second,
			PeerListen: "127.0.0.1:0",
		}
		if clusterTransport == "fabric" {
			cfg.Transport = "fabric" // in this process (fabriccluster_test.go)
		}
		for _, o := range opts {
			if o, ok := o.(func(*agent.Config)); ok {
				o(&cfg)
			}
		}
		cfgs = append(cfgs, cfg)
	}
	if clusterTransport == "mpi" {
		c.agents = startMPIAgents(t, cfgs)
	}
	for _, cfg := range cfgs[len(c.agents):] {
		a, err := agent.Start(cfg)
		if err != nil {
			t.Fatal(err)
		}
		c.agents = append(c.agents, a)
		t.Cleanup(func() { a.Close() })
	}
	rank := 0
	for i, n := range ranksPerNode {
		for l := range n {
			cfg := ddstore.Config{Namespace: c.ns, Rank: rank, Size: size, LocalRank: l, LocalSize: n,
				Node: fmt.Sprintf("node%d", i), Socket: c.agents[i].Socket(), NoSpawn: true,
				Timeout: 10 * time.Second, PublishTimeout: 10 * time.Second}
			for _, o := range opts {
				if o, ok := o.(func(*ddstore.Config)); ok {
					o(&cfg)
				}
			}
			s, err := ddstore.Open(cfg)
			if err != nil {
				t.Fatal(err)
			}
			c.stores = append(c.stores, s)
			t.Cleanup(func() { s.Close() })
			rank++
		}
	}
	return c
}

// each runs f for every rank at once (collectives need all ranks) and
// returns the errors by rank.
func (c *cluster) each(f func(rank int, s *ddstore.Store) error) []error {
	errs := make([]error, len(c.stores))
	var wg sync.WaitGroup
	for r, s := range c.stores {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[r] = f(r, s)
		}()
	}
	wg.Wait()
	return errs
}

func (c *cluster) mustEach(t testing.TB, f func(rank int, s *ddstore.Store) error) {
	t.Helper()
	for r, err := range c.each(f) {
		if err != nil {
			t.Fatalf("rank %d: %v", r, err)
		}
	}
}

// pattern is the content of global row g: every 8-byte word holds g and
// the word's position, so a row from the wrong place never passes.
func pattern(row []byte, g int64) {
	for w := 0; w+8 <= len(row); w += 8 {
		binary.LittleEndian.PutUint64(row[w:], uint64(g)<<20|uint64(w/8))
	}
	for w := len(row) &^ 7; w < len(row); w++ {
		row[w] = byte(g + int64(w))
	}
}

func checkRow(t testing.TB, row []byte, g int64) {
	t.Helper()
	want := make([]byte, len(row))
	pattern(want, g)
	if string(want) != string(row) {
		t.Fatalf("row %d: got %x..., want %x...", g, row[:min(16, len(row))], want[:min(16, len(want))])
	}
}

// addPattern adds a variable where rank r holds rows[r] patterned rows.
func (c *cluster) addPattern(t testing.TB, name string, rows []int64, disp, itemsize int64) {
	t.Helper()
	rb := disp * itemsize
	first := make([]int64, len(rows)+1)
	for r, n := range rows {
		first[r+1] = first[r] + n
	}
	c.mustEach(t, func(r int, s *ddstore.Store) error {
		buf := make([]byte, rows[r]*rb)
		for i := range rows[r] {
			pattern(buf[i*rb:(i+1)*rb], first[r]+i)
		}
		return s.Add(name, buf, disp, itemsize)
	})
}

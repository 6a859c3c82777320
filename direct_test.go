package ddstore_test

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/ddstore-go/ddstore"
	"github.com/ddstore-go/ddstore/internal/auth"
	"github.com/ddstore-go/ddstore/internal/base"
	"github.com/ddstore-go/ddstore/internal/testutil"
	"github.com/ddstore-go/ddstore/internal/wire"
)

// agentInfo is the info of the agent of node in c's job.
func agentInfo(t *testing.T, c *cluster, runDir, node string) ddstore.AgentInfo {
	t.Helper()
	in, err := ddstore.QueryAgent(ddstore.SocketPath(runDir, c.ns, node), c.ns, node)
	if err != nil {
		t.Fatal(err)
	}
	return in
}

// checkRows reads idx of v from s (GetBatch) and each run from start
// (Get), and checks every row against the pattern, shifted by shift.
func checkRows(s *ddstore.Store, v string, idx []int64, rb int, shift int64) error {
	dst := make([]byte, len(idx)*rb)
	if err := s.GetBatch(v, dst, idx); err != nil {
		return err
	}
	for i, g := range idx {
		if err := samePattern(dst[i*rb:(i+1)*rb], g+shift); err != nil {
			return fmt.Errorf("GetBatch: %w", err)
		}
	}
	if err := s.Get(v, dst[:3*rb], idx[0]); err != nil {
		return err
	}
	for k := range int64(3) {
		if err := samePattern(dst[k*int64(rb):(k+1)*int64(rb)], idx[0]+k+shift); err != nil {
			return fmt.Errorf("Get: %w", err)
		}
	}
	return nil
}

// TestDirectReads: rows of the other node are read straight from its agent
// (agents as processes on two simulated nodes), the connection is closed
// when idle, a connection without the direct key is refused and counted,
// a direct connection can fetch rows and nothing else, and with NoDirect
// the same rows come through the own agent.
func TestDirectReads(t *testing.T) {
	c, _ := startTwoNodeProcs(t, "direct", "5s")
	runDir := filepath.Dir(c.stores[0].Socket())
	c.addPattern(t, "v", []int64{10, 10}, 16, 4)
	const rb = 64
	// A store of n0 that closes its direct connections at once.
	quick, err := ddstore.Open(ddstore.Config{Namespace: c.ns, Reader: true, Node: "n0", Rank: 0, Size: 2, RunDir: runDir,
		NoSpawn: true, Timeout: 10 * time.Second, DirectIdle: 50 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer quick.Close()
	for _, s := range []*ddstore.Store{c.stores[0], quick} {
		if err := checkRows(s, "v", []int64{15, 13, 19, 11}, rb, 0); err != nil {
			t.Fatal(err)
		}
	}
	p, err := c.stores[0].Profile("v")
	if err != nil {
		t.Fatal(err)
	}
	if p.Direct != 7 || p.RemoteRows != 7 {
		t.Fatalf("profile after a GetBatch of 4 and a Get of 3 rows of n1: Direct %d, RemoteRows %d; want 7, 7", p.Direct, p.RemoteRows)
	}
	// The rank's connection stays (10 s idle), quick's goes.
	testutil.WaitFor(t, 10*time.Second, func() error {
		if n := agentInfo(t, c, runDir, "n1").Counters["direct_connections"]; n != 1 {
			return fmt.Errorf("n1's direct_connections = %d, want 1 (the rank's; the quick store's closed when idle)", n)
		}
		return nil
	})

	// A client with the wrong key is refused and counted; with the right
	// key it may fetch rows but not ask a control op.
	addr := agentInfo(t, c, runDir, "n1").PeerAddr
	before := agentInfo(t, c, runDir, "n1").Counters["refused_connections"]
	nc, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	nc.SetDeadline(time.Now().Add(10 * time.Second))
	if err := auth.Initiate(nc, auth.Generate(), auth.Direct); !errors.Is(err, base.ErrAuth) {
		t.Fatalf("direct handshake with a wrong key: %v, want ErrAuth", err)
	}
	nc.Close()
	testutil.WaitFor(t, 10*time.Second, func() error {
		if n := agentInfo(t, c, runDir, "n1").Counters["refused_connections"]; n != before+1 {
			return fmt.Errorf("n1's refused_connections = %d, want %d", n, before+1)
		}
		return nil
	})
	key, err := directKeyOf(c.stores[0].Socket(), c.ns)
	if err != nil {
		t.Fatal(err)
	}
	nc, err = net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	nc.SetDeadline(time.Now().Add(10 * time.Second))
	if err := auth.Initiate(nc, key, auth.Direct); err != nil {
		t.Fatalf("direct handshake with the key n0's agent gives: %v", err)
	}
	info := wire.Text{}
	if _, err := nc.Write(wire.AppendFrame(nil, wire.OpPeerInfo, 0, auth.FirstID, 0, info.Encode)); err != nil {
		t.Fatal(err)
	}
	h, body, err := wire.ReadFrame(nc, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := wire.StatusError(h, body); !errors.Is(err, base.ErrAuth) {
		t.Fatalf("peer-info on a direct connection: %v, want ErrAuth", err)
	}

	// NoDirect: the same rows through n0's agent.
	via, err := ddstore.Open(ddstore.Config{Namespace: c.ns, Reader: true, Node: "n0", Rank: 0, Size: 2, RunDir: runDir,
		NoSpawn: true, Timeout: 10 * time.Second, NoDirect: true})
	if err != nil {
		t.Fatal(err)
	}
	defer via.Close()
	if err := checkRows(via, "v", []int64{15, 13, 19, 11}, rb, 0); err != nil {
		t.Fatal(err)
	}
	if p, _ := via.Profile("v"); p.Direct != 0 || p.RemoteRows != 7 {
		t.Fatalf("NoDirect profile: Direct %d, RemoteRows %d; want 0, 7", p.Direct, p.RemoteRows)
	}
	// Larger reads than DirectMaxBytes, and reads over both nodes' rows
	// with rows of n1, go direct for n1's rows only when small.
	if err := checkRows(c.stores[0], "v", []int64{2, 12, 5, 18}, rb, 0); err != nil {
		t.Fatal(err)
	}
}

// directKeyOf asks the agent at socket for the direct key, as a client
// does.
func directKeyOf(socket, ns string) (auth.Key, error) {
	k, _, err := auth.ClientKey(socket)
	if err != nil {
		return auth.Key{}, err
	}
	nc, err := net.Dial("unix", socket)
	if err != nil {
		return auth.Key{}, err
	}
	defer nc.Close()
	nc.SetDeadline(time.Now().Add(10 * time.Second))
	if err := auth.Initiate(nc, k, auth.Client); err != nil {
		return auth.Key{}, err
	}
	hello := wire.Hello{Namespace: ns, Node: "n0", Rank: -1, Size: 2}
	if _, err := nc.Write(wire.AppendFrame(nil, wire.OpHello, 0, auth.FirstID, 0, hello.Encode)); err != nil {
		return auth.Key{}, err
	}
	if _, _, err := wire.ReadFrame(nc, nil); err != nil {
		return auth.Key{}, err
	}
	if _, err := nc.Write(wire.AppendFrame(nil, wire.OpDirectKey, 0, auth.FirstID+1, 0, nil)); err != nil {
		return auth.Key{}, err
	}
	h, body, err := wire.ReadFrame(nc, nil)
	if err != nil {
		return auth.Key{}, err
	}
	if err := wire.StatusError(h, body); err != nil {
		return auth.Key{}, err
	}
	m, err := wire.DecodeDirectKey(body)
	return auth.FromBytes(m.Key), err
}

// TestDirectFreedReadded: a reader that read a variable's rows of the other
// node directly (its connection pooled) never gets the old rows once every
// rank freed the variable and added a new one of the same name: the owner
// refuses the old table id, the read goes through its agent, which says
// ErrFreed, and the reader looks the name up again.
func TestDirectFreedReadded(t *testing.T) {
	c, _ := startTwoNodeProcs(t, "directfree", "5s")
	runDir := filepath.Dir(c.stores[0].Socket())
	c.addPattern(t, "v", []int64{10, 10}, 16, 4)
	r, err := ddstore.Open(ddstore.Config{Namespace: c.ns, Reader: true, Node: "n0", Rank: 0, Size: 2, RunDir: runDir,
		NoSpawn: true, Timeout: 10 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	idx := []int64{15, 13, 19, 11}
	if err := checkRows(r, "v", idx, 64, 0); err != nil {
		t.Fatal(err)
	}
	c.mustEach(t, func(_ int, s *ddstore.Store) error { return s.Free("v") })
	// The same name, the same geometry, other rows: each row holds the
	// pattern of the row 1000 further.
	c.mustEach(t, func(rank int, s *ddstore.Store) error {
		buf := make([]byte, 10*64)
		for i := range int64(10) {
			pattern(buf[i*64:(i+1)*64], int64(rank)*10+i+1000)
		}
		return s.Add("v", buf, 16, 4)
	})
	// The first read after it is of one row: the owner's error reply is
	// longer than the row, so it comes partly past the destination.
	one := make([]byte, 64)
	if err := r.Get("v", one, 17); err != nil {
		t.Fatal(err)
	}
	if err := samePattern(one, 1017); err != nil {
		t.Fatal(err)
	}
	for range 3 {
		if err := checkRows(r, "v", idx, 64, 1000); err != nil {
			t.Fatal(err)
		}
	}
	// The owner's refusal left the connection and the address in use: the
	// new variable's rows came direct.
	if p, _ := r.Profile("v"); p.Direct != 1+3*7 {
		t.Fatalf("reads of the new variable: %d rows direct (profile %+v), want %d", p.Direct, p, 1+3*7)
	}
}

// TestDirectOwnerRestart: the owner's agent is killed with a rank's
// direct connection pooled, and started again on a new port; reads fail
// as through the agent while it is gone (ErrPeer), then find it again
// (through this node's agent, which learns the new address), always with
// the right rows; and then go direct again, to the new address, without
// the variable looked up again by hand: fixed rows (GetBatch and Get) and
// ragged rows.
func TestDirectOwnerRestart(t *testing.T) {
	c, p1 := startTwoNodeProcs(t, "directrestart", "5s")
	c.addPattern(t, "v", []int64{10, 10}, 16, 4)
	ragLen := func(g int64) int64 { return g%3 + 1 }
	c.mustEach(t, func(rank int, s *ddstore.Store) error {
		var vals []byte
		var lens []int64
		for g := int64(rank) * 10; g < int64(rank+1)*10; g++ {
			lens = append(lens, ragLen(g))
			for u := range ragLen(g) {
				vals = append(vals, byte(g*5+u))
			}
		}
		return s.AddRagged("g", vals, lens, ddstore.Uint8)
	})
	s := c.stores[0]
	ragged := func(idx ...int64) error {
		var want []byte
		for _, g := range idx {
			for u := range ragLen(g) {
				want = append(want, byte(g*5+u))
			}
		}
		dst := make([]byte, len(want))
		got, err := s.GetRagged("g", dst, idx, nil)
		if err != nil {
			return err
		}
		if string(dst[:got]) != string(want) {
			return fmt.Errorf("GetRagged %v: %v, want %v", idx, dst[:got], want)
		}
		return nil
	}
	direct := func(name string) int64 {
		t.Helper()
		p, err := s.Profile(name)
		if err != nil {
			t.Fatal(err)
		}
		return p.Direct
	}
	// idx and the run of 3 rows from idx[0] are all of n1: 7 rows direct
	// per checkRows.
	idx := []int64{15, 13, 19, 11}
	if err := checkRows(s, "v", idx, 64, 0); err != nil {
		t.Fatal(err)
	}
	if err := ragged(12, 15, 19); err != nil {
		t.Fatal(err)
	}
	if d, g := direct("v"), direct("g"); d != 7 || g != 3 {
		t.Fatalf("before the restart: %d and %d rows direct, want 7 and 3", d, g)
	}
	runDir := p1.arg("--run-dir")
	old := agentInfo(t, c, runDir, "n1").PeerAddr
	p1.kill()
	if err := checkRows(s, "v", idx, 64, 0); !errors.Is(err, ddstore.ErrPeer) {
		t.Fatalf("rows of a dead node: %v, want ErrPeer", err)
	}
	p1.start()
	testutil.WaitFor(t, 20*time.Second, func() error { return checkRows(s, "v", idx, 64, 0) })
	moved := agentInfo(t, c, runDir, "n1")
	if moved.PeerAddr == old {
		t.Fatalf("n1 restarted at its old peer address %s", old)
	}
	// Direct again, at the new address, for a batch and for Get.
	before := direct("v")
	for k := range int64(3) {
		if err := checkRows(s, "v", idx, 64, 0); err != nil {
			t.Fatal(err)
		}
		if d := direct("v"); d != before+7*(k+1) {
			t.Fatalf("read %d after the restart: %d rows direct, want %d", k+1, d, before+7*(k+1))
		}
	}
	if n := agentInfo(t, c, runDir, "n1").Counters["direct_connections"]; n < 1 {
		t.Fatalf("the restarted agent at %s took %d direct connections, want some", moved.PeerAddr, n)
	}
	// The ragged variable's addresses likewise: its first read after the
	// restart (through the own agent) refreshes them, the next are direct.
	if err := ragged(11, 13); err != nil {
		t.Fatal(err)
	}
	before = direct("g")
	for k := range int64(2) {
		if err := ragged(14, 18, 10); err != nil {
			t.Fatal(err)
		}
		if g := direct("g"); g != before+3*(k+1) {
			t.Fatalf("ragged read %d after the restart: %d rows direct, want %d", k+1, g, before+3*(k+1))
		}
	}
}

// TestDirectRagged: ragged rows of the other node are read straight from
// its agent (each row its own size, placed between this node's rows), and
// a variable freed and added again with other rows never gives the old
// ones.
func TestDirectRagged(t *testing.T) {
	c, _ := startTwoNodeProcs(t, "directrag", "5s")
	const n = 10
	length := func(g, shift int64) int64 { return (g + shift) % 4 } // empty rows too
	add := func(shift int64) {
		c.mustEach(t, func(rank int, s *ddstore.Store) error {
			var vals []byte
			lens := make([]int64, n)
			for i := range int64(n) {
				g := int64(rank)*n + i
				lens[i] = length(g, shift)
				for u := range lens[i] {
					vals = append(vals, byte(g*7+u+shift))
				}
			}
			return s.AddRagged("r", vals, lens, ddstore.Uint8)
		})
	}
	check := func(s *ddstore.Store, idx []int64, shift int64) {
		t.Helper()
		var want []byte
		for _, g := range idx {
			for u := range length(g, shift) {
				want = append(want, byte(g*7+u+shift))
			}
		}
		dst := make([]byte, len(want)+5)
		lens := make([]int64, len(idx))
		got, err := s.GetRagged("r", dst, idx, lens)
		if err != nil {
			t.Fatal(err)
		}
		if string(dst[:got]) != string(want) {
			t.Fatalf("GetRagged %v: %v, want %v", idx, dst[:got], want)
		}
	}
	direct := func(s *ddstore.Store) int64 {
		p, err := s.Profile("r")
		if err != nil {
			t.Fatal(err)
		}
		return p.Direct
	}
	add(0)
	s := c.stores[0]
	check(s, []int64{11, 12, 13, 14, 15}, 0) // 12 is empty
	if d := direct(s); d != 4 {
		t.Fatalf("rows of n1 alone: %d direct, want 4", d)
	}
	check(s, []int64{1, 13, 2, 15, 3, 17}, 0)
	if d := direct(s); d != 7 {
		t.Fatalf("rows of both nodes: %d direct, want 7", d)
	}
	// A reader that keeps its table while the variable is freed and added
	// again.
	r, err := ddstore.Open(ddstore.Config{Namespace: c.ns, Reader: true, Node: "n0", Rank: 0, Size: 2,
		RunDir: filepath.Dir(s.Socket()), NoSpawn: true, Timeout: 10 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	check(r, []int64{11, 13, 1, 14, 15}, 0)
	before := direct(r)
	c.mustEach(t, func(_ int, s *ddstore.Store) error { return s.Free("r") })
	add(3)
	for range 3 {
		check(r, []int64{11, 13, 1, 14, 15}, 3)
	}
	if d := direct(r); d <= before {
		t.Fatalf("reads of the new variable: %d rows direct, want more than %d", d, before)
	}
}

// TestDirectPieces: a direct read of a MiB or more is cut into pieces,
// each read on a connection of its own to the owner at once (agents as
// processes): random rows with repeats, runs of consecutive rows, into a
// plain buffer and into a receive buffer, and two such reads in flight
// together, all land right and all direct; once the variable is freed
// and added again with other rows, the pieces the owner refuses send the
// whole read through this node's agent, and the next reads come direct
// again with the new rows.
func TestDirectPieces(t *testing.T) {
	c, _ := startTwoNodeProcs(t, "directpieces", "5s")
	runDir := filepath.Dir(c.stores[0].Socket())
	const n, rb = 600, 4096 // rows per node; 256 of them: 1 MiB
	c.addPattern(t, "v", []int64{n, n}, 1024, 4)
	s := c.stores[0]
	rng := rand.New(rand.NewPCG(7, 8))
	batch := func() []int64 {
		idx := make([]int64, 256)
		for i := range idx {
			switch {
			case i%50 < 10 && i > 0:
				idx[i] = min(idx[i-1]+1, 2*n-1) // a run
			case i%61 == 0 && i > 0:
				idx[i] = idx[i/2] // a repeat
			default:
				idx[i] = n + rng.Int64N(n)
			}
		}
		return idx
	}
	check := func(s *ddstore.Store, dst []byte, idx []int64, shift int64) error {
		if err := s.GetBatch("v", dst, idx); err != nil {
			return err
		}
		for i, g := range idx {
			if err := samePattern(dst[i*rb:(i+1)*rb], g+shift); err != nil {
				return fmt.Errorf("GetBatch row %d of %d: %w", i, len(idx), err)
			}
		}
		run := dst[:256*rb]
		if err := s.Get("v", run, n+100); err != nil {
			return err
		}
		for k := range int64(256) {
			if err := samePattern(run[k*rb:(k+1)*rb], n+100+k+shift); err != nil {
				return fmt.Errorf("Get of 256 rows: %w", err)
			}
		}
		return nil
	}
	plain := make([]byte, 256*rb)
	recv, err := s.AllocRecv(256 * rb)
	if err != nil {
		t.Fatal(err)
	}
	defer s.FreeRecv(recv)
	for _, dst := range [][]byte{plain, recv} {
		if err := check(s, dst, batch(), 0); err != nil {
			t.Fatal(err)
		}
	}
	p, err := s.Profile("v")
	if err != nil {
		t.Fatal(err)
	}
	if p.Direct != 2*(256+256) || p.RemoteRows != p.Direct {
		t.Fatalf("profile after 2 GetBatch of 256 rows and 2 Get of 256 of n1: Direct %d, RemoteRows %d; want %d, %d", p.Direct, p.RemoteRows, 2*(256+256), 2*(256+256))
	}
	// The pieces went over several connections, which stay pooled.
	if got := agentInfo(t, c, runDir, "n1").Counters["direct_connections"]; got < 2 {
		t.Fatalf("n1's direct_connections after reads of 1 MiB and more = %d, want >= 2 (one per piece)", got)
	}

	// The bound (DDSTORE_DIRECT_MAX_BYTES, read at Open): one row more
	// than it goes through this node's agent, all rows right.
	t.Setenv("DDSTORE_DIRECT_MAX_BYTES", fmt.Sprint(255*rb))
	bound, err := ddstore.Open(ddstore.Config{Namespace: c.ns, Reader: true, Node: "n0", Rank: 0, Size: 2, RunDir: runDir,
		NoSpawn: true, Timeout: 10 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer bound.Close()
	idx := batch()
	if err := check(bound, plain[:256*rb], idx, 0); err != nil {
		t.Fatal(err)
	}
	if err := bound.GetBatch("v", plain[:255*rb], idx[:255]); err != nil {
		t.Fatal(err)
	}
	if p, _ := bound.Profile("v"); p.Direct != 255 || p.RemoteRows != 256+256+255 {
		t.Fatalf("with a bound of 255 rows: Direct %d, RemoteRows %d; want 255 (the batch of 255 rows), %d", p.Direct, p.RemoteRows, 256+256+255)
	}

	// Two reads in flight at once.
	var wg sync.WaitGroup
	errs := make([]error, 2)
	for g := range errs {
		dst := make([]byte, 256*rb)
		idx := batch()
		wg.Go(func() {
			for range 20 {
				if errs[g] = check(s, dst, idx, 0); errs[g] != nil {
					return
				}
			}
		})
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		t.Fatal(err)
	}

	// Freed and added again: the same geometry, each row the pattern of
	// the row 5000 further.
	c.mustEach(t, func(_ int, s *ddstore.Store) error { return s.Free("v") })
	c.mustEach(t, func(rank int, s *ddstore.Store) error {
		buf := make([]byte, n*rb)
		for i := range int64(n) {
			pattern(buf[i*rb:(i+1)*rb], int64(rank)*n+i+5000)
		}
		return s.Add("v", buf, 1024, 4)
	})
	for range 3 {
		if err := check(s, recv, batch(), 5000); err != nil {
			t.Fatal(err)
		}
	}
	if p, _ := s.Profile("v"); p.Direct < 2*(256+256) || p.RemoteRows != 3*(256+256) {
		t.Fatalf("reads of the new variable: Direct %d, RemoteRows %d; want >= %d direct of %d", p.Direct, p.RemoteRows, 2*(256+256), 3*(256+256))
	}
}

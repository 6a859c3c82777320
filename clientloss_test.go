package ddstore_test

// Client loss: a trainer killed mid-request leaves nothing
// behind in its node's agent. The clients are real processes (this test
// binary re-executed), SIGKILLed at a random moment while they open,
// register receive buffers, read rows of both nodes, create and free
// variables, or wait in a collective that will never complete.

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/ddstore-go/ddstore"
	"github.com/ddstore-go/ddstore/internal/testutil"
)

// lossArgs is what a killed client is told.
type lossArgs struct {
	NS, Node, Socket string
	Mode             string // read, create or pending
	Seed             uint64
	Rows             int64 // rows of "data" (all ranks)
	RowBytes         int64
}

// Phases a client writes to stdout as one byte before each step, so that
// the test knows roughly where each kill landed.
var lossPhases = map[byte]string{
	'o': "open", 'g': "register a receive buffer", 'u': "unregister one", 'r': "read",
	'c': "create+publish (Add)", 'f': "free",
}

var _ = testutil.Helper("clientloss", lossClient)

// lossClient runs until it is killed; it exits by itself only on an error,
// which fails the test.
func lossClient(a lossArgs) int {
	mark := func(c byte) { os.Stdout.Write([]byte{c}) }
	fail := func(err error) int {
		fmt.Fprintf(os.Stderr, "client %s: %v\n", a.Mode, err)
		return 3
	}
	rng := rand.New(rand.NewPCG(a.Seed, uint64(os.Getpid())))
	mark('o')
	cfg := ddstore.Config{Namespace: a.NS, Node: a.Node, Socket: a.Socket, NoSpawn: true, Rank: 0, Size: 1,
		LocalRank: 0, LocalSize: 1, Timeout: 20 * time.Second, PublishTimeout: time.Second, AgentWait: 5 * time.Second}
	switch a.Mode {
	case "read":
		cfg.Reader = true
	case "pending":
		cfg.Rank, cfg.Size = 1, 2 // rank 0 never comes
	}
	s, err := ddstore.Open(cfg)
	if err != nil {
		return fail(err)
	}
	rb := a.RowBytes
	var bufs [][]byte
	read := func() error {
		if len(bufs) == 0 || rng.IntN(8) == 0 {
			mark('g')
			buf, err := s.AllocRecv((1 + rng.IntN(8)) << 18) // 256 KiB .. 2 MiB
			if err != nil {
				return err
			}
			bufs = append(bufs, buf)
			if len(bufs) > 3 {
				mark('u')
				if err := s.FreeRecv(bufs[0]); err != nil {
					return err
				}
				bufs = bufs[1:]
			}
		}
		// Into a receive buffer (the agent writes there) or a plain slice
		// (through the lane's staging region).
		n := 1 + rng.Int64N(256)
		dst := make([]byte, n*rb)
		if rng.IntN(2) == 0 {
			dst = bufs[rng.IntN(len(bufs))][:n*rb]
		}
		mark('r')
		if rng.IntN(4) == 0 {
			start := rng.Int64N(a.Rows - n + 1)
			if err := s.Get("data", dst, start); err != nil {
				return err
			}
			for i := range n {
				if !rowOK(dst[i*rb:(i+1)*rb], start+i) {
					return fmt.Errorf("Get: row %d wrong", start+i)
				}
			}
			return nil
		}
		idx := make([]int64, n)
		for i := range idx {
			idx[i] = rng.Int64N(a.Rows)
		}
		if err := s.GetBatch("data", dst, idx); err != nil {
			return err
		}
		for i, g := range idx {
			if !rowOK(dst[int64(i)*rb:int64(i+1)*rb], g) {
				return fmt.Errorf("GetBatch: row %d wrong", g)
			}
		}
		return nil
	}
	switch a.Mode {
	case "read":
		for {
			if err := read(); err != nil {
				return fail(err)
			}
		}
	case "create":
		// Up to 4 MiB, so that the copy between Create and Publish takes
		// a while.
		const most = 64 + 4096
		rows := make([]byte, most*rb)
		for i := 0; ; i++ {
			n := 64 + rng.Int64N(most-64)
			pattern(rows[(n-1)*rb:n*rb], n-1) // the row read back
			name := fmt.Sprintf("c.%d.%d", os.Getpid(), i)
			mark('c')
			if err := s.Add(name, rows[:n*rb], rb, 1); err != nil {
				return fail(err)
			}
			mark('r')
			got := make([]byte, rb)
			if err := s.Get(name, got, n-1); err != nil {
				return fail(err)
			}
			if !rowOK(got, n-1) {
				return fail(fmt.Errorf("%s: row %d wrong", name, n-1))
			}
			mark('f')
			if err := s.Free(name); err != nil {
				return fail(err)
			}
		}
	case "pending":
		// Reads go on while a collective waits for a rank that never
		// comes: the kill finds requests in flight on several sessions.
		errc := make(chan error, 1)
		go func() {
			for {
				if err := read(); err != nil {
					errc <- err
					return
				}
			}
		}()
		rows := make([]byte, 16*rb)
		for {
			err := s.Add(fmt.Sprintf("p.%d", os.Getpid()), rows, rb, 1)
			if !errors.Is(err, ddstore.ErrTimeout) {
				return fail(fmt.Errorf("Add without rank 0: %v, want a timeout", err))
			}
			select {
			case err := <-errc:
				return fail(err)
			default:
			}
		}
	}
	return fail(fmt.Errorf("unknown mode %q", a.Mode))
}

// clientKills is DDSTORE_CLIENT_KILLS, default 300 (see TestClientLoss).
func clientKills(t *testing.T) int {
	if v := os.Getenv("DDSTORE_CLIENT_KILLS"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 {
			t.Fatalf("DDSTORE_CLIENT_KILLS=%q: want a positive count", v)
		}
		return n
	}
	return 300
}

// TestClientLoss kills clients of a two-node job at random moments and
// checks that the agent they talked to is back where it was after a
// warm-up: the same sessions, receive regions and variables, no more open
// descriptors or goroutines (on both agents), the same entries in /dev/shm,
// and resident memory within a bound (below).
//
// `make soak` kills 1,000 clients (without -race: about 21 ms a kill, 24 s
// in all). `make test` kills 300 (DDSTORE_CLIENT_KILLS): under -race a kill
// takes about 36 ms, so 1,000 would take some 36 s of a suite that already
// takes 100; 300 take about 16 s in all.
//
// A client is this test binary in the role lossClient: a reader (receive
// buffers registered and freed, GetBatch and Get of rows of both nodes into
// them or through staging), a creator (Add of up to 4 MiB, read, Free,
// again), or a rank waiting in an Add whose other rank never comes while it
// reads on other lanes. Each is killed 0-30 ms after it starts to run (one
// in ten within 2 ms, while it connects).
func TestClientLoss(t *testing.T) {
	if testing.Short() {
		t.Skip("starts hundreds of processes")
	}
	kills := clientKills(t)
	ns, runDir, agents := startAgentProcs(t, "loss", "a", "b")
	a := agents[0]

	// The job the clients read: rank 0's rows on node a, rank 1's on b.
	const perRank, rb = 4096, 1024
	c := &cluster{ns: ns}
	for r, node := range []string{"a", "b"} {
		s, err := ddstore.Open(ddstore.Config{Namespace: ns, Rank: r, Size: 2, LocalRank: 0, LocalSize: 1,
			Node: node, RunDir: runDir, NoSpawn: true, Timeout: 20 * time.Second, PublishTimeout: 20 * time.Second})
		if err != nil {
			t.Fatal(err)
		}
		c.stores = append(c.stores, s)
		t.Cleanup(func() { s.Close() })
	}
	c.addPattern(t, "data", []int64{perRank, perRank}, rb, 1)
	// Node b's rows in pieces on every connection of a's pool to b, so
	// that the warm-up leaves the pool at its full size.
	big := make([]int64, perRank)
	for i := range big {
		big[i] = perRank + int64(i)
	}
	for range 8 {
		if err := c.stores[0].GetBatch("data", make([]byte, perRank*rb), big); err != nil {
			t.Fatal(err)
		}
	}

	rng := rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), 7))
	phases := map[string]int{}
	modes := map[string]int{}
	cycle := func(i int) {
		mode := "read"
		switch k := rng.IntN(20); {
		case k < 5:
			mode = "create"
		case k < 8:
			mode = "pending"
		}
		modes[mode]++
		cmd := testutil.HelperCmd(t, "clientloss", lossArgs{NS: ns, Node: "a", Socket: a.socket, Mode: mode,
			Seed: rng.Uint64(), Rows: 2 * perRank, RowBytes: rb})
		// Without DDSTORE_SECRET a client proves the key in the agent's key
		// file, as a trainer on the node may: deriving the key from the
		// secret (PBKDF2) would take most of a short-lived client's life.
		cmd.Env = slices.DeleteFunc(cmd.Env, func(kv string) bool { return strings.HasPrefix(kv, "DDSTORE_SECRET=") })
		out, err := cmd.StdoutPipe()
		if err != nil {
			t.Fatal(err)
		}
		var stderr testutil.Buffer
		cmd.Stderr = &stderr
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		var last atomic.Int32
		started := make(chan struct{})
		go func() {
			b := make([]byte, 256)
			for {
				n, err := out.Read(b)
				if n > 0 {
					if last.Swap(int32(b[n-1])) == 0 {
						close(started)
					}
				}
				if err != nil {
					return
				}
			}
		}()
		select {
		case <-started:
		case <-time.After(30 * time.Second):
			cmd.Process.Kill()
			cmd.Wait()
			t.Fatalf("client %d (%s) never started: %s", i, mode, stderr.String())
		}
		// One in ten within its first 2 ms: while it connects and proves
		// the key.
		wait := 30 * time.Millisecond
		if rng.IntN(10) == 0 {
			wait = 2 * time.Millisecond
		}
		time.Sleep(time.Duration(rng.Int64N(int64(wait))))
		at := byte(last.Load())
		cmd.Process.Kill()
		err = cmd.Wait()
		var ee interface{ Sys() any }
		if errors.As(err, &ee) {
			if ws, ok := ee.Sys().(syscall.WaitStatus); ok && ws.Signaled() && ws.Signal() == syscall.SIGKILL {
				ph := lossPhases[at]
				if mode == "pending" {
					ph = "wait in a collective, reading meanwhile"
				}
				phases[ph]++
				return
			}
		}
		t.Fatalf("client %d (%s) ended before it was killed: %v\n%s", i, mode, err, stderr.String())
	}

	// settle waits until the killed clients are gone from the agent: it
	// sees a client die when its socket closes or, for a rank waiting in a
	// collective, when the round times out (1 s). A creator killed after
	// its Add returned and before its Free leaves a variable that the job
	// owns, by design (the data stay with the agent when a rank goes, for
	// the other ranks and a restarted one): the job frees those here, as a
	// restarted rank would. It returns how many it freed.
	jobClients := a.state(t, ns).Clients // the job's own lanes, and the query
	settle := func() int {
		freed := 0
		testutil.WaitFor(t, 15*time.Second, func() error {
			in, err := ddstore.QueryAgent(a.socket, ns, "a")
			if err != nil {
				return err
			}
			var left []string
			for _, v := range in.Variables {
				switch {
				case strings.HasPrefix(v.Name, "c.") && v.Published:
					if err := freeVariable(ns, a.socket, v.Name); err != nil {
						return err
					}
					freed++
				case v.Name != "data":
					left = append(left, fmt.Sprintf("%s (published %v)", v.Name, v.Published))
				}
			}
			if in.Clients != jobClients || len(left) > 0 {
				return fmt.Errorf("agent a still has %d clients (the job has %d), variables %v", in.Clients, jobClients, left)
			}
			return nil
		})
		return freed
	}

	// Warm-up: the agent's pools, buffers and heap reach their working
	// size before the baseline is taken.
	const warm = 30
	for i := range warm {
		cycle(i)
	}
	settle()
	base, baseB, baseShm := a.state(t, ns), agents[1].state(t, ns), shmEntries(ns)
	t.Logf("baseline after %d warm-up kills: node a: %v; node b: %v; /dev/shm: %v", warm, base, baseB, baseShm)
	clear(phases)
	clear(modes)

	t0 := time.Now()
	for i := range kills {
		cycle(i)
	}
	elapsed := time.Since(t0)
	t.Logf("%d clients killed in %v (%.1f ms each): modes %v", kills, elapsed.Round(time.Millisecond),
		float64(elapsed.Milliseconds())/float64(kills), modes)
	t.Logf("last step begun when killed: %v", phases)
	t.Logf("variables left by creators killed between Add and Free, freed by the job: %d", settle())

	// RSS bound. The agent's live heap is a few MiB; Go lets the heap
	// reach twice the live size before collecting (GOGC 100), returns freed
	// pages to the kernel lazily (the scavenger), and under -race the
	// detector's shadow memory grows with the heap. Measured growth after
	// 300 to 1,000 kills: under 1 MiB without -race, 5-9 MiB with it. 32 MiB
	// over the baseline leaves room for that, and is crossed by any leak of
	// 110 KiB a kill over 300 kills (32 KiB over 1,000): one receive region
	// (256 KiB at least, written by the agent) or one session (a
	// goroutine with its buffers) left per killed client; those are also
	// counted directly here (regions exactly; sessions, descriptors and
	// goroutines must not grow).
	const rssSlack = 32 << 20
	var now, nowB procState
	deadline := time.Now().Add(10 * time.Second)
	for {
		now, nowB = a.state(t, ns), agents[1].state(t, ns)
		shm := shmEntries(ns)
		var diffs []string
		// Sessions must not grow; the job's own lanes may be fewer than at
		// the baseline (the query of the baseline's moment, a lane the job
		// had open then), never more.
		if now.Clients > base.Clients || now.Regions != base.Regions || now.Vars != base.Vars {
			diffs = append(diffs, fmt.Sprintf("agent a: clients %d→%d, recv regions %d→%d, variables %d→%d",
				base.Clients, now.Clients, base.Regions, now.Regions, base.Vars, now.Vars))
		}
		if now.Fds > base.Fds || nowB.Fds > baseB.Fds {
			diffs = append(diffs, fmt.Sprintf("open descriptors: a %d→%d, b %d→%d", base.Fds, now.Fds, baseB.Fds, nowB.Fds))
		}
		if now.Goroutines > base.Goroutines || nowB.Goroutines > baseB.Goroutines {
			diffs = append(diffs, fmt.Sprintf("goroutines: a %d→%d, b %d→%d", base.Goroutines, now.Goroutines, baseB.Goroutines, nowB.Goroutines))
		}
		if !slices.Equal(shm, baseShm) {
			diffs = append(diffs, fmt.Sprintf("/dev/shm: %v → %v", baseShm, shm))
		}
		if now.RSS > base.RSS+rssSlack {
			diffs = append(diffs, fmt.Sprintf("agent a RSS %.1f → %.1f MiB", float64(base.RSS)/(1<<20), float64(now.RSS)/(1<<20)))
		}
		if len(diffs) == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("after %d kills, not back to the baseline:\n%s", kills, strings.Join(diffs, "\n"))
		}
		time.Sleep(100 * time.Millisecond)
	}
	t.Logf("after %d kills: node a: %v (RSS %+.1f MiB); node b: %v", kills, now, float64(now.RSS-base.RSS)/(1<<20), nowB)
}

// freeVariable frees a variable of one rank (size 1), as that rank would.
func freeVariable(ns, socket, name string) error {
	s, err := ddstore.Open(ddstore.Config{Namespace: ns, Rank: 0, Size: 1, LocalRank: 0, LocalSize: 1,
		Node: "a", Socket: socket, NoSpawn: true})
	if err != nil {
		return err
	}
	defer s.Close()
	if _, err := s.Info(name); err != nil {
		return err
	}
	return s.Free(name)
}

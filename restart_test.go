package ddstore_test

import (
	"bytes"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/ddstore-go/ddstore"
	"github.com/ddstore-go/ddstore/internal/testutil"
)

// restartableAgent is a real `ddstore agent` process that a test can kill and
// start again with the same arguments.
type restartableAgent struct {
	t    *testing.T
	args []string
	cmd  *exec.Cmd
	log  bytes.Buffer
}

func startRestartableAgent(t *testing.T, args ...string) *restartableAgent {
	p := &restartableAgent{t: t, args: args}
	p.start()
	t.Cleanup(func() {
		p.kill()
		if t.Failed() {
			t.Logf("agent %v log:\n%s", args, p.log.String())
		}
	})
	return p
}

func (p *restartableAgent) start() {
	p.cmd = exec.Command(ddstoreBin, append([]string{"agent"}, p.args...)...)
	p.cmd.Stdout, p.cmd.Stderr = &p.log, &p.log
	if err := p.cmd.Start(); err != nil {
		p.t.Fatal(err)
	}
}

func (p *restartableAgent) signal(sig syscall.Signal) {
	if p.cmd != nil && p.cmd.Process != nil {
		p.cmd.Process.Signal(sig)
		p.cmd.Wait()
		p.cmd = nil
	}
}

func (p *restartableAgent) kill() { p.signal(syscall.SIGKILL) }

// arg is the value the agent was given for flag.
func (p *restartableAgent) arg(flag string) string {
	if i := slices.Index(p.args, flag); i >= 0 && i+1 < len(p.args) {
		return p.args[i+1]
	}
	p.t.Fatalf("agent started without %s: %v", flag, p.args)
	return ""
}

// inode is a file's inode number: the same one after a restart means the
// agent re-adopted the segment rather than loading the data again.
func inode(t *testing.T, path string) uint64 {
	t.Helper()
	var st syscall.Stat_t
	if err := syscall.Stat(path, &st); err != nil {
		t.Fatal(err)
	}
	return st.Ino
}

// TestAgentRestartReadopts: an agent killed outright (SIGKILL) and started
// again re-adopts its segments — the same files, no reload — and the job's
// open Store reads every row on through it; a new variable after the
// restart gets a new table id. Then a clean stop without --persist removes
// everything, and one with --persist keeps it for the next agent.
func TestAgentRestartReadopts(t *testing.T) {
	dir := t.TempDir()
	ns := fmt.Sprintf("restart%d", os.Getpid())
	runDir := filepath.Join(dir, "run")
	removeSegmentsAtEnd(t, ns)
	args := []string{"--namespace", ns, "--node", "n0", "--run-dir", runDir, "--timeout", "5s"}
	p := startRestartableAgent(t, args...)
	open := func(rank, size int) *ddstore.Store { return openLocal(t, ns, "n0", runDir, rank, size, rank, size) }
	c := &cluster{ns: ns, stores: []*ddstore.Store{open(0, 2), open(1, 2)}}
	c.addPattern(t, "v", []int64{30, 20}, 8, 8)
	segs := segments(ns)
	if len(segs) != 2 {
		t.Fatalf("segments %v", segs)
	}
	before := map[string]uint64{}
	for _, s := range segs {
		before[s] = inode(t, s)
	}
	readAll := func() error {
		return c.each(func(r int, s *ddstore.Store) error {
			all := make([]byte, 50*64)
			if err := s.Get("v", all, 0); err != nil {
				return err
			}
			for g := range int64(50) {
				if err := samePattern(all[g*64:(g+1)*64], g); err != nil {
					return err
				}
			}
			return nil
		})[0]
	}
	if err := readAll(); err != nil {
		t.Fatal(err)
	}

	p.kill()
	if got := segments(ns); !slices.Equal(got, segs) {
		t.Fatalf("after SIGKILL the segments are %v, want %v", got, segs)
	}
	p.start()
	var in ddstore.AgentInfo
	testutil.WaitFor(t, 20*time.Second, func() (err error) {
		in, err = ddstore.QueryAgent(ddstore.SocketPath(runDir, ns, "n0"), ns, "n0")
		return err
	})
	// Node-local rows never needed the agent; the open stores reconnect
	// by themselves for what does (a new variable, below).
	if err := readAll(); err != nil {
		t.Fatal(err)
	}
	for _, s := range segments(ns) {
		if inode(t, s) != before[s] {
			t.Errorf("segment %s was made again, not re-adopted", s)
		}
	}
	if in.Counters["adopted_variables"] != 1 {
		t.Errorf("adopted_variables = %d, want 1", in.Counters["adopted_variables"])
	}
	// A variable made after the restart is new (its own id), and a Store
	// opened now reads the old one.
	c.addPattern(t, "w", []int64{3, 4}, 8, 8)
	late := open(0, 2)
	row := make([]byte, 64)
	if err := late.Get("v", row, 49); err != nil {
		t.Fatal(err)
	}
	if err := samePattern(row, 49); err != nil {
		t.Fatal(err)
	}
	vi, _ := late.Info("v")
	wi, _ := late.Info("w")
	if vi.TotalRows != 50 || wi.TotalRows != 7 {
		t.Errorf("info: v %d rows, w %d rows", vi.TotalRows, wi.TotalRows)
	}

	// A clean stop without --persist removes the shards and the manifest.
	for _, st := range c.stores {
		st.Close()
	}
	late.Close()
	p.signal(syscall.SIGTERM)
	if got := segments(ns); len(got) != 0 {
		t.Fatalf("after SIGTERM without --persist: segments %v", got)
	}
	if _, err := os.Stat(ddstore.SocketPath(runDir, ns, "n0") + ".manifest.json"); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("after SIGTERM without --persist the manifest is there: %v", err)
	}

	// With --persist a clean stop keeps them for the next agent.
	p.args = append(p.args, "--persist")
	p.start()
	c = &cluster{ns: ns, stores: []*ddstore.Store{open(0, 2), open(1, 2)}}
	c.addPattern(t, "x", []int64{5, 6}, 8, 8)
	for _, st := range c.stores {
		st.Close()
	}
	p.signal(syscall.SIGTERM)
	if n := len(segments(ns)); n != 2 {
		t.Fatalf("after SIGTERM with --persist: %d segments, want 2", n)
	}
	p.start()
	testutil.WaitFor(t, 20*time.Second, func() error {
		_, err := ddstore.QueryAgent(ddstore.SocketPath(runDir, ns, "n0"), ns, "n0")
		return err
	})
	r := open(0, 1)
	all := make([]byte, 11*64)
	testutil.WaitFor(t, 20*time.Second, func() error { return r.Get("x", all, 0) })
	for g := range int64(11) {
		checkRow(t, all[g*64:(g+1)*64], g)
	}
}

// removeSegmentsAtEnd removes the namespace's segments when the test ends.
// Called before the test starts its agents, its cleanup runs after theirs:
// agents killed outright leave their segments.
func removeSegmentsAtEnd(t *testing.T, ns string) {
	t.Cleanup(func() {
		for _, seg := range segments(ns) {
			os.Remove(seg)
		}
	})
}

// twoNodeJobs numbers the jobs of startTwoNodeProcs, so that each has a
// namespace of its own (also under -count).
var twoNodeJobs atomic.Int64

// startTwoNodeProcs starts two agent processes, nodes n0 and n1 meeting at
// a loopback rendezvous (agent timeout as given, n0 the coordinator), and a
// rank's Store on each; it returns the job and n1's agent, for the test to
// kill.
func startTwoNodeProcs(t *testing.T, prefix, timeout string) (*cluster, *restartableAgent) {
	ns := fmt.Sprintf("%s%d-%d", prefix, os.Getpid(), twoNodeJobs.Add(1))
	runDir := filepath.Join(t.TempDir(), "run")
	removeSegmentsAtEnd(t, ns)
	common := []string{"--namespace", ns, "--run-dir", runDir, "--rendezvous", freeAddr(t), "--peer-listen", "127.0.0.1:0", "--timeout", timeout}
	startRestartableAgent(t, append([]string{"--node", "n0"}, common...)...)
	// n0 is up, holding the rendezvous address, before n1 starts: n0 is
	// the coordinator, and n1 the agent the tests kill.
	testutil.WaitFor(t, 20*time.Second, func() error {
		_, err := ddstore.QueryAgent(ddstore.SocketPath(runDir, ns, "n0"), ns, "n0")
		return err
	})
	p1 := startRestartableAgent(t, append([]string{"--node", "n1"}, common...)...)
	c := &cluster{ns: ns}
	for r, node := range []string{"n0", "n1"} {
		c.stores = append(c.stores, openAt(t, ns, node, runDir, r, 2))
	}
	return c, p1
}

// TestNodeAgentRestartAcrossNodes: the agent of the second node is killed
// and started again on a new port; it re-adopts its shard, tells the
// coordinator, and the first node's reads of its rows find it there.
func TestNodeAgentRestartAcrossNodes(t *testing.T) {
	c, p1 := startTwoNodeProcs(t, "restart2n", "5s")
	stores := c.stores
	c.addPattern(t, "v", []int64{10, 10}, 16, 4)
	idx := []int64{15, 3, 19, 10}
	dst := make([]byte, len(idx)*64)
	check := func() error {
		if err := stores[0].GetBatch("v", dst, idx); err != nil {
			return err
		}
		for i, g := range idx {
			if err := samePattern(dst[i*64:(i+1)*64], g); err != nil {
				return err
			}
		}
		return nil
	}
	if err := check(); err != nil {
		t.Fatal(err)
	}
	p1.kill()
	if err := check(); !errors.Is(err, ddstore.ErrPeer) {
		t.Fatalf("rows of a dead node: %v, want ErrPeer", err)
	}
	p1.start()
	testutil.WaitFor(t, 20*time.Second, check)
}

// TestNodeAgentRestartWithBadManifest: the agent of the second node is
// killed, its manifest spoiled, and it is started again on a new port; it
// re-adopts nothing, but tells the coordinator where it is now, so that
// the first node's reads of its rows reach it and fail with ErrUnknown
// naming the node (not a dial of the old port) — or, for a variable with a
// backing file, come from the file — and a variable created afterwards
// reads across both nodes.
func TestNodeAgentRestartWithBadManifest(t *testing.T) {
	c, p1 := startTwoNodeProcs(t, "restartbad", "5s")
	stores := c.stores
	c.addPattern(t, "v", []int64{10, 10}, 16, 4)
	file := filepath.Join(t.TempDir(), "b.npy")
	writeNPY(t, file, 20, 64)
	c.addBacked(t, "b", file, 20, 20, 64)
	idx := []int64{15, 3}
	dst := make([]byte, len(idx)*64)
	for _, name := range []string{"v", "b"} {
		if err := stores[0].GetBatch(name, dst, idx); err != nil {
			t.Fatal(err)
		}
	}
	p1.kill()
	manifest := ddstore.SocketPath(p1.arg("--run-dir"), c.ns, "n1") + ".manifest.json"
	if err := os.WriteFile(manifest, []byte("{not json"), 0o600); err != nil {
		t.Fatal(err)
	}
	p1.start()
	testutil.WaitFor(t, 20*time.Second, func() error {
		err := stores[0].GetBatch("v", dst, idx)
		if !errors.Is(err, ddstore.ErrUnknown) || !strings.Contains(err.Error(), `"n1"`) {
			return fmt.Errorf("rows of a node that lost them: %v, want ErrUnknown naming n1", err)
		}
		return nil
	})
	// The rows it held of a variable with a backing file come from the file.
	if err := stores[0].GetBatch("b", dst, idx); err != nil {
		t.Fatalf("backed rows of a node that lost its shard: %v", err)
	}
	for i, g := range idx {
		if err := samePattern(dst[i*64:(i+1)*64], g); err != nil {
			t.Fatal(err)
		}
	}
	if err := stores[0].Free("v"); err != nil {
		t.Log("free after the node lost its shard:", err)
	}
	c.addPattern(t, "w", []int64{10, 10}, 16, 4)
	if err := stores[0].GetBatch("w", dst, idx); err != nil {
		t.Fatal(err)
	}
	for i, g := range idx {
		if err := samePattern(dst[i*64:(i+1)*64], g); err != nil {
			t.Fatal(err)
		}
	}
}

// TestPeerKilledMidBatches: goroutines read batches of both nodes' rows
// without pause while the second node's agent is killed and started again.
// Every read either returns the right rows or fails with ErrPeer naming
// the node, within the timeout — no hang, no wrong row — and once the
// agent is back, reads succeed again.
func TestPeerKilledMidBatches(t *testing.T) {
	c, p1 := startTwoNodeProcs(t, "peerkill", "3s")
	stores := c.stores
	const n, rb = 400, 1024
	c.addPattern(t, "v", []int64{n / 2, n / 2}, rb/8, 8)
	s := stores[0]
	stop := make(chan struct{})
	type result struct{ ok, peerErrs int }
	results := make(chan result, 4)
	var bad error
	var badOnce sync.Once
	for w := range 4 {
		go func() {
			var res result
			defer func() { results <- res }()
			rng := rand.New(rand.NewPCG(uint64(w), 1))
			idx := make([]int64, 32)
			dst := make([]byte, len(idx)*rb)
			for {
				select {
				case <-stop:
					return
				default:
				}
				for i := range idx {
					idx[i] = rng.Int64N(n)
				}
				err := s.GetBatch("v", dst, idx)
				switch {
				case err == nil:
					for i, g := range idx {
						if e := samePattern(dst[i*rb:(i+1)*rb], g); e != nil {
							badOnce.Do(func() { bad = e })
						}
					}
					res.ok++
				case errors.Is(err, ddstore.ErrPeer) && strings.Contains(err.Error(), `"n1"`):
					res.peerErrs++
				default:
					badOnce.Do(func() { bad = fmt.Errorf("unexpected error: %w", err) })
				}
			}
		}()
	}
	// The readers' load runs through three phases, each some batches
	// long: the peer up, killed, started again. The pauses pace the
	// scenario; no assertion waits on them (the readers check each batch).
	time.Sleep(200 * time.Millisecond)
	p1.kill()
	time.Sleep(300 * time.Millisecond)
	p1.start()
	// Back: reads of its rows succeed again.
	testutil.WaitFor(t, 20*time.Second, func() error {
		return s.GetBatch("v", make([]byte, rb), []int64{n - 1})
	})
	time.Sleep(200 * time.Millisecond) // a phase of reads with the peer back, as above
	close(stop)
	var total result
	for range 4 {
		r := <-results
		total.ok += r.ok
		total.peerErrs += r.peerErrs
	}
	if bad != nil {
		t.Fatal(bad)
	}
	if total.ok == 0 || total.peerErrs == 0 {
		t.Errorf("%d reads succeeded, %d failed for the lost node: want both", total.ok, total.peerErrs)
	}
	t.Logf("%d batches read, %d failed while node n1 was down", total.ok, total.peerErrs)
}

package ddstore_test

// A rank killed in a collective: the others fail at once, and a job
// started right after in the namespace does not meet the dead job's
// round or fence. The agents and the ranks are real processes (the ranks
// this test binary re-executed), the kill a SIGKILL.

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
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

// rankArgs is what a rank process of rankLossRank is told.
type rankArgs struct {
	NS, Node, RunDir string
	Rank, Size       int
	// Op: "add", "fence", or "sleep" (until its stdin closes); "add+add"
	// adds "x" then "y", "add+sleep" adds "x" (printing "ok") then sleeps,
	// "add+wait+add" adds "x" (printing "ok") and, once a line comes on
	// its stdin, "y"; "add+add+wait+z" adds "x" and "y" (printing how
	// y went; an error of x ends it) and, once a line comes, "z"; "z"
	// adds "z".
	Op             string
	PublishTimeout time.Duration // 0: 300 s
	// Prefix goes before the names of the variables it adds.
	Prefix string
	// Linger: after printing its result the rank stays, its store
	// open, until its stdin closes (a rank that goes on after an error).
	Linger bool
}

// rankRows is the rows rank r adds to "x": 4 rows of 8 bytes, row g
// holding g.
const rankRows = 4

var _ = testutil.Helper("rankloss", rankLossRank)

// rankLossRank is one rank: it opens its store (then prints "open"), does
// its collective and prints "ok" or "err: " and the error, wrapped kinds
// first ("peer", "timeout"), then exits 0; a failure of its own exits 3.
func rankLossRank(a rankArgs) int {
	if a.PublishTimeout == 0 {
		a.PublishTimeout = 300 * time.Second
	}
	s, err := ddstore.Open(ddstore.Config{Namespace: a.NS, Node: a.Node, RunDir: a.RunDir, NoSpawn: true,
		Rank: a.Rank, Size: a.Size, LocalRank: -1, PublishTimeout: a.PublishTimeout, Timeout: 20 * time.Second,
		AgentWait: 10 * time.Second})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 3
	}
	defer s.Close()
	fmt.Println("open")
	// add adds variable name and reads every rank's rows of it, this
	// node's and the others'; false: a row read wrong.
	add := func(name string) bool {
		rows := make([]byte, rankRows*8)
		for i := range rankRows {
			binary.LittleEndian.PutUint64(rows[i*8:], uint64(a.Rank*rankRows+i))
		}
		if err = s.Add(name, rows, 8, 1); err == nil {
			all := make([]int64, a.Size*rankRows)
			for i := range all {
				all[i] = int64(i)
			}
			got := make([]byte, len(all)*8)
			if err = s.GetBatch(name, got, all); err == nil {
				for i := range all {
					if v := binary.LittleEndian.Uint64(got[i*8:]); v != uint64(i) {
						fmt.Fprintf(os.Stderr, "row %d of %q holds %d\n", i, name, v)
						return false
					}
				}
			}
		}
		return true
	}
	switch a.Op {
	case "add", "add+add", "add+sleep", "add+wait+add", "add+add+wait+z":
		if !add(a.Prefix + "x") {
			return 3
		}
		switch {
		case err != nil:
		case a.Op == "add+add":
			if !add(a.Prefix + "y") {
				return 3
			}
		case a.Op == "add+wait+add":
			fmt.Println("ok")
			if _, err := bufio.NewReader(os.Stdin).ReadString('\n'); err != nil {
				fmt.Fprintln(os.Stderr, err)
				return 3
			}
			if !add(a.Prefix + "y") {
				return 3
			}
		case a.Op == "add+sleep":
			fmt.Println("ok")
			io.Copy(io.Discard, os.Stdin)
			return 0
		case a.Op == "add+add+wait+z":
			if !add(a.Prefix + "y") {
				return 3
			}
			printResult(err) // and the rank goes on
			err = nil
			if _, err := bufio.NewReader(os.Stdin).ReadString('\n'); err != nil {
				fmt.Fprintln(os.Stderr, err)
				return 3
			}
			if !add(a.Prefix + "z") {
				return 3
			}
		}
	case "z":
		if !add(a.Prefix + "z") {
			return 3
		}
	case "fence":
		err = s.Fence()
	case "sleep":
		io.Copy(io.Discard, os.Stdin)
		return 0
	}
	printResult(err)
	if a.Linger {
		io.Copy(io.Discard, os.Stdin)
	}
	return 0
}

// printResult prints a rank's result: "ok", or "err: " and the error,
// wrapped kinds first ("peer", "timeout").
func printResult(err error) {
	if err == nil {
		fmt.Println("ok")
		return
	}
	kinds := ""
	for _, k := range []struct {
		name string
		err  error
	}{{"peer", ddstore.ErrPeer}, {"timeout", ddstore.ErrTimeout}} {
		if errors.Is(err, k.err) {
			kinds += k.name + " "
		}
	}
	fmt.Printf("err: %s%v\n", kinds, err)
}

// rankProc is a running rank process.
type rankProc struct {
	cmd   *exec.Cmd
	stdin io.WriteCloser
	out   *testutil.Buffer // its stdout, line by line
	done  chan struct{}    // closed once it exited
	err   error            // its exit, once done
}

func startRank(t *testing.T, a rankArgs) *rankProc {
	t.Helper()
	p := &rankProc{cmd: testutil.HelperCmd(t, "rankloss", a), out: &testutil.Buffer{}, done: make(chan struct{})}
	var stderr testutil.Buffer
	p.cmd.Stderr = &stderr
	stdout, err := p.cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if p.stdin, err = p.cmd.StdinPipe(); err != nil {
		t.Fatal(err)
	}
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			p.out.Write([]byte(sc.Text() + "\n"))
		}
		p.err = p.cmd.Wait()
		close(p.done)
	}()
	t.Cleanup(func() {
		p.cmd.Process.Kill()
		<-p.done
		if t.Failed() {
			t.Logf("rank %d (%s): stdout %q, stderr %q, exit %v", a.Rank, a.Op, p.out.String(), stderr.String(), p.err)
		}
	})
	return p
}

// result is what the rank printed after "open", once it exited (within
// the test's deadline, far below the 300 s the collectives would wait).
func (p *rankProc) result(t *testing.T, who string) string {
	t.Helper()
	select {
	case <-p.done:
	case <-time.After(90 * time.Second):
		t.Fatalf("%s still runs: it waits for a collective that should have failed or ended (stdout %q)", who, p.out.String())
	}
	if p.err != nil {
		t.Fatalf("%s: exit %v (stdout %q)", who, p.err, p.out.String())
	}
	return strings.TrimSpace(strings.TrimPrefix(p.out.String(), "open\n"))
}

// TestClusterRankKilledMidCollective: of a job of three ranks (nodes a, b,
// a), ranks 0 and 1 wait in a collective (an Add, a Fence) that rank 2 has
// not reached; rank 1 is SIGKILLed. Rank 0 fails at once with ErrPeer
// naming rank 1 (the publish timeout and the agents' join timeout are 300
// s: waiting for it would outlast the test's deadline). Then a new job of
// three new processes, started right away in the namespace, does the same
// collective (the same name and attempt, the same fence sequence) and
// succeeds: it never meets the dead job's round.
func TestClusterRankKilledMidCollective(t *testing.T) {
	for _, op := range []string{"add", "fence"} {
		t.Run(op, func(t *testing.T) {
			ns, runDir, agents := startAgentProcsArgs(t, "rk"+op, []string{"--join-timeout", "300s"}, "a", "b")
			nodes := []string{"a", "b", "a"}
			start := func(ops ...string) []*rankProc {
				var ps []*rankProc
				for r, o := range ops {
					ps = append(ps, startRank(t, rankArgs{NS: ns, Node: nodes[r], RunDir: runDir, Rank: r, Size: len(ops), Op: o}))
				}
				return ps
			}
			name, seq := "x", int64(1)
			kind := "publish"
			if op == "fence" {
				name, kind = "", "fence"
			}
			// waitFor waits until the coordinator holds the collective
			// with exactly the ranks want.
			waitFor := func(want []int64) {
				testutil.WaitFor(t, 60*time.Second, func() error {
					for _, a := range agents {
						in, err := ddstore.QueryAgent(a.socket, ns, a.node)
						if err != nil || !in.Coordinator {
							continue
						}
						for _, c := range in.Collectives {
							if c.Kind == kind && c.Name == name && c.Seq == seq && slices.Equal(c.Ranks, want) {
								return nil
							}
						}
						return fmt.Errorf("the coordinator holds %+v, want %s %q %d with ranks %v", in.Collectives, kind, name, seq, want)
					}
					return errors.New("no coordinator yet")
				})
			}

			dead := start(op, op, "sleep")
			waitFor([]int64{0, 1})
			if err := dead[1].cmd.Process.Signal(syscall.SIGKILL); err != nil {
				t.Fatal(err)
			}
			got := dead[0].result(t, "rank 0 of the dead job")
			if !strings.HasPrefix(got, "err: peer ") || !strings.Contains(got, "rank 1 ") || !strings.Contains(got, "went away") {
				t.Fatalf("rank 0 of the job whose rank 1 was killed: %q, want an ErrPeer naming rank 1", got)
			}
			dead[2].stdin.Close() // the job's last rank ends too
			if got := dead[2].result(t, "rank 2 of the dead job"); got != "" {
				t.Fatalf("rank 2 of the dead job: %q", got)
			}

			for r, p := range start(op, op, op) {
				if got := p.result(t, fmt.Sprintf("rank %d of the new job", r)); got != "ok" {
					t.Fatalf("rank %d of the job started after the dead one: %q, want ok", r, got)
				}
			}
		})
	}
}

// TestClusterNewJobAfterATimedOutRound: a job whose rank 1 never comes to
// its Add or Fence (alive, but elsewhere) times out on rank 0 (a 2 s
// publish timeout: the timeout is what this job is about); its processes
// exit; a job started at once in the namespace, far within the
// coordinator's 10 s LateGrace, does the same collective and succeeds,
// rather than get the dead job's timeout.
func TestClusterNewJobAfterATimedOutRound(t *testing.T) {
	for _, op := range []string{"add", "fence"} {
		t.Run(op, func(t *testing.T) {
			ns, runDir, _ := startAgentProcsArgs(t, "rt"+op, []string{"--join-timeout", "300s"}, "a", "b")
			nodes := []string{"a", "b"}
			r0 := startRank(t, rankArgs{NS: ns, Node: "a", RunDir: runDir, Rank: 0, Size: 2, Op: op, PublishTimeout: 2 * time.Second})
			r1 := startRank(t, rankArgs{NS: ns, Node: "b", RunDir: runDir, Rank: 1, Size: 2, Op: "sleep"})
			if got := r0.result(t, "rank 0 of the first job"); !strings.HasPrefix(got, "err: timeout ") || !strings.Contains(got, "missing ranks 1") {
				t.Fatalf("rank 0 of the job whose rank 1 never came: %q, want ErrTimeout naming rank 1", got)
			}
			r1.stdin.Close()
			if got := r1.result(t, "rank 1 of the first job"); got != "" {
				t.Fatalf("rank 1 of the first job: %q", got)
			}
			var ps []*rankProc
			for r, node := range nodes {
				ps = append(ps, startRank(t, rankArgs{NS: ns, Node: node, RunDir: runDir, Rank: r, Size: 2, Op: op}))
			}
			for r, p := range ps {
				if got := p.result(t, fmt.Sprintf("rank %d of the new job", r)); got != "ok" {
					t.Fatalf("rank %d of the job started right after: %q, want ok (not the first job's error)", r, got)
				}
			}
		})
	}
}

// cutProxy forwards TCP connections to an address and cuts them on
// demand, as a network that drops a node's connections would: the ends
// see their connection fail, and new connections get through again.
type cutProxy struct {
	l     net.Listener
	mu    sync.Mutex
	conns []net.Conn
	// muted: while set, what the far end sends back is dropped (mute,
	// until cut).
	muted atomic.Bool
	wg    sync.WaitGroup
}

func startCutProxy(t *testing.T, to string) *cutProxy {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &cutProxy{l: l}
	p.wg.Add(1)
	go func() {
		defer p.wg.Done()
		for {
			in, err := l.Accept()
			if err != nil {
				return
			}
			out, err := net.Dial("tcp", to)
			if err != nil {
				in.Close()
				continue
			}
			p.mu.Lock()
			p.conns = append(p.conns, in, out)
			p.mu.Unlock()
			for i, pair := range [][2]net.Conn{{in, out}, {out, in}} {
				p.wg.Add(1)
				go func() {
					defer p.wg.Done()
					buf := make([]byte, 32<<10)
					for {
						n, err := pair[1].Read(buf)
						if n > 0 && (i == 1 || !p.muted.Load()) {
							if _, err := pair[0].Write(buf[:n]); err != nil {
								break
							}
						}
						if err != nil {
							break
						}
					}
					pair[0].Close()
					pair[1].Close()
				}()
			}
		}
	}()
	t.Cleanup(func() {
		l.Close()
		p.cut()
		p.wg.Wait()
	})
	return p
}

func (p *cutProxy) addr() string { return p.l.Addr().String() }

// cut closes every connection made so far and returns how many pairs;
// connections made after it get through both ways (a mute ends).
func (p *cutProxy) cut() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.muted.Store(false) // before the close: the new connections it brings are not muted
	for _, c := range p.conns {
		c.Close()
	}
	n := len(p.conns) / 2
	p.conns = nil
	return n
}

// mute drops from now on what the far end sends back, on every
// connection until the next cut, as a network that loses replies.
func (p *cutProxy) mute() { p.muted.Store(true) }

// TestClusterRoundLostInTransport: of a job of three ranks (nodes a, b,
// a; a coordinates), ranks 0 and 1 wait in an Add that rank 2 has not
// reached, and node b's connection to the coordinator (through a proxy:
// b meets the coordinator at the proxy's address) is cut. Rank 1's agent
// tells the coordinator, over a new connection, that rank 1 is out of
// the round, so rank 0 fails at once with ErrPeer naming rank 1 (the
// publish and join timeouts are 300 s: waiting for it would outlast the
// test's deadline), and rank 1 with its agent's transport error. A new
// job started right after succeeds.
func TestClusterRoundLostInTransport(t *testing.T) {
	ns := fmt.Sprintf("rlost%d", os.Getpid())
	runDir := filepath.Join(t.TempDir(), "run")
	rdv := freeAddr(t)
	a := startAgentProc(t, ns, "a", runDir, rdv, "--join-timeout", "300s")
	proxy := startCutProxy(t, rdv)
	b := startAgentProc(t, ns, "b", runDir, proxy.addr(), "--join-timeout", "300s")
	nodes := []string{"a", "b", "a"}
	start := func(linger bool, ops ...string) []*rankProc {
		var ps []*rankProc
		for r, o := range ops {
			ps = append(ps, startRank(t, rankArgs{NS: ns, Node: nodes[r], RunDir: runDir, Rank: r, Size: len(ops), Op: o, Linger: linger && r == 1}))
		}
		return ps
	}
	// Rank 1 stays after its error (its process does not go, which
	// would fail the round too).
	ps := start(true, "add", "add", "sleep")
	waitPublish(t, a, ns, "x", 0, 1)
	if n := proxy.cut(); n == 0 {
		t.Fatal("node b holds no connection to the coordinator through the proxy")
	}
	got := ps[0].result(t, "rank 0")
	if !strings.HasPrefix(got, "err: peer ") || !strings.Contains(got, "rank 1 ") || !strings.Contains(got, `node "b"`) {
		t.Fatalf("rank 0 of the job whose rank 1's request was cut: %q, want an ErrPeer naming rank 1 on node b", got)
	}
	ps[1].stdin.Close()
	if got := ps[1].result(t, "rank 1"); !strings.HasPrefix(got, "err: peer ") {
		t.Fatalf("rank 1, whose agent's request to the coordinator was cut: %q, want an ErrPeer", got)
	}
	ps[2].stdin.Close()
	if got := ps[2].result(t, "rank 2"); got != "" {
		t.Fatalf("rank 2: %q", got)
	}
	if n := b.counter(t, ns, "rounds_lost"); n != 1 {
		t.Errorf("node b told the coordinator of %d ranks out of their round, want 1", n)
	}
	for r, p := range start(false, "add", "add", "add") {
		if got := p.result(t, fmt.Sprintf("rank %d of the new job", r)); got != "ok" {
			t.Fatalf("rank %d of the job started after: %q, want ok", r, got)
		}
	}
}

// TestClusterNodeAgentKilledMidRound: a job of four ranks (nodes a, b,
// b, a; a coordinates) adds "x"; then ranks 0 and 3 wait in the Add of
// "y" that ranks 1 and 2 have not reached, and node b's agent, which
// holds ranks 1 and 2, is SIGKILLed while no request of it waits on the
// coordinator. The coordinator sees the agent's watch close and its
// address refuse, and fails the round: ranks 0 and 3 get ErrPeer naming
// node b at once (the publish and join timeouts are 300 s: waiting for
// them would outlast the test's deadline). Node b's agent is started
// again, ranks 1 and 2 start again on it, and the job goes on: all four
// add "z" and read it across both nodes.
func TestClusterNodeAgentKilledMidRound(t *testing.T) {
	ns := fmt.Sprintf("nodekill%d", os.Getpid())
	runDir := filepath.Join(t.TempDir(), "run")
	removeSegmentsAtEnd(t, ns)
	rdv := freeAddr(t)
	a := startAgentProc(t, ns, "a", runDir, rdv, "--join-timeout", "300s")
	b := startAgentProc(t, ns, "b", runDir, rdv, "--join-timeout", "300s")
	nodes := []string{"a", "b", "b", "a"}
	rank := func(r int, op string) *rankProc {
		return startRank(t, rankArgs{NS: ns, Node: nodes[r], RunDir: runDir, Rank: r, Size: len(nodes), Op: op})
	}
	ps := []*rankProc{rank(0, "add+add+wait+z"), rank(1, "add+sleep"), rank(2, "add+sleep"), rank(3, "add+add+wait+z")}
	waitPublish(t, a, ns, "y", 0, 3)
	for r := 1; r <= 2; r++ {
		// x's round is complete (ranks 0 and 3 are in y's); rank r's
		// print of it may still be on its way.
		testutil.WaitFor(t, 60*time.Second, func() error {
			if got := ps[r].out.String(); got != "open\nok\n" {
				return fmt.Errorf("rank %d before its agent was killed: %q, want x added", r, got)
			}
			return nil
		})
	}
	b.cmd.Process.Kill()
	b.cmd.Wait()
	for _, r := range []int{0, 3} {
		testutil.WaitFor(t, 90*time.Second, func() error {
			got := ps[r].out.String()
			if !strings.HasPrefix(got, "open\n") || !strings.HasSuffix(got, "\n") || got == "open\n" {
				return fmt.Errorf("rank %d printed %q so far, want y's result", r, got)
			}
			got = strings.TrimSpace(strings.TrimPrefix(got, "open\n"))
			if !strings.HasPrefix(got, "err: peer ") || !strings.Contains(got, `variable "y"`) || !strings.Contains(got, `node "b"`) {
				t.Fatalf("rank %d of the job whose node b's agent was killed: %q, want an ErrPeer of y naming node b", r, got)
			}
			return nil
		})
	}
	for r := 1; r <= 2; r++ {
		ps[r].stdin.Close()
		ps[r].result(t, fmt.Sprintf("rank %d", r))
	}
	if n := a.counter(t, ns, "nodes_gone"); n != 1 {
		t.Errorf("the coordinator found %d nodes gone, want 1", n)
	}
	startAgentProc(t, ns, "b", runDir, rdv, "--join-timeout", "300s")
	ps[1], ps[2] = rank(1, "z"), rank(2, "z")
	for _, r := range []int{0, 3} {
		if _, err := io.WriteString(ps[r].stdin, "go on\n"); err != nil {
			t.Fatal(err)
		}
	}
	for r, p := range ps {
		got := p.result(t, fmt.Sprintf("rank %d", r))
		if i := strings.LastIndexByte(got, '\n'); i >= 0 {
			got = got[i+1:] // the survivors printed y's result before
		}
		if got != "ok" {
			t.Fatalf("rank %d's Add of z after node b's agent came back: %q, want ok", r, got)
		}
	}
}

// TestClusterRoundReplyLostAfterItCompleted: of a job of two ranks (nodes
// a and b; a coordinates, b meets it through a proxy), rank 0 waits in
// the Add of "y"; then the proxy drops what the coordinator sends node b,
// and rank 1 comes: its shard completes the round, and the table on its
// way to node b is lost. Once the round is complete on the coordinator
// the proxy cuts b's connections; b's agent reports rank 1 out of the
// round, hears that the variable exists, and keeps rank 1's shard with
// the coordinator's table. Both ranks' Adds succeed and each reads every
// row, node b's included (rank 0 holds a table that points to it).
func TestClusterRoundReplyLostAfterItCompleted(t *testing.T) {
	ns := fmt.Sprintf("rkept%d", os.Getpid())
	runDir := filepath.Join(t.TempDir(), "run")
	removeSegmentsAtEnd(t, ns)
	rdv := freeAddr(t)
	a := startAgentProc(t, ns, "a", runDir, rdv, "--join-timeout", "300s")
	proxy := startCutProxy(t, rdv)
	b := startAgentProc(t, ns, "b", runDir, proxy.addr(), "--join-timeout", "300s")
	ps := []*rankProc{
		startRank(t, rankArgs{NS: ns, Node: "a", RunDir: runDir, Rank: 0, Size: 2, Op: "add+add"}),
		startRank(t, rankArgs{NS: ns, Node: "b", RunDir: runDir, Rank: 1, Size: 2, Op: "add+wait+add"}),
	}
	testutil.WaitFor(t, 60*time.Second, func() error {
		if got := ps[1].out.String(); got != "open\nok\n" {
			return fmt.Errorf("rank 1 printed %q, want x added", got)
		}
		return nil
	})
	waitPublish(t, a, ns, "y", 0)
	proxy.mute()
	if _, err := io.WriteString(ps[1].stdin, "go\n"); err != nil {
		t.Fatal(err)
	}
	waitPublish(t, a, ns, "y") // complete
	if n := proxy.cut(); n == 0 {
		t.Fatal("node b holds no connection to the coordinator through the proxy")
	}
	for r, want := range []string{"ok", "ok\nok"} {
		if got := ps[r].result(t, fmt.Sprintf("rank %d", r)); got != want {
			t.Fatalf("rank %d of the round whose table to node b was lost: %q, want %q", r, got, want)
		}
	}
	if kept, lost := b.counter(t, ns, "rounds_kept"), b.counter(t, ns, "rounds_lost"); kept != 1 || lost != 0 {
		t.Errorf("node b kept %d ranks' shards of completed rounds and reported %d out of theirs, want 1 and 0",
			kept, lost)
	}
}

// waitPublish waits until the coordinator, agent a, holds the pending
// publish round of variable name with exactly ranks come; with no ranks,
// until it holds none of name (it completed, or never began).
func waitPublish(t *testing.T, a *agentProc, ns, name string, ranks ...int64) {
	t.Helper()
	testutil.WaitFor(t, 60*time.Second, func() error {
		in, err := ddstore.QueryAgent(a.socket, ns, a.node)
		if err != nil {
			return err
		}
		for _, c := range in.Collectives {
			if c.Kind == "publish" && c.Name == name {
				if len(ranks) > 0 && slices.Equal(c.Ranks, ranks) {
					return nil
				}
				return fmt.Errorf("the coordinator holds the publish of %q with ranks %v, want %v", name, c.Ranks, ranks)
			}
		}
		if len(ranks) == 0 {
			return nil
		}
		return fmt.Errorf("the coordinator holds %+v, want the publish of %q with ranks %v", in.Collectives, name, ranks)
	})
}

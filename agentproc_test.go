package ddstore_test

// Shared pieces of the fault and load tests (clientloss_test.go,
// soak_test.go): real `ddstore agent` processes watched from outside
// (/proc, the Prometheus endpoint), and this test binary re-executed as a
// client process.

import (
	"bufio"
	"encoding/binary"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/ddstore-go/ddstore"
	"github.com/ddstore-go/ddstore/internal/testutil"
)

// The helper processes of these tests (roles registered with
// testutil.Helper by clientloss_test.go and soak_test.go) are played from
// init, before TestMain builds the agent binary.
func init() { testutil.RunHelper() }

// testAgentBin is the agent binary of these tests: DDSTORE_SOAK_BIN (make
// soak passes a build without -race, so that the figures mean something),
// else the one TestMain built.
func testAgentBin() string {
	if b := os.Getenv("DDSTORE_SOAK_BIN"); b != "" {
		return b
	}
	return ddstoreBin
}

// agentProc is a `ddstore agent` process serving its Prometheus endpoint
// on loopback, so that its goroutines can be counted from outside.
type agentProc struct {
	node, socket, metrics string
	cmd                   *exec.Cmd
	log                   *testutil.Buffer
}

// counter is the agent's counter name (its info's Counters).
func (a *agentProc) counter(t *testing.T, ns, name string) int {
	t.Helper()
	in, err := ddstore.QueryAgent(a.socket, ns, a.node)
	if err != nil {
		t.Fatal(err)
	}
	return in.Counters[name]
}

// startAgentProc starts the agent of node and waits until it answers.
// startAgentProcs starts one agent process per node of a fresh namespace
// (prefix and this process's pid), meeting at a rendezvous address; it
// returns the namespace, the run directory and the agents.
func startAgentProcs(t testing.TB, prefix string, nodes ...string) (string, string, []*agentProc) {
	t.Helper()
	return startAgentProcsArgs(t, prefix, []string{"--join-timeout", "20s"}, nodes...)
}

// startAgentProcsArgs is startAgentProcs with the agents' flags past the
// common ones (--join-timeout among them).
func startAgentProcsArgs(t testing.TB, prefix string, args []string, nodes ...string) (string, string, []*agentProc) {
	t.Helper()
	ns := fmt.Sprintf("%s%d", prefix, os.Getpid())
	runDir := filepath.Join(t.TempDir(), "run")
	rdv := freeAddr(t)
	var agents []*agentProc
	for _, node := range nodes {
		agents = append(agents, startAgentProc(t, ns, node, runDir, rdv, args...))
	}
	return ns, runDir, agents
}

func startAgentProc(t testing.TB, ns, node, runDir, rendezvous string, args ...string) *agentProc {
	t.Helper()
	a := &agentProc{node: node, socket: ddstore.SocketPath(runDir, ns, node), metrics: freeAddr(t), log: &testutil.Buffer{}}
	a.cmd = exec.Command(testAgentBin(), append([]string{"agent", "--namespace", ns, "--node", node, "--run-dir", runDir,
		"--rendezvous", rendezvous, "--peer-listen", "127.0.0.1:0", "--metrics-addr", a.metrics,
		"--timeout", "10s"}, args...)...)
	a.cmd.Env = append(os.Environ(), testutil.NoRaceExitPause)
	if os.Getenv("DDSTORE_SECRET") == "" {
		// Agents meeting at a rendezvous address prove a shared secret;
		// clients without one prove the key in the agent's key file.
		a.cmd.Env = append(a.cmd.Env, "DDSTORE_SECRET=ddstore-fault-tests-0123456789")
	}
	a.cmd.Stdout, a.cmd.Stderr = a.log, a.log
	if err := a.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		a.cmd.Process.Signal(syscall.SIGTERM)
		done := make(chan struct{})
		go func() { a.cmd.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(20 * time.Second):
			a.cmd.Process.Kill()
			<-done
		}
		if t.Failed() {
			t.Logf("agent %s log:\n%s", node, a.log.String())
		}
	})
	testutil.WaitFor(t, 20*time.Second, func() error {
		_, err := ddstore.QueryAgent(a.socket, ns, node)
		return err
	})
	return a
}

// procState is what the fault tests compare before and after: the agent as
// its clients see it (sessions, receive regions, variables) and as the
// kernel and the Go runtime see it (descriptors, resident memory,
// goroutines, live heap).
type procState struct {
	Clients, Regions, Vars int
	Fds                    int
	RSS                    int64 // bytes, /proc/PID/status VmRSS
	Goroutines             int
	HeapInuse              int64 // bytes, go_memstats_heap_inuse_bytes
}

func (a *agentProc) state(t testing.TB, ns string) procState {
	t.Helper()
	in, err := ddstore.QueryAgent(a.socket, ns, a.node)
	if err != nil {
		t.Fatal(err)
	}
	st := procState{Clients: in.Clients, Regions: in.Regions, Vars: len(in.Variables), Fds: 1 << 30, Goroutines: 1 << 30}
	// The query's own connection, and the scrape's, may still be open in
	// the agent for a moment after they end: of a few samples, the
	// smallest counts are the agent's own.
	pid := a.cmd.Process.Pid
	for range 5 {
		time.Sleep(20 * time.Millisecond)
		fds, err := os.ReadDir(fmt.Sprintf("/proc/%d/fd", pid))
		if err != nil {
			t.Fatal(err)
		}
		st.Fds = min(st.Fds, len(fds))
		m := a.scrape(t)
		st.Goroutines, st.HeapInuse = min(st.Goroutines, int(m["go_goroutines"])), int64(m["go_memstats_heap_inuse_bytes"])
	}
	status, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(status), "\n") {
		if f := strings.Fields(line); len(f) == 3 && f[0] == "VmRSS:" && f[2] == "kB" {
			kb, _ := strconv.ParseInt(f[1], 10, 64)
			st.RSS = kb << 10
		}
	}
	return st
}

// scrape reads the agent's metrics without labels.
func (a *agentProc) scrape(t testing.TB) map[string]float64 {
	t.Helper()
	// A fresh connection each time, closed after: a kept-alive one would be
	// one more goroutine in the agent between two samples.
	c := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}, Timeout: 10 * time.Second}
	resp, err := c.Get("http://" + a.metrics + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	m := map[string]float64{}
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) == 2 && !strings.HasPrefix(f[0], "#") && !strings.Contains(f[0], "{") {
			m[f[0]], _ = strconv.ParseFloat(f[1], 64)
		}
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return m
}

func (s procState) String() string {
	return fmt.Sprintf("clients %d, recv regions %d, variables %d, fds %d, RSS %.1f MiB, goroutines %d, heap in use %.1f MiB",
		s.Clients, s.Regions, s.Vars, s.Fds, float64(s.RSS)/(1<<20), s.Goroutines, float64(s.HeapInuse)/(1<<20))
}

// shmEntries lists what the namespace holds in /dev/shm, sorted.
func shmEntries(ns string) []string {
	m, _ := filepath.Glob("/dev/shm/ddstore." + ns + ".*")
	for i := range m {
		m[i] = filepath.Base(m[i])
	}
	return m
}

// rowOK says whether row holds global row g as pattern writes it, without
// allocating (the soak checks every row it reads).
func rowOK(row []byte, g int64) bool {
	w := 0
	for ; w+8 <= len(row); w += 8 {
		if binary.LittleEndian.Uint64(row[w:]) != uint64(g)<<20|uint64(w/8) {
			return false
		}
	}
	for ; w < len(row); w++ {
		if row[w] != byte(g+int64(w)) {
			return false
		}
	}
	return true
}

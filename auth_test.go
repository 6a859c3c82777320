package ddstore_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/ddstore-go/ddstore"
	"github.com/ddstore-go/ddstore/internal/auth"
	"github.com/ddstore-go/ddstore/internal/shm"
	"github.com/ddstore-go/ddstore/internal/testutil"
	"github.com/ddstore-go/ddstore/internal/transport"
	"github.com/ddstore-go/ddstore/internal/wire"
)

// Authentication with real agent processes (the agent and transport tests
// cover each refusal in detail).

// environWith is this process's environment with DDSTORE_SECRET set to
// secret, or left out when secret is "".
func environWith(secret string) []string {
	var env []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, auth.SecretEnv+"=") {
			env = append(env, kv)
		}
	}
	if secret != "" {
		env = append(env, auth.SecretEnv+"="+secret)
	}
	return env
}

// authAgent is a `ddstore agent` process and its output.
type authAgent struct {
	cmd *exec.Cmd
	log *testutil.Buffer
}

func startAuthAgent(t *testing.T, secret string, args ...string) *authAgent {
	t.Helper()
	a := &authAgent{cmd: exec.Command(ddstoreBin, append([]string{"agent"}, args...)...), log: &testutil.Buffer{}}
	a.cmd.Env = environWith(secret)
	a.cmd.Stdout, a.cmd.Stderr = a.log, a.log
	if err := a.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		a.cmd.Process.Signal(syscall.SIGTERM)
		a.cmd.Wait()
		if t.Failed() {
			t.Logf("agent %v log:\n%s", args, a.log.String())
		}
	})
	return a
}

// openAt opens rank r of size on node's agent (already running), the
// job's only rank on that node.
func openAt(t *testing.T, ns, node, runDir string, r, size int) *ddstore.Store {
	t.Helper()
	return openLocal(t, ns, node, runDir, r, size, 0, 1)
}

// openLocal opens rank r of size on node's agent (already running), as
// local rank lr of the node's ls.
func openLocal(t *testing.T, ns, node, runDir string, r, size, lr, ls int) *ddstore.Store {
	t.Helper()
	s, err := ddstore.Open(ddstore.Config{Namespace: ns, Rank: r, Size: size, LocalRank: lr, LocalSize: ls, Node: node,
		RunDir: runDir, NoSpawn: true, AgentWait: 20 * time.Second, Timeout: 10 * time.Second, PublishTimeout: 20 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

// checkHidden fails if any key shows in what the agents wrote, said or were
// started with.
func checkHidden(t *testing.T, keys []string, agents []*authAgent, texts map[string]string) {
	t.Helper()
	for i, a := range agents {
		texts[fmt.Sprintf("agent %d log", i)] = a.log.String()
		cmdline, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", a.cmd.Process.Pid))
		if err != nil {
			t.Fatal(err)
		}
		texts[fmt.Sprintf("agent %d command line", i)] = string(cmdline)
	}
	for where, text := range texts {
		for _, k := range keys {
			if k != "" && strings.Contains(text, k) {
				t.Errorf("a key or secret (%d bytes) shows in %s", len(k), where)
			}
		}
	}
}

// TestAuthHandshakeDirProcesses: agents that meet through a handshake
// directory, with no secret: rank 0's agent draws the job's key and hands it
// out in its record (0600); the job runs; a peer without the key and a
// client with another secret are refused and counted; no key shows in the
// agents' logs, `ddstore info` or command lines.
func TestAuthHandshakeDirProcesses(t *testing.T) {
	t.Setenv(auth.SecretEnv, "") // clients use the agents' key files
	dir := t.TempDir()
	ns := fmt.Sprintf("authhs%d", os.Getpid())
	runDir, hs := filepath.Join(dir, "run"), filepath.Join(dir, "hs")
	var agents []*authAgent
	for _, node := range []string{"n0", "n1"} {
		agents = append(agents, startAuthAgent(t, "", "--namespace", ns, "--node", node, "--run-dir", runDir,
			"--handshake-dir", hs, "--peer-listen", "127.0.0.1:0", "--timeout", "5s"))
	}
	c := &cluster{ns: ns, stores: []*ddstore.Store{openAt(t, ns, "n0", runDir, 0, 2), openAt(t, ns, "n1", runDir, 1, 2)}}
	c.addPattern(t, "v", []int64{5, 7}, 4, 2)
	c.mustEach(t, func(r int, s *ddstore.Store) error {
		dst := make([]byte, 12*8)
		if err := s.Get("v", dst, 0); err != nil {
			return err
		}
		for g := range int64(12) {
			checkRow(t, dst[g*8:(g+1)*8], g)
		}
		return nil
	})

	recPath := filepath.Join(hs, shm.Escape(ns)+".coordinator.json")
	st, err := os.Stat(recPath)
	if err != nil || st.Mode().Perm() != 0o600 {
		t.Fatalf("coordinator record: %v, mode %v; want 0600", err, st.Mode())
	}
	var rec struct{ Addr, Key string }
	if b, err := os.ReadFile(recPath); err != nil || json.Unmarshal(b, &rec) != nil || len(rec.Key) != 2*auth.KeySize {
		t.Fatalf("coordinator record %s: %v; want a key in it", recPath, err)
	}

	// A peer that does not hold the job's key.
	p := transport.NewPool(transport.Options{ConnsPerPeer: 1, Key: func() (auth.Key, error) { return auth.Generate(), nil }})
	defer p.Close()
	if _, err := p.Call(context.Background(), rec.Addr, wire.OpPeerInfo, nil); !errors.Is(err, ddstore.ErrAuth) {
		t.Fatalf("a peer without the job's key: %v, want ErrAuth", err)
	}
	// A client with a secret the agent does not have.
	info := exec.Command(ddstoreBin, "info", "--namespace", ns, "--node", "n0", "--run-dir", runDir)
	info.Env = environWith("some-other-secret-0123456789")
	if out, err := info.CombinedOutput(); err == nil || !strings.Contains(string(out), "ddstore: not authenticated") ||
		!strings.Contains(string(out), "with the key of DDSTORE_SECRET") {
		t.Fatalf("ddstore info with another secret: %v\n%s", err, out)
	}

	// The agent counts a refusal once the other side has hung up.
	testutil.WaitFor(t, 10*time.Second, func() error {
		in, err := ddstore.QueryAgent(ddstore.SocketPath(runDir, ns, "n0"), ns, "n0")
		if err == nil && in.Counters["refused_connections"] != 2 {
			err = fmt.Errorf("n0 refused %d connections, want 2", in.Counters["refused_connections"])
		}
		return err
	})
	var texts = map[string]string{}
	for _, node := range []string{"n0", "n1"} {
		var in ddstore.AgentInfo
		out, err := exec.Command(ddstoreBin, "info", "--json", "--namespace", ns, "--node", node, "--run-dir", runDir).Output()
		if err != nil || json.Unmarshal(out, &in) != nil {
			t.Fatalf("info --json of %s: %v\n%s", node, err, out)
		}
		text, err := exec.Command(ddstoreBin, "info", "--namespace", ns, "--node", node, "--run-dir", runDir).Output()
		if err != nil {
			t.Fatal(err)
		}
		texts["info of "+node], texts["info --json of "+node] = string(text), string(out)
		want := map[string][2]any{"n0": {2, "generated"}, "n1": {0, "generated; the job's key from the coordinator's record"}}[node]
		if in.Counters["refused_connections"] != want[0] || in.Auth != want[1] {
			t.Errorf("info of %s: refused_connections %d, auth %q; want %v, %q", node, in.Counters["refused_connections"], in.Auth, want[0], want[1])
		}
	}
	keys := []string{rec.Key}
	for _, node := range []string{"n0", "n1"} {
		k, err := auth.ReadKeyFile(auth.KeyFile(ddstore.SocketPath(runDir, ns, node)))
		if err != nil {
			t.Fatal(err)
		}
		keys = append(keys, k.Hex())
	}
	checkHidden(t, keys, agents, texts)
}

// TestAuthRendezvousProcesses: agents that meet through a rendezvous
// address refuse to start without a secret, saying what to do; with one,
// an agent of another secret cannot join; the secret and its keys show
// nowhere.
func TestAuthRendezvousProcesses(t *testing.T) {
	dir := t.TempDir()
	ns := fmt.Sprintf("authrdv%d", os.Getpid())
	runDir := filepath.Join(dir, "run")
	rdv := freeAddr(t)
	args := func(node string) []string {
		return []string{"--namespace", ns, "--node", node, "--run-dir", runDir, "--rendezvous", rdv,
			"--peer-listen", "127.0.0.1:0", "--timeout", "5s", "--join-timeout", "10s"}
	}

	cmd := exec.Command(ddstoreBin, append([]string{"agent"}, args("lone")...)...)
	cmd.Env = environWith("")
	out, err := cmd.CombinedOutput()
	if err == nil || !strings.Contains(string(out), "need a shared secret") || !strings.Contains(string(out), "DDSTORE_SECRET") {
		t.Fatalf("an agent with a rendezvous and no secret: %v\n%s", err, out)
	}

	const other = "another-jobs-secret-0123456789"
	agents := []*authAgent{startAuthAgent(t, testSecret, args("n0")...), startAuthAgent(t, testSecret, args("n1")...)}
	c := &cluster{ns: ns, stores: []*ddstore.Store{openAt(t, ns, "n0", runDir, 0, 2), openAt(t, ns, "n1", runDir, 1, 2)}}
	c.addPattern(t, "v", []int64{3, 4}, 2, 4)
	dst := make([]byte, 7*8)
	if err := c.stores[0].Get("v", dst, 0); err != nil {
		t.Fatal(err)
	}
	for g := range int64(7) {
		checkRow(t, dst[g*8:(g+1)*8], g)
	}

	// An agent of another secret on the same rendezvous: its clients (who
	// hold that secret) reach it, but it cannot join the coordinator.
	agents = append(agents, startAuthAgent(t, other, args("n2")...))
	t.Setenv(auth.SecretEnv, other)
	s := openAt(t, ns, "n2", runDir, 0, 1)
	err = s.Add("w", make([]byte, 8), 8, 1)
	if !errors.Is(err, ddstore.ErrAuth) {
		t.Fatalf("a rank whose agent holds another secret: %v, want ErrAuth", err)
	}
	t.Setenv(auth.SecretEnv, testSecret)
	// The coordinator (n0 or n1: whichever bound the rendezvous address
	// first) counts once the refused agent hangs up.
	var info []byte
	testutil.WaitFor(t, 10*time.Second, func() error {
		info = nil
		for i, node := range []string{"n0", "n1"} {
			in, err := ddstore.QueryAgent(c.stores[i].Socket(), ns, node)
			if err != nil {
				return err
			}
			want := 0
			if in.Coordinator {
				want = 1
			}
			if in.Counters["refused_connections"] != want || in.Auth != "secret (DDSTORE_SECRET)" {
				return fmt.Errorf("%s (coordinator %v): refused_connections %d, auth %q; want %d and the secret",
					node, in.Coordinator, in.Counters["refused_connections"], in.Auth, want)
			}
			b, _ := json.Marshal(in)
			info = append(info, b...)
		}
		return nil
	})

	keys := []string{testSecret, other}
	for _, secret := range []string{testSecret, other} {
		ks, err := auth.FromSecret(secret)
		if err != nil {
			t.Fatal(err)
		}
		keys = append(keys, ks.Client.Hex(), ks.Peer.Hex())
	}
	var errText bytes.Buffer
	fmt.Fprint(&errText, err)
	checkHidden(t, keys, agents, map[string]string{"info": string(info), "the refused rank's error": errText.String()})
}

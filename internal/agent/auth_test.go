package agent

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/ddstore-go/ddstore/internal/auth"
	"github.com/ddstore-go/ddstore/internal/base"
	"github.com/ddstore-go/ddstore/internal/shm"
	"github.com/ddstore-go/ddstore/internal/testutil"
	"github.com/ddstore-go/ddstore/internal/transport"
	"github.com/ddstore-go/ddstore/internal/wire"
)

func refused(a *Agent) int { return a.info().Counters["refused_connections"] }

// waitRefused polls until the agent has refused want connections.
func waitRefused(t *testing.T, a *Agent, want int) {
	t.Helper()
	testutil.WaitFor(t, ioWait, func() error {
		if got := refused(a); got != want {
			return fmt.Errorf("refused_connections = %d, want %d", got, want)
		}
		return nil
	})
}

// TestAgentClientAuth: a client that does not prove the key gets nothing
// but a refusal, and is counted; one that does is served; no key shows in
// logs, info or metrics.
func TestAgentClientAuth(t *testing.T) {
	t.Setenv(auth.SecretEnv, "")
	var logs testutil.Buffer
	a := startAgent(t, Config{MetricsAddr: "127.0.0.1:0",
		Logger: slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug}))})

	// The key file: 0600, in the 0700 directory of the socket.
	st, err := os.Stat(auth.KeyFile(a.Socket()))
	if err != nil || st.Mode().Perm() != 0o600 {
		t.Fatalf("key file: %v, mode %v; want 0600", err, st.Mode())
	}

	// Hello first: refused with ErrAuth, then the connection is closed.
	r := dialUnauthenticated(t, a)
	m := wire.Hello{Namespace: a.cfg.Namespace, Node: a.cfg.Node, Rank: -1}
	if _, err := r.call(wire.OpHello, m.Encode); !errors.Is(err, base.ErrAuth) || !strings.Contains(err.Error(), "before the authentication handshake") {
		t.Fatalf("hello before the handshake: %v, want ErrAuth", err)
	}
	r.expectClosed()
	waitRefused(t, a, 1)

	// Another key: the client finds out from the agent's proof and hangs
	// up; the agent counts it.
	r = dialUnauthenticated(t, a)
	r.c.SetDeadline(time.Now().Add(ioWait))
	if err := auth.Initiate(r.c, auth.Generate(), auth.Client); !errors.Is(err, base.ErrAuth) {
		t.Fatalf("handshake with another key: %v, want ErrAuth", err)
	}
	r.c.Close()
	waitRefused(t, a, 2)

	// A recorded handshake of a real client, replayed: refused.
	k, err := auth.ReadKeyFile(auth.KeyFile(a.Socket()))
	if err != nil {
		t.Fatal(err)
	}
	r = dialUnauthenticated(t, a)
	rec := &recordingConn{UnixConn: r.c}
	if err := auth.Initiate(rec, k, auth.Client); err != nil {
		t.Fatal(err)
	}
	waitRefused(t, a, 2)
	r = dialUnauthenticated(t, a)
	r.write(rec.sent[0])
	h, _, err := wire.ReadFrame(r.c, nil) // the agent's challenge, fresh
	if err != nil || h.Status != 0 {
		t.Fatalf("auth reply: %v, status %d", err, h.Status)
	}
	r.write(rec.sent[1])
	r.c.SetReadDeadline(time.Now().Add(ioWait))
	h, body, err := wire.ReadFrame(r.c, nil)
	if err != nil {
		t.Fatalf("reply to a replayed proof: %v", err)
	}
	if serr := wire.StatusError(h, body); !errors.Is(serr, base.ErrAuth) || !strings.Contains(serr.Error(), "does not match") {
		t.Fatalf("a replayed proof: %v, want ErrAuth: the key does not match", serr)
	}
	r.expectClosed()
	waitRefused(t, a, 3)

	// A probe (connect, close) is no attempt: not counted.
	c, err := net.Dial("unix", a.Socket())
	if err != nil {
		t.Fatal(err)
	}
	c.Close()

	// The right key: served.
	ok := dialRaw(t, a)
	ok.hello(a, -1, 0)
	in := ok.info()
	if in.Counters["refused_connections"] != 3 || in.Auth != "generated" {
		t.Fatalf("info: refused_connections %d, auth %q; want 3, generated", in.Counters["refused_connections"], in.Auth)
	}
	if v := metricValue(t, a, "refused_connections_total", "source", "client"); v != 3 {
		t.Errorf("metric refused_connections_total{source=client} = %v, want 3", v)
	}

	// No key anywhere it could be seen.
	secrets := []string{a.auth.client.Hex(), a.auth.peer.Load().Hex()}
	seen := map[string]string{"log": logs.String(), "info": a.infoJSON()}
	resp, err := metricsClient.Get("http://" + a.MetricsAddr() + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	var mb bytes.Buffer
	mb.ReadFrom(resp.Body)
	resp.Body.Close()
	seen["metrics"] = mb.String()
	for where, text := range seen {
		for _, s := range secrets {
			if strings.Contains(text, s) || strings.Contains(text, s[:16]) {
				t.Errorf("a key shows in the agent's %s", where)
			}
		}
	}
	if !strings.Contains(logs.String(), "client refused") {
		t.Errorf("the refusals were not logged:\n%s", logs.String())
	}
}

// recordingConn keeps the frames a client writes.
type recordingConn struct {
	*net.UnixConn
	sent [][]byte
}

func (r *recordingConn) Write(b []byte) (int, error) {
	r.sent = append(r.sent, append([]byte(nil), b...))
	return r.UnixConn.Write(b)
}

// TestAgentPeerAuth: on the peer port, a connection that does not prove the
// job's key is refused and counted; one that does is served.
func TestAgentPeerAuth(t *testing.T) {
	t.Setenv(auth.SecretEnv, "")
	a := startAgent(t, Config{MetricsAddr: "127.0.0.1:0"})
	ctx := context.Background()

	wrong := transport.NewPool(transport.Options{ConnsPerPeer: 1, Key: func() (auth.Key, error) { return auth.Generate(), nil }})
	defer wrong.Close()
	if _, err := wrong.Call(ctx, a.PeerAddr(), wire.OpPeerInfo, nil); !errors.Is(err, base.ErrAuth) || !strings.Contains(err.Error(), a.PeerAddr()) {
		t.Fatalf("a peer with another key: %v, want ErrAuth naming the address", err)
	}
	waitRefused(t, a, 1)

	// No handshake at all: a Fetch straight away is answered with ErrAuth.
	c, err := net.Dial("tcp", a.PeerAddr())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	f := wire.Fetch{Name: "x", Globals: []int64{0}}
	c.SetDeadline(time.Now().Add(ioWait))
	if _, err := c.Write(wire.AppendFrame(nil, wire.OpFetch, 0, 1, 0, f.Encode)); err != nil {
		t.Fatal(err)
	}
	h, body, err := wire.ReadFrame(c, nil)
	if err != nil || !errors.Is(wire.StatusError(h, body), base.ErrAuth) {
		t.Fatalf("a fetch before the handshake: %v, %v; want an ErrAuth reply", err, wire.StatusError(h, body))
	}
	waitRefused(t, a, 2)

	right := transport.NewPool(transport.Options{ConnsPerPeer: 1, Key: a.peerKey})
	defer right.Close()
	if _, err := right.Call(ctx, a.PeerAddr(), wire.OpPeerInfo, nil); err != nil {
		t.Fatalf("a peer with the job's key: %v", err)
	}
	if got := refused(a); got != 2 {
		t.Fatalf("refused_connections = %d after a good peer, want 2", got)
	}
	if v := metricValue(t, a, "refused_connections_total", "source", "peer"); v != 2 {
		t.Errorf("metric refused_connections_total{source=peer} = %v, want 2", v)
	}
}

// TestAgentRefusesOtherUser: a client process of another user is refused
// (SO_PEERCRED) before it can say anything, and counted. It needs root, to
// connect as another user.
func TestAgentRefusesOtherUser(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root to connect as another user")
	}
	dir, err := os.MkdirTemp("", "ddstore-uid-") // 0700, in /tmp: no private parent
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	a := startAgent(t, Config{Socket: filepath.Join(dir, "s.sock")})
	// Let uid 65534 reach the socket (the agent checks its directory only
	// when it starts), so that only the agent's own check stands.
	if err := os.Chmod(dir, 0o711); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(a.Socket(), 0o666); err != nil {
		t.Fatal(err)
	}
	// Connect from a thread whose effective uid is 65534. The thread is
	// never given back to other goroutines: it ends with this one.
	res := make(chan error, 1)
	var conn net.Conn
	go func() {
		runtime.LockOSThread()
		if _, _, e := unix.RawSyscall(unix.SYS_SETRESUID, ^uintptr(0), 65534, ^uintptr(0)); e != 0 {
			res <- e
			return
		}
		c, err := net.Dial("unix", a.Socket())
		conn = c
		res <- err
	}()
	if err := <-res; err != nil {
		t.Fatalf("connecting as uid 65534: %v", err)
	}
	defer conn.Close()
	conn.SetReadDeadline(time.Now().Add(ioWait))
	if n, err := conn.Read(make([]byte, 64)); n != 0 || err == nil {
		t.Fatalf("a client of uid 65534 read %d bytes, %v; want the connection closed", n, err)
	}
	waitRefused(t, a, 1)

	for _, c := range []struct {
		client uint32
		agent  int
		ok     bool
	}{{1000, 1000, true}, {0, 1000, true}, {1001, 1000, false}, {1000, 0, false}, {0, 0, true}} {
		if got := uidAllowed(c.client, c.agent); got != c.ok {
			t.Errorf("client uid %d, agent uid %d: allowed %v, want %v", c.client, c.agent, got, c.ok)
		}
	}
}

// TestAgentSecretRules: agents that meet through a rendezvous address need
// a secret; a secret too short is refused without being shown; with a
// secret, both keys come from it.
func TestAgentSecretRules(t *testing.T) {
	t.Setenv(auth.SecretEnv, "")
	dir := privateTempDir(t)
	_, err := Start(Config{Namespace: testNamespace(), Node: "n1", Socket: filepath.Join(dir, "a.sock"), Rendezvous: "127.0.0.1:1"})
	if !errors.Is(err, base.ErrArgument) || !strings.Contains(err.Error(), "rendezvous address 127.0.0.1:1 need a shared secret") ||
		!strings.Contains(err.Error(), "DDSTORE_SECRET") {
		t.Fatalf("rendezvous without a secret: %v", err)
	}
	if _, err := os.Stat(auth.KeyFile(filepath.Join(dir, "a.sock"))); !os.IsNotExist(err) {
		t.Errorf("a refused agent left its key file: %v", err)
	}
	_, err = Start(Config{Namespace: testNamespace(), Node: "n1", Socket: filepath.Join(dir, "b.sock"), Secret: "Short_Secret"})
	if !errors.Is(err, base.ErrArgument) || !strings.Contains(err.Error(), "DDSTORE_SECRET of 12 bytes") || strings.Contains(err.Error(), "Short_Secret") {
		t.Fatalf("a short secret: %v", err)
	}

	const secret = "agent-test-secret-0123456789"
	t.Setenv(auth.SecretEnv, secret)
	a := startAgent(t, Config{})
	ks, _ := auth.FromSecret(secret)
	if k, err := auth.ReadKeyFile(auth.KeyFile(a.Socket())); err != nil || k != ks.Client {
		t.Fatalf("key file with a secret: %v; want the secret's client key", err)
	}
	if k, _ := a.peerKey(); k != ks.Peer {
		t.Fatal("the peer key is not the secret's")
	}
	r := dialRaw(t, a)
	r.hello(a, -1, 0)
	if in := r.info(); in.Auth != "secret (DDSTORE_SECRET)" {
		t.Fatalf("info auth %q", in.Auth)
	}
}

// TestAgentKeyFileRemoved: the key file goes with the agent.
func TestAgentKeyFileRemoved(t *testing.T) {
	t.Setenv(auth.SecretEnv, "")
	sock := filepath.Join(privateTempDir(t), "s.sock")
	a, err := Start(Config{Namespace: testNamespace(), Node: "n1", Socket: sock})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(auth.KeyFile(sock)); err != nil {
		t.Fatal(err)
	}
	a.Close()
	if _, err := os.Stat(auth.KeyFile(sock)); !os.IsNotExist(err) {
		t.Fatalf("key file after Close: %v", err)
	}
}

// TestAgentSegmentNamesUnguessable: another local user (anyone may create
// files in /dev/shm) who makes a file at the name a shard's segment would
// have without its nonce does not stop the Create, nor gets the file
// touched; each segment's name has a random nonce of its own, so a Create
// of the same variable and rank again gets another name. (Shard segments
// are never another user's file: shm.Create and shm.Open refuse them,
// TestCreateExisting, TestNoSegmentOfOthers.)
func TestAgentSegmentNamesUnguessable(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root to chown")
	}
	a := startAgent(t, Config{})
	guess := shm.SegmentPath(a.cfg.Namespace, a.cfg.Node, "x", 0, "")
	if err := os.WriteFile(guess, make([]byte, 4096+64), 0o600); err != nil {
		t.Fatal(err)
	}
	defer os.Remove(guess)
	if err := os.Chown(guess, 65534, 65534); err != nil {
		t.Fatal(err)
	}
	r := dialRaw(t, a)
	r.hello(a, 0, 1)
	m := wire.Shard{Name: "x", Rank: 0, Size: 1, Rows: 8, Disp: 1, ItemSize: 8, Attempt: 1}
	seen := map[string]bool{}
	for range 2 {
		p, err := wire.DecodePath(r.must(wire.OpCreate, m.Encode))
		if err != nil {
			t.Fatalf("Create with another user's file at the name without a nonce: %v", err)
		}
		if p.Path == guess || seen[p.Path] || !strings.HasPrefix(p.Path, strings.TrimSuffix(guess, "r0")) {
			t.Fatalf("segment %s: want a name of its own after %s", p.Path, strings.TrimSuffix(guess, "r0"))
		}
		seen[p.Path] = true
		// Take it back (a failed Publish), so that the next Create of the
		// rank makes a new segment.
		f := m
		f.Failed = true
		r.call(wire.OpPublish, f.Encode)
		if _, err := os.Stat(p.Path); !os.IsNotExist(err) {
			t.Fatalf("segment %s after its round failed: %v", p.Path, err)
		}
		m.Attempt++
	}
	st, err := os.Stat(guess)
	if err != nil || st.Sys().(*syscall.Stat_t).Uid != 65534 {
		t.Fatalf("the other user's file was touched: %v", err)
	}
}

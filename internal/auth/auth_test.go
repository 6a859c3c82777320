package auth

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/ddstore-go/ddstore/internal/base"
	"github.com/ddstore-go/ddstore/internal/wire"
)

const testSecret = "correct horse battery staple 42"

func TestFromSecret(t *testing.T) {
	a, err := FromSecret(testSecret)
	if err != nil {
		t.Fatal(err)
	}
	cache.Lock()
	cache.ok = false // derive again, not from the cache
	cache.Unlock()
	b, err := FromSecret(testSecret)
	if err != nil {
		t.Fatal(err)
	}
	if a != b {
		t.Fatal("two derivations of one secret differ")
	}
	if a.Client == a.Peer {
		t.Fatal("the client and peer keys are the same")
	}
	c, err := FromSecret(testSecret + "!")
	if err != nil {
		t.Fatal(err)
	}
	if c.Client == a.Client || c.Peer == a.Peer {
		t.Fatal("another secret gives the same keys")
	}
	for _, short := range []string{"", "Q", "Fifteen_bytes!!"} {
		_, err := FromSecret(short)
		if !errors.Is(err, base.ErrArgument) {
			t.Fatalf("secret of %d bytes: %v, want ErrArgument", len(short), err)
		}
		want := fmt.Sprintf("DDSTORE_SECRET of %d bytes: want at least 16", len(short))
		if !strings.Contains(err.Error(), want) || (short != "" && strings.Contains(err.Error(), short)) {
			t.Fatalf("secret of %d bytes: error %q: want it to say %q and not quote the secret", len(short), err, want)
		}
	}
}

// TestKeyRedacted: no formatting, logging or JSON encoding shows a key.
func TestKeyRedacted(t *testing.T) {
	k := Generate()
	secret := k.Hex()
	var logged bytes.Buffer
	slog.New(slog.NewTextHandler(&logged, nil)).Info("m", "key", k, "ptr", &k)
	slog.New(slog.NewJSONHandler(&logged, nil)).Info("m", "key", k)
	js, _ := json.Marshal(struct{ K Key }{k})
	outs := []string{
		fmt.Sprint(k), fmt.Sprintf("%v %+v %#v %s %q %x %X %d", k, k, k, k, k, k, k, k), fmt.Sprintf("%v", &k),
		fmt.Sprintf("%v", Keys{Client: k, Peer: k}), fmt.Errorf("key %v", k).Error(), logged.String(), string(js),
	}
	for _, out := range outs {
		if strings.Contains(out, secret) || strings.Contains(out, secret[:16]) {
			t.Fatalf("a key shows in %q", out)
		}
	}
	back, err := ParseHex(" " + secret + "\n")
	if err != nil || back != k {
		t.Fatalf("ParseHex(Hex()) = %v, %v", back == k, err)
	}
	for _, bad := range []string{"", secret[:62], secret + "00", strings.Repeat("zz", 32)} {
		if _, err := ParseHex(bad); !errors.Is(err, base.ErrAuth) || (bad != "" && strings.Contains(err.Error(), bad)) {
			t.Errorf("ParseHex(%d chars): %v, want ErrAuth that does not quote the text", len(bad), err)
		}
	}
}

// pair is two ends of a Unix stream socket pair; writes do not wait for a
// reader (as they would on net.Pipe), as on a real connection.
func pair(t *testing.T) (net.Conn, net.Conn) {
	t.Helper()
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	var cs [2]net.Conn
	for i, fd := range fds {
		f := os.NewFile(uintptr(fd), "pair")
		c, err := net.FileConn(f)
		f.Close()
		if err != nil {
			t.Fatal(err)
		}
		c.SetDeadline(time.Now().Add(10 * time.Second))
		t.Cleanup(func() { c.Close() })
		cs[i] = c
	}
	return cs[0], cs[1]
}

func keyOf(k Key) func() (Key, error) { return func() (Key, error) { return k, nil } }

// handshake runs both sides at once and returns what each returned.
func handshake(t *testing.T, p Proto, ki Key, kr func() (Key, error)) (initErr, respErr error) {
	t.Helper()
	ci, cr := pair(t)
	done := make(chan error, 1)
	go func() {
		err := Respond(cr, p, kr)
		cr.Close()
		done <- err
	}()
	initErr = Initiate(ci, ki, p)
	ci.Close()
	return initErr, <-done
}

func TestHandshake(t *testing.T) {
	k, other := Generate(), Generate()
	noKey := func() (Key, error) { return Key{}, base.Errorf(base.ErrAuth, "no key here yet") }
	cases := []struct {
		name           string
		ki             Key
		kr             func() (Key, error)
		initOK, respOK bool
		initSays       string
		respSays       string
	}{
		{"same key", k, keyOf(k), true, true, "", ""},
		// The initiator finds out first (the responder's proof) and hangs
		// up without proving anything.
		{"other key", other, keyOf(k), false, false, "does not hold this key", "hung up after this side's proof"},
		{"responder without a key", k, noKey, false, false, "no key here yet", "no key here yet"},
	}
	for _, p := range []Proto{Client, Peer, Direct} {
		for _, c := range cases {
			t.Run(p.String()+"/"+c.name, func(t *testing.T) {
				ie, re := handshake(t, p, c.ki, c.kr)
				for _, side := range []struct {
					who  string
					err  error
					ok   bool
					says string
				}{{"initiator", ie, c.initOK, c.initSays}, {"responder", re, c.respOK, c.respSays}} {
					if side.ok {
						if side.err != nil {
							t.Errorf("%s: %v", side.who, side.err)
						}
						continue
					}
					if !errors.Is(side.err, base.ErrAuth) || !strings.Contains(side.err.Error(), side.says) {
						t.Errorf("%s: %v, want ErrAuth saying %q", side.who, side.err, side.says)
					}
				}
			})
		}
	}
}

// TestRespondAny: the peer port answers agents (the peer key) and clients
// reading rows directly (the direct key, derived from it): the initiator's
// first op says which, and a key proved on one is worth nothing on the
// other.
func TestRespondAny(t *testing.T) {
	peer := Generate()
	direct := DirectKeyOf(peer)
	if direct == peer || DirectKeyOf(peer) != direct || DirectKeyOf(Generate()) == direct {
		t.Fatal("DirectKeyOf: not a deterministic key of its own")
	}
	keys := func(p Proto) (Key, error) {
		if p == Direct {
			return direct, nil
		}
		return peer, nil
	}
	for _, c := range []struct {
		name string
		p    Proto
		k    Key
		ok   bool
	}{
		{"agent", Peer, peer, true},
		{"client", Direct, direct, true},
		{"client with the peer key", Direct, peer, false},
		{"agent with the direct key", Peer, direct, false},
		{"client protocol", Client, peer, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			ci, cr := pair(t)
			type res struct {
				p   Proto
				err error
			}
			done := make(chan res, 1)
			go func() {
				p, err := RespondAny(cr, []Proto{Peer, Direct}, keys)
				cr.Close()
				done <- res{p, err}
			}()
			ie := Initiate(ci, c.k, c.p)
			ci.Close()
			r := <-done
			if c.ok {
				if ie != nil || r.err != nil || r.p != c.p {
					t.Fatalf("initiator %v, responder %v as %s; want both nil, as %s", ie, r.err, r.p, c.p)
				}
				return
			}
			if !errors.Is(ie, base.ErrAuth) || !errors.Is(r.err, base.ErrAuth) {
				t.Fatalf("initiator %v, responder %v: want ErrAuth on both sides", ie, r.err)
			}
		})
	}
}

// rawFrame sends one request and reads its reply.
func rawFrame(t *testing.T, c net.Conn, op wire.Op, id uint64, fill func(*wire.Encoder)) (wire.Header, []byte) {
	t.Helper()
	if _, err := c.Write(wire.AppendFrame(nil, op, 0, id, 0, fill)); err != nil {
		t.Fatal(err)
	}
	h, body, err := wire.ReadFrame(c, nil)
	if err != nil {
		t.Fatalf("reply to %s: %v", op, err)
	}
	return h, body
}

// TestHandshakeAttacks: what an attacker who does not hold the key can try,
// with what it saw of other handshakes, is refused.
func TestHandshakeAttacks(t *testing.T) {
	k := Generate()
	// A recorded handshake: the initiator's two frames.
	ci, cr := pair(t)
	rec := &recorder{Conn: ci}
	go Respond(cr, Peer, keyOf(k))
	if err := Initiate(rec, k, Peer); err != nil {
		t.Fatal(err)
	}
	if len(rec.sent) != 2 {
		t.Fatalf("the initiator sent %d frames, want 2", len(rec.sent))
	}

	t.Run("replay", func(t *testing.T) {
		a, b := pair(t)
		done := make(chan error, 1)
		go func() { done <- Respond(b, Peer, keyOf(k)) }()
		for _, f := range rec.sent {
			a.Write(f)
		}
		if err := <-done; !errors.Is(err, base.ErrAuth) || !strings.Contains(err.Error(), "does not match") {
			t.Fatalf("a replayed handshake: %v, want ErrAuth: the key does not match", err)
		}
	})

	t.Run("reflection", func(t *testing.T) {
		// Send the responder's own proof back as the initiator's.
		a, b := pair(t)
		done := make(chan error, 1)
		go func() { done <- Respond(b, Peer, keyOf(k)) }()
		hello := wire.AuthHello{Nonce: nonce()}
		h, body := rawFrame(t, a, wire.OpPeerAuth, 1, hello.Encode)
		r, err := wire.DecodeAuthReply(body)
		if err != nil || h.Status != 0 {
			t.Fatalf("auth reply: %v, status %d", err, h.Status)
		}
		proof := wire.AuthProof{MAC: r.MAC}
		h, body = rawFrame(t, a, wire.OpPeerAuthProof, 2, proof.Encode)
		if serr := wire.StatusError(h, body); !errors.Is(serr, base.ErrAuth) {
			t.Fatalf("the responder's own proof sent back: reply %v, want ErrAuth", serr)
		}
		if err := <-done; !errors.Is(err, base.ErrAuth) {
			t.Fatalf("Respond: %v, want ErrAuth", err)
		}
	})

	t.Run("other protocol", func(t *testing.T) {
		// A client's proof (its MAC is labelled "client") on the peer port.
		a, b := pair(t)
		done := make(chan error, 1)
		go func() { done <- Respond(b, Peer, keyOf(k)) }()
		ni := nonce()
		hello := wire.AuthHello{Nonce: ni}
		_, body := rawFrame(t, a, wire.OpPeerAuth, 1, hello.Encode)
		r, _ := wire.DecodeAuthReply(body)
		proof := wire.AuthProof{MAC: MAC(k, Client, Initiator, &ni, &r.Nonce)}
		rawFrame(t, a, wire.OpPeerAuthProof, 2, proof.Encode)
		if err := <-done; !errors.Is(err, base.ErrAuth) {
			t.Fatalf("a client-protocol proof on the peer protocol: %v, want ErrAuth", err)
		}
	})

	t.Run("other op first", func(t *testing.T) {
		a, b := pair(t)
		done := make(chan error, 1)
		go func() { done <- Respond(b, Client, keyOf(k)) }()
		m := wire.Hello{Namespace: "ns", Node: "n"}
		h, body := rawFrame(t, a, wire.OpHello, 1, m.Encode)
		if serr := wire.StatusError(h, body); h.Op != wire.OpHello || !errors.Is(serr, base.ErrAuth) ||
			!strings.Contains(serr.Error(), "hello before the authentication handshake") {
			t.Fatalf("hello first: reply op %s: %v, want ErrAuth", h.Op, serr)
		}
		if err := <-done; !errors.Is(err, base.ErrAuth) {
			t.Fatalf("Respond: %v, want ErrAuth", err)
		}
	})

	t.Run("probe", func(t *testing.T) {
		a, b := pair(t)
		a.Close()
		if err := Respond(b, Client, keyOf(k)); !errors.Is(err, ErrHungUp) {
			t.Fatalf("a connection closed at once: %v, want ErrHungUp", err)
		}
	})
}

// recorder keeps what an initiator writes.
type recorder struct {
	net.Conn
	sent [][]byte
}

func (r *recorder) Write(b []byte) (int, error) {
	r.sent = append(r.sent, append([]byte(nil), b...))
	return r.Conn.Write(b)
}

func TestKeyFile(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "s.sock.key")
	k := Generate()
	if err := WriteKeyFile(path, k); err != nil {
		t.Fatal(err)
	}
	st, err := os.Stat(path)
	if err != nil || st.Mode().Perm() != 0o600 {
		t.Fatalf("key file: %v, mode %v, want 0600", err, st.Mode())
	}
	if got, err := ReadKeyFile(path); err != nil || got != k {
		t.Fatalf("ReadKeyFile: same %v, %v", got == k, err)
	}
	if ents, _ := os.ReadDir(dir); len(ents) != 1 {
		t.Fatalf("%d files in the directory, want only the key file", len(ents))
	}

	bad := func(name string, mk func(p string) error, says string) {
		t.Run(name, func(t *testing.T) {
			p := filepath.Join(t.TempDir(), "k")
			if err := mk(p); err != nil {
				t.Fatal(err)
			}
			_, err := ReadKeyFile(p)
			if !errors.Is(err, base.ErrAuth) || !strings.Contains(err.Error(), says) {
				t.Fatalf("%v, want ErrAuth saying %q", err, says)
			}
		})
	}
	bad("missing", func(string) error { return nil }, "no such file")
	bad("readable by others", func(p string) error {
		if err := os.WriteFile(p, []byte(k.Hex()), 0o600); err != nil {
			return err
		}
		return os.Chmod(p, 0o644)
	}, "has mode 644: want 0600")
	bad("symlink", func(p string) error { return os.Symlink(path, p) }, "too many levels of symbolic links")
	bad("directory", func(p string) error { return os.Mkdir(p, 0o700) }, "not a regular file")
	bad("not a key", func(p string) error { return os.WriteFile(p, []byte("hello\n"), 0o600) }, "a key is 64 hex digits")
	if os.Geteuid() != 0 {
		t.Log("not root: the other-user case needs chown")
	} else {
		// Root may read anyone's key file (it may connect to anyone's
		// agent); the check is for other users, which root cannot become
		// here without dropping privileges, so only the allowed case runs.
		p := filepath.Join(t.TempDir(), "k")
		if err := WriteKeyFile(p, k); err != nil {
			t.Fatal(err)
		}
		if err := os.Chown(p, 65534, 65534); err != nil {
			t.Fatal(err)
		}
		if got, err := ReadKeyFile(p); err != nil || got != k {
			t.Fatalf("root reading a key file of uid 65534: %v", err)
		}
	}
}

func TestClientKey(t *testing.T) {
	sock := filepath.Join(t.TempDir(), "s.sock")
	file := Generate()
	if err := WriteKeyFile(KeyFile(sock), file); err != nil {
		t.Fatal(err)
	}
	t.Setenv(SecretEnv, "")
	k, from, err := ClientKey(sock)
	if err != nil || k != file || from != KeyFile(sock) {
		t.Fatalf("without a secret: key from %q, %v; want the key file's", from, err)
	}
	t.Setenv(SecretEnv, testSecret)
	ks, _ := FromSecret(testSecret)
	k, from, err = ClientKey(sock)
	if err != nil || k != ks.Client || from != SecretEnv {
		t.Fatalf("with a secret: key from %q, %v; want the secret's client key", from, err)
	}
	t.Setenv(SecretEnv, "short")
	if _, _, err := ClientKey(sock); !errors.Is(err, base.ErrArgument) {
		t.Fatalf("a short secret: %v, want ErrArgument", err)
	}
	t.Setenv(SecretEnv, "")
	if _, _, err := ClientKey(filepath.Join(t.TempDir(), "none.sock")); !errors.Is(err, base.ErrAuth) ||
		!strings.Contains(err.Error(), "DDSTORE_SECRET is unset") {
		t.Fatalf("no secret, no key file: %v", err)
	}
}

package agent

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/ddstore-go/ddstore/internal/auth"
	"github.com/ddstore-go/ddstore/internal/base"
	"github.com/ddstore-go/ddstore/internal/naming"
	"github.com/ddstore-go/ddstore/internal/shm"
	"github.com/ddstore-go/ddstore/internal/testutil"
	"github.com/ddstore-go/ddstore/internal/wire"
)

// These tests run a real agent on a Unix socket in a temporary directory and
// talk to it with raw frames, as a client in another language would. They
// do not run in parallel: each checks that Close leaves no goroutine behind.

const ioWait = 5 * time.Second // deadline of one read or write on a test connection

var nsSeq atomic.Int64

// testNamespace is unique per agent started by this test binary, so that
// segment files in /dev/shm never collide with another test or process.
func testNamespace() string {
	return fmt.Sprintf("agtest-%d-%d", os.Getpid(), nsSeq.Add(1))
}

// startAgent starts a single-node agent (it coordinates itself) and closes
// it when the test ends, then checks that no goroutine is left over.
func startAgent(t *testing.T, cfg Config) *Agent {
	t.Helper()
	if cfg.Namespace == "" {
		cfg.Namespace = testNamespace()
	}
	if cfg.Node == "" {
		cfg.Node = "n1"
	}
	if cfg.Socket == "" {
		cfg.Socket = filepath.Join(privateTempDir(t), "s.sock")
	}
	before := runtime.NumGoroutine()
	a, err := Start(cfg)
	if err != nil {
		t.Fatalf("Start: %v", err)
	}
	t.Cleanup(func() {
		a.Close()
		checkNoLeak(t, before)
	})
	return a
}

// privateTempDir is t.TempDir made 0700, as the agent wants its socket
// directory (t.TempDir itself is 0755 under the usual umask).
func privateTempDir(t *testing.T) string {
	t.Helper()
	d := t.TempDir()
	if err := os.Chmod(d, 0o700); err != nil {
		t.Fatal(err)
	}
	return d
}

// checkNoLeak polls until at most `before` goroutines run.
func checkNoLeak(t *testing.T, before int) {
	t.Helper()
	err := testutil.Poll(5*time.Second, func() error {
		if n := runtime.NumGoroutine(); n > before {
			return fmt.Errorf("%d goroutines after Close, %d before Start", n, before)
		}
		return nil
	})
	if err != nil {
		buf := make([]byte, 1<<20)
		n := runtime.Stack(buf, true)
		t.Errorf("%v:\n%s", err, buf[:n])
	}
}

// rawConn is a client connection that speaks frames by hand.
type rawConn struct {
	t  *testing.T
	c  *net.UnixConn
	id uint64
	in []byte
}

// dialRaw connects to the agent and runs the authentication handshake with
// the key of its key file, as every client does first.
func dialRaw(t *testing.T, a *Agent) *rawConn {
	t.Helper()
	r := dialUnauthenticated(t, a)
	k, err := auth.ReadKeyFile(auth.KeyFile(a.Socket()))
	if err != nil {
		t.Fatal(err)
	}
	r.c.SetDeadline(time.Now().Add(ioWait))
	if err := auth.Initiate(r.c, k, auth.Client); err != nil {
		t.Fatalf("authenticating to %s: %v", a.Socket(), err)
	}
	r.c.SetDeadline(time.Time{})
	r.id = auth.FirstID - 1
	return r
}

// dialUnauthenticated connects without the handshake.
func dialUnauthenticated(t *testing.T, a *Agent) *rawConn {
	t.Helper()
	c, err := net.DialUnix("unix", nil, &net.UnixAddr{Name: a.Socket(), Net: "unix"})
	if err != nil {
		t.Fatalf("dial %s: %v", a.Socket(), err)
	}
	t.Cleanup(func() { c.Close() })
	return &rawConn{t: t, c: c}
}

// write sends raw bytes, with descriptors beside them when fds are given.
func (r *rawConn) write(b []byte, fds ...int) {
	r.t.Helper()
	r.c.SetWriteDeadline(time.Now().Add(ioWait))
	var err error
	if len(fds) > 0 {
		_, _, err = r.c.WriteMsgUnix(b, unix.UnixRights(fds...), nil)
	} else {
		_, err = r.c.Write(b)
	}
	if err != nil {
		r.t.Fatalf("write: %v", err)
	}
}

// call sends one request frame and returns its reply's body, or the error
// the reply carries.
func (r *rawConn) call(op wire.Op, fill func(*wire.Encoder), fds ...int) ([]byte, error) {
	r.t.Helper()
	r.id++
	r.write(wire.AppendFrame(nil, op, 0, r.id, 0, fill), fds...)
	r.c.SetReadDeadline(time.Now().Add(ioWait))
	h, body, err := wire.ReadFrame(r.c, r.in)
	if err != nil {
		r.t.Fatalf("%s: reading the reply: %v", op, err)
	}
	r.in = body[:0]
	if h.Op != op || h.ID != r.id || h.Payload != 0 {
		r.t.Fatalf("%s id %d: reply has op %s id %d payload %d", op, r.id, h.Op, h.ID, h.Payload)
	}
	if err := wire.StatusError(h, body); err != nil {
		return nil, err
	}
	return append([]byte(nil), body...), nil
}

// must is call for a request that has to succeed.
func (r *rawConn) must(op wire.Op, fill func(*wire.Encoder), fds ...int) []byte {
	r.t.Helper()
	body, err := r.call(op, fill, fds...)
	if err != nil {
		r.t.Fatalf("%s: %v", op, err)
	}
	return body
}

func (r *rawConn) hello(a *Agent, rank, size int64) {
	r.t.Helper()
	m := wire.Hello{Namespace: a.cfg.Namespace, Node: a.cfg.Node, Rank: rank, Size: size, LocalRank: rank, LocalSize: size, Pid: int64(os.Getpid())}
	rep, err := wire.DecodeHelloReply(r.must(wire.OpHello, m.Encode))
	if err != nil || rep.Node != a.cfg.Node || rep.AgentPid != int64(os.Getpid()) {
		r.t.Fatalf("hello reply %+v, %v", rep, err)
	}
}

func (r *rawConn) info() Info {
	r.t.Helper()
	txt, err := wire.DecodeText(r.must(wire.OpInfo, nil))
	if err != nil {
		r.t.Fatal(err)
	}
	var in Info
	if err := json.Unmarshal([]byte(txt.Text), &in); err != nil {
		r.t.Fatal(err)
	}
	return in
}

// expectClosed checks that the agent has closed the connection: a read
// ends (EOF, or a reset when bytes were left unread) instead of timing out.
func (r *rawConn) expectClosed() {
	r.t.Helper()
	r.c.SetReadDeadline(time.Now().Add(ioWait))
	var b [64]byte
	n, err := r.c.Read(b[:])
	if n > 0 {
		r.t.Fatalf("the agent answered %d bytes (% x) instead of closing the connection", n, b[:n])
	}
	if err != io.EOF && !errors.Is(err, syscall.ECONNRESET) {
		r.t.Fatalf("connection not closed by the agent: %v", err)
	}
}

// publishPending sends sh's Publish on r and returns once the coordinator
// holds it, its round waiting for the other ranks. The reply, when the
// round ends, comes on the channel, read by a goroutine of its own (t.Fatal
// is not for other goroutines) that ends with the reply, the connection or
// ioWait.
func publishPending(t *testing.T, a *Agent, r *rawConn, sh wire.Shard) <-chan error {
	t.Helper()
	r.id++
	r.write(wire.AppendFrame(nil, wire.OpPublish, 0, r.id, 0, sh.Encode))
	done := make(chan error, 1)
	go func() {
		r.c.SetReadDeadline(time.Now().Add(ioWait))
		h, body, err := wire.ReadFrame(r.c, nil)
		if err == nil {
			err = wire.StatusError(h, body)
		}
		done <- err
	}()
	testutil.WaitFor(t, ioWait, func() error {
		if n, _ := recorded(a.coord.Load(), sh.Name, sh.Attempt); n < 1 {
			return fmt.Errorf("rank %d's publish of %q never reached the coordinator", sh.Rank, sh.Name)
		}
		return nil
	})
	return done
}

func badFrames(a *Agent) int { return a.info().Counters["bad_frames"] }

// waitCounter polls until the agent's bad_frames counter reaches want.
func waitBadFrames(t *testing.T, a *Agent, want int) {
	t.Helper()
	testutil.WaitFor(t, ioWait, func() error {
		if got := badFrames(a); got < want {
			return fmt.Errorf("bad_frames = %d, want %d", got, want)
		}
		return nil
	})
}

func TestAgentDropsMalformedFrames(t *testing.T) {
	a := startAgent(t, Config{})
	good := dialRaw(t, a)
	good.hello(a, -1, 0)

	header := func(op wire.Op, payload uint64) []byte { return wire.AppendFrame(nil, op, 0, 1, payload, nil) }
	badMagic := header(wire.OpInfo, 0)
	badMagic[0] ^= 0xFF
	badVersion := header(wire.OpInfo, 0)
	badVersion[2] = 9
	badReserved := header(wire.OpInfo, 0)
	badReserved[13] = 1
	tooLong := header(wire.OpInfo, 0)
	tooLong[11] = 0x7F // body length ~2 GiB
	withStatus := wire.AppendFrame(nil, wire.OpInfo, 3, 1, 0, nil)
	garbage := []byte(strings.Repeat("this is not a frame!", 2))[:wire.HeaderSize]
	helloFrame := func(fill func(*wire.Encoder)) []byte { return wire.AppendFrame(nil, wire.OpHello, 0, 1, 0, fill) }
	okHello := wire.Hello{Namespace: a.cfg.Namespace, Node: a.cfg.Node, Rank: -1}

	cases := []struct {
		name string
		// greet: say a valid Hello first.
		greet bool
		send  []byte
		// halfClose: shut the write side after sending.
		halfClose bool
		// counted: the drop shows in bad_frames.
		counted bool
	}{
		{"garbage", false, garbage, false, true},
		{"bad magic", false, badMagic, false, true},
		{"bad version", false, badVersion, false, true},
		{"reserved field", false, badReserved, false, true},
		{"body too long", true, tooLong, false, true},
		{"nonzero payload", true, header(wire.OpInfo, 8), false, true},
		{"nonzero status", true, withStatus, false, true},
		{"op before hello", false, header(wire.OpInfo, 0), false, true},
		{"create before hello", false, wire.AppendFrame(nil, wire.OpCreate, 0, 1, 0, (&wire.Shard{Name: "x", Size: 1, Rows: 1, Disp: 1, ItemSize: 1}).Encode), false, true},
		{"unknown op", true, header(200, 0), false, true},
		{"peer op on the client socket", true, header(wire.OpFetch, 0), false, true},
		{"hello undecodable", false, helloFrame(func(e *wire.Encoder) { e.U8(7) }), false, true},
		{"hello with bytes left over", false, helloFrame(func(e *wire.Encoder) { okHello.Encode(e); e.U8(0) }), false, true},
		{"read undecodable", true, wire.AppendFrame(nil, wire.OpRead, 0, 1, 0, func(e *wire.Encoder) { e.String("x") }), false, true},
		{"read counts differ", true, wire.AppendFrame(nil, wire.OpRead, 0, 1, 0, (&wire.Read{Name: "x", Globals: []int64{1}}).Encode), false, true},
		// A connection cut inside a header is closed, but it is a client
		// going away rather than a malformed frame: the agent does not
		// count it (serveSession counts only ErrProtocol).
		{"truncated header then close", false, badMagic[:10], true, false},
		{"truncated body then close", true, helloFrame(okHello.Encode)[:wire.HeaderSize+3], true, false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			before := badFrames(a)
			r := dialRaw(t, a)
			if tc.greet {
				r.hello(a, -1, 0)
			}
			r.write(tc.send)
			if tc.halfClose {
				if err := r.c.CloseWrite(); err != nil {
					t.Fatal(err)
				}
			}
			r.expectClosed()
			if tc.counted {
				waitBadFrames(t, a, before+1)
			}
			// The agent keeps serving its other clients.
			if in := good.info(); in.Node != a.cfg.Node {
				t.Fatalf("info on the good connection: %+v", in)
			}
			if !tc.counted {
				if n := badFrames(a); n != before {
					t.Errorf("bad_frames went from %d to %d", before, n)
				}
			}
			// And new ones.
			r2 := dialRaw(t, a)
			r2.hello(a, -1, 0)
			r2.info()
		})
	}
	waitClients(t, a, 1)
}

// waitClients polls until the agent has n client connections.
func waitClients(t *testing.T, a *Agent, n int) {
	t.Helper()
	testutil.WaitFor(t, ioWait, func() error {
		a.mu.Lock()
		got := len(a.mu.sessions)
		a.mu.Unlock()
		if got != n {
			return fmt.Errorf("%d client sessions, want %d", got, n)
		}
		return nil
	})
}

func TestAgentHelloIdentity(t *testing.T) {
	a := startAgent(t, Config{})
	for _, tc := range []struct{ name, ns, node string }{
		{"wrong namespace", "other", a.cfg.Node},
		{"wrong node", a.cfg.Namespace, "n2"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := dialRaw(t, a)
			m := wire.Hello{Namespace: tc.ns, Node: tc.node, Rank: -1}
			_, err := r.call(wire.OpHello, m.Encode)
			if !errors.Is(err, base.ErrArgument) || base.Code(err) != base.Code(base.ErrArgument) {
				t.Fatalf("hello as %q/%q: %v, want ErrArgument", tc.ns, tc.node, err)
			}
			for _, w := range []string{fmt.Sprintf("%q", tc.ns), fmt.Sprintf("%q", tc.node), fmt.Sprintf("%q", a.cfg.Namespace)} {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not name %s", err, w)
				}
			}
			// The connection stays usable: a right Hello, then requests.
			r.hello(a, -1, 0)
			r.info()
			// A wrong Hello on a greeted connection leaves it greeted.
			if _, err := r.call(wire.OpHello, m.Encode); !errors.Is(err, base.ErrArgument) {
				t.Fatalf("second wrong hello: %v", err)
			}
			r.info()
		})
	}
	t.Run("wrong hello does not greet", func(t *testing.T) {
		r := dialRaw(t, a)
		m := wire.Hello{Namespace: "other", Node: a.cfg.Node, Rank: -1}
		if _, err := r.call(wire.OpHello, m.Encode); !errors.Is(err, base.ErrArgument) {
			t.Fatalf("hello: %v", err)
		}
		r.write(wire.AppendFrame(nil, wire.OpInfo, 0, 9, 0, nil))
		r.expectClosed()
	})
}

func TestAgentFullFlow(t *testing.T) {
	a := startAgent(t, Config{})
	r := dialRaw(t, a)
	r.hello(a, 0, 1)

	const rows, disp, itemsize = 6, 2, 4
	const rb = disp * itemsize
	sh := wire.Shard{Name: "x/y z", Rank: 0, Size: 1, Rows: rows, Disp: disp, ItemSize: itemsize, TimeoutMs: 5000, Attempt: 1, Dtype: "int32"}
	p, err := wire.DecodePath(r.must(wire.OpCreate, sh.Encode))
	if err != nil {
		t.Fatal(err)
	}
	path := p.Path
	if ns, node, _, ok := shm.ParseSegmentName(filepath.Base(path)); !ok || ns != a.cfg.Namespace || node != a.cfg.Node || filepath.Dir(path) != shm.Dir {
		t.Errorf("segment path %s: not a segment of namespace %q, node %q in %s", path, a.cfg.Namespace, a.cfg.Node, shm.Dir)
	}
	t.Cleanup(func() { shm.Remove(path) })
	// The same rank cannot create its shard twice.
	if _, err := r.call(wire.OpCreate, sh.Encode); !errors.Is(err, base.ErrExists) {
		t.Fatalf("second create: %v, want ErrExists", err)
	}

	// Write the rows: row i is bytes 16*i, 16*i+1, ...
	seg, err := shm.Open(path, true)
	if err != nil {
		t.Fatal(err)
	}
	if seg.Header != (shm.Header{Rank: 0, Rows: rows, Disp: disp, ItemSize: itemsize}) || len(seg.Data) != rows*rb {
		t.Fatalf("segment header %+v, %d data bytes", seg.Header, len(seg.Data))
	}
	row := func(i int) []byte {
		b := make([]byte, rb)
		for j := range b {
			b[j] = byte(16*i + j)
		}
		return b
	}
	for i := range rows {
		copy(seg.Data[i*rb:], row(i))
	}
	seg.Close()

	tab, err := wire.DecodeTable(r.must(wire.OpPublish, sh.Encode))
	if err != nil {
		t.Fatal(err)
	}
	if tab.Name != sh.Name || tab.Disp != disp || tab.ItemSize != itemsize || len(tab.Paths) != 1 || tab.Paths[0] != path ||
		len(tab.ShardRows) != 1 || tab.ShardRows[0] != rows || len(tab.Nodes) != 1 || tab.Nodes[0] != a.cfg.Node ||
		len(tab.Addrs) != 1 || tab.Addrs[0] != a.PeerAddr() || tab.RankNode[0] != 0 || tab.Dtype != "int32" {
		t.Fatalf("published table %+v", tab)
	}
	if vs := r.info().Variables; len(vs) != 1 || vs[0].Name != sh.Name || !vs[0].Published || vs[0].TotalRows != rows ||
		vs[0].RowBytes != rb || vs[0].Dtype != "int32" || vs[0].LocalBytes != rows*rb {
		t.Errorf("info variables after publish: %+v", vs)
	}
	// Lookup gives the same table.
	if lt, err := wire.DecodeTable(r.must(wire.OpLookup, (&wire.Name{Name: sh.Name}).Encode)); err != nil || lt.Paths[0] != path {
		t.Fatalf("lookup: %+v, %v", lt, err)
	}
	if _, err := r.call(wire.OpLookup, (&wire.Name{Name: "nope"}).Encode); !errors.Is(err, base.ErrUnknown) || !strings.Contains(err.Error(), "x/y z") {
		t.Fatalf("lookup of an unknown name: %v, want ErrUnknown listing x/y z", err)
	}

	// A receive region.
	const regionSize = 64
	reg, err := shm.NewRegion("agent-test", regionSize)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { reg.Close() })
	for i := range reg.Mem {
		reg.Mem[i] = 0xEE
	}
	rm, err := wire.DecodeRegion(r.must(wire.OpRegister, (&wire.Region{Size: regionSize}).Encode, reg.Fd))
	if err != nil || rm.ID == 0 || rm.Size != regionSize {
		t.Fatalf("register reply %+v, %v", rm, err)
	}
	if in := r.info(); in.Regions != 1 || in.MemoryBytes < regionSize {
		t.Errorf("info after register: %d regions, %d bytes", in.Regions, in.MemoryBytes)
	}
	read := func(globals, offsets []int64) error {
		m := wire.Read{Name: sh.Name, Region: rm.ID, ID: tab.ID, Globals: globals, Offsets: offsets}
		body, err := r.call(wire.OpRead, m.Encode)
		if err == nil && len(body) != 0 {
			t.Fatalf("read reply has a %d-byte body", len(body))
		}
		return err
	}
	if err := read([]int64{3, 0, 5, 3}, []int64{0, 8, 40, 56}); err != nil {
		t.Fatalf("read: %v", err)
	}
	want := bytes.Repeat([]byte{0xEE}, regionSize)
	copy(want[0:], row(3))
	copy(want[8:], row(0))
	copy(want[40:], row(5))
	copy(want[56:], row(3))
	if !bytes.Equal(reg.Mem, want) {
		t.Fatalf("region after read:\n% x\nwant\n% x", reg.Mem, want)
	}
	if n := a.info().Counters["read_rows"]; n != 4 {
		t.Errorf("read_rows = %d, want 4", n)
	}

	// Offsets past the region, or negative: ErrBuffer, and no row is
	// written, not even those before the bad one.
	for i := range reg.Mem {
		reg.Mem[i] = 0xEE
	}
	for _, offs := range [][]int64{{0, 57}, {16, regionSize}, {0, -1}, {1 << 40, 0}} {
		err := read([]int64{1, 2}, offs)
		if !errors.Is(err, base.ErrBuffer) {
			t.Errorf("read at offsets %v: %v, want ErrBuffer", offs, err)
		}
		if !bytes.Equal(reg.Mem, bytes.Repeat([]byte{0xEE}, regionSize)) {
			t.Fatalf("a failed read at offsets %v wrote into the region: % x", offs, reg.Mem)
		}
	}
	// An index out of range: ErrIndex, nothing written.
	if err := read([]int64{0, rows}, []int64{0, 8}); !errors.Is(err, base.ErrIndex) {
		t.Errorf("read of row %d of %d: %v, want ErrIndex", rows, rows, err)
	}
	if !bytes.Equal(reg.Mem, bytes.Repeat([]byte{0xEE}, regionSize)) {
		t.Fatalf("a read with a bad index wrote into the region")
	}
	// Unknown variable, unknown region.
	if _, err := r.call(wire.OpRead, (&wire.Read{Name: "nope", Region: rm.ID}).Encode); !errors.Is(err, base.ErrUnknown) {
		t.Errorf("read of an unknown variable: %v, want ErrUnknown", err)
	}
	if _, err := r.call(wire.OpRead, (&wire.Read{Name: sh.Name, Region: rm.ID, ID: tab.ID + 1}).Encode); !errors.Is(err, base.ErrFreed) {
		t.Errorf("read naming another table id: %v, want ErrFreed", err)
	}
	if _, err := r.call(wire.OpRead, (&wire.Read{Name: sh.Name, Region: rm.ID + 100, ID: tab.ID}).Encode); !errors.Is(err, base.ErrArgument) {
		t.Errorf("read into an unknown region: %v, want ErrArgument", err)
	}

	// Register without a descriptor; with a size larger than the file.
	if _, err := r.call(wire.OpRegister, (&wire.Region{Size: regionSize}).Encode); !errors.Is(err, base.ErrArgument) {
		t.Errorf("register without a descriptor: %v, want ErrArgument", err)
	}
	if _, err := r.call(wire.OpRegister, (&wire.Region{Size: regionSize + 1}).Encode, reg.Fd); !errors.Is(err, base.ErrArgument) {
		t.Errorf("register of more bytes than the file has: %v, want ErrArgument", err)
	}
	if _, err := r.call(wire.OpRegister, (&wire.Region{Size: 0}).Encode, reg.Fd); !errors.Is(err, base.ErrArgument) {
		t.Errorf("register of size 0: %v, want ErrArgument", err)
	}
	// A memfd that could still shrink under the agent's mapping is refused.
	unsealed, err := unix.MemfdCreate("unsealed", unix.MFD_CLOEXEC)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(unsealed)
	unix.Ftruncate(unsealed, regionSize)
	if _, err := r.call(wire.OpRegister, (&wire.Region{Size: regionSize}).Encode, unsealed); !errors.Is(err, base.ErrArgument) || !strings.Contains(err.Error(), "sealed") {
		t.Errorf("register of an unsealed memfd: %v, want ErrArgument naming the seal", err)
	}
	// Another connection cannot unregister this one's region.
	other := dialRaw(t, a)
	other.hello(a, -1, 0)
	if _, err := other.call(wire.OpUnregister, (&wire.Region{ID: rm.ID}).Encode); !errors.Is(err, base.ErrArgument) {
		t.Errorf("unregister from another connection: %v, want ErrArgument", err)
	}
	// Unregister, then the id is gone.
	r.must(wire.OpUnregister, (&wire.Region{ID: rm.ID}).Encode)
	if err := read([]int64{0}, []int64{0}); !errors.Is(err, base.ErrArgument) {
		t.Errorf("read into an unregistered region: %v, want ErrArgument", err)
	}
	if _, err := r.call(wire.OpUnregister, (&wire.Region{ID: rm.ID}).Encode); !errors.Is(err, base.ErrArgument) {
		t.Errorf("second unregister: %v, want ErrArgument", err)
	}
	if n := a.regions.count(); n != 0 {
		t.Errorf("%d regions left", n)
	}

	// Free: the segment goes, and the name can be created again. A client
	// still mapping it (a reader) finds it marked dropped.
	mapped, err := shm.Open(path, false)
	if err != nil {
		t.Fatal(err)
	}
	defer mapped.Close()
	if mapped.Dropped() {
		t.Fatal("a published segment reads dropped")
	}
	r.must(wire.OpFree, (&wire.Name{Name: sh.Name, Rank: 0}).Encode)
	if _, err := os.Stat(path); !os.IsNotExist(err) {
		t.Fatalf("segment %s after free: %v", path, err)
	}
	if !mapped.Dropped() {
		t.Fatal("the freed segment is not marked dropped for a client mapping it")
	}
	if _, err := r.call(wire.OpLookup, (&wire.Name{Name: sh.Name}).Encode); !errors.Is(err, base.ErrUnknown) {
		t.Errorf("lookup after free: %v, want ErrUnknown", err)
	}
	if _, err := r.call(wire.OpFree, (&wire.Name{Name: sh.Name, Rank: 0}).Encode); !errors.Is(err, base.ErrUnknown) {
		t.Errorf("second free: %v, want ErrUnknown", err)
	}
	sh.Attempt = 2
	r.must(wire.OpCreate, sh.Encode)
	if _, err := wire.DecodeTable(r.must(wire.OpPublish, sh.Encode)); err != nil {
		t.Fatal(err)
	}
	// Close removes what is left.
	a.Close()
	if _, err := os.Stat(path); !os.IsNotExist(err) {
		t.Errorf("segment %s after Close: %v", path, err)
	}
	if _, err := os.Stat(a.Socket()); !os.IsNotExist(err) {
		t.Errorf("socket after Close: %v", err)
	}
}

func TestAgentPublishOtherGeometryThanCreated(t *testing.T) {
	// docs/protocol.md, Publish: "fails ... with ErrGeometry if rows, disp
	// or itemsize differ from the Create ... On any failure the agent
	// removes this rank's segment, so a corrected retry starts again with
	// Create."
	a := startAgent(t, Config{})
	r := dialRaw(t, a)
	r.hello(a, 0, 1)
	sh := wire.Shard{Name: "v", Rank: 0, Size: 1, Rows: 3, Disp: 2, ItemSize: 4, Attempt: 1}
	p, err := wire.DecodePath(r.must(wire.OpCreate, sh.Encode))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { shm.Remove(p.Path) })
	wrong := sh
	wrong.Rows++
	if _, err := r.call(wire.OpPublish, wrong.Encode); !errors.Is(err, base.ErrGeometry) || !strings.Contains(err.Error(), "created 3 rows") {
		t.Fatalf("publish of other rows than created: %v, want ErrGeometry naming both", err)
	}
	sh.Attempt = 2
	if _, err := r.call(wire.OpCreate, sh.Encode); err != nil {
		_, statErr := os.Stat(p.Path)
		t.Fatalf("agent.publish (session.go): a Publish refused because its rows/disp/itemsize differ from the Create keeps the segment "+
			"(stat: %v), so the documented corrected retry (Create again) fails: %v", statErr, err)
	}
	if _, err := wire.DecodeTable(r.must(wire.OpPublish, sh.Encode)); err != nil {
		t.Fatal(err)
	}
}

func TestAgentRegionsDroppedWithConnection(t *testing.T) {
	a := startAgent(t, Config{})
	r := dialRaw(t, a)
	r.hello(a, -1, 0)
	reg, err := shm.NewRegion("agent-test", 4096)
	if err != nil {
		t.Fatal(err)
	}
	defer reg.Close()
	r.must(wire.OpRegister, (&wire.Region{Size: 4096}).Encode, reg.Fd)
	r.must(wire.OpRegister, (&wire.Region{Size: 100}).Encode, reg.Fd)
	if n := a.regions.count(); n != 2 {
		t.Fatalf("%d regions, want 2", n)
	}
	r.c.Close()
	waitClients(t, a, 0)
	if n := a.regions.count(); n != 0 {
		t.Fatalf("%d regions after the connection closed, want 0", n)
	}
}

func TestAgentCreateChecks(t *testing.T) {
	a := startAgent(t, Config{})
	r := dialRaw(t, a)
	r.hello(a, 0, 2)
	ok := wire.Shard{Name: "v", Rank: 0, Size: 2, Rows: 1, Disp: 1, ItemSize: 1, Attempt: 1}
	for _, tc := range []struct {
		name     string
		edit     func(*wire.Shard)
		sentinel error
	}{
		{"empty name", func(s *wire.Shard) { s.Name = "" }, base.ErrArgument},
		{"long name", func(s *wire.Shard) { s.Name = strings.Repeat("n", naming.MaxVariableName+1) }, base.ErrArgument},
		{"rank = size", func(s *wire.Shard) { s.Rank = 2 }, base.ErrArgument},
		{"negative rank", func(s *wire.Shard) { s.Rank = -1 }, base.ErrArgument},
		{"size 0", func(s *wire.Shard) { s.Size, s.Rank = 0, 0 }, base.ErrArgument},
		{"negative rows", func(s *wire.Shard) { s.Rows = -1 }, base.ErrGeometry},
		{"disp 0", func(s *wire.Shard) { s.Disp = 0 }, base.ErrGeometry},
		{"itemsize 0", func(s *wire.Shard) { s.ItemSize = 0 }, base.ErrGeometry},
		{"itemsize 65", func(s *wire.Shard) { s.ItemSize = 65 }, base.ErrGeometry},
		{"too large", func(s *wire.Shard) { s.Rows, s.Disp, s.ItemSize = 1<<40, 1<<10, 64 }, base.ErrGeometry},
	} {
		sh := ok
		tc.edit(&sh)
		if _, err := r.call(wire.OpCreate, sh.Encode); !errors.Is(err, tc.sentinel) {
			t.Errorf("%s: create: %v, want %v", tc.name, err, tc.sentinel)
		}
	}
	// Publish of a shard never created.
	if _, err := r.call(wire.OpPublish, ok.Encode); !errors.Is(err, base.ErrUnknown) {
		t.Errorf("publish without create: %v, want ErrUnknown", err)
	}
	if in := a.info(); len(in.Variables) != 0 {
		t.Errorf("variables left by refused requests: %+v", in.Variables)
	}
}

func TestAgentFailedPublishFailsRound(t *testing.T) {
	// Rank 1 cannot create its shard and says so; rank 0, waiting on another
	// connection, gets ErrGeometry at once, and its segment is taken back.
	a := startAgent(t, Config{})
	r0, r1 := dialRaw(t, a), dialRaw(t, a)
	r0.hello(a, 0, 2)
	r1.hello(a, 1, 2)
	s0 := wire.Shard{Name: "v", Rank: 0, Size: 2, Rows: 3, Disp: 1, ItemSize: 8, TimeoutMs: 10_000, Attempt: 1}
	p, err := wire.DecodePath(r0.must(wire.OpCreate, s0.Encode))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { shm.Remove(p.Path) })
	done := publishPending(t, a, r0, s0)
	s1 := s0
	s1.Rank, s1.Failed = 1, true
	if _, err := r1.call(wire.OpPublish, s1.Encode); !errors.Is(err, base.ErrGeometry) {
		t.Fatalf("failed rank 1: %v, want ErrGeometry", err)
	}
	if err := <-done; !errors.Is(err, base.ErrGeometry) || !strings.Contains(err.Error(), "rank 1") {
		t.Fatalf("rank 0: %v, want ErrGeometry naming rank 1", err)
	}
	if _, err := os.Stat(p.Path); !os.IsNotExist(err) {
		t.Errorf("rank 0's segment after the failed round: %v", err)
	}
	// A retry by both works.
	s0.Attempt, s1.Attempt, s1.Failed = 2, 2, false
	p1 := wire.Path{}
	r0.must(wire.OpCreate, s0.Encode)
	if p1, err = wire.DecodePath(r1.must(wire.OpCreate, s1.Encode)); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { shm.Remove(p1.Path) })
	done = publishPending(t, a, r0, s0)
	if _, err := r1.call(wire.OpPublish, s1.Encode); err != nil {
		t.Fatalf("rank 1 retry: %v", err)
	}
	if err := <-done; err != nil {
		t.Fatalf("rank 0 retry: %v", err)
	}
}

func TestAgentStartTwice(t *testing.T) {
	sock := filepath.Join(privateTempDir(t), "s.sock")
	ns := testNamespace()
	before := runtime.NumGoroutine()
	a, err := Start(Config{Namespace: ns, Node: "n1", Socket: sock})
	if err != nil {
		t.Fatal(err)
	}
	b, err := Start(Config{Namespace: ns, Node: "n1", Socket: sock})
	if err == nil {
		b.Close()
		a.Close()
		t.Fatal("a second agent started on the same socket")
	}
	if !errors.Is(err, naming.ErrAgentRuns) || !errors.Is(err, base.ErrExists) {
		t.Fatalf("second Start: %v, want ErrAgentRuns (an ErrExists)", err)
	}
	// The first one still serves, on its socket.
	r := dialRaw(t, a)
	r.hello(a, -1, 0)
	r.info()
	r.c.Close()
	a.Close()
	if _, err := os.Stat(sock + ".lock"); !os.IsNotExist(err) {
		t.Errorf("lock file after Close: %v", err)
	}
	checkNoLeak(t, before)
	// The lock is released: a new agent starts on the same socket.
	c := startAgent(t, Config{Namespace: ns, Node: "n1", Socket: sock})
	r = dialRaw(t, c)
	r.hello(c, -1, 0)
	r.info()
}

func TestAgentCloseWithPublishPending(t *testing.T) {
	// A Publish waiting for ranks that never come does not hold Close up,
	// and its segment goes with the agent.
	a := startAgent(t, Config{})
	r := dialRaw(t, a)
	r.hello(a, 0, 2)
	sh := wire.Shard{Name: "v", Rank: 0, Size: 2, Rows: 1, Disp: 1, ItemSize: 1, Attempt: 1} // timeout: the 5 min join timeout
	p, err := wire.DecodePath(r.must(wire.OpCreate, sh.Encode))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { shm.Remove(p.Path) })
	publishPending(t, a, r, sh)
	closed := make(chan struct{})
	go func() { a.Close(); close(closed) }()
	select {
	case <-closed:
	case <-time.After(ioWait):
		t.Fatal("Close blocked behind a pending Publish")
	}
	if _, err := os.Stat(p.Path); !os.IsNotExist(err) {
		t.Errorf("segment after Close: %v", err)
	}
}

func TestAgentFailedStartCleansUp(t *testing.T) {
	// A Start that fails after taking the lock and the socket (here: a peer
	// address it cannot listen on) releases both.
	sock := filepath.Join(privateTempDir(t), "s.sock")
	ns := testNamespace()
	before := runtime.NumGoroutine()
	a, err := Start(Config{Namespace: ns, Node: "n1", Socket: sock, PeerListen: "256.0.0.1:0"})
	if err == nil {
		a.Close()
		t.Fatal("Start with an impossible peer address succeeded")
	}
	if !strings.Contains(err.Error(), "256.0.0.1:0") {
		t.Errorf("error %q does not name the peer address", err)
	}
	for _, p := range []string{sock, sock + ".lock"} {
		if _, err := os.Stat(p); !os.IsNotExist(err) {
			t.Errorf("%s after a failed Start: %v", p, err)
		}
	}
	checkNoLeak(t, before)
	b := startAgent(t, Config{Namespace: ns, Node: "n1", Socket: sock})
	r := dialRaw(t, b)
	r.hello(b, -1, 0)
}

func TestAgentStartArguments(t *testing.T) {
	dir := t.TempDir()
	for _, cfg := range []Config{
		{Node: "n", Socket: filepath.Join(dir, "a.sock")},
		{Namespace: "ns", Socket: filepath.Join(dir, "b.sock")},
		{Namespace: "ns", Node: "n"},
	} {
		if a, err := Start(cfg); !errors.Is(err, base.ErrArgument) {
			if a != nil {
				a.Close()
			}
			t.Errorf("Start(%+v): %v, want ErrArgument", cfg, err)
		}
	}
}

func TestAgentIdleExit(t *testing.T) {
	t.Run("no client", func(t *testing.T) {
		a := startAgent(t, Config{IdleExit: 200 * time.Millisecond})
		select {
		case <-a.Done():
		case <-time.After(3 * time.Second):
			t.Fatal("agent without clients still runs 3 s after a 200 ms idle exit")
		}
		if _, err := net.Dial("unix", a.Socket()); err == nil {
			t.Error("the socket still answers after the idle exit")
		}
	})
	t.Run("client connected", func(t *testing.T) {
		a := startAgent(t, Config{IdleExit: 200 * time.Millisecond})
		r := dialRaw(t, a)
		r.hello(a, -1, 0)
		select {
		case <-a.Done():
			t.Fatal("agent stopped while a client was connected")
		case <-time.After(800 * time.Millisecond): // 4 idle periods
		}
		r.info()
		r.c.Close()
		select {
		case <-a.Done():
		case <-time.After(3 * time.Second):
			t.Fatal("agent still runs 3 s after its last client left")
		}
	})
}

func TestCheckPrivateDir(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "pub")
	if err := os.Mkdir(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := checkPrivateDir(dir); err != nil {
		t.Fatalf("0700 directory: %v", err)
	}
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := checkPrivateDir(dir); !errors.Is(err, base.ErrArgument) || !strings.Contains(err.Error(), "755") {
		t.Fatalf("0755 directory: %v, want ErrArgument naming mode 755", err)
	}
	before := runtime.NumGoroutine()
	a, err := Start(Config{Namespace: testNamespace(), Node: "n1", Socket: filepath.Join(dir, "s.sock")})
	if err == nil {
		a.Close()
		t.Fatal("agent started with its socket in a 0755 directory")
	}
	if !errors.Is(err, base.ErrArgument) || !strings.Contains(err.Error(), "mode 755") || !strings.Contains(err.Error(), dir) {
		t.Fatalf("Start in a 0755 directory: %v, want ErrArgument naming the directory and mode 755", err)
	}
	if _, err := os.Stat(filepath.Join(dir, "s.sock.lock")); !os.IsNotExist(err) {
		t.Errorf("lock file left by a failed Start: %v", err)
	}
	checkNoLeak(t, before)
	if err := checkPrivateDir(filepath.Join(dir, "missing")); err == nil {
		t.Error("checkPrivateDir of a missing directory succeeded")
	}
}

// TestStartChecksNames: names that cannot name a socket unambiguously
// (naming.CheckName) never reach the agent's paths.
func TestStartChecksNames(t *testing.T) {
	if _, err := Start(Config{Namespace: "a\x00b", Node: "n", Socket: filepath.Join(t.TempDir(), "s")}); !errors.Is(err, base.ErrArgument) {
		t.Errorf("Start with a NUL in the namespace: %v, want ErrArgument", err)
	}
}

// TestAgentSkipsDroppedSegments: an agent stopped with Persist leaves its
// segments unmarked (they are re-adopted); one whose segment is marked
// dropped (an agent killed between marking and unlinking it, whose readers
// have been told the variable is gone) does not re-adopt it.
func TestAgentSkipsDroppedSegments(t *testing.T) {
	cfg := Config{Namespace: testNamespace(), Node: "n1", Socket: filepath.Join(privateTempDir(t), "s.sock"), Persist: true}
	a := startAgent(t, cfg)
	r := dialRaw(t, a)
	r.hello(a, 0, 1)
	sh := wire.Shard{Name: "kept", Rank: 0, Size: 1, Rows: 2, Disp: 1, ItemSize: 8, TimeoutMs: 5000, Attempt: 1}
	p, err := wire.DecodePath(r.must(wire.OpCreate, sh.Encode))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { shm.Remove(p.Path) })
	r.must(wire.OpPublish, sh.Encode)
	a.Close()
	seg, err := shm.Open(p.Path, true)
	if err != nil {
		t.Fatalf("the segment after a stop with Persist: %v", err)
	}
	defer seg.Close()
	if seg.Dropped() {
		t.Fatal("a stop with Persist marked the segment dropped")
	}
	seg.MarkDropped()
	b := startAgent(t, cfg)
	if n := b.info().Counters["adopted_variables"]; n != 0 {
		t.Fatalf("adopted_variables = %d, want 0", n)
	}
	r = dialRaw(t, b)
	r.hello(b, 0, 1)
	// The coordinator's restored state still lists the table; its shard
	// here is gone.
	if _, err := r.call(wire.OpLookup, (&wire.Name{Name: sh.Name}).Encode); !errors.Is(err, base.ErrFreed) {
		t.Fatalf("lookup of the dropped variable: %v, want ErrFreed", err)
	}
}

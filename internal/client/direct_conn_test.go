package client

import (
	"encoding/binary"
	"errors"
	"net"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/ddstore-go/ddstore/internal/auth"
	"github.com/ddstore-go/ddstore/internal/base"
	"github.com/ddstore-go/ddstore/internal/wire"
)

// fakeOwner accepts one direct connection on a loopback listener, proves
// key, answers the first request with rows (the header and the first row
// in one write, the rest in another) and reads the second without
// answering until the test ends. It returns the address.
func fakeOwner(t *testing.T, key auth.Key, rows []byte) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	served := make(chan error, 1)
	go func() {
		c, err := ln.Accept()
		ln.Close()
		if err != nil {
			served <- err
			return
		}
		defer c.Close()
		err = auth.Respond(c, auth.Direct, func() (auth.Key, error) { return key, nil })
		var h wire.Header
		if err == nil {
			h, _, err = wire.ReadFrame(c, nil)
		}
		if err == nil {
			reply := wire.AppendFrame(nil, h.Op, 0, h.ID, uint64(len(rows)), nil)
			if _, err = c.Write(append(reply, rows[:8]...)); err == nil {
				_, err = c.Write(rows[8:])
			}
		}
		if err == nil {
			_, _, err = wire.ReadFrame(c, nil) // the second request, never answered
		}
		served <- err
		<-done
	}()
	t.Cleanup(func() {
		close(done)
		if err := <-served; err != nil {
			t.Errorf("fake owner: %v", err)
		}
	})
	return ln.Addr().String()
}

// TestDirectConnBlocking: a direct connection is a blocking, close-on-exec
// socket out of the runtime's poller; a read on it gets its rows through
// replies that come in several pieces, and a reply that never comes fails
// the read with ErrTimeout once the Store's timeout has passed.
func TestDirectConnBlocking(t *testing.T) {
	key := auth.DirectKeyOf(auth.Generate())
	rows := make([]byte, 4*64)
	for i := range 4 {
		binary.LittleEndian.PutUint64(rows[i*64:], uint64(100+i))
	}
	addr := fakeOwner(t, key, rows)
	c, err := dialDirect(addr, key, 5*time.Second, 300*time.Millisecond)
	if err != nil {
		t.Fatal(err)
	}
	defer c.close()
	fl, err := unix.FcntlInt(uintptr(c.fd), unix.F_GETFL, 0)
	if err != nil || fl&unix.O_NONBLOCK != 0 {
		t.Fatalf("direct socket flags %#x, %v: want a blocking socket", fl, err)
	}
	if fd, err := unix.FcntlInt(uintptr(c.fd), unix.F_GETFD, 0); err != nil || fd&unix.FD_CLOEXEC == 0 {
		t.Fatalf("direct socket descriptor flags %#x, %v: want close-on-exec", fd, err)
	}

	v := &variable{name: "v", id: 7, rb: 64}
	dst := make([]byte, len(rows))
	at := func(i int) int64 { return 100 + int64(i) }
	if err := c.read(v, dst, []int64{0, 1, 2, 3}, at, 5*time.Second); err != nil {
		t.Fatalf("read: %v", err)
	}
	for i := range 4 {
		if got := binary.LittleEndian.Uint64(dst[i*64:]); got != uint64(100+i) {
			t.Fatalf("row %d read as %d", 100+i, got)
		}
	}
	err = c.read(v, dst, []int64{0}, at, 5*time.Second)
	if !errors.Is(err, base.ErrTimeout) {
		t.Fatalf("read of an owner that does not answer: %v, want ErrTimeout", err)
	}
}

// TestDirectWaitBy: the receive timeout of a direct socket stays the
// Store's timeout while a read has about that left (no setsockopt per
// read), follows a read's deadline once less is left, within rcvSlack, is
// the Store's timeout again on the next read, and a read past its
// deadline fails with ErrTimeout.
func TestDirectWaitBy(t *testing.T) {
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fds[1])
	const timeout = time.Minute
	c := &directConn{addr: "test", fd: fds[0], timeout: timeout}
	defer c.close()
	got := func() time.Duration {
		tv, err := unix.GetsockoptTimeval(c.fd, unix.SOL_SOCKET, unix.SO_RCVTIMEO)
		if err != nil {
			t.Fatal(err)
		}
		return time.Duration(tv.Nano())
	}
	if err := setTimeo(c.fd, unix.SO_RCVTIMEO, timeout); err != nil {
		t.Fatal(err)
	}
	c.rcvTimeo = timeout
	now := time.Now()
	for _, tc := range []struct {
		name     string
		left     time.Duration
		lo, hi   time.Duration // the receive timeout wanted after waitBy
		changed  bool
		timedOut bool
	}{
		{"a new read", timeout, timeout, timeout, false, false},
		{"a read that waited a little", timeout - rcvSlack/2, timeout, timeout, false, false},
		{"10 s left", 10 * time.Second, 10*time.Second - rcvSlack, 10 * time.Second, true, false},
		{"within the slack", 10*time.Second - rcvSlack/2, 10*time.Second - rcvSlack, 10 * time.Second, false, false},
		{"past the slack", 9 * time.Second, 9*time.Second - rcvSlack, 9 * time.Second, true, false},
		{"the next read", timeout, timeout, timeout, true, false},
		{"past the deadline", -time.Millisecond, timeout, timeout, false, true},
	} {
		before := c.rcvTimeo
		err := c.waitBy(now.Add(tc.left))
		if tc.timedOut != errors.Is(err, base.ErrTimeout) || (!tc.timedOut && err != nil) {
			t.Fatalf("%s: waitBy(%v left) = %v, timed out: want %v", tc.name, tc.left, err, tc.timedOut)
		}
		// The kernel keeps the timeout in clock ticks.
		const tick = 20 * time.Millisecond
		if g := got(); g < tc.lo-tick || g > tc.hi+tick || (c.rcvTimeo-g).Abs() > tick {
			t.Fatalf("%s: SO_RCVTIMEO %v (recorded %v), want within [%v, %v]", tc.name, g, c.rcvTimeo, tc.lo, tc.hi)
		}
		if changed := c.rcvTimeo != before; changed != tc.changed {
			t.Fatalf("%s: receive timeout changed %v -> %v, want a change: %v", tc.name, before, c.rcvTimeo, tc.changed)
		}
		now = time.Now()
	}
}

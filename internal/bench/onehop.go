package bench

// The limits of a single-row read of another node: one raw round trip of
// the same bytes over loopback TCP and over a Unix socket, measured in the
// run that measures the store's Get, direct (one hop to the owner's agent)
// and through the own agent.

import (
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"
)

// pingEnv makes `ddstore bench` the other end of a PingPong between
// processes: "NETWORK ADDR REPLY ITERS".
const pingEnv = "DDSTORE_BENCH_PING"

// PingRole runs this process as the answering end of a PingPong when
// pingEnv says so (ok true), and returns when it is done.
func PingRole() (ok bool, err error) {
	arg := os.Getenv(pingEnv)
	if arg == "" {
		return false, nil
	}
	f := strings.Fields(arg)
	if len(f) != 4 {
		return true, fmt.Errorf("bench: %s=%q: want NETWORK ADDR REPLY ITERS", pingEnv, arg)
	}
	reply, err1 := strconv.Atoi(f[2])
	iters, err2 := strconv.Atoi(f[3])
	if err1 != nil || err2 != nil {
		return true, fmt.Errorf("bench: %s=%q: bad numbers", pingEnv, arg)
	}
	c, err := net.Dial(f[0], f[1])
	if err != nil {
		return true, err
	}
	defer c.Close()
	return true, answer(c, reply, iters)
}

// answer is the answering end of iters round trips on c.
func answer(c net.Conn, reply, iters int) error {
	if tc, ok := c.(*net.TCPConn); ok {
		tc.SetNoDelay(true)
	}
	c.SetDeadline(time.Now().Add(time.Minute))
	req, out := make([]byte, pingRequest), make([]byte, 32+reply)
	for range iters {
		if _, err := io.ReadFull(c, req); err != nil {
			return err
		}
		if _, err := c.Write(out); err != nil {
			return err
		}
	}
	return nil
}

// pingRequest is the bytes a ping sends: about a Fetch of one row (a
// frame header and a short body).
const pingRequest = 64

// PingPong times iters round trips on one connection of network ("tcp" on
// loopback, or "unix"): the client writes pingRequest bytes, the server
// reads them and answers 32+reply bytes (a frame header and the row),
// which the client reads in full. The server is a goroutine of this
// process, or with bin a process of its own (`bin bench` as PingRole), as
// an agent is. It returns each round trip in µs. The listener, both
// connections and the server are gone when it returns.
func PingPong(network string, reply, iters int, bin string) ([]float64, error) {
	p, err := NewPinger(network, reply, iters, bin)
	if err != nil {
		return nil, err
	}
	ds := make([]time.Duration, iters)
	for i := range ds {
		if ds[i], err = p.Once(); err != nil {
			p.Close()
			return nil, err
		}
	}
	if err := p.Close(); err != nil {
		return nil, err
	}
	return DurationsToMicros(ds), nil
}

// Pinger is the timing end of iters raw round trips (as PingPong's), made
// one at a time by Once, so that a benchmark can take them in turns with
// the reads it compares with them: each turn then sees the machine as the
// others do (idle processors that must be woken, or busy ones).
type Pinger struct {
	c       net.Conn
	req, in []byte
	left    int
	network string
	done    func() error // waits for the answering end
	cleanup func()
}

// NewPinger starts the answering end of iters round trips of network, as
// PingPong does, and connects to it. Close it after (at most) iters Once.
func NewPinger(network string, reply, iters int, bin string) (*Pinger, error) {
	addr, cleanup := "127.0.0.1:0", func() {}
	if network == "unix" {
		dir, err := os.MkdirTemp("", "ddstore-ping-")
		if err != nil {
			return nil, err
		}
		addr, cleanup = filepath.Join(dir, "s"), func() { os.RemoveAll(dir) }
	}
	ln, err := net.Listen(network, addr)
	if err != nil {
		cleanup()
		return nil, fmt.Errorf("bench: %s listen: %w", network, err)
	}
	var c net.Conn
	var done func() error
	if bin != "" {
		c, done, err = pingProcess(ln, network, reply, iters, bin)
	} else {
		c, done, err = pingGoroutine(ln, network, reply, iters)
	}
	if err != nil {
		cleanup()
		return nil, err
	}
	if tc, ok := c.(*net.TCPConn); ok {
		tc.SetNoDelay(true)
	}
	c.SetDeadline(time.Now().Add(time.Minute))
	return &Pinger{c: c, req: make([]byte, pingRequest), in: make([]byte, 32+reply), left: iters,
		network: network, done: done, cleanup: cleanup}, nil
}

// Once times one round trip.
func (p *Pinger) Once() (time.Duration, error) {
	if p.left == 0 {
		return 0, fmt.Errorf("bench: %s ping: every round trip the other end answers is made", p.network)
	}
	p.left--
	t0 := time.Now()
	_, err := p.c.Write(p.req)
	if err == nil {
		_, err = io.ReadFull(p.c, p.in)
	}
	if err != nil {
		return 0, fmt.Errorf("bench: %s ping: %w", p.network, err)
	}
	return time.Since(t0), nil
}

// Close ends the connection and waits for the answering end, which
// fails if fewer round trips were made than it was started for.
func (p *Pinger) Close() error {
	p.c.Close() // ends the server's loop
	err := p.done()
	p.cleanup()
	if err != nil && p.left == 0 {
		return fmt.Errorf("bench: %s ping server: %w", p.network, err)
	}
	return nil
}

// pingGoroutine serves the answering end in a goroutine of this process.
func pingGoroutine(ln net.Listener, network string, reply, iters int) (net.Conn, func() error, error) {
	defer ln.Close()
	client, err := net.Dial(network, ln.Addr().String())
	if err != nil {
		return nil, nil, fmt.Errorf("bench: %s dial: %w", network, err)
	}
	server, err := ln.Accept()
	if err != nil {
		client.Close()
		return nil, nil, fmt.Errorf("bench: %s accept: %w", network, err)
	}
	if tc, ok := server.(*net.TCPConn); ok {
		tc.SetNoDelay(true)
	}
	server.SetDeadline(time.Now().Add(time.Minute))
	done := make(chan error, 1)
	go func() {
		defer server.Close()
		done <- answer(server, reply, iters)
	}()
	return client, func() error { return <-done }, nil
}

// pingProcess serves the answering end in a process of its own.
func pingProcess(ln net.Listener, network string, reply, iters int, bin string) (net.Conn, func() error, error) {
	defer ln.Close()
	cmd := exec.Command(bin, "bench")
	cmd.Env = append(os.Environ(), fmt.Sprintf("%s=%s %s %d %d", pingEnv, network, ln.Addr().String(), reply, iters))
	var out strings.Builder
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		return nil, nil, fmt.Errorf("bench: ping process: %w", err)
	}
	wait := func() error {
		if err := cmd.Wait(); err != nil {
			return fmt.Errorf("%w: %s", err, out.String())
		}
		return nil
	}
	if l, ok := ln.(*net.TCPListener); ok {
		l.SetDeadline(time.Now().Add(30 * time.Second))
	} else if l, ok := ln.(*net.UnixListener); ok {
		l.SetDeadline(time.Now().Add(30 * time.Second))
	}
	c, err := ln.Accept()
	if err != nil {
		cmd.Process.Kill()
		wait()
		return nil, nil, fmt.Errorf("bench: ping process did not connect: %w", err)
	}
	return c, wait, nil
}

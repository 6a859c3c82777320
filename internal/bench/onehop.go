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
	addr := "127.0.0.1:0"
	if network == "unix" {
		dir, err := os.MkdirTemp("", "ddstore-ping-")
		if err != nil {
			return nil, err
		}
		defer os.RemoveAll(dir)
		addr = filepath.Join(dir, "s")
	}
	ln, err := net.Listen(network, addr)
	if err != nil {
		return nil, fmt.Errorf("bench: %s listen: %w", network, err)
	}
	if bin != "" {
		return pingProcess(ln, network, reply, iters, bin)
	}
	client, err := net.Dial(network, ln.Addr().String())
	if err != nil {
		ln.Close()
		return nil, fmt.Errorf("bench: %s dial: %w", network, err)
	}
	defer client.Close()
	server, err := ln.Accept()
	ln.Close()
	if err != nil {
		return nil, fmt.Errorf("bench: %s accept: %w", network, err)
	}
	for _, c := range []net.Conn{client, server} {
		if tc, ok := c.(*net.TCPConn); ok {
			tc.SetNoDelay(true)
		}
		c.SetDeadline(time.Now().Add(time.Minute))
	}
	done := make(chan error, 1)
	go func() {
		defer server.Close()
		done <- answer(server, reply, iters)
	}()
	return ping(client, reply, iters, func() error { return <-done }, network)
}

// pingProcess is PingPong with the answering end a process of its own.
func pingProcess(ln net.Listener, network string, reply, iters int, bin string) ([]float64, error) {
	defer ln.Close()
	cmd := exec.Command(bin, "bench")
	cmd.Env = append(os.Environ(), fmt.Sprintf("%s=%s %s %d %d", pingEnv, network, ln.Addr().String(), reply, iters))
	var out strings.Builder
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("bench: ping process: %w", err)
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
		return nil, fmt.Errorf("bench: ping process did not connect: %w", err)
	}
	return ping(c, reply, iters, wait, network)
}

// ping is the timing end of PingPong on client; done waits for the other
// end (which ends once client closes).
func ping(client net.Conn, reply, iters int, done func() error, network string) ([]float64, error) {
	defer client.Close()
	if tc, ok := client.(*net.TCPConn); ok {
		tc.SetNoDelay(true)
	}
	client.SetDeadline(time.Now().Add(time.Minute))
	req, in := make([]byte, pingRequest), make([]byte, 32+reply)
	ds := make([]time.Duration, iters)
	for i := range ds {
		t0 := time.Now()
		_, err := client.Write(req)
		if err == nil {
			_, err = io.ReadFull(client, in)
		}
		if err != nil {
			client.Close() // ends the server's loop
			done()
			return nil, fmt.Errorf("bench: %s ping: %w", network, err)
		}
		ds[i] = time.Since(t0)
	}
	if err := done(); err != nil {
		return nil, fmt.Errorf("bench: %s ping server: %w", network, err)
	}
	return DurationsToMicros(ds), nil
}

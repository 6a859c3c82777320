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
	"path/filepath"
	"time"
)

// pingRequest is the bytes a ping sends: about a Fetch of one row (a
// frame header and a short body).
const pingRequest = 64

// PingPong times iters round trips on one connection of network ("tcp" on
// loopback, or "unix"): the client writes pingRequest bytes, the server
// reads them and answers 32+reply bytes (a frame header and the row),
// which the client reads in full. It returns each round trip in µs. The
// listener, both connections and the server goroutine are gone when it
// returns.
func PingPong(network string, reply, iters int) ([]float64, error) {
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
		req, out := make([]byte, pingRequest), make([]byte, 32+reply)
		for range iters {
			if _, err := io.ReadFull(server, req); err != nil {
				done <- err
				return
			}
			if _, err := server.Write(out); err != nil {
				done <- err
				return
			}
		}
		done <- nil
	}()
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
			<-done
			return nil, fmt.Errorf("bench: %s ping: %w", network, err)
		}
		ds[i] = time.Since(t0)
	}
	if err := <-done; err != nil {
		return nil, fmt.Errorf("bench: %s ping server: %w", network, err)
	}
	return DurationsToMicros(ds), nil
}

package bench

import (
	"fmt"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"time"
)

const (
	// tcpChunk matches the large writes the store's transport issues, so the
	// ceiling measures the kernel's copy path rather than syscall overhead.
	tcpChunk = 4 << 20
	// tcpSample is long enough to span many chunks at loopback speeds yet
	// short enough to give a usable number of samples in a brief run.
	tcpSample = 20 * time.Millisecond
	// tcpGrace bounds how long a stuck peer can hang the measurement beyond
	// dur; a bench run must finish even if loopback misbehaves.
	tcpGrace = 5 * time.Second
)

// TCPLimit measures raw loopback TCP throughput: one goroutine writes 4 MiB
// chunks as fast as it can, and the caller's goroutine reads them with
// io.ReadFull into a reused buffer. It is the ceiling for any store read that
// crosses a socket on this machine.
//
// It runs for about dur (at least one sample) and returns the median GB/s over
// roughly 20ms samples. The listener, both connections and the writer
// goroutine are gone by the time it returns, whether or not it fails.
func TCPLimit(dur time.Duration) (Rate, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return Rate{}, fmt.Errorf("bench: tcp listen: %w", err)
	}
	// Dial completes against the listen backlog, so no accept goroutine is
	// needed; the listener is closed as soon as the one connection exists.
	client, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		ln.Close()
		return Rate{}, fmt.Errorf("bench: tcp dial: %w", err)
	}
	server, err := ln.Accept()
	ln.Close()
	if err != nil {
		client.Close()
		return Rate{}, fmt.Errorf("bench: tcp accept: %w", err)
	}

	deadline := time.Now().Add(dur + tcpGrace)
	client.SetDeadline(deadline)
	server.SetDeadline(deadline)

	var (
		stopping atomic.Bool
		wg       sync.WaitGroup
		werr     error
	)
	wg.Add(1)
	go func() {
		defer wg.Done()
		buf := make([]byte, tcpChunk)
		for !stopping.Load() {
			if _, err := client.Write(buf); err != nil {
				// Once the reader is done it closes the connection, which
				// is how this loop gets unblocked; only earlier failures
				// mean the measurement is invalid.
				if !stopping.Load() {
					werr = err
				}
				return
			}
		}
	}()

	samples, rerr := readSamples(server, dur)

	stopping.Store(true)
	server.Close()
	client.Close()
	wg.Wait()

	// The writer's error is the cause when both failed: a dead writer shows
	// up on the reader side only as EOF or a reset.
	if werr != nil {
		return Rate{}, fmt.Errorf("bench: tcp write: %w", werr)
	}
	if rerr != nil {
		return Rate{}, fmt.Errorf("bench: tcp read: %w", rerr)
	}
	return Rate{GBps: Median(samples), Samples: samples}, nil
}

func readSamples(r io.Reader, dur time.Duration) ([]float64, error) {
	buf := make([]byte, tcpChunk)
	// One untimed chunk lets the connection's windows and buffers grow
	// before anything is counted.
	if _, err := io.ReadFull(r, buf); err != nil {
		return nil, err
	}
	var samples []float64
	start := time.Now()
	for len(samples) == 0 || time.Since(start) < dur {
		t0 := time.Now()
		var n int64
		var el time.Duration
		for el < tcpSample {
			if _, err := io.ReadFull(r, buf); err != nil {
				return nil, err
			}
			n += tcpChunk
			el = time.Since(t0)
		}
		samples = append(samples, float64(n)/el.Seconds()/1e9)
	}
	return samples, nil
}

// turnsOfRates is how many turns remoteTurns takes of each figure.
const turnsOfRates = 6

// turnRates is remoteTurns' outcome: the medians of the turns' rates of
// ours and of the TCP stream, and the median of the turns' ratios.
type turnRates struct{ ours, limit, ratio float64 }

// remoteTurns measures ours (a throughput over the duration it is given)
// and TCPLimit in turns, each turn a slice of dur/2 of both (at least 50
// ms), the first of a turn alternating between them, so that a ratio is
// of figures taken a fraction of a second apart.
func remoteTurns(dur time.Duration, ours func(time.Duration) (Rate, error)) (turnRates, error) {
	slice := max(dur/2, 50*time.Millisecond)
	var o, l, ratio []float64
	for t := range turnsOfRates {
		var a, b Rate
		var err error
		if t%2 == 0 {
			if a, err = ours(slice); err == nil {
				b, err = TCPLimit(slice)
			}
		} else if b, err = TCPLimit(slice); err == nil {
			a, err = ours(slice)
		}
		if err != nil {
			return turnRates{}, err
		}
		o, l = append(o, a.GBps), append(l, b.GBps)
		if b.GBps > 0 {
			ratio = append(ratio, a.GBps/b.GBps)
		}
	}
	return turnRates{ours: Median(o), limit: Median(l), ratio: Median(ratio)}, nil
}

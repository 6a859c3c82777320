package transport

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"syscall"
	"testing"
	"time"
)

// tcpPair is a connected pair of loopback TCP connections.
func tcpPair(t *testing.T) (w, r *net.TCPConn) {
	t.Helper()
	ln := listen(t)
	defer ln.Close()
	acc := make(chan net.Conn, 1)
	go func() {
		c, err := ln.Accept()
		if err != nil {
			acc <- nil
			return
		}
		acc <- c
	}()
	wc, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatalf("dial: %v", err)
	}
	rc := <-acc
	if rc == nil {
		t.Fatal("accept failed")
	}
	t.Cleanup(func() { wc.Close(); rc.Close() })
	return wc.(*net.TCPConn), rc.(*net.TCPConn)
}

func rawConn(t *testing.T, c *net.TCPConn) syscall.RawConn {
	t.Helper()
	rc, err := c.SyscallConn()
	if err != nil {
		t.Fatalf("SyscallConn: %v", err)
	}
	return rc
}

// writeChunks writes data in chunks of odd sizes, then closes the write side
// if closeAfter, and reports the first error.
func writeChunks(w *net.TCPConn, data []byte, seed uint64, closeAfter bool) <-chan error {
	done := make(chan error, 1)
	go func() {
		r := rand.New(rand.NewPCG(seed, 7))
		sizes := []int{1, 3, 7, 13, 101, 999, 4093, 65537}
		for len(data) > 0 {
			n := min(sizes[r.IntN(len(sizes))], len(data))
			if _, err := w.Write(data[:n]); err != nil {
				done <- err
				return
			}
			data = data[n:]
		}
		if closeAfter {
			w.CloseWrite()
		}
		done <- nil
	}()
	return done
}

// smallIovs splits total bytes into buffers of 0 to 17 bytes.
func smallIovs(r *rand.Rand, total int) [][]byte {
	var iovs [][]byte
	for total > 0 {
		n := min(r.IntN(18), total)
		iovs = append(iovs, make([]byte, n))
		total -= n
	}
	return iovs
}

func TestReadvFull(t *testing.T) {
	for _, total := range []int{1, 17, 1024, 5000, 20000, 300000} {
		t.Run("", func(t *testing.T) {
			w, rd := tcpPair(t)
			r := rand.New(rand.NewPCG(uint64(total), 1))
			data := make([]byte, total)
			for i := range data {
				data[i] = byte(r.Uint32())
			}
			iovs := smallIovs(r, total)
			// Leading and trailing empty buffers too.
			iovs = append([][]byte{{}, {}}, append(iovs, []byte{}, []byte{})...)
			keep := append([][]byte(nil), iovs...) // readvFull consumes the slice
			wrote := writeChunks(w, data, uint64(total), false)
			rd.SetReadDeadline(time.Now().Add(10 * time.Second))
			if err := readvFull(rawConn(t, rd), iovs); err != nil {
				t.Fatalf("readvFull of %d bytes in %d buffers: %v", total, len(keep), err)
			}
			if err := <-wrote; err != nil {
				t.Fatalf("write: %v", err)
			}
			got := bytes.Join(keep, nil)
			if !bytes.Equal(got, data) {
				t.Fatalf("readvFull of %d bytes in %d buffers read different bytes", total, len(keep))
			}
			// It read no further than asked: the next byte is still there.
			w.Write([]byte{0x42})
			one := make([]byte, 1)
			if _, err := io.ReadFull(rd, one); err != nil || one[0] != 0x42 {
				t.Fatalf("byte after the buffers: %#x, %v", one[0], err)
			}
		})
	}
}

func TestReadvFullManyOneByteBuffers(t *testing.T) {
	// More buffers than IOV_MAX, all sent at once, so one readv could fill
	// more than 1024 of them if it were allowed to.
	const n = 3*maxIov + 5
	w, rd := tcpPair(t)
	data := make([]byte, n)
	for i := range data {
		data[i] = byte(i % 251)
	}
	if _, err := w.Write(data); err != nil {
		t.Fatal(err)
	}
	iovs := make([][]byte, n)
	for i := range iovs {
		iovs[i] = make([]byte, 1)
	}
	keep := append([][]byte(nil), iovs...)
	rd.SetReadDeadline(time.Now().Add(10 * time.Second))
	if err := readvFull(rawConn(t, rd), iovs); err != nil {
		t.Fatalf("readvFull: %v", err)
	}
	if got := bytes.Join(keep, nil); !bytes.Equal(got, data) {
		t.Fatal("readvFull read different bytes")
	}
}

func TestReadvFullNothingToRead(t *testing.T) {
	_, rd := tcpPair(t)
	rc := rawConn(t, rd)
	// No buffers, or only empty ones: return at once without reading.
	for _, iovs := range [][][]byte{nil, {}, {{}}, {{}, {}, {}}} {
		done := make(chan error, 1)
		go func() { done <- readvFull(rc, iovs) }()
		select {
		case err := <-done:
			if err != nil {
				t.Fatalf("readvFull(%d empty buffers) = %v", len(iovs), err)
			}
		case <-time.After(5 * time.Second):
			t.Fatalf("readvFull(%d empty buffers) blocked", len(iovs))
		}
	}
}

func TestReadvFullEOF(t *testing.T) {
	for _, sent := range []int{0, 1, 999, 5000} {
		t.Run("", func(t *testing.T) {
			w, rd := tcpPair(t)
			r := rand.New(rand.NewPCG(uint64(sent), 2))
			data := make([]byte, sent)
			for i := range data {
				data[i] = byte(r.Uint32())
			}
			iovs := smallIovs(r, sent+1000)
			keep := append([][]byte(nil), iovs...)
			wrote := writeChunks(w, data, uint64(sent), true)
			rd.SetReadDeadline(time.Now().Add(10 * time.Second))
			err := readvFull(rawConn(t, rd), iovs)
			if !errors.Is(err, io.ErrUnexpectedEOF) {
				t.Fatalf("readvFull with %d of %d bytes sent = %v, want io.ErrUnexpectedEOF", sent, sent+1000, err)
			}
			if werr := <-wrote; werr != nil {
				t.Fatalf("write: %v", werr)
			}
			if got := bytes.Join(keep, nil)[:sent]; !bytes.Equal(got, data) {
				t.Fatal("the bytes before EOF were not read in place")
			}
		})
	}
}

func TestReadvFullDeadline(t *testing.T) {
	// A read deadline on the connection ends a readv that waits.
	_, rd := tcpPair(t)
	rd.SetReadDeadline(time.Now().Add(100 * time.Millisecond))
	done := make(chan error, 1)
	go func() { done <- readvFull(rawConn(t, rd), [][]byte{make([]byte, 10)}) }()
	select {
	case err := <-done:
		var ne net.Error
		if !errors.As(err, &ne) || !ne.Timeout() {
			t.Fatalf("readvFull past its deadline = %v, want a timeout", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("readvFull ignored the read deadline")
	}
}

func TestReadvFullClosed(t *testing.T) {
	// Closing the connection ends a readv that waits (how a timed-out Fetch
	// stops its read loop).
	_, rd := tcpPair(t)
	rc := rawConn(t, rd)
	done := make(chan error, 1)
	go func() { done <- readvFull(rc, [][]byte{make([]byte, 10)}) }()
	time.AfterFunc(50*time.Millisecond, func() { rd.Close() })
	select {
	case err := <-done:
		if err == nil {
			t.Fatal("readvFull on a closed connection returned nil")
		}
	case <-time.After(5 * time.Second):
		t.Fatal("readvFull did not end when its connection closed")
	}
}

func TestAdvance(t *testing.T) {
	a, b, c := []byte("abc"), []byte("de"), []byte("f")
	for _, tc := range []struct {
		n    int
		want []string
	}{
		{0, []string{"abc", "de", "f"}},
		{1, []string{"bc", "de", "f"}},
		{3, []string{"de", "f"}},
		{4, []string{"e", "f"}},
		{5, []string{"f"}},
		{6, nil},
	} {
		got := Advance([][]byte{a, b, c}, tc.n)
		var s []string
		for _, v := range got {
			s = append(s, string(v))
		}
		if fmt.Sprint(s) != fmt.Sprint(tc.want) {
			t.Errorf("Advance(abc|de|f, %d) = %q, want %q", tc.n, s, tc.want)
		}
	}
	// An empty vector after the consumed bytes is dropped too.
	if got := Advance([][]byte{[]byte("ab"), {}, []byte("c")}, 2); len(got) != 1 || string(got[0]) != "c" {
		t.Errorf("Advance(ab||c, 2) = %q, want [c]", got)
	}
}

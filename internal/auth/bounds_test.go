package auth

import (
	"errors"
	"net"
	"testing"

	"github.com/ddstore-go/ddstore/internal/base"
	"github.com/ddstore-go/ddstore/internal/wire"
)

// TestRespondReadsNoLongBody: the handshake reads no more of an
// unauthenticated frame than its header when the body it claims is longer
// than a handshake's, or when its op is not the one due.
func TestRespondReadsNoLongBody(t *testing.T) {
	for _, c := range []struct {
		name string
		op   wire.Op
		want error
	}{
		{"hello of 32 MiB", wire.OpPeerAuth, base.ErrProtocol},
		{"another op first", wire.OpPeerInfo, base.ErrAuth},
	} {
		t.Run(c.name, func(t *testing.T) {
			a, b := net.Pipe()
			defer a.Close()
			defer b.Close()
			hdr := make([]byte, wire.HeaderSize)
			(&wire.Header{Op: c.op, BodyLen: wire.MaxBody, ID: 1}).Put(hdr)
			sent := make(chan int, 1)
			go func() {
				n, _ := a.Write(hdr)
				zeros := make([]byte, 64<<10)
				for {
					m, err := a.Write(zeros)
					n += m
					if err != nil {
						sent <- n
						return
					}
				}
			}()
			go func() { // the refusal, if any
				var sink [4096]byte
				for {
					if _, err := a.Read(sink[:]); err != nil {
						return
					}
				}
			}()
			err := Respond(b, Peer, func() (Key, error) { return Generate(), nil })
			if !errors.Is(err, c.want) {
				t.Fatalf("Respond = %v, want %v", err, c.want)
			}
			b.Close()
			if n := <-sent; n != wire.HeaderSize {
				t.Fatalf("Respond read %d bytes of the frame: want only its %d-byte header", n, wire.HeaderSize)
			}
		})
	}
}

package wire

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math"
	"strings"
	"testing"
	"unsafe"

	"github.com/ddstore-go/ddstore/internal/base"
)

// sentinels lists every sentinel error of base, in wire-code order.
var sentinels = []error{
	base.ErrIndex, base.ErrGeometry, base.ErrUnknown, base.ErrExists, base.ErrBuffer,
	base.ErrFreed, base.ErrClosed, base.ErrTimeout, base.ErrPeer, base.ErrProtocol,
	base.ErrNoAgent, base.ErrArgument, base.ErrInternal,
}

func headerBytes(h Header) []byte {
	b := make([]byte, HeaderSize)
	h.Put(b)
	return b
}

// dataPtr is the address of s's backing array (nil for a nil slice).
func dataPtr[E any](s []E) *E { return unsafe.SliceData(s) }

func TestHeaderRoundTrip(t *testing.T) {
	for _, h := range []Header{
		{},
		{Op: OpHello, ID: 1},
		{Op: OpRead, Status: 3, BodyLen: 17, ID: 42, Payload: 4096},
		{Op: OpFetch, BodyLen: MaxBody, Payload: MaxPayload},
		{Op: Op(255), Status: math.MaxUint16, BodyLen: MaxBody, ID: math.MaxUint64, Payload: MaxPayload},
	} {
		t.Run(fmt.Sprintf("%v/%d", h.Op, h.ID), func(t *testing.T) {
			b := headerBytes(h)
			le := binary.LittleEndian
			if le.Uint16(b) != Magic || b[2] != Version {
				t.Fatalf("Put wrote magic %#x version %d", le.Uint16(b), b[2])
			}
			if le.Uint16(b[6:]) != 0 || le.Uint32(b[12:]) != 0 {
				t.Fatalf("Put left reserved fields nonzero: % x", b)
			}
			got, err := ParseHeader(b)
			if err != nil {
				t.Fatalf("ParseHeader: %v", err)
			}
			if got != h {
				t.Fatalf("ParseHeader = %+v, want %+v", got, h)
			}
			// Extra bytes after the header are not its business.
			got, err = ParseHeader(append(b, 1, 2, 3))
			if err != nil || got != h {
				t.Fatalf("ParseHeader with trailing bytes = %+v, %v", got, err)
			}
		})
	}
}

func TestHeaderPutOverwrites(t *testing.T) {
	b := bytes.Repeat([]byte{0xAA}, HeaderSize)
	h := Header{Op: OpInfo, ID: 9}
	h.Put(b)
	if !bytes.Equal(b, headerBytes(h)) {
		t.Fatalf("Put over garbage = % x, want % x", b, headerBytes(h))
	}
}

func TestParseHeaderRejects(t *testing.T) {
	valid := headerBytes(Header{Op: OpRead, BodyLen: 8, ID: 5, Payload: 16})
	mod := func(f func(b []byte)) []byte {
		b := bytes.Clone(valid)
		f(b)
		return b
	}
	le := binary.LittleEndian
	for _, c := range []struct {
		name string
		b    []byte
		want string // text naming the bad value
	}{
		{"nil", nil, "header of 0 bytes"},
		{"empty", []byte{}, "header of 0 bytes"},
		{"one byte", valid[:1], "header of 1 bytes"},
		{"short by one", valid[:HeaderSize-1], fmt.Sprintf("header of %d bytes", HeaderSize-1)},
		{"bad magic", mod(func(b []byte) { le.PutUint16(b, 0xBEEF) }), "magic 0xbeef"},
		{"big-endian magic", mod(func(b []byte) { binary.BigEndian.PutUint16(b, Magic) }), "magic 0x5edd"},
		{"version 0", mod(func(b []byte) { b[2] = 0 }), "version 0"},
		{"version 2", mod(func(b []byte) { b[2] = 2 }), "version 2"},
		{"version 255", mod(func(b []byte) { b[2] = 255 }), "version 255"},
		{"body MaxBody+1", mod(func(b []byte) { le.PutUint32(b[8:], MaxBody+1) }), fmt.Sprintf("body of %d bytes", MaxBody+1)},
		{"body max uint32", mod(func(b []byte) { le.PutUint32(b[8:], math.MaxUint32) }), "body of 4294967295 bytes"},
		{"payload MaxPayload+1", mod(func(b []byte) { le.PutUint64(b[24:], MaxPayload+1) }), fmt.Sprintf("payload of %d bytes", uint64(MaxPayload)+1)},
		{"payload max uint64", mod(func(b []byte) { le.PutUint64(b[24:], math.MaxUint64) }), "payload of 18446744073709551615 bytes"},
	} {
		t.Run(c.name, func(t *testing.T) {
			h, err := ParseHeader(c.b)
			if err == nil {
				t.Fatalf("ParseHeader(% x) = %+v, want an error", c.b, h)
			}
			if !errors.Is(err, base.ErrProtocol) {
				t.Errorf("error %q does not match ErrProtocol", err)
			}
			if !strings.Contains(err.Error(), c.want) {
				t.Errorf("error %q does not name %q", err, c.want)
			}
			if h != (Header{}) {
				t.Errorf("rejected header returned %+v, want zero", h)
			}
		})
	}
}

func TestParseHeaderLimitsInclusive(t *testing.T) {
	h := Header{BodyLen: MaxBody, Payload: MaxPayload}
	if got, err := ParseHeader(headerBytes(h)); err != nil || got != h {
		t.Fatalf("ParseHeader at the limits = %+v, %v", got, err)
	}
}

// frame builds a whole frame with the given body and payload bytes after it.
func frame(op Op, id uint64, body, payload []byte) []byte {
	b := AppendFrame(nil, op, 0, id, uint64(len(payload)), func(e *Encoder) { e.b = append(e.b, body...) })
	return append(b, payload...)
}

func TestReadFrameComplete(t *testing.T) {
	body := []byte("the body of a frame")
	payload := []byte("rows rows rows")
	data := append(frame(OpFetch, 77, body, payload), frame(OpHello, 78, nil, nil)...)
	r := bytes.NewReader(data)

	h, got, err := ReadFrame(r, nil)
	if err != nil {
		t.Fatalf("ReadFrame: %v", err)
	}
	want := Header{Op: OpFetch, BodyLen: uint32(len(body)), ID: 77, Payload: uint64(len(payload))}
	if h != want {
		t.Fatalf("header = %+v, want %+v", h, want)
	}
	if !bytes.Equal(got, body) {
		t.Fatalf("body = %q, want %q", got, body)
	}
	// The payload is left on the reader.
	rest := make([]byte, len(payload))
	if _, err := io.ReadFull(r, rest); err != nil || !bytes.Equal(rest, payload) {
		t.Fatalf("payload after frame = %q, %v; want %q", rest, err, payload)
	}

	h, got, err = ReadFrame(r, got)
	if err != nil {
		t.Fatalf("second ReadFrame: %v", err)
	}
	if want := (Header{Op: OpHello, ID: 78}); h != want || len(got) != 0 {
		t.Fatalf("second frame = %+v, body %q; want %+v, empty body", h, got, want)
	}
	if _, _, err := ReadFrame(r, got); err != io.EOF {
		t.Fatalf("ReadFrame at end of stream = %v, want io.EOF", err)
	}
}

func TestReadFrameTruncatedHeader(t *testing.T) {
	data := frame(OpRead, 1, []byte("body"), nil)
	for n := 0; n < HeaderSize; n++ {
		_, _, err := ReadFrame(bytes.NewReader(data[:n]), nil)
		want := io.ErrUnexpectedEOF
		if n == 0 {
			want = io.EOF
		}
		if !errors.Is(err, want) {
			t.Errorf("header cut to %d bytes: err = %v, want %v", n, err, want)
		}
	}
}

func TestReadFrameTruncatedBody(t *testing.T) {
	data := frame(OpRead, 1, []byte("a body of some length"), nil)
	for n := HeaderSize; n < len(data); n++ {
		h, _, err := ReadFrame(bytes.NewReader(data[:n]), nil)
		if !errors.Is(err, io.ErrUnexpectedEOF) {
			t.Errorf("frame cut to %d of %d bytes: err = %v, want io.ErrUnexpectedEOF", n, len(data), err)
		}
		if h.ID != 1 || h.Op != OpRead {
			t.Errorf("frame cut to %d bytes: header = %+v, want the parsed header", n, h)
		}
	}
}

func TestReadFrameBadHeader(t *testing.T) {
	data := frame(OpRead, 1, []byte("body"), nil)
	data[2] = 9
	_, _, err := ReadFrame(bytes.NewReader(data), nil)
	if !errors.Is(err, base.ErrProtocol) || !strings.Contains(err.Error(), "version 9") {
		t.Fatalf("ReadFrame with version 9 = %v, want ErrProtocol naming it", err)
	}
}

// errReader fails after its data with a non-EOF error.
type errReader struct {
	data []byte
	err  error
}

func (r *errReader) Read(p []byte) (int, error) {
	if len(r.data) == 0 {
		return 0, r.err
	}
	n := copy(p, r.data)
	r.data = r.data[n:]
	return n, nil
}

func TestReadFrameReaderError(t *testing.T) {
	boom := errors.New("boom")
	data := frame(OpRead, 1, []byte("body"), nil)
	for _, n := range []int{0, 5, HeaderSize, HeaderSize + 2} {
		_, _, err := ReadFrame(&errReader{data: data[:n], err: boom}, nil)
		if !errors.Is(err, boom) {
			t.Errorf("reader failing after %d bytes: err = %v, want %v", n, err, boom)
		}
	}
}

func TestReadFrameBufferReuse(t *testing.T) {
	small := frame(OpRead, 1, bytes.Repeat([]byte{1}, 100), nil)
	big := frame(OpRead, 2, bytes.Repeat([]byte{2}, 10000), nil)

	t.Run("caller buffer", func(t *testing.T) {
		buf := make([]byte, 0, 1024)
		_, body, err := ReadFrame(bytes.NewReader(small), buf)
		if err != nil {
			t.Fatal(err)
		}
		if dataPtr(body) != dataPtr(buf) || cap(body) != cap(buf) {
			t.Fatalf("body does not reuse the caller's buffer (cap %d, want %d)", cap(body), cap(buf))
		}
	})

	t.Run("returned buffer", func(t *testing.T) {
		_, body, err := ReadFrame(bytes.NewReader(small), nil)
		if err != nil {
			t.Fatal(err)
		}
		if cap(body) < HeaderSize {
			t.Fatalf("first buffer has cap %d", cap(body))
		}
		p, c := dataPtr(body), cap(body)
		_, body2, err := ReadFrame(bytes.NewReader(small), body)
		if err != nil {
			t.Fatal(err)
		}
		if dataPtr(body2) != p || cap(body2) != c {
			t.Fatalf("second read allocated a new buffer (cap %d -> %d)", c, cap(body2))
		}
		if !bytes.Equal(body2, small[HeaderSize:]) {
			t.Fatalf("second body wrong")
		}
	})

	t.Run("grows then reuses", func(t *testing.T) {
		buf := make([]byte, 0, 64)
		_, body, err := ReadFrame(bytes.NewReader(big), buf)
		if err != nil {
			t.Fatal(err)
		}
		if cap(body) < 10000 || !bytes.Equal(body, big[HeaderSize:]) {
			t.Fatalf("grown body: cap %d, len %d", cap(body), len(body))
		}
		p := dataPtr(body)
		_, body2, err := ReadFrame(bytes.NewReader(small), body)
		if err != nil {
			t.Fatal(err)
		}
		if dataPtr(body2) != p {
			t.Fatalf("smaller frame after a grown buffer allocated a new one")
		}
		if !bytes.Equal(body2, small[HeaderSize:]) {
			t.Fatalf("body after reuse wrong")
		}
	})

	t.Run("too small for a header", func(t *testing.T) {
		buf := make([]byte, 0, HeaderSize-1)
		_, body, err := ReadFrame(bytes.NewReader(small), buf)
		if err != nil || !bytes.Equal(body, small[HeaderSize:]) {
			t.Fatalf("ReadFrame with a tiny buffer = %q, %v", body, err)
		}
	})

	t.Run("no allocations", func(t *testing.T) {
		buf := make([]byte, 0, 4096)
		r := bytes.NewReader(nil)
		allocs := testing.AllocsPerRun(100, func() {
			r.Reset(small)
			var err error
			_, buf, err = ReadFrame(r, buf)
			if err != nil {
				t.Fatal(err)
			}
		})
		if allocs != 0 {
			t.Fatalf("ReadFrame with a big enough buffer: %v allocations, want 0", allocs)
		}
	})
}

func TestAppendFrame(t *testing.T) {
	prefix := []byte("already here")
	b := AppendFrame(bytes.Clone(prefix), OpPeerInfo, 4, 99, 123, func(e *Encoder) {
		e.U32(7)
		e.String("x")
	})
	if !bytes.HasPrefix(b, prefix) {
		t.Fatalf("AppendFrame clobbered dst")
	}
	h, err := ParseHeader(b[len(prefix):])
	if err != nil {
		t.Fatal(err)
	}
	want := Header{Op: OpPeerInfo, Status: 4, BodyLen: 7, ID: 99, Payload: 123}
	if h != want {
		t.Fatalf("header = %+v, want %+v", h, want)
	}
	if len(b) != len(prefix)+HeaderSize+7 {
		t.Fatalf("frame length %d", len(b)-len(prefix))
	}

	b = AppendFrame(nil, OpHello, 0, 1, 0, nil)
	if h, err := ParseHeader(b); err != nil || h.BodyLen != 0 || len(b) != HeaderSize {
		t.Fatalf("AppendFrame with nil fill: %+v, %v, len %d", h, err, len(b))
	}
}

func TestErrorRoundTrip(t *testing.T) {
	type tc struct {
		name     string
		err      error
		sentinel error
	}
	var cases []tc
	for _, s := range sentinels {
		cases = append(cases,
			tc{"bare " + s.Error(), s, s},
			tc{"wrapped " + s.Error(), base.Errorf(s, "detail %d, ünïcødé 名前", 42), s},
			tc{"double wrapped " + s.Error(), fmt.Errorf("context: %w", base.Errorf(s, "inner")), s},
			tc{"remote " + s.Error(), base.FromCode(base.Code(s), "came over the wire"), s},
		)
	}
	cases = append(cases,
		tc{"plain error", errors.New("boom"), base.ErrInternal},
		tc{"empty message", base.FromCode(base.Code(base.ErrIndex), ""), base.ErrIndex},
		tc{"long message", base.Errorf(base.ErrGeometry, "%s", strings.Repeat("x", 70000)), base.ErrGeometry},
	)
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			b := AppendError(nil, OpLookup, 1234, c.err)
			h, body, err := ReadFrame(bytes.NewReader(b), nil)
			if err != nil {
				t.Fatalf("ReadFrame: %v", err)
			}
			if h.Op != OpLookup || h.ID != 1234 || h.Payload != 0 {
				t.Fatalf("header = %+v", h)
			}
			if h.Status == 0 || h.Status != base.Code(c.sentinel) {
				t.Fatalf("status %d, want %d", h.Status, base.Code(c.sentinel))
			}
			got := StatusError(h, body)
			if got == nil {
				t.Fatal("StatusError = nil")
			}
			if got.Error() != c.err.Error() {
				t.Errorf("message %q, want %q", trunc(got.Error()), trunc(c.err.Error()))
			}
			for _, s := range sentinels {
				if is := errors.Is(got, s); is != (s == c.sentinel) {
					t.Errorf("errors.Is(got, %q) = %v", s, is)
				}
			}
		})
	}
}

func trunc(s string) string {
	if len(s) > 80 {
		return s[:80] + "..."
	}
	return s
}

func TestStatusError(t *testing.T) {
	var e Encoder
	e.String32("a message")
	msg := e.Bytes()

	if err := StatusError(Header{}, msg); err != nil {
		t.Errorf("status 0: %v, want nil", err)
	}
	if err := StatusError(Header{}, []byte{1, 2}); err != nil {
		t.Errorf("status 0 with junk body: %v, want nil", err)
	}

	err := StatusError(Header{Status: 999}, msg)
	if !errors.Is(err, base.ErrInternal) || err.Error() != "a message" {
		t.Errorf("unknown status: %v, want ErrInternal with the message", err)
	}
	err = StatusError(Header{Status: math.MaxUint16}, msg)
	if !errors.Is(err, base.ErrInternal) {
		t.Errorf("status 0xffff: %v, want ErrInternal", err)
	}

	for _, body := range [][]byte{nil, {1, 0}, {5, 0, 0, 0, 'a'}} {
		err := StatusError(Header{Status: base.Code(base.ErrFreed)}, body)
		if !errors.Is(err, base.ErrFreed) {
			t.Errorf("undecodable message % x: %v, want ErrFreed", body, err)
		}
		if !strings.Contains(err.Error(), "undecodable") {
			t.Errorf("undecodable message % x: text %q", body, err)
		}
	}
}

func TestOpString(t *testing.T) {
	for _, c := range []struct {
		op   Op
		want string
	}{
		{OpHello, "hello"}, {OpCreate, "create"}, {OpPublish, "publish"}, {OpLookup, "lookup"},
		{OpRead, "read"}, {OpRegister, "register"}, {OpUnregister, "unregister"}, {OpFree, "free"},
		{OpInfo, "info"}, {OpPrefetch, "prefetch"}, {OpJoin, "join"}, {OpPeerPublish, "peer-publish"},
		{OpPeerLookup, "peer-lookup"}, {OpFetch, "fetch"}, {OpPeerFree, "peer-free"},
		{OpPeerNodes, "peer-nodes"}, {OpPeerInfo, "peer-info"}, {OpPeerDrop, "peer-drop"},
		{OpAuth, "auth"}, {OpAuthProof, "auth-proof"}, {OpPeerAuth, "peer-auth"}, {OpPeerAuthProof, "peer-auth-proof"},
		{OpPeerWindow, "peer-window"}, {OpPeerOffsets, "peer-offsets"}, {OpBarrier, "barrier"}, {OpPeerBarrier, "peer-barrier"},
		{OpReadRange, "read-range"}, {OpFetchRange, "fetch-range"}, {OpPeerGone, "peer-gone"},
		{OpPeerRound, "peer-round"}, {OpPeerTable, "peer-table"}, {OpPeerShards, "peer-shards"}, {OpPeerFrees, "peer-frees"},
		{OpDirectKey, "direct-key"}, {OpDirectAuth, "direct-auth"}, {OpDirectAuthProof, "direct-auth-proof"},
		{Op(0), "op0"}, {Op(31), "op31"},
		{Op(100), "op100"}, {Op(255), "op255"},
	} {
		if got := c.op.String(); got != c.want {
			t.Errorf("Op(%d).String() = %q, want %q", uint8(c.op), got, c.want)
		}
	}
	if got := fmt.Sprint(OpFetch); got != "fetch" {
		t.Errorf("fmt.Sprint(OpFetch) = %q", got)
	}
}

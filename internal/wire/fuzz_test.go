package wire

import (
	"bytes"
	"errors"
	"io"
	"reflect"
	"testing"

	"github.com/ddstore-go/ddstore/internal/base"
)

// junkSeeds are inputs every decoder must refuse without panicking.
var junkSeeds = [][]byte{
	nil,
	{0},
	{0xff, 0xff},
	{0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff},
}

// fuzzCodec checks a decoder against arbitrary bytes: it never panics,
// fails only with ErrProtocol, and what it accepts re-encodes to the same
// bytes and decodes again to an equal value.
func fuzzCodec[T any, P msgPtr[T]](f *testing.F, samples []T, dec func([]byte) (T, error)) {
	for _, m := range samples {
		// Long samples slow the mutator down for nothing; the unit tests
		// cover them.
		if b := encodeMsg[T, P](m); len(b) <= 1024 {
			f.Add(b)
		}
	}
	for _, b := range junkSeeds {
		f.Add(b)
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		m, err := dec(b)
		if err != nil {
			if !errors.Is(err, base.ErrProtocol) {
				t.Fatalf("decode error %v does not match ErrProtocol", err)
			}
			return
		}
		again := encodeMsg[T, P](m)
		if !bytes.Equal(again, b) {
			t.Fatalf("re-encoding differs:\n got % x\nwant % x", again, b)
		}
		m2, err := dec(again)
		if err != nil {
			t.Fatalf("decoding the re-encoding: %v", err)
		}
		if !msgEqual(m, m2) {
			t.Fatalf("second decode differs:\n got %+v\nwant %+v", m2, m)
		}
	})
}

func FuzzParseHeader(f *testing.F) {
	for _, h := range []Header{
		{},
		{Op: OpRead, Status: 3, BodyLen: 17, ID: 42, Payload: 4096},
		{Op: Op(255), Status: 0xffff, BodyLen: MaxBody, ID: 1<<64 - 1, Payload: MaxPayload},
	} {
		f.Add(headerBytes(h))
	}
	for _, b := range junkSeeds {
		f.Add(b)
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		h, err := ParseHeader(b)
		if err != nil {
			if !errors.Is(err, base.ErrProtocol) {
				t.Fatalf("error %v does not match ErrProtocol", err)
			}
			return
		}
		if h.BodyLen > MaxBody || h.Payload > MaxPayload {
			t.Fatalf("accepted %+v beyond the limits", h)
		}
		out := headerBytes(h)
		// Everything but the reserved fields is carried.
		for _, r := range [][2]int{{0, 6}, {8, 12}, {16, HeaderSize}} {
			if !bytes.Equal(out[r[0]:r[1]], b[r[0]:r[1]]) {
				t.Fatalf("re-encoding differs in [%d:%d]:\n got % x\nwant % x", r[0], r[1], out, b[:HeaderSize])
			}
		}
		h2, err := ParseHeader(out)
		if err != nil {
			t.Fatalf("parsing the re-encoding: %v", err)
		}
		if h2 != h {
			t.Fatalf("second parse = %+v, want %+v", h2, h)
		}
	})
}

func FuzzReadFrame(f *testing.F) {
	f.Add(frame(OpFetch, 77, []byte("body"), []byte("payload")))
	f.Add(frame(OpHello, 1, nil, nil))
	f.Add(frame(OpRead, 2, encodeMsg(readSamples[2]), nil))
	f.Add(AppendError(nil, OpLookup, 3, base.Errorf(base.ErrUnknown, "no such variable")))
	f.Add(append(frame(OpHello, 1, nil, nil), frame(OpJoin, 2, []byte{1, 2, 3}, nil)...))
	f.Add(frame(OpRead, 2, []byte("cut short"), nil)[:HeaderSize+3])
	for _, b := range junkSeeds {
		f.Add(b)
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		r := bytes.NewReader(data)
		h, body, err := ReadFrame(r, nil)
		if err != nil {
			if err != io.EOF && err != io.ErrUnexpectedEOF && !errors.Is(err, base.ErrProtocol) {
				t.Fatalf("unexpected error %v", err)
			}
			return
		}
		if uint32(len(body)) != h.BodyLen {
			t.Fatalf("body of %d bytes, header says %d", len(body), h.BodyLen)
		}
		if used := len(data) - r.Len(); used != HeaderSize+len(body) {
			t.Fatalf("read %d bytes, want %d", used, HeaderSize+len(body))
		}
		if !bytes.Equal(body, data[HeaderSize:HeaderSize+len(body)]) {
			t.Fatalf("body differs from the input")
		}
		out := AppendFrame(nil, h.Op, h.Status, h.ID, h.Payload, func(e *Encoder) { e.b = append(e.b, body...) })
		h2, body2, err := ReadFrame(bytes.NewReader(out), nil)
		if err != nil {
			t.Fatalf("reading the re-encoding: %v", err)
		}
		if h2 != h || !bytes.Equal(body2, body) {
			t.Fatalf("second read = %+v % x, want %+v % x", h2, body2, h, body)
		}
		// Reading with the returned buffer gives the same frame.
		h3, body3, err := ReadFrame(bytes.NewReader(out), body2)
		if err != nil || h3 != h || !bytes.Equal(body3, body) {
			t.Fatalf("read into a reused buffer = %+v % x, %v", h3, body3, err)
		}
	})
}

func FuzzDecodeHello(f *testing.F)      { fuzzCodec(f, helloSamples, DecodeHello) }
func FuzzDecodeHelloReply(f *testing.F) { fuzzCodec(f, helloReplySamples, DecodeHelloReply) }
func FuzzDecodeShard(f *testing.F)      { fuzzCodec(f, shardSamples, DecodeShard) }
func FuzzDecodePath(f *testing.F)       { fuzzCodec(f, pathSamples, DecodePath) }
func FuzzDecodeName(f *testing.F)       { fuzzCodec(f, nameSamples, DecodeName) }
func FuzzDecodeRegion(f *testing.F)     { fuzzCodec(f, regionSamples, DecodeRegion) }
func FuzzDecodeText(f *testing.F)       { fuzzCodec(f, textSamples, DecodeText) }
func FuzzDecodeJoin(f *testing.F)       { fuzzCodec(f, joinSamples, DecodeJoin) }
func FuzzDecodeDrop(f *testing.F)       { fuzzCodec(f, dropSamples, DecodeDrop) }
func FuzzDecodeDropTree(f *testing.F)   { fuzzCodec(f, dropTreeSamples, DecodeDropTree) }
func FuzzDecodeRound(f *testing.F)      { fuzzCodec(f, roundSamples, DecodeRound) }
func FuzzDecodeRoundReply(f *testing.F) { fuzzCodec(f, roundReplySamples, DecodeRoundReply) }
func FuzzDecodeShards(f *testing.F)     { fuzzCodec(f, shardsSamples, DecodeShards) }
func FuzzDecodeNames(f *testing.F)      { fuzzCodec(f, namesSamples, DecodeNames) }
func FuzzDecodeResults(f *testing.F) {
	fuzzCodec(f, resultsSamples, DecodeResults)
}
func FuzzDecodeWindow(f *testing.F)     { fuzzCodec(f, windowSamples, DecodeWindow) }
func FuzzDecodePeerWindow(f *testing.F) { fuzzCodec(f, peerWindowSamples, DecodePeerWindow) }
func FuzzDecodePeerNodes(f *testing.F)  { fuzzCodec(f, peerNodesSamples, DecodePeerNodes) }
func FuzzDecodeBarrier(f *testing.F)    { fuzzCodec(f, barrierSamples, DecodeBarrier) }
func FuzzDecodeReadRange(f *testing.F)  { fuzzCodec(f, readRangeSamples, DecodeReadRange) }
func FuzzDecodeFetchRange(f *testing.F) { fuzzCodec(f, fetchRangeSamples, DecodeFetchRange) }
func FuzzDecodeGone(f *testing.F)       { fuzzCodec(f, goneSamples, DecodeGone) }
func FuzzDecodePeerOffsets(f *testing.F) {
	fuzzCodec(f, peerOffsetsSamples, DecodePeerOffsets)
}

func FuzzDecodeOffsets(f *testing.F) {
	f.Add(encodeMsg(Offsets{Offsets: []int64{0, 5, 4}})) // decreasing: refused
	fuzzCodec(f, offsetsSamples, func(b []byte) (Offsets, error) {
		m, err := DecodeOffsets(b)
		if err == nil {
			for i := 1; i < len(m.Offsets); i++ {
				if m.Offsets[i] < m.Offsets[i-1] {
					panic("DecodeOffsets accepted decreasing offsets")
				}
			}
		}
		return m, err
	})
}

func FuzzDecodeTable(f *testing.F) {
	// A few invalid tables too: Check must refuse them.
	f.Add(encodeMsg(Table{Name: "bad", ShardRows: []int64{1}, RankNode: []int64{1}, Nodes: []string{"a"}, Addrs: []string{"x"}}))
	f.Add(encodeMsg(Table{Name: "bad", ShardRows: []int64{1, 2}, RankNode: []int64{0}, Nodes: []string{"a"}, Addrs: []string{"x"}}))
	f.Add(encodeMsg(Table{Name: "bad", Nodes: []string{"a"}}))
	fuzzCodec(f, tableSamples, func(b []byte) (Table, error) {
		m, err := DecodeTable(b)
		if err == nil {
			if cerr := m.Check(); cerr != nil {
				panic("DecodeTable accepted a table Check refuses: " + cerr.Error())
			}
			// A decoded table can be indexed without further tests.
			for _, n := range m.RankNode {
				_ = m.Nodes[n]
				_ = m.Addrs[n]
			}
			if len(m.Paths) != 0 {
				_ = m.Paths[len(m.ShardRows)-1]
			}
		}
		return m, err
	})
}

// The reusing decoders are also run into slices left over from another
// message; the result must not depend on them.
var (
	dirtyGlobals = []int64{-7, -7, -7, -7, -7, -7, -7, -7}
	dirtyOffsets = []int64{-9, -9, -9}
)

func FuzzDecodeRead(f *testing.F) {
	f.Add(encodeMsg(Read{Name: "bad", Globals: []int64{1, 2}, Offsets: []int64{1}}))
	fuzzCodec(f, readSamples, func(b []byte) (Read, error) {
		m, err := decodeRead(b)
		reused := Read{
			Name: "dirty", Region: 5,
			Globals: append(make([]int64, 0, 8), dirtyGlobals...),
			Offsets: append(make([]int64, 0, 3), dirtyOffsets...),
		}
		err2 := DecodeRead(b, &reused)
		if (err == nil) != (err2 == nil) {
			panic("DecodeRead into used slices disagrees with a fresh decode")
		}
		if err == nil && !msgEqual(m, reused) {
			panic("DecodeRead into used slices decodes differently")
		}
		return m, err
	})
}

func FuzzDecodeFetch(f *testing.F) {
	fuzzCodec(f, fetchSamples, func(b []byte) (Fetch, error) {
		m, err := decodeFetch(b)
		reused := Fetch{Name: "dirty", Globals: append(make([]int64, 0, 8), dirtyGlobals...)}
		err2 := DecodeFetch(b, &reused)
		if (err == nil) != (err2 == nil) {
			panic("DecodeFetch into a used slice disagrees with a fresh decode")
		}
		if err == nil && !msgEqual(m, reused) {
			panic("DecodeFetch into a used slice decodes differently")
		}
		return m, err
	})
}

func FuzzStatusError(f *testing.F) {
	for i, s := range sentinels {
		f.Add(base.Code(s), encodeMsg(Text{Text: base.Errorf(s, "detail %d", i).Error()}))
	}
	f.Add(uint16(0), []byte(nil))
	f.Add(uint16(0), []byte{1, 2, 3})
	f.Add(uint16(999), encodeMsg(Text{Text: "unknown code"}))
	f.Add(uint16(0xffff), []byte{})
	f.Add(uint16(1), []byte{5, 0, 0, 0, 'a'})
	f.Fuzz(func(t *testing.T, status uint16, body []byte) {
		err := StatusError(Header{Op: OpRead, Status: status, BodyLen: uint32(len(body)), ID: 1}, body)
		if status == 0 {
			if err != nil {
				t.Fatalf("status 0 gave %v", err)
			}
			return
		}
		if err == nil {
			t.Fatalf("status %d gave nil", status)
		}
		code := base.Code(err)
		if want := base.Code(base.FromCode(status, "")); code != want || code == 0 {
			t.Fatalf("status %d came back as code %d, want %d", status, code, want)
		}
		out := AppendError(nil, OpRead, 1, err)
		h, body2, rerr := ReadFrame(bytes.NewReader(out), nil)
		if rerr != nil {
			t.Fatalf("reading the error frame: %v", rerr)
		}
		if h.Status != code {
			t.Fatalf("error frame status %d, want %d", h.Status, code)
		}
		err2 := StatusError(h, body2)
		if !reflect.DeepEqual(err2, err) {
			t.Fatalf("second StatusError = %#v, want %#v", err2, err)
		}
		if err2.Error() != err.Error() {
			t.Fatalf("message %q, want %q", err2, err)
		}
	})
}

// Package wire is the byte format of ddstore's two protocols: the client
// protocol (a trainer and its node's agent, over a Unix socket) and the peer
// protocol (agent and agent, over TCP). Both use the same frame:
//
//	offset size field
//	0      2    magic 0xDD5E (little-endian)
//	2      1    version (1)
//	3      1    op
//	4      2    status: 0 ok, else the wire code of a sentinel error (then the body is the message)
//	6      2    reserved, 0
//	8      4    body length (≤ MaxBody)
//	12     4    reserved, 0
//	16     8    request id, echoed by the response
//	24     8    payload length: raw row bytes that follow the body
//
// The body holds the op's fields (little-endian integers, strings and lists
// prefixed by their length); the payload, when there is one, is rows, kept
// apart from the body so that they can be read straight into their
// destination. docs/protocol.md lists every op.
package wire

import (
	"encoding/binary"
	"io"

	"github.com/ddstore-go/ddstore/internal/base"
)

const (
	Magic      = 0xDD5E
	Version    = 1
	HeaderSize = 32
	// MaxBody bounds the control part of a frame; a batch of 1M indices with
	// destination offsets fits.
	MaxBody = 32 << 20
	// MaxPayload bounds the rows of one frame.
	MaxPayload = 1 << 40
)

// Op is what a frame asks for.
type Op uint8

// Client protocol ops.
const (
	OpHello      Op = 1
	OpCreate     Op = 2
	OpPublish    Op = 3
	OpLookup     Op = 4
	OpRead       Op = 5
	OpRegister   Op = 6
	OpUnregister Op = 7
	OpFree       Op = 8
	OpInfo       Op = 9
	OpPrefetch   Op = 10
	// OpBarrier (client protocol 1.2) is a rank's part in a fence: it
	// returns once every rank of its group has sent its own.
	OpBarrier Op = 13
	// OpReadRange (client protocol 1.3) reads contiguous rows in one
	// request, whatever their size.
	OpReadRange Op = 14
)

// Peer protocol ops.
const (
	OpJoin        Op = 32
	OpPeerPublish Op = 33
	OpPeerLookup  Op = 34
	OpFetch       Op = 35
	OpPeerFree    Op = 36
	OpPeerNodes   Op = 37
	OpPeerInfo    Op = 38
	OpPeerDrop    Op = 39
	// OpPeerWindow (peer protocol 1.1) asks an agent of a one-sided
	// transport (mpi, fabric) where its shards of a variable lie.
	OpPeerWindow Op = 42
	// OpPeerOffsets asks an agent for a rank's offsets of a ragged
	// variable, to build the asker's node index.
	OpPeerOffsets Op = 43
	// OpPeerBarrier hands a rank's Barrier to the coordinator.
	OpPeerBarrier Op = 44
	// OpFetchRange (peer protocol 1.3) asks an owner node for contiguous
	// rows of its own.
	OpFetchRange Op = 45
	// OpPeerGone tells the coordinator a client process went away.
	OpPeerGone Op = 46
	// OpPeerRound hands a rank's shard to the coordinator, as
	// PeerPublish, but answers with the table only to one request per
	// node, and to most nodes with where to fetch it (PeerTable): the
	// coordinator sends a round's table a few times, not once per rank.
	OpPeerRound Op = 47
	// OpPeerTable asks any agent for the table of a variable it holds.
	OpPeerTable Op = 48
	// OpPeerShards hands the coordinator shards of several ranks of one
	// node at once, answered as soon as they are recorded: the node's
	// ranks but one of each round (whose PeerRound waits for the round).
	OpPeerShards Op = 49
	// OpPeerFrees hands the coordinator the frees of several ranks of
	// one node at once (each as PeerFree).
	OpPeerFrees Op = 50
	// OpPeerDropTree is PeerDrop for an agent that passes the drop on to
	// other nodes: the coordinator sends a Free's drops to a few nodes,
	// not to every one.
	OpPeerDropTree Op = 53
	// OpPeerGather hands a relay node of the round's gather tree a
	// Round carrying its subtree's shards: the relay carries them up in
	// its own PeerRound (or PeerGather) and answers with the round's
	// outcome, or RoundReplyDirect when it does not carry them (the
	// sender then sends them to the coordinator itself).
	OpPeerGather Op = 54
)

var opNames = map[Op]string{
	OpHello: "hello", OpCreate: "create", OpPublish: "publish", OpLookup: "lookup",
	OpRead: "read", OpRegister: "register", OpUnregister: "unregister", OpFree: "free",
	OpInfo: "info", OpPrefetch: "prefetch", OpJoin: "join", OpPeerPublish: "peer-publish", OpPeerLookup: "peer-lookup",
	OpFetch: "fetch", OpPeerFree: "peer-free", OpPeerNodes: "peer-nodes", OpPeerInfo: "peer-info",
	OpPeerDrop: "peer-drop", OpPeerWindow: "peer-window", OpPeerOffsets: "peer-offsets",
	OpBarrier: "barrier", OpPeerBarrier: "peer-barrier", OpReadRange: "read-range", OpFetchRange: "fetch-range", OpPeerGone: "peer-gone",
	OpPeerRound: "peer-round", OpPeerTable: "peer-table", OpPeerShards: "peer-shards", OpPeerFrees: "peer-frees",
	OpPeerDropTree: "peer-drop-tree", OpPeerGather: "peer-gather",
}

func (o Op) String() string {
	if s, ok := opNames[o]; ok {
		return s
	}
	return "op" + itoa(int(o))
}

func itoa(n int) string {
	var b [20]byte
	i := len(b)
	for {
		i--
		b[i] = byte('0' + n%10)
		n /= 10
		if n == 0 {
			return string(b[i:])
		}
	}
}

// Header is the fixed part of a frame.
type Header struct {
	Op      Op
	Status  uint16
	BodyLen uint32
	ID      uint64
	Payload uint64
}

// Put writes h into b[:HeaderSize].
func (h *Header) Put(b []byte) {
	le := binary.LittleEndian
	le.PutUint16(b[0:], Magic)
	b[2] = Version
	b[3] = byte(h.Op)
	le.PutUint16(b[4:], h.Status)
	le.PutUint16(b[6:], 0)
	le.PutUint32(b[8:], h.BodyLen)
	le.PutUint32(b[12:], 0)
	le.PutUint64(b[16:], h.ID)
	le.PutUint64(b[24:], h.Payload)
}

// ParseHeader decodes and checks a frame header.
func ParseHeader(b []byte) (Header, error) {
	if len(b) < HeaderSize {
		return Header{}, base.Errorf(base.ErrProtocol, "frame header of %d bytes, want %d", len(b), HeaderSize)
	}
	le := binary.LittleEndian
	if m := le.Uint16(b[0:]); m != Magic {
		return Header{}, base.Errorf(base.ErrProtocol, "frame magic %#04x, want %#04x", m, Magic)
	}
	if b[2] != Version {
		return Header{}, base.Errorf(base.ErrProtocol, "frame version %d, want %d", b[2], Version)
	}
	if le.Uint16(b[6:]) != 0 || le.Uint32(b[12:]) != 0 {
		return Header{}, base.Errorf(base.ErrProtocol, "frame reserved fields %#x, %#x: want 0", le.Uint16(b[6:]), le.Uint32(b[12:]))
	}
	h := Header{
		Op:      Op(b[3]),
		Status:  le.Uint16(b[4:]),
		BodyLen: le.Uint32(b[8:]),
		ID:      le.Uint64(b[16:]),
		Payload: le.Uint64(b[24:]),
	}
	if h.BodyLen > MaxBody {
		return Header{}, base.Errorf(base.ErrProtocol, "frame body of %d bytes exceeds %d", h.BodyLen, MaxBody)
	}
	if h.Payload > MaxPayload {
		return Header{}, base.Errorf(base.ErrProtocol, "frame payload of %d bytes exceeds %d", h.Payload, uint64(MaxPayload))
	}
	return h, nil
}

// ReadFrame reads a header and its body into buf (grown if needed, so a
// connection's reads reuse one buffer). The payload, if any, is left on r
// for the caller to read where it belongs.
func ReadFrame(r io.Reader, buf []byte) (Header, []byte, error) {
	h, buf, err := ReadHeader(r, buf)
	if err != nil {
		return h, buf, err
	}
	return ReadBody(r, h, buf, MaxBody)
}

// ReadHeader reads and checks a frame's header into buf[:HeaderSize]
// (made if smaller), leaving its body on r (ReadBody).
func ReadHeader(r io.Reader, buf []byte) (Header, []byte, error) {
	if cap(buf) < HeaderSize {
		buf = make([]byte, 0, 4096)
	}
	buf = buf[:HeaderSize]
	if _, err := io.ReadFull(r, buf); err != nil {
		return Header{}, buf, err
	}
	h, err := ParseHeader(buf)
	return h, buf, err
}

// ReadBody reads the body of the frame of header h into buf (grown if
// needed), refusing with ErrProtocol, before reading or allocating
// anything, a body longer than max: where only small frames may come (a
// handshake, before the other side has proved anything), max keeps what
// a header claims from costing memory.
func ReadBody(r io.Reader, h Header, buf []byte, max uint32) (Header, []byte, error) {
	if h.BodyLen > max {
		return h, buf[:0], base.Errorf(base.ErrProtocol, "%s frame body of %d bytes exceeds %d", h.Op, h.BodyLen, max)
	}
	if int(h.BodyLen) > cap(buf) {
		buf = make([]byte, h.BodyLen)
	}
	buf = buf[:h.BodyLen]
	if _, err := io.ReadFull(r, buf); err != nil {
		if err == io.EOF {
			err = io.ErrUnexpectedEOF
		}
		return h, buf, err
	}
	return h, buf, nil
}

// AppendFrame appends a whole frame (header and body) for op with body built
// by fill; payload is the number of raw bytes the caller sends after it.
func AppendFrame(dst []byte, op Op, status uint16, id uint64, payload uint64, fill func(*Encoder)) []byte {
	start := len(dst)
	dst = append(dst, make([]byte, HeaderSize)...)
	e := Encoder{b: dst}
	if fill != nil {
		fill(&e)
	}
	dst = e.b
	h := Header{Op: op, Status: status, BodyLen: uint32(len(dst) - start - HeaderSize), ID: id, Payload: payload}
	h.Put(dst[start:])
	return dst
}

// AppendError appends a response frame carrying err.
func AppendError(dst []byte, op Op, id uint64, err error) []byte {
	if err == nil {
		err = base.ErrInternal
	}
	return AppendFrame(dst, op, base.Code(err), id, 0, func(e *Encoder) { e.String32(err.Error()) })
}

// StatusError rebuilds the error of a response frame with a nonzero status.
func StatusError(h Header, body []byte) error {
	if h.Status == 0 {
		return nil
	}
	d := NewDecoder(body)
	msg := d.String32()
	if d.Done() != nil {
		msg = "ddstore: remote error (undecodable message)"
	}
	return base.FromCode(h.Status, msg)
}

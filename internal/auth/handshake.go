package auth

import (
	"errors"
	"io"

	"github.com/ddstore-go/ddstore/internal/base"
	"github.com/ddstore-go/ddstore/internal/wire"
)

// The handshake, as frames (docs/protocol.md, Authentication):
//
//	initiator → responder  Auth (id 1)       AuthHello{Ni}
//	responder → initiator  reply             AuthReply{Nr, MAC(responder, Ni, Nr)}
//	initiator → responder  AuthProof (id 2)  AuthProof{MAC(initiator, Ni, Nr)}
//	responder → initiator  reply             empty
//
// The initiator checks the responder's MAC before it sends its own, and the
// responder sends nothing else before it has checked the initiator's. The
// responder proves first, to anyone who asks: what it gives away is a MAC of
// the responder's role, which is never accepted as an initiator's
// (reflection), over a nonce of its own, fresh for each connection, so a
// recorded handshake fails when replayed. A refusal is an error reply
// carrying ErrAuth, after which the responder closes the connection; the
// initiator refuses by hanging up.

// FirstID is the request id of the first request after the handshake, whose
// two requests have ids 1 and 2.
const FirstID = 3

// ErrHungUp is returned by Respond when the other side closed the
// connection before sending anything: a probe (is the socket up?), not an
// attempt to authenticate.
var ErrHungUp = errors.New("ddstore: connection closed before the handshake")

// Initiate runs the dialing side of the handshake on c, with key k; the
// caller sets c's deadlines. It returns nil once both sides have proved
// they hold k. A refusal from the other side, or a proof from it that does
// not match k, gives ErrAuth; I/O errors come back as they are.
func Initiate(c io.ReadWriter, k Key, p Proto) error {
	helloOp, proofOp := p.ops()
	ni := nonce()
	hello := wire.AuthHello{Nonce: ni}
	if _, err := c.Write(wire.AppendFrame(nil, helloOp, 0, 1, 0, hello.Encode)); err != nil {
		return err
	}
	body, err := readReply(c, helloOp, 1)
	if err != nil {
		return err
	}
	r, err := wire.DecodeAuthReply(body)
	if err != nil {
		return err
	}
	if !check(k, p, Responder, &ni, &r.Nonce, r.MAC) {
		return base.Errorf(base.ErrAuth, "the other side does not hold this key (its proof does not match)")
	}
	proof := wire.AuthProof{MAC: MAC(k, p, Initiator, &ni, &r.Nonce)}
	if _, err := c.Write(wire.AppendFrame(nil, proofOp, 0, 2, 0, proof.Encode)); err != nil {
		return err
	}
	body, err = readReply(c, proofOp, 2)
	if err != nil {
		return err
	}
	if len(body) != 0 {
		return base.Errorf(base.ErrProtocol, "%s reply of %d bytes: want an empty body", proofOp, len(body))
	}
	return nil
}

// MaxBody bounds the body of a handshake frame the responder reads, before
// the other side has proved anything: a hello or a proof is 32 bytes, and
// a header claiming more is refused before its body is read.
const MaxBody = wire.NonceSize + wire.MACSize

// maxReplyBody bounds a reply the initiator reads: a reply of the
// handshake, or an error's message.
const maxReplyBody = 64 << 10

// readReply reads the reply to request id of op, as the error it carries
// when it has one.
func readReply(c io.Reader, op wire.Op, id uint64) ([]byte, error) {
	h, body, err := wire.ReadHeader(c, nil)
	if err == nil {
		h, body, err = wire.ReadBody(c, h, body, maxReplyBody)
	}
	if err != nil {
		if errors.Is(err, io.EOF) {
			err = io.ErrUnexpectedEOF
		}
		return nil, err
	}
	if h.Op != op || h.ID != id || h.Payload != 0 {
		return nil, base.Errorf(base.ErrProtocol, "reply %s #%d (payload %d) to %s #%d", h.Op, h.ID, h.Payload, op, id)
	}
	if err := wire.StatusError(h, body); err != nil {
		return nil, err
	}
	return body, nil
}

// Respond runs the accepting side of the handshake on c; the caller sets
// c's deadlines. key gives the key to check against, or an error saying why
// there is none yet (the connection is then refused with that reason). It
// returns nil once both sides have proved they hold the key; ErrHungUp when
// c closed before its first byte; an error matching ErrAuth for a refusal
// (another op first, a proof that does not match, no key), after telling
// the other side; other errors (malformed frames, I/O) as they are. The
// caller closes c on any error.
//
// Nothing the other side claims costs memory here: each frame's op is
// checked from its header, and its body is read into a buffer of MaxBody
// bytes on the stack (a longer one is refused unread).
func Respond(c io.ReadWriter, p Proto, key func() (Key, error)) error {
	_, err := RespondAny(c, []Proto{p}, func(Proto) (Key, error) { return key() })
	return err
}

// RespondAny is Respond for a listener that serves several protocols (the
// peer port: agents, and clients reading rows directly): the initiator's
// first op says which of protos it runs, key gives that protocol's key,
// and the protocol is returned once both sides have proved it.
func RespondAny(c io.ReadWriter, protos []Proto, key func(Proto) (Key, error)) (Proto, error) {
	var frame [wire.HeaderSize + MaxBody]byte
	h, buf, err := wire.ReadHeader(c, frame[:0])
	if errors.Is(err, io.EOF) {
		return 0, ErrHungUp
	}
	if err != nil {
		return 0, err
	}
	if h.Status != 0 || h.Payload != 0 {
		return protos[0], base.Errorf(base.ErrProtocol, "%s request with status %d, payload %d", h.Op, h.Status, h.Payload)
	}
	p, found := protos[0], false
	for _, q := range protos {
		if hello, _ := q.ops(); hello == h.Op {
			p, found = q, true
		}
	}
	helloOp, proofOp := p.ops()
	if !found {
		return p, refuse(c, h, base.Errorf(base.ErrAuth, "%s before the authentication handshake (%s): a client or agent of an older ddstore?", h.Op, helloOp))
	}
	h, body, err := wire.ReadBody(c, h, buf[:0], MaxBody)
	if err != nil {
		return p, err
	}
	return p, respond(c, p, h, body, proofOp, frame[:0], key)
}

// respond is the handshake after the initiator's hello (h, body) of p.
func respond(c io.ReadWriter, p Proto, h wire.Header, body []byte, proofOp wire.Op, frame []byte, key func(Proto) (Key, error)) error {
	m, err := wire.DecodeAuthHello(body)
	if err != nil {
		return err
	}
	k, err := key(p)
	if err != nil {
		return refuse(c, h, err)
	}
	r := wire.AuthReply{Nonce: nonce()}
	r.MAC = MAC(k, p, Responder, &m.Nonce, &r.Nonce)
	if _, err := c.Write(wire.AppendFrame(nil, h.Op, 0, h.ID, 0, r.Encode)); err != nil {
		return err
	}
	h, body, err = readRequest(c, frame, proofOp)
	if errors.Is(err, io.EOF) {
		return base.Errorf(base.ErrAuth, "the other side hung up after this side's proof (it holds another key?)")
	}
	if err != nil {
		return err
	}
	if h.Op != proofOp {
		return refuse(c, h, base.Errorf(base.ErrAuth, "%s where %s was due", h.Op, proofOp))
	}
	proof, err := wire.DecodeAuthProof(body)
	if err != nil {
		return err
	}
	if !check(k, p, Initiator, &m.Nonce, &r.Nonce, proof.MAC) {
		return refuse(c, h, base.Errorf(base.ErrAuth, "the key does not match (a different %s, or a stale key file?)", SecretEnv))
	}
	_, err = c.Write(wire.AppendFrame(nil, proofOp, 0, h.ID, 0, nil))
	return err
}

// readRequest reads a handshake request into buf (of MaxBody past the
// header): its header, then, when it is the op due, its body, which must
// fit. Of another op only the header is read: the caller refuses it.
func readRequest(c io.Reader, buf []byte, due wire.Op) (wire.Header, []byte, error) {
	h, buf, err := wire.ReadHeader(c, buf)
	if err != nil {
		return h, nil, err
	}
	if h.Status != 0 || h.Payload != 0 {
		return h, nil, base.Errorf(base.ErrProtocol, "%s request with status %d, payload %d", h.Op, h.Status, h.Payload)
	}
	if h.Op != due {
		return h, nil, nil
	}
	return wire.ReadBody(c, h, buf[:0], MaxBody)
}

// refuse tells the other side why, then returns why.
func refuse(c io.Writer, h wire.Header, why error) error {
	c.Write(wire.AppendError(nil, h.Op, h.ID, why))
	return why
}

package ddstore_test

import (
	"encoding/hex"
	"testing"

	"github.com/ddstore-go/ddstore/internal/auth"
	"github.com/ddstore-go/ddstore/internal/base"
	"github.com/ddstore-go/ddstore/internal/wire"
)

// vectorAuth is the authentication handshake (docs/protocol.md,
// Authentication): the keys a secret gives, and one handshake per protocol
// with fixed nonces, as MACs and as the four frames, so that another client
// can check its key derivation, its MACs and its frames.
func vectorAuth(t *testing.T) obj {
	const secret = "correct horse battery staple 42"
	ks, err := auth.FromSecret(secret)
	if err != nil {
		t.Fatal(err)
	}
	var ni, nr [wire.NonceSize]byte
	for i := range ni {
		ni[i], nr[i] = byte(i), byte(0xff-i)
	}
	frame := func(op wire.Op, id uint64, status uint16, fill func(*wire.Encoder)) obj {
		return obj{"op": op, "id": id, "hex": hex.EncodeToString(wire.AppendFrame(nil, op, status, id, 0, fill))}
	}
	var handshakes []obj
	for _, c := range []struct {
		proto          auth.Proto
		key            auth.Key
		hello, proofOp wire.Op
	}{
		{auth.Client, ks.Client, wire.OpAuth, wire.OpAuthProof},
		{auth.Peer, ks.Peer, wire.OpPeerAuth, wire.OpPeerAuthProof},
		{auth.Direct, auth.DirectKeyOf(ks.Peer), wire.OpDirectAuth, wire.OpDirectAuthProof},
	} {
		rmac := auth.MAC(c.key, c.proto, auth.Responder, &ni, &nr)
		imac := auth.MAC(c.key, c.proto, auth.Initiator, &ni, &nr)
		if rmac == imac {
			t.Fatalf("%s: the two roles' MACs are equal", c.proto)
		}
		hello := wire.AuthHello{Nonce: ni}
		reply := wire.AuthReply{Nonce: nr, MAC: rmac}
		proof := wire.AuthProof{MAC: imac}
		handshakes = append(handshakes, obj{
			"proto": c.proto.String(), "key": c.key.Hex(),
			"initiator_nonce": hex.EncodeToString(ni[:]), "responder_nonce": hex.EncodeToString(nr[:]),
			"responder_context": "ddstore-auth-v1 " + c.proto.String() + " responder",
			"initiator_context": "ddstore-auth-v1 " + c.proto.String() + " initiator",
			"responder_mac":     hex.EncodeToString(rmac[:]), "initiator_mac": hex.EncodeToString(imac[:]),
			"frames": obj{
				"auth":             frame(c.hello, 1, 0, hello.Encode),
				"auth_reply":       frame(c.hello, 1, 0, reply.Encode),
				"auth_proof":       frame(c.proofOp, 2, 0, proof.Encode),
				"auth_proof_reply": frame(c.proofOp, 2, 0, nil),
			},
		})
	}
	// What an agent answers to a Hello sent before the handshake (then it
	// closes the connection).
	refused := base.Errorf(base.ErrAuth, "hello before the authentication handshake (auth): a client or agent of an older ddstore?")
	// The direct key, as a client's agent hands it out (client op
	// DirectKey, an empty request).
	direct := wire.DirectKey{Key: auth.DirectKeyOf(ks.Peer).Bytes()}
	return obj{
		"direct_key": auth.DirectKeyOf(ks.Peer).Hex(), "direct_key_label": "ddstore direct key",
		"direct_key_frames": obj{"request": frame(wire.OpDirectKey, 3, 0, nil), "reply": frame(wire.OpDirectKey, 3, 0, direct.Encode)},
		"secret":            secret, "salt": "ddstore secret v1", "iterations": auth.SecretIterations, "min_secret_bytes": auth.MinSecret,
		"client_key": ks.Client.Hex(), "peer_key": ks.Peer.Hex(),
		"client_key_label": "ddstore client key", "peer_key_label": "ddstore peer key",
		"handshakes": handshakes,
		"refused_hello": obj{"status": base.Code(refused), "message": refused.Error(),
			"hex": hex.EncodeToString(wire.AppendError(nil, wire.OpHello, 1, refused))},
	}
}

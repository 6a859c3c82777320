package wire

import (
	"bytes"
	"testing"
)

// counting is 32 bytes counting up from start, a recognizable nonce or MAC.
func counting[T ~[32]byte](start byte) T {
	var b T
	for i := range b {
		b[i] = start + byte(i)
	}
	return b
}

var (
	authHelloSamples = []AuthHello{{}, {Nonce: counting[[NonceSize]byte](1)}}
	authReplySamples = []AuthReply{{}, {Nonce: counting[[NonceSize]byte](0x40), MAC: counting[[MACSize]byte](0x80)}}
	authProofSamples = []AuthProof{{}, {MAC: counting[[MACSize]byte](0xc0)}}
)

func TestAuthMessages(t *testing.T) {
	t.Run("AuthHello", func(t *testing.T) { testCodec(t, authHelloSamples, DecodeAuthHello) })
	t.Run("AuthReply", func(t *testing.T) { testCodec(t, authReplySamples, DecodeAuthReply) })
	t.Run("AuthProof", func(t *testing.T) { testCodec(t, authProofSamples, DecodeAuthProof) })
}

// TestAuthMessageBytes pins the layout: the fields back to back, nothing
// else (no length prefix, as the sizes are fixed).
func TestAuthMessageBytes(t *testing.T) {
	r := authReplySamples[1]
	cases := []struct {
		name string
		got  []byte
		want []byte
	}{
		{"AuthHello", encodeMsg(authHelloSamples[1]), authHelloSamples[1].Nonce[:]},
		{"AuthReply", encodeMsg(r), append(append([]byte(nil), r.Nonce[:]...), r.MAC[:]...)},
		{"AuthProof", encodeMsg(authProofSamples[1]), authProofSamples[1].MAC[:]},
	}
	for _, c := range cases {
		if !bytes.Equal(c.got, c.want) {
			t.Errorf("%s: % x, want % x", c.name, c.got, c.want)
		}
	}
}

func FuzzDecodeAuthHello(f *testing.F) { fuzzCodec(f, authHelloSamples, DecodeAuthHello) }
func FuzzDecodeAuthReply(f *testing.F) { fuzzCodec(f, authReplySamples, DecodeAuthReply) }
func FuzzDecodeAuthProof(f *testing.F) { fuzzCodec(f, authProofSamples, DecodeAuthProof) }

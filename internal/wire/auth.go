package wire

// The authentication handshake's ops and bodies (docs/protocol.md,
// Authentication): the first two requests of every connection, on both
// protocols, before any other op. internal/auth drives the handshake.

// Client protocol ops of the handshake.
const (
	OpAuth      Op = 11 // AuthHello → AuthReply
	OpAuthProof Op = 12 // AuthProof → empty
)

// Peer protocol ops of the handshake.
const (
	OpPeerAuth      Op = 40 // AuthHello → AuthReply
	OpPeerAuthProof Op = 41 // AuthProof → empty
)

// Peer protocol ops of the handshake a client runs when it reads rows
// straight from another node's agent (a direct connection): it proves the
// direct key, not the peer key, and may then only read rows.
const (
	OpDirectAuth      Op = 51 // AuthHello → AuthReply
	OpDirectAuthProof Op = 52 // AuthProof → empty
)

// OpDirectKey (client protocol 1.4) asks the client's agent for the key
// its direct connections prove: an empty request, a DirectKey reply.
const OpDirectKey Op = 15

func init() {
	opNames[OpAuth], opNames[OpAuthProof] = "auth", "auth-proof"
	opNames[OpPeerAuth], opNames[OpPeerAuthProof] = "peer-auth", "peer-auth-proof"
	opNames[OpDirectAuth], opNames[OpDirectAuthProof] = "direct-auth", "direct-auth-proof"
	opNames[OpDirectKey] = "direct-key"
}

const (
	// NonceSize is the length of each side's challenge.
	NonceSize = 32
	// MACSize is the length of a proof: an HMAC-SHA256.
	MACSize = 32
)

// AuthHello opens the handshake: the dialing side's fresh challenge.
type AuthHello struct {
	Nonce [NonceSize]byte
}

func (m *AuthHello) Encode(e *Encoder) { e.b = append(e.b, m.Nonce[:]...) }

func DecodeAuthHello(b []byte) (m AuthHello, err error) {
	d := NewDecoder(b)
	copy(m.Nonce[:], d.take(NonceSize, "nonce"))
	return m, d.Done()
}

// AuthReply is the accepting side's answer: its own fresh challenge, and
// its proof that it holds the key (a MAC over both challenges).
type AuthReply struct {
	Nonce [NonceSize]byte
	MAC   [MACSize]byte
}

func (m *AuthReply) Encode(e *Encoder) {
	e.b = append(e.b, m.Nonce[:]...)
	e.b = append(e.b, m.MAC[:]...)
}

func DecodeAuthReply(b []byte) (m AuthReply, err error) {
	d := NewDecoder(b)
	copy(m.Nonce[:], d.take(NonceSize, "nonce"))
	copy(m.MAC[:], d.take(MACSize, "mac"))
	return m, d.Done()
}

// AuthProof is the dialing side's proof that it holds the key.
type AuthProof struct {
	MAC [MACSize]byte
}

func (m *AuthProof) Encode(e *Encoder) { e.b = append(e.b, m.MAC[:]...) }

func DecodeAuthProof(b []byte) (m AuthProof, err error) {
	d := NewDecoder(b)
	copy(m.MAC[:], d.take(MACSize, "mac"))
	return m, d.Done()
}

// DirectKey is the agent's answer to OpDirectKey: the job's direct key
// (derived from the peer key, docs/protocol.md, Authentication), which the
// client proves to other nodes' agents on their peer port.
type DirectKey struct {
	Key [32]byte
}

func (m *DirectKey) Encode(e *Encoder) { e.b = append(e.b, m.Key[:]...) }

func DecodeDirectKey(b []byte) (m DirectKey, err error) {
	d := NewDecoder(b)
	copy(m.Key[:], d.take(len(m.Key), "key"))
	return m, d.Done()
}

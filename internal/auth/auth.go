// Package auth lets both ends of a connection prove that they belong to the
// same job before anything else crosses it: they share a key, and each
// answers the other's fresh challenge with an HMAC-SHA256 of both
// challenges (docs/protocol.md, Authentication). The key itself never
// crosses a connection and is never logged, shown or put on a command line.
//
// Keys come from the job's secret (DDSTORE_SECRET, the same on every node),
// from a random draw (an agent's key for its own clients; the key rank 0's
// agent hands out through a handshake directory), or from a key file that
// an agent writes beside its socket for the clients of its node.
package auth

import (
	"crypto/hmac"
	"crypto/pbkdf2"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"sync"

	"github.com/ddstore-go/ddstore/internal/base"
	"github.com/ddstore-go/ddstore/internal/wire"
)

const (
	// KeySize is the length of a key.
	KeySize = 32
	// SecretEnv names the variable that holds the job's secret.
	SecretEnv = "DDSTORE_SECRET"
	// MinSecret is the shortest secret accepted, in bytes.
	MinSecret = 16
	// SecretIterations is PBKDF2's work factor in deriving keys from a
	// secret: a transcript of a handshake lets whoever saw it test guesses
	// of the secret offline, and each guess costs this many HMACs.
	SecretIterations = 100_000
	// secretSalt is PBKDF2's salt: fixed, since every node derives the same
	// key from the secret alone.
	secretSalt = "ddstore secret v1"
)

// Key is a shared key. Its bytes stay unexported and it formats as
// "[redacted]", so that no log line, error or info output can show it by
// accident; Hex is the one way out, for the key file and the handshake
// record.
type Key struct{ b [KeySize]byte }

// String, GoString and LogValue keep the key out of logs and messages.
func (Key) String() string               { return "[redacted]" }
func (Key) GoString() string             { return "auth.Key{[redacted]}" }
func (Key) LogValue() slog.Value         { return slog.StringValue("[redacted]") }
func (k Key) Format(f fmt.State, _ rune) { fmt.Fprint(f, "[redacted]") }

// Hex is the key in hex, for files only readable by the job's user.
func (k Key) Hex() string { return hex.EncodeToString(k.b[:]) }

// ParseHex reads a key written by Hex; surrounding white space is ignored.
// The error never quotes the text, which may be a key.
func ParseHex(s string) (Key, error) {
	s = strings.TrimSpace(s)
	var k Key
	if len(s) != 2*KeySize {
		return k, base.Errorf(base.ErrAuth, "a key is %d hex digits, not %d", 2*KeySize, len(s))
	}
	if _, err := hex.Decode(k.b[:], []byte(s)); err != nil {
		return k, base.Errorf(base.ErrAuth, "a key holds hex digits only")
	}
	return k, nil
}

// Generate draws a random key.
func Generate() Key {
	var k Key
	rand.Read(k.b[:]) // never fails (crypto/rand, Go 1.24)
	return k
}

// Keys are the two keys of a job derived from its secret: one for the
// clients of each node's agent, one between agents, so that the key file of
// one node never opens the agents of the others.
type Keys struct {
	Client, Peer Key
}

// FromSecret derives a job's keys from its secret:
//
//	master = PBKDF2-HMAC-SHA256(secret, "ddstore secret v1", 100000 iterations, 32 bytes)
//	client = HMAC-SHA256(master, "ddstore client key")
//	peer   = HMAC-SHA256(master, "ddstore peer key")
//
// The error names the secret's length, never the secret.
func FromSecret(secret string) (Keys, error) {
	if len(secret) < MinSecret {
		return Keys{}, base.Errorf(base.ErrArgument, "%s of %d bytes: want at least %d (a random one: openssl rand -hex 32)", SecretEnv, len(secret), MinSecret)
	}
	cache.Lock()
	defer cache.Unlock()
	if cache.ok && cache.secret == secret {
		return cache.keys, nil
	}
	master, err := pbkdf2.Key(sha256.New, secret, []byte(secretSalt), SecretIterations, KeySize)
	if err != nil {
		return Keys{}, base.Errorf(base.ErrInternal, "deriving keys from %s: %v", SecretEnv, err)
	}
	var ks Keys
	sub := func(label string, k *Key) {
		h := hmac.New(sha256.New, master)
		h.Write([]byte(label))
		h.Sum(k.b[:0])
	}
	sub("ddstore client key", &ks.Client)
	sub("ddstore peer key", &ks.Peer)
	clear(master)
	cache.secret, cache.keys, cache.ok = secret, ks, true
	return ks, nil
}

// cache keeps the last derivation: a client dials one lane after another,
// and each derivation is deliberately slow. Its lock is held while
// deriving, and is a leaf (lock order: internal/LOCKS.md).
var cache struct {
	sync.Mutex
	secret string
	keys   Keys
	ok     bool
}

// SecretFromEnv returns the keys of DDSTORE_SECRET; ok is false when it is
// unset or empty.
func SecretFromEnv() (ks Keys, ok bool, err error) {
	s := os.Getenv(SecretEnv)
	if s == "" {
		return Keys{}, false, nil
	}
	ks, err = FromSecret(s)
	return ks, err == nil, err
}

// Proto says which protocol a handshake runs on; each has its own ops, and
// its own label in the MACs, so that a proof made on one protocol is worth
// nothing on the other.
type Proto uint8

const (
	Client Proto = iota // a client and its node's agent, on the Unix socket
	Peer                // agent and agent, on TCP
	Direct              // a client and another node's agent, on its peer port: rows only
)

func (p Proto) String() string {
	switch p {
	case Peer:
		return "peer"
	case Direct:
		return "direct"
	}
	return "client"
}

// ops are the handshake's two requests on p.
func (p Proto) ops() (hello, proof wire.Op) {
	switch p {
	case Peer:
		return wire.OpPeerAuth, wire.OpPeerAuthProof
	case Direct:
		return wire.OpDirectAuth, wire.OpDirectAuthProof
	}
	return wire.OpAuth, wire.OpAuthProof
}

// DirectKeyOf derives the key a client proves to another node's agent on
// its peer port (Direct) from the job's peer key:
//
//	direct = HMAC-SHA256(peer, "ddstore direct key")
//
// A client gets it from its own agent over the authenticated Unix socket;
// it opens only the row reads of the peer port (Fetch, FetchRange), never
// the agents' control ops, and the peer key cannot be found from it.
func DirectKeyOf(peer Key) Key {
	h := hmac.New(sha256.New, peer.b[:])
	h.Write([]byte("ddstore direct key"))
	var k Key
	h.Sum(k.b[:0])
	return k
}

// FromBytes makes a key of 32 bytes (a DirectKey reply).
func FromBytes(b [KeySize]byte) Key { return Key{b: b} }

// Bytes are the key's bytes, for the one message that hands one out
// (DirectKey, on a client's authenticated Unix socket).
func (k Key) Bytes() [KeySize]byte { return k.b }

// Role says which side of a handshake made a MAC. The two sides' MACs
// differ, so a side can never be answered with its own proof (reflection).
type Role string

const (
	Initiator Role = "initiator" // the side that dialed
	Responder Role = "responder" // the side that accepted
)

// MAC is a side's proof that it holds k:
//
//	HMAC-SHA256(k, "ddstore-auth-v1 " + proto + " " + role + initiator's nonce + responder's nonce)
//
// with proto "client", "peer" or "direct" and role "initiator" or "responder".
func MAC(k Key, p Proto, r Role, initiator, responder *[wire.NonceSize]byte) [wire.MACSize]byte {
	h := hmac.New(sha256.New, k.b[:])
	h.Write([]byte("ddstore-auth-v1 " + p.String() + " " + string(r)))
	h.Write(initiator[:])
	h.Write(responder[:])
	var m [wire.MACSize]byte
	h.Sum(m[:0])
	return m
}

// check compares a received MAC with the expected one in constant time.
func check(k Key, p Proto, r Role, initiator, responder *[wire.NonceSize]byte, got [wire.MACSize]byte) bool {
	want := MAC(k, p, r, initiator, responder)
	return hmac.Equal(want[:], got[:])
}

func nonce() [wire.NonceSize]byte {
	var n [wire.NonceSize]byte
	rand.Read(n[:])
	return n
}

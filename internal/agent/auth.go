package agent

import (
	"errors"
	"io"
	"net"
	"os"
	"path/filepath"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"

	"github.com/ddstore-go/ddstore/internal/auth"
	"github.com/ddstore-go/ddstore/internal/base"
)

// Authentication on the agent's side (docs/design.md, Security). Two keys:
//
//   - the client key, which the clients of this node prove on the Unix
//     socket: the secret's client key, or a random one; either way written
//     to the key file beside the socket (mode 0600, in the 0700 run
//     directory), where the node's clients read it when they have no secret;
//   - the peer key, which agents prove to each other: the secret's peer
//     key; without a secret, a random one on a single node, or the one rank
//     0's agent draws and hands out in its handshake-directory record (nil
//     here until that record is read). Agents that meet through a
//     rendezvous address need the secret: nothing private carries a key
//     between them.

// agentAuth is the agent's keys and refusals.
type agentAuth struct {
	client  auth.Key
	keyFile string // written by initAuth; removed at shutdown
	secret  bool   // both keys come from the job's secret
	peer    atomic.Pointer[auth.Key]
	// fromRecord: the peer key came from the coordinator's record.
	fromRecord atomic.Bool
	// refusedClients counts client connections refused (another user, no
	// or a wrong key); the peer server counts its own.
	refusedClients atomic.Int64
}

// authTimeout bounds a client's handshake.
const authTimeout = 10 * time.Second

// initAuth sets the keys up and writes the key file; the caller holds the
// agent's lock, so the file is this agent's.
func (a *Agent) initAuth() error {
	secret := a.cfg.Secret
	if secret == "" {
		secret = os.Getenv(auth.SecretEnv)
	}
	switch {
	case secret != "":
		ks, err := auth.FromSecret(secret)
		if err != nil {
			return err
		}
		a.auth.client, a.auth.secret = ks.Client, true
		a.auth.peer.Store(&ks.Peer)
	case a.cfg.Rendezvous != "":
		return base.Errorf(base.ErrArgument, "agents that meet through the rendezvous address %s need a shared secret to prove to each other "+
			"that they belong to the job: set %s to the same random value for every node of the job (e.g. export %s=$(openssl rand -hex 32) "+
			"before launching), or let them meet through a handshake directory on a shared filesystem (--handshake-dir), through which "+
			"rank 0's agent hands out a generated key", a.cfg.Rendezvous, auth.SecretEnv, auth.SecretEnv)
	default:
		a.auth.client = auth.Generate()
		if a.cfg.HandshakeDir == "" {
			// A single-node job: no other agent needs the key, but the
			// peer port still refuses whoever cannot prove it.
			k := auth.Generate()
			a.auth.peer.Store(&k)
		}
	}
	path := auth.KeyFile(a.cfg.Socket)
	if err := auth.WriteKeyFile(path, a.auth.client); err != nil {
		return err
	}
	a.auth.keyFile = path
	return nil
}

func (a *Agent) removeKeyFile() {
	if a.auth.keyFile != "" {
		os.Remove(a.auth.keyFile)
	}
}

// peerKey is the job's key between agents, for the peer server and pool.
func (a *Agent) peerKey() (auth.Key, error) {
	if k := a.auth.peer.Load(); k != nil {
		return *k, nil
	}
	return auth.Key{}, base.Errorf(base.ErrAuth, "the agent of node %q does not have the job's key yet: it reads it from the coordinator's record in %s (written once rank 0 says hello to its agent)",
		a.cfg.Node, a.cfg.HandshakeDir)
}

// coordinatorKey is the key to hand out in this agent's coordinator record:
// none with a secret (every agent has it), else the job's key, drawn now if
// this agent has none yet.
func (a *Agent) coordinatorKey() string {
	if a.auth.secret {
		return ""
	}
	k := auth.Generate()
	a.auth.peer.CompareAndSwap(nil, &k)
	return a.auth.peer.Load().Hex()
}

// takeRecordKey takes the job's key from the coordinator's record, unless
// this agent has one (its secret's, or one taken before).
func (a *Agent) takeRecordKey(rec nodeRecord) error {
	path := filepath.Join(a.cfg.HandshakeDir, a.recordName("coordinator"))
	if a.auth.secret {
		if rec.Key != "" {
			a.log.Warn("the coordinator's record hands out a key, but this agent has a secret: the coordinator runs without it, and will refuse this agent",
				"record", path, "secret", auth.SecretEnv)
		}
		return nil
	}
	if a.auth.peer.Load() != nil {
		return nil
	}
	if rec.Key == "" {
		return base.Errorf(base.ErrAuth, "the coordinator's record %s carries no key: its agent runs with %s, so this one needs the same %s", path, auth.SecretEnv, auth.SecretEnv)
	}
	// The key is only as private as the record: refuse one that another
	// user wrote or may read.
	var st unix.Stat_t
	if err := unix.Stat(path, &st); err != nil {
		return base.Errorf(base.ErrAuth, "coordinator record %s: %v", path, err)
	}
	if int(st.Uid) != os.Geteuid() {
		return base.Errorf(base.ErrAuth, "coordinator record %s belongs to uid %d, not %d: its key is not this job's", path, st.Uid, os.Geteuid())
	}
	if st.Mode&0o077 != 0 {
		return base.Errorf(base.ErrAuth, "coordinator record %s has mode %o: want 0600, as its key must stay private", path, st.Mode&0o777)
	}
	k, err := auth.ParseHex(rec.Key)
	if err != nil {
		return base.Errorf(base.ErrAuth, "coordinator record %s: a bad key", path)
	}
	if a.auth.peer.CompareAndSwap(nil, &k) {
		a.auth.fromRecord.Store(true)
	}
	return nil
}

// authSource says where the keys come from, for `ddstore info`.
func (a *Agent) authSource() string {
	switch {
	case a.auth.secret:
		return "secret (" + auth.SecretEnv + ")"
	case a.auth.fromRecord.Load():
		return "generated; the job's key from the coordinator's record"
	case a.auth.peer.Load() != nil:
		return "generated"
	default:
		return "generated; waiting for the coordinator's record for the job's key"
	}
}

// admitClient checks a new client connection before anything else is read
// from it: a process of this user (or root), that proves the client key.
// False: it is refused (counted, logged) and the caller closes it.
func (a *Agent) admitClient(s *session) bool {
	if err := checkPeerUID(s.conn); err != nil {
		a.auth.refusedClients.Add(1)
		a.log.Warn("client refused", "err", err)
		return false
	}
	s.conn.SetDeadline(time.Now().Add(authTimeout))
	err := auth.Respond(struct {
		io.Reader
		io.Writer
	}{s, s.conn}, auth.Client, func() (auth.Key, error) { return a.auth.client, nil })
	s.conn.SetDeadline(time.Time{})
	if err == nil {
		return true
	}
	if errors.Is(err, auth.ErrHungUp) { // a probe: is the socket up?
		return false
	}
	a.auth.refusedClients.Add(1)
	a.log.Warn("client refused: it did not prove the key", "err", err)
	return false
}

// checkPeerUID refuses a process of another user than the agent's; root
// may connect (it can read the key file anyway).
func checkPeerUID(c *net.UnixConn) error {
	raw, err := c.SyscallConn()
	if err != nil {
		return err
	}
	var cred *unix.Ucred
	var cerr error
	if err := raw.Control(func(fd uintptr) {
		cred, cerr = unix.GetsockoptUcred(int(fd), unix.SOL_SOCKET, unix.SO_PEERCRED)
	}); err != nil {
		return err
	}
	if cerr != nil {
		return base.Errorf(base.ErrAuth, "cannot tell the client's user (SO_PEERCRED): %v", cerr)
	}
	if !uidAllowed(cred.Uid, os.Geteuid()) {
		return base.Errorf(base.ErrAuth, "client pid %d runs as uid %d: this agent (uid %d) serves only its own user and root", cred.Pid, cred.Uid, os.Geteuid())
	}
	return nil
}

func uidAllowed(client uint32, agent int) bool { return int(client) == agent || client == 0 }

"""Authentication (docs/protocol.md, Authentication), as internal/auth does it:
before anything else on a connection, the client and its agent each prove they
hold the key, by an HMAC-SHA256 over both sides' fresh nonces; the key never
crosses the socket. The key is the one derived from DDSTORE_SECRET when it is
set, else the one in the agent's key file beside its socket.
tests/unit/test_vectors.py checks this module against the Go code."""

import functools
import hashlib
import hmac
import os
import stat

from . import _wire
from ._errors import ArgumentError, AuthError, ProtocolError

SECRET_ENV = "DDSTORE_SECRET"
MIN_SECRET = 16
ITERATIONS = 100_000
SALT = b"ddstore secret v1"
NONCE = 32
KEY = 32


@functools.lru_cache(maxsize=4)
def keys_from_secret(secret):
    """(client key, peer key) of a secret (bytes): PBKDF2-HMAC-SHA256 of the
    secret, then one HMAC per key. The error names the length, never the
    secret."""
    if len(secret) < MIN_SECRET:
        raise ArgumentError(f"ddstore: bad argument: {SECRET_ENV} of {len(secret)} bytes: want at least {MIN_SECRET} "
                            f"(a random one: openssl rand -hex 32)")
    master = hashlib.pbkdf2_hmac("sha256", secret, SALT, ITERATIONS, KEY)
    return (hmac.new(master, b"ddstore client key", hashlib.sha256).digest(),
            hmac.new(master, b"ddstore peer key", hashlib.sha256).digest())


def mac(key, proto, role, initiator_nonce, responder_nonce):
    """A side's proof: HMAC-SHA256(key, "ddstore-auth-v1 PROTO ROLE" + both
    nonces), proto "client" or "peer", role "initiator" or "responder"."""
    msg = f"ddstore-auth-v1 {proto} {role}".encode() + bytes(initiator_nonce) + bytes(responder_nonce)
    return hmac.new(key, msg, hashlib.sha256).digest()


def key_file(socket_path):
    return socket_path + ".key"


def read_key_file(path):
    """The key in an agent's key file: a regular file of this user (root may
    read anyone's) that no one else may read or write."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as e:
        raise AuthError(f"ddstore: not authenticated: key file {path}: {e.strerror}") from None
    try:
        st = os.fstat(fd)
        euid = os.geteuid()
        if not stat.S_ISREG(st.st_mode):
            raise AuthError(f"ddstore: not authenticated: key file {path} is not a regular file")
        if st.st_uid != euid and euid != 0:
            raise AuthError(f"ddstore: not authenticated: key file {path} belongs to uid {st.st_uid}, not {euid}")
        if st.st_mode & 0o077:
            raise AuthError(f"ddstore: not authenticated: key file {path} has mode {st.st_mode & 0o777:o}: want 0600 "
                            f"(no access for others)")
        text = os.read(fd, 2 * KEY + 2)
    finally:
        os.close(fd)
    try:
        key = bytes.fromhex(text.decode("ascii").strip())
    except (UnicodeDecodeError, ValueError):
        key = b""
    if len(key) != KEY:
        raise AuthError(f"ddstore: not authenticated: a key is {2 * KEY} hex digits (key file {path})")
    return key


def client_key(socket_path):
    """(key, where it came from): DDSTORE_SECRET's client key when it is set
    (an agent of another job, or a stale one, is then found out), else the
    agent's key file's."""
    secret = os.environb.get(SECRET_ENV.encode(), b"")
    if secret:
        return keys_from_secret(secret)[0], SECRET_ENV
    path = key_file(socket_path)
    try:
        return read_key_file(path), path
    except AuthError as e:
        raise AuthError(f"{e} ({SECRET_ENV} is unset, so the key comes from the agent's key file)") from None


def handshake(lane, socket_path):
    """Runs the client's side of the handshake on a new lane (its requests
    get ids 1 and 2); raises AuthError when either side does not hold the
    key."""
    key, source = client_key(socket_path)
    ni = os.urandom(NONCE)
    e = _wire.Encoder()
    e.b += ni
    try:
        body = lane.call(_wire.OP_AUTH, e)
    except AuthError as err:
        raise AuthError(f"agent at {socket_path}, with the key of {source}: {err}") from None
    if len(body) != NONCE + 32:
        lane.broken = True
        raise ProtocolError(f"ddstore: protocol error: auth reply of {len(body)} bytes: want {NONCE + 32}")
    nr, theirs = bytes(body[:NONCE]), bytes(body[NONCE:])
    if not hmac.compare_digest(theirs, mac(key, "client", "responder", ni, nr)):
        lane.broken = True
        raise AuthError(f"ddstore: not authenticated: the agent at {socket_path} does not hold the key of {source} "
                        f"(its proof does not match)")
    e = _wire.Encoder()
    e.b += mac(key, "client", "initiator", ni, nr)
    try:
        body = lane.call(_wire.OP_AUTH_PROOF, e)
    except AuthError as err:
        raise AuthError(f"agent at {socket_path}, with the key of {source}: {err}") from None
    if body:
        lane.broken = True
        raise ProtocolError(f"ddstore: protocol error: auth-proof reply of {len(body)} bytes: want none")

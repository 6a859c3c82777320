"""Authentication against real agents: a client proves the key (DDSTORE_SECRET's,
else the agent's key file) before anything else; anything else is refused and
counted, and no key shows where it could be seen."""

import json
import os
import socket
import stat
import subprocess
import time

import numpy as np
import pytest

import ddstore
from ddstore import _auth, _wire

SECRET = "python-auth-test-secret-0123456789"


def agent_info(job, node=None):
    node = node or os.uname().nodename
    out = subprocess.run([job["DDSTORE_BIN"], "info", "--json", "--namespace", job["DDSTORE_NAMESPACE"], "--node", node,
                          "--run-dir", job["DDSTORE_RUN_DIR"]], capture_output=True, text=True, check=True,
                         env={k: v for k, v in os.environ.items() if k != "DDSTORE_SECRET"})
    return json.loads(out.stdout)


@pytest.fixture
def store(job):
    s = ddstore.Store()
    s.add("v", np.arange(12, dtype=np.int64).reshape(4, 3))
    yield s
    s.close()


def raw(store):
    c = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    c.settimeout(10)
    c.connect(store.socket_path)
    return c


def read_frame(c):
    hdr = b""
    while len(hdr) < _wire.HEADER.size:
        b = c.recv(_wire.HEADER.size - len(hdr))
        if not b:
            raise EOFError
        hdr += b
    op, status, blen, rid, _ = _wire.parse_header(hdr)
    body = b""
    while len(body) < blen:
        body += c.recv(blen - len(body))
    return op, status, rid, body


def closed(c):
    try:
        return c.recv(64) == b""
    except ConnectionResetError:
        return True


def test_key_file(store):
    path = _auth.key_file(store.socket_path)
    st = os.stat(path)
    assert stat.S_IMODE(st.st_mode) == 0o600 and st.st_uid == os.geteuid()
    assert stat.S_IMODE(os.stat(os.path.dirname(path)).st_mode) == 0o700
    assert len(_auth.read_key_file(path)) == 32


def test_hello_first_is_refused_and_counted(store, job):
    c = raw(store)
    c.sendall(store._hello().frame(_wire.OP_HELLO, 1))
    op, status, rid, body = read_frame(c)
    err = _wire.status_error(status, body)
    assert (op, rid, type(err)) == (_wire.OP_HELLO, 1, ddstore.AuthError), err
    assert "before the authentication handshake" in str(err)
    assert closed(c)
    c.close()
    assert agent_info(job)["counters"]["refused_connections"] == 1


def test_replayed_handshake_is_refused(store, job):
    """A handshake recorded from a client that held the key, replayed on a new
    connection, fails: the agent's nonce is new."""
    key = _auth.read_key_file(_auth.key_file(store.socket_path))
    ni = os.urandom(32)
    sent = []
    c = raw(store)
    e = _wire.Encoder()
    e.b += ni
    sent.append(bytes(e.frame(_wire.OP_AUTH, 1)))
    c.sendall(sent[0])
    _, status, _, body = read_frame(c)
    assert status == 0
    e = _wire.Encoder()
    e.b += _auth.mac(key, "client", "initiator", ni, body[:32])
    sent.append(bytes(e.frame(_wire.OP_AUTH_PROOF, 2)))
    c.sendall(sent[1])
    assert read_frame(c)[1] == 0  # accepted
    c.close()

    c = raw(store)
    c.sendall(sent[0])
    assert read_frame(c)[1] == 0
    c.sendall(sent[1])
    _, status, _, body = read_frame(c)
    err = _wire.status_error(status, body)
    assert type(err) is ddstore.AuthError and "does not match" in str(err), err
    assert closed(c)
    c.close()
    assert agent_info(job)["counters"]["refused_connections"] == 1


def test_another_secret_is_refused(store, job, monkeypatch):
    monkeypatch.setenv("DDSTORE_SECRET", SECRET)
    with pytest.raises(ddstore.AuthError, match="does not hold the key of DDSTORE_SECRET"):
        ddstore.Store(spawn=False)
    monkeypatch.setenv("DDSTORE_SECRET", "short")
    with pytest.raises(ddstore.ArgumentError, match="DDSTORE_SECRET of 5 bytes: want at least 16"):
        ddstore.Store(spawn=False)
    monkeypatch.delenv("DDSTORE_SECRET")
    # The client hung up on the agent's proof: the agent counts it, once it
    # has seen the hang-up.
    deadline = time.monotonic() + 10
    while agent_info(job)["counters"]["refused_connections"] != 1:
        assert time.monotonic() < deadline, agent_info(job)["counters"]
        time.sleep(0.01)
    out = np.empty((1, 3), np.int64)
    store.get("v", out, 2)  # the store that holds the key is still served
    assert out.tolist() == [[6, 7, 8]]


def test_key_file_others_may_read_is_refused(store):
    path = _auth.key_file(store.socket_path)
    os.chmod(path, 0o644)
    try:
        with pytest.raises(ddstore.AuthError, match="has mode 644: want 0600"):
            ddstore.Store(spawn=False)
    finally:
        os.chmod(path, 0o600)


def test_secret_shows_nowhere(job, monkeypatch):
    """With DDSTORE_SECRET, the agent a store starts has it from the
    environment: not on its command line, not in its log, not in its info."""
    monkeypatch.setenv("DDSTORE_SECRET", SECRET)
    s = ddstore.Store()
    try:
        s.add("v", np.zeros((2, 2)))
        # ddstore info without the secret would be refused: ask with it.
        out = subprocess.run([job["DDSTORE_BIN"], "info", "--json", "--namespace", job["DDSTORE_NAMESPACE"],
                              "--run-dir", job["DDSTORE_RUN_DIR"]], capture_output=True, text=True, check=True)
        info = json.loads(out.stdout)
        assert info["auth"] == "secret (DDSTORE_SECRET)"
        with open(f"/proc/{info['pid']}/cmdline", "rb") as f:
            cmdline = f.read()
        with open(s.socket_path + ".log", "rb") as f:
            log = f.read()
        client, peer = _auth.keys_from_secret(SECRET.encode())
        for what, text in (("command line", cmdline), ("log", log), ("info", out.stdout.encode())):
            for k in (SECRET.encode(), client.hex().encode(), peer.hex().encode()):
                assert k not in text, f"a key shows in the agent's {what}"
    finally:
        s.close()


def test_segment_symlink_is_refused(tmp_path):
    from ddstore._shm import Segment
    target = tmp_path / "real"
    target.write_bytes(b"\0" * 64)
    target.chmod(0o600)
    link = tmp_path / "link"
    link.symlink_to(target)
    with pytest.raises(ddstore.ArgumentError, match="symbolic link"):
        Segment(str(link), writable=False)

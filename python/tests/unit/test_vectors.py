"""The Python client against the test vectors the Go implementation writes
(testdata/vectors.json, made by vectors_test.go; regenerate it with
`go test -run TestVectors . ./internal/client -args -update` in the repository root). Each test
rebuilds or decodes what Go recorded with the client's own code, so the two
clients cannot drift apart unnoticed."""

import json
import os
import re
import sys
import types

import numpy as np
import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
# python/, two folders up: the package under test.
PY = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, PY)

import ddstore  # noqa: E402
from ddstore import _agent, _auth, _env, _errors, _fence, _lanes, _vars, _wire, store  # noqa: E402

VECTORS = os.path.join(os.path.dirname(PY), "testdata", "vectors.json")

with open(VECTORS, encoding="utf-8") as _f:
    V = json.load(_f)


def _ids(cases):
    return [c["name"] for c in cases]


# ---- frames -------------------------------------------------------------------


def _shard(e, f):
    return _wire.shard(e, f["name"], f["node"], f["rank"], f["size"], f["rows"], f["disp"], f["itemsize"],
                       f["timeout_ms"], f["attempt"], f["failed"], f["dtype"], f["backing"], f["total"],
                       f["kind"], f["items"], f["shape"], f["group"], f["client"], f["client_age_ms"], f["why"])


def _body(message, f):
    """The request body of a message, built the way ddstore/store.py builds it."""
    e = _wire.Encoder()
    if message == "Hello":  # Store._hello
        return e.string(f["namespace"]).string(f["node"]).i64(f["rank"], f["size"], f["local_rank"],
                                                              f["local_size"], f["pid"])
    if message == "Shard":  # Store.add
        return _shard(e, f)
    if message == "Name":  # Lookup, Free
        return e.string(f["name"]).string(f["node"]).i64(f["rank"])
    if message == "Read":  # Store._fetch
        return (e.string(f["name"]).u32(f["region"]).i64(f["id"]).i64s(np.array(f["globals"], dtype=np.int64))
                .i64s(np.array(f["offsets"], dtype=np.int64)))
    if message == "ReadRange":  # Store._fetch_range
        return _wire.read_range(e, f["name"], f["region"], f["id"], f["start"], f["count"], f["offset"])
    if message == "FetchRange":  # peer protocol: the client never sends it, but its encoder can
        return e.string(f["name"]).i64(f["id"], f["start"], f["count"])
    if message == "Barrier":  # Store.fence
        return _fence.barrier_request(f["key"], f["rank"], f["size"], f["seq"], f["timeout_ms"] / 1000, f["client"],
                                      f["client_age_ms"])
    if message == "Region":  # register(), Unregister
        return e.u32(f["id"]).i64(f["size"])
    if message == "Fetch":  # peer protocol: the client never sends it, but its encoder can
        return e.string(f["name"]).i64(f["id"]).i64s(np.array(f["globals"], dtype=np.int64))
    if message == "Gone":  # peer protocol, likewise
        return e.string(f["node"]).u64(f["client"]).i64(f["pid"], f["rank"], f["size"])
    if message == "PeerOffsets":  # peer protocol, likewise
        return e.string(f["name"]).i64(f["id"], f["rank"], f["first"], f["count"])
    if message == "Round":  # peer protocol, likewise: what is wanted back, then a Shard
        e.u8(f["want"])
        return _shard(e, f)
    if message == "Shards":  # peer protocol, likewise: a count, then each Shard
        e.u32(len(f["shards"]))
        for s in f["shards"]:
            _shard(e, s)
        return e
    if message == "Names":  # peer protocol, likewise: a count, then each Name
        e.u32(len(f["names"]))
        for n in f["names"]:
            e.string(n["name"]).string(n["node"]).i64(n["rank"])
        return e
    if message == "Drop":  # peer protocol, likewise (PeerDrop, PeerTable)
        return e.string(f["name"]).i64(f["id"])
    assert message is None, message
    return e  # Info: empty body


REQUESTS = {k: v for k, v in V["frames"].items() if not v["reply"]}


def test_vectors_hold_every_request():
    assert {v["op"] for v in REQUESTS.values()} >= {_wire.OP_HELLO, _wire.OP_CREATE, _wire.OP_PUBLISH, _wire.OP_LOOKUP,
                                                    _wire.OP_READ, _wire.OP_REGISTER, _wire.OP_UNREGISTER,
                                                    _wire.OP_FREE, _wire.OP_INFO, _wire.OP_BARRIER,
                                                    _wire.OP_READ_RANGE}


@pytest.mark.parametrize("name", sorted(REQUESTS))
def test_request_frame(name):
    v = REQUESTS[name]
    got = bytes(_body(v.get("message"), v["fields"]).frame(v["op"], v["id"]))
    assert got.hex() == v["hex"]


@pytest.mark.parametrize("name", sorted(V["frames"]))
def test_parse_header(name):
    v = V["frames"][name]
    b = bytes.fromhex(v["hex"])
    op, status, blen, req_id, payload = _wire.parse_header(b[:_wire.HEADER.size])
    assert (op, status, blen, req_id, payload) == (v["op"], v["status"], len(b) - _wire.HEADER.size, v["id"],
                                                    v["payload"])


@pytest.mark.parametrize("name", [n for n in sorted(REQUESTS) if REQUESTS[n].get("message") == "Hello"])
def test_store_hello(name, monkeypatch):
    """Store._hello itself, not a copy of it."""
    v = REQUESTS[name]
    f = v["fields"]
    monkeypatch.setattr(store.os, "getpid", lambda: f["pid"])
    s = types.SimpleNamespace(reader=False, namespace=f["namespace"], node=f["node"], rank=f["rank"], size=f["size"],
                              _hello_rank=f["rank"], _hello_size=f["size"], local_rank=f["local_rank"],
                              local_size=f["local_size"])
    assert bytes(store.Store._hello(s).frame(v["op"], v["id"])).hex() == v["hex"]


def test_error_frame():
    v = V["frames"]["error_unknown"]
    b = bytes.fromhex(v["hex"])
    op, status, blen, req_id, payload = _wire.parse_header(b[:_wire.HEADER.size])
    assert (op, status, req_id, payload) == (_wire.OP_LOOKUP, v["status"], v["id"], 0)
    body = b[_wire.HEADER.size:]
    assert len(body) == blen
    e = _wire.status_error(status, body)
    assert type(e) is ddstore.UnknownVariable
    assert e.code == v["status"]
    assert str(e) == v["fields"]["text"]


@pytest.mark.parametrize("case", [pytest.param(c, id=c["name"]) for c in V["status_errors"]])
def test_status_error(case):
    b = bytes.fromhex(case["hex"])
    _, status, blen, _, _ = _wire.parse_header(b[:_wire.HEADER.size])
    assert status == case["status"]
    e = _wire.status_error(status, b[_wire.HEADER.size:_wire.HEADER.size + blen])
    assert isinstance(e, ddstore.Error)
    assert e.code == case["code"]
    assert str(e) == bytes.fromhex(case["message_hex"]).decode("utf-8", "replace")


# ---- bodies -------------------------------------------------------------------


@pytest.mark.parametrize("name", [n for n, b in sorted(V["bodies"].items()) if b["message"] == "Table"])
def test_table_decode(name):
    v = V["bodies"][name]
    t = _wire.Table.decode(bytes.fromhex(v["hex"]))
    got = {k: getattr(t, k) for k in _wire.Table.__slots__}
    for k in ("shard_rows", "rank_node", "shard_items", "shape"):
        assert got[k].dtype == np.int64
        got[k] = got[k].tolist()
    assert got == v["fields"]


def test_hello_reply_decode():
    v = V["bodies"]["hello_reply"]
    d = _wire.Decoder(bytes.fromhex(v["hex"]))
    got = {"node": d.string(), "agent_pid": d.i64()}
    d.done()
    assert got == v["fields"]


def test_create_reply_decode():
    v = V["bodies"]["create_reply"]
    d = _wire.Decoder(bytes.fromhex(v["hex"]))
    got = {"path": d.string32()}
    d.done()
    assert got == v["fields"]


def test_register_reply_decode():
    """_lanes.register() reads the region id out of the reply."""
    v = V["bodies"]["register_reply"]
    body = bytes.fromhex(v["hex"])
    lane = types.SimpleNamespace(call=lambda op, enc, fds=None, timeout=None: body)
    assert _lanes.register(lane, types.SimpleNamespace(size=0, fd=-1), None) == v["fields"]["id"]


# ---- status codes -------------------------------------------------------------

# The Python exception of each Go sentinel of internal/base/errors.go.
CLASSES = {
    "ErrIndex": ddstore.IndexOutOfRange, "ErrGeometry": ddstore.GeometryError, "ErrUnknown": ddstore.UnknownVariable,
    "ErrExists": ddstore.VariableExists, "ErrBuffer": ddstore.BadBuffer, "ErrFreed": ddstore.FreedVariable,
    "ErrClosed": ddstore.ClosedError, "ErrTimeout": ddstore.Timeout, "ErrPeer": ddstore.PeerError,
    "ErrProtocol": ddstore.ProtocolError, "ErrNoAgent": ddstore.NoAgent, "ErrArgument": ddstore.ArgumentError,
    "ErrInternal": ddstore.InternalError, "ErrAuth": ddstore.AuthError, "ErrRegion": ddstore.RegionLost,
}


def test_status_codes():
    codes = V["status_codes"]
    assert {s["sentinel"] for s in codes.values()} == set(CLASSES), "a Go sentinel without a Python exception"
    for code, s in codes.items():
        cls = CLASSES[s["sentinel"]]
        assert cls.code == int(code), s
        e = _errors.from_status(int(code), s["text"])
        assert type(e) is cls and str(e) == s["text"]
    # Every exception class of the client is some sentinel's.
    assert {c.code for c in _errors._BY_CODE.values()} == {int(c) for c in codes}
    # A code from a newer agent is an InternalError.
    assert type(_errors.from_status(max(int(c) for c in codes) + 1, "m")) is ddstore.InternalError


def test_dtypes():
    """The item types and their sizes are Go's (internal/layout)."""
    from ddstore import dtypes
    assert list(dtypes.NAMES) == [d["name"] for d in V["dtypes"]]
    for d in V["dtypes"]:
        assert dtypes.itemsize(d["name"]) == d["size"], d
        assert dtypes.dtype_name(d["name"]) == d["name"]


def test_exit_codes():
    """ddstore._errors reads the `ddstore` command's exit statuses as
    cli.ExitCode sets them: each sentinel's kind, and the statuses kept
    apart."""
    x = V["exit_codes"]
    assert (_errors.EXIT_USAGE, _errors.EXIT_AGENT_RUNS, _errors.EXIT_KIND) == (x["usage"], x["agent_runs"],
                                                                               x["kind_base"])
    assert x["agent_runs"] == V["naming"]["agent_runs_exit"]
    assert set(x["kinds"]) == set(V["status_codes"])
    for code, k in x["kinds"].items():
        e = _errors.from_exit(k["exit"], "m")
        assert type(e) is CLASSES[k["sentinel"]] and e.code == int(code) and str(e) == "m", k
    assert type(_errors.from_exit(x["agent_runs"], "m")) is ddstore.VariableExists  # ErrAgentRuns is an ErrExists
    assert type(_errors.from_exit(x["no_kind"], "m")) is ddstore.InternalError
    for status in (1, x["usage"], x["kind_base"], max(k["exit"] for k in x["kinds"].values()) + 1, -9):
        assert type(_errors.from_exit(status, "m")) is ddstore.InternalError, status
    # The command lines Go ran: a flag the binary lacks is the usage status,
    # a bad value of a flag it takes a bad argument.
    by_args = {tuple(c["args"]): c["exit"] for c in x["commands"]}
    assert by_args[("schedule", "--no-such-flag")] == x["usage"]
    assert type(_errors.from_exit(by_args[("schedule", "--emit-rank", "4", "--ranks", "4")], "m")) is ddstore.ArgumentError


_SENTINEL_TEXT = {CLASSES[s["sentinel"]]: s["text"] for s in V["status_codes"].values()}


# Every exception class of the package: the sentinels' and the Python-only
# subclasses of them (ddstore.torch's, the sampler's, pyddstore's).
ERRORS = [getattr(ddstore, n) for n in ddstore.__all__
          if isinstance(getattr(ddstore, n), type) and issubclass(getattr(ddstore, n), ddstore.Error)]


def _made_up_messages():
    """(file, line, exception class name, message up to its first colon) of
    every `Cls("ddstore: ...` and `Cls(f"ddstore: ...` in the client,
    ddstore.torch included."""
    names = sorted((c.__name__ for c in ERRORS), key=len, reverse=True)
    pat = re.compile(r"\b(" + "|".join(names) + r')\(f?"(ddstore: [^:"]*)[:"]')
    src = os.path.join(PY, "ddstore")
    out = []
    for d, _, files in sorted(os.walk(src)):
        for fn in sorted(files):
            if fn.endswith(".py"):
                rel = os.path.relpath(os.path.join(d, fn), src)
                with open(os.path.join(d, fn), encoding="utf-8") as f:
                    for lineno, line in enumerate(f, 1):
                        out.extend((rel, lineno, cls, prefix) for cls, prefix in pat.findall(line))
    return out


def test_every_error_is_a_sentinels():
    """Each exception class of the package is, or derives from, the class of
    one Go sentinel, whose code it carries."""
    for c in ERRORS:
        if c is ddstore.Error:
            continue
        base = next((b for b in c.__mro__ if b in _SENTINEL_TEXT), None)
        assert base is not None and c.code == base.code, c


MESSAGES = _made_up_messages()


def test_message_scan_finds_messages():
    assert len(MESSAGES) > 20


@pytest.mark.parametrize("fn,lineno,cls_name,prefix", [pytest.param(*m, id=f"{m[0]}:{m[1]}") for m in MESSAGES])
def test_message_prefix(fn, lineno, cls_name, prefix):
    """A message the client makes up starts with its exception's sentinel
    text, as Go's base.Errorf writes it (or, for ArgumentError, with the
    text of Go's rendezvous.ErrBadEnv, which _env mirrors)."""
    cls = getattr(ddstore, cls_name)
    sentinel = next(b for b in cls.__mro__ if b in _SENTINEL_TEXT)
    ok = (_SENTINEL_TEXT[sentinel],) + ((V["env"]["error_text"],) if sentinel is ddstore.ArgumentError else ())
    assert prefix.startswith(ok), f"{fn}:{lineno}: {cls_name}({prefix!r}...), want a message starting with {ok}"


# ---- layout -------------------------------------------------------------------


@pytest.mark.parametrize("case", V["layout"], ids=_ids(V["layout"]))
def test_layout(case):
    rows = np.array(case["shard_rows"], dtype=np.int64)
    p = len(rows)
    t = types.SimpleNamespace(name="x", disp=1, itemsize=1, dtype="", shard_rows=rows,
                              rank_node=np.zeros(p, dtype=np.int64), nodes=["n"], addrs=["a"], paths=[], id=1,
                              backing="", total=0, kind=_wire.KIND_ROWS, shard_items=np.zeros(0, np.int64),
                              shape=np.zeros(0, np.int64), index="")
    v = _vars.Var(t, 0)  # builds the prefix sums the way a Store does
    assert v.total == case["total"]
    assert v.prefix.tolist() == case["first"] + [case["total"]]
    idx = np.array(case["globals"], dtype=np.int64)
    owner = np.searchsorted(v.prefix, idx, side="right") - 1  # Store._gather
    assert owner.tolist() == case["ranks"]
    assert (idx - v.prefix[owner]).tolist() == case["locals"]
    bad = np.array(case["out_of_range"], dtype=np.int64)
    assert ((bad < 0) | (bad >= v.total)).all()  # Store.get_batch's check


# ---- file names ---------------------------------------------------------------


@pytest.mark.parametrize("case", V["escape"]["names"], ids=repr)
def test_escape(case):
    assert _agent.escape(case["name"]) == case["escaped"]


@pytest.mark.parametrize("case", V["escape"]["sockets"], ids=lambda c: repr((c["namespace"], c["node"]))[:60])
def test_socket_path(case):
    assert _agent.socket_path(V["escape"]["run_dir"], case["namespace"], case["node"]) == case["path"]


# ---- launcher environments ----------------------------------------------------

_HOST = "hostname-must-not-be-used"


def _env_param(c):
    return pytest.param(c, id=c["name"])


ENV_CASES = V["env"]["cases"]


def test_env_cases_name_their_node():
    for c in ENV_CASES:
        assert c["env"].get("DDSTORE_NODE_ID") or c["env"].get("SLURMD_NODENAME"), c["name"]


@pytest.mark.parametrize("case", [_env_param(c) for c in ENV_CASES])
def test_from_env(case):
    if "identity" in case:
        i = case["identity"]
        got = _env.from_env(dict(case["env"]), hostname=_HOST)
        assert got.as_tuple() == (i["rank"], i["size"], i["local_rank"], i["local_size"], i["node"], i["launcher"])
    else:
        with pytest.raises(ddstore.ArgumentError) as ei:
            _env.from_env(dict(case["env"]), hostname=_HOST)
        msg = str(ei.value)
        assert case["error"]["var"] in msg
        assert msg.startswith(V["env"]["error_text"] + ": ")


def _go_quotes_to_repr(msg):
    """Go's message with its %q-quoted values written as Python's repr, the
    one known difference of wording between the two."""
    return re.sub(r'=("(?:[^"\\]|\\.)*")', lambda m: "=" + repr(json.loads(m.group(1))), msg)


ENV_ERRORS = [c for c in ENV_CASES if "error" in c]


@pytest.mark.parametrize("case", ENV_ERRORS, ids=_ids(ENV_ERRORS))
def test_from_env_message(case):
    with pytest.raises(ddstore.ArgumentError) as ei:
        _env.from_env(dict(case["env"]), hostname=_HOST)
    assert str(ei.value) == _go_quotes_to_repr(case["error"]["message"])


def test_from_env_error_code():
    for c in ENV_CASES:
        if "error" in c:
            assert ddstore.ArgumentError.code == c["error"]["code"], c["name"]


# ---- authentication -------------------------------------------------------------

AUTH = V["auth"]


def test_auth_keys_from_secret():
    client, peer = _auth.keys_from_secret(AUTH["secret"].encode())
    assert (client.hex(), peer.hex()) == (AUTH["client_key"], AUTH["peer_key"])
    assert (_auth.SALT.decode(), _auth.ITERATIONS, _auth.MIN_SECRET) == (AUTH["salt"], AUTH["iterations"],
                                                                        AUTH["min_secret_bytes"])
    want = f"DDSTORE_SECRET of 15 bytes: want at least {AUTH['min_secret_bytes']}"
    with pytest.raises(ddstore.ArgumentError, match=want):
        _auth.keys_from_secret(b"Fifteen_bytes!!")


@pytest.mark.parametrize("hs", AUTH["handshakes"], ids=lambda h: h["proto"])
def test_auth_macs(hs):
    key, ni, nr = (bytes.fromhex(hs[k]) for k in ("key", "initiator_nonce", "responder_nonce"))
    assert _auth.mac(key, hs["proto"], "responder", ni, nr).hex() == hs["responder_mac"]
    assert _auth.mac(key, hs["proto"], "initiator", ni, nr).hex() == hs["initiator_mac"]
    for role in ("responder", "initiator"):
        assert hs[role + "_context"] == f"ddstore-auth-v1 {hs['proto']} {role}"


class _ScriptedAgent:
    """A lane whose agent answers with the vectors' replies, recording the
    client's requests."""

    def __init__(self, frames, tamper=False):
        self.frames, self.tamper, self.req, self.broken, self.sent = frames, tamper, 0, False, []

    def call(self, op, enc, fds=None, timeout=None):
        self.req += 1
        self.sent.append(bytes(enc.frame(op, self.req)).hex())
        reply = bytes.fromhex(self.frames["auth_reply" if op == _wire.OP_AUTH else "auth_proof_reply"]["hex"])
        body = bytearray(reply[_wire.HEADER.size:])
        if self.tamper:
            body[-1] ^= 1
        return body


def test_auth_client_handshake(monkeypatch):
    """The client's side of the handshake, with the vectors' nonces: the
    frames it sends are Go's, and it accepts Go's replies."""
    hs = next(h for h in AUTH["handshakes"] if h["proto"] == "client")
    monkeypatch.setenv("DDSTORE_SECRET", AUTH["secret"])
    monkeypatch.setattr(_auth.os, "urandom", lambda n: bytes.fromhex(hs["initiator_nonce"]))
    lane = _ScriptedAgent(hs["frames"])
    _auth.handshake(lane, "/nonexistent/s.sock")
    assert lane.sent == [hs["frames"]["auth"]["hex"], hs["frames"]["auth_proof"]["hex"]]
    assert [hs["frames"][k]["op"] for k in ("auth", "auth_proof")] == [_wire.OP_AUTH, _wire.OP_AUTH_PROOF]
    # An agent whose proof does not match is refused, before the client
    # proves anything.
    lane = _ScriptedAgent(hs["frames"], tamper=True)
    with pytest.raises(ddstore.AuthError, match="does not hold the key of DDSTORE_SECRET"):
        _auth.handshake(lane, "/nonexistent/s.sock")
    assert len(lane.sent) == 1 and lane.broken


def test_auth_refused_hello():
    r = AUTH["refused_hello"]
    frame = bytes.fromhex(r["hex"])
    op, status, blen, rid, payload = _wire.parse_header(frame[:_wire.HEADER.size])
    e = _wire.status_error(status, frame[_wire.HEADER.size:])
    assert (op, status, type(e), str(e)) == (_wire.OP_HELLO, r["status"], ddstore.AuthError, r["message"])


def test_direct_key_and_handshake(monkeypatch):
    """The direct key (HMAC of the peer key) and the direct handshake a
    client runs on another node's peer port: the frames it sends are Go's,
    over a socket pair whose other end answers Go's replies."""
    import hashlib
    import hmac as hmac_
    import socket
    import threading

    from ddstore import _direct
    peer = bytes.fromhex(AUTH["peer_key"])
    key = hmac_.new(peer, AUTH["direct_key_label"].encode(), hashlib.sha256).digest()
    assert key.hex() == AUTH["direct_key"]
    f = AUTH["direct_key_frames"]
    assert (f["request"]["op"], f["reply"]["op"]) == (_direct.OP_DIRECT_KEY, _direct.OP_DIRECT_KEY)
    assert bytes.fromhex(f["reply"]["hex"])[_wire.HEADER.size:] == key
    hs = next(h for h in AUTH["handshakes"] if h["proto"] == "direct")
    assert hs["key"] == AUTH["direct_key"]
    assert [hs["frames"][k]["op"] for k in ("auth", "auth_proof")] == [_direct.OP_DIRECT_AUTH, _direct.OP_DIRECT_AUTH_PROOF]
    monkeypatch.setattr(_direct.os, "urandom", lambda n: bytes.fromhex(hs["initiator_nonce"]))
    a, b = socket.socketpair()
    got = []

    def agent():
        for k, reply in (("auth", "auth_reply"), ("auth_proof", "auth_proof_reply")):
            want = bytes.fromhex(hs["frames"][k]["hex"])
            buf = b""
            while len(buf) < len(want):
                buf += b.recv(len(want) - len(buf))
            got.append(buf.hex())
            b.sendall(bytes.fromhex(hs["frames"][reply]["hex"]))

    t = threading.Thread(target=agent)
    t.start()
    c = _direct.Conn.__new__(_direct.Conn)
    c.addr, c.req, c.hdr, c.sock = "pair", 0, bytearray(_wire.HEADER.size), a
    c._handshake(key)
    t.join()
    assert got == [hs["frames"]["auth"]["hex"], hs["frames"]["auth_proof"]["hex"]]
    a.close()
    b.close()

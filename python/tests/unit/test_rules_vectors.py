"""The rules the Python client shares with the Go one, checked against the
vectors the Go code generates (testdata/rules.json, by
internal/client/rules_vectors_test.go: `go test -run TestVectors .
./internal/client -args -update`): name checks, backing file specs, the
agent's spawn and the dial back-off, and when a read into a receive buffer
registers the buffers again. Each check calls the Python code that enforces
the rule; none needs an agent (the row geometry, which the agent checks
too, is in integration/test_rules_geometry.py)."""

import json
import os
import struct

import numpy as np
import pytest

import ddstore
from ddstore import _agent, _direct, _lanes, _wire
from ddstore import store as store_mod
from ddstore._errors import Error, NoAgent, from_status

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

with open(os.path.join(ROOT, "testdata", "rules.json"), encoding="utf-8") as f:
    V = json.load(f)


def error_class(code):
    """The exception class the client raises for a wire code (0: none)."""
    return None if code == 0 else type(from_status(code, ""))


def check_raises(code, f, *args):
    want = error_class(code)
    if want is None:
        f(*args)
        return
    with pytest.raises(Error) as e:
        f(*args)
    assert type(e.value) is want, f"{args!r}: raised {type(e.value).__name__}, want {want.__name__}"


@pytest.mark.parametrize("case", V["names"]["namespace_node"], ids=lambda c: f"{c['bytes']}B")
def test_namespace_and_node_names(case):
    assert len(case["name"].encode()) == case["bytes"]
    for what in ("namespace", "node"):
        check_raises(case["code"], _agent.check_name, what, case["name"])


@pytest.mark.parametrize("case", V["names"]["variable"], ids=lambda c: f"{c['bytes']}B")
def test_variable_names(case):
    assert len(case["name"].encode()) == case["bytes"]
    check_raises(case["code"], store_mod._check_name, case["name"])


def test_backing_specs(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with open(V["backing"]["hdf5_signature_file"], "wb") as f:
        f.write(b"\x89HDF\r\n\x1a\nrest of the file")
    cwd = os.getcwd()
    for case in V["backing"]["specs"]:
        if case["code"]:
            check_raises(case["code"], store_mod._absolute_spec, "v", case["spec"])
        else:
            assert store_mod._absolute_spec("v", case["spec"]) == case["sent"].replace("$CWD", cwd, 1), case


def test_ragged_backing_pairs(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with open(V["backing"]["hdf5_signature_file"], "wb") as f:
        f.write(b"\x89HDF\r\n\x1a\nrest of the file")
    cwd = os.getcwd()
    for case in V["backing"]["ragged_pairs"]:
        pair = (case["values"], case["offsets"])
        if case["code"]:
            check_raises(case["code"], store_mod._check_ragged_backing, "v", pair, 1, 0)
        else:
            sent, total = store_mod._check_ragged_backing("v", pair, 1, 0)
            assert (sent, total) == (case["sent"].replace("$CWD", cwd), 1), case


def test_ragged_backing_rows():
    for case in V["backing"]["ragged_rows"]:
        check_raises(case["code"], store_mod._check_ragged_backing, "v", ("/d/v.npy", "/d/o.npy"), case["total"],
                     case["nrows"])


def test_backing_rows():
    for case in V["backing"]["rows"]:
        check_raises(case["code"], store_mod._check_backing, "v", "/d/x.npy", case["total"], case["nrows"])


class _Clock:
    """The time the agent's connect sees: it moves only when it sleeps."""

    def __init__(self):
        self.now = 0.0
        self.sleeps = []

    def monotonic(self):
        return self.now

    def sleep(self, s):
        self.sleeps.append(s)
        self.now += s


def _connect_without_agent(monkeypatch, local_rank, agent_wait):
    """_lanes.Agent.connect with no agent ever answering, on a clock of its
    own: the pauses between dials, and when the rank started an agent."""
    clock = _Clock()
    monkeypatch.setattr(_lanes.time, "monotonic", clock.monotonic)
    monkeypatch.setattr(_lanes.time, "sleep", clock.sleep)

    def no_agent(*a, **kw):
        raise NoAgent("ddstore: no agent: nothing listens")

    spawned = []
    monkeypatch.setattr(_lanes, "Lane", no_agent)
    monkeypatch.setattr(_lanes._agent, "spawn", lambda *a, **kw: spawned.append(clock.now))
    agent = _lanes.Agent("job", "n0", "/nonexistent/job.n0.sock", lambda: b"", 1.0, agent_wait, True, local_rank,
                         (), None)
    with pytest.raises(NoAgent):
        agent.connect()
    return clock, spawned


def test_dial_backoff(monkeypatch):
    clock, spawned = _connect_without_agent(monkeypatch, 0, 20.0)
    want = V["spawn"]["waits_s"]
    assert clock.sleeps[:len(want)] == pytest.approx(want)
    assert all(w == pytest.approx(want[-1]) for w in clock.sleeps[len(want):])
    assert spawned == [0.0], "local rank 0 starts the agent at once"


@pytest.mark.parametrize("case", V["spawn"]["grace"], ids=lambda c: f"wait{c['agent_wait_s']}s")
def test_spawn_grace(monkeypatch, case):
    clock, spawned = _connect_without_agent(monkeypatch, 1, case["agent_wait_s"])
    assert len(spawned) == 1, "another local rank starts the agent once, after the grace"
    # The first dial after the grace starts it: after the first pause that
    # ends past the grace, not before.
    assert spawned[0] > case["grace_s"] or (case["grace_s"] == 0 and spawned[0] >= 0)
    before = [t for t in np.cumsum([0.0] + clock.sleeps) if t < spawned[0]]
    assert not before or before[-1] <= case["grace_s"] + 1e-9


def test_spawn_args(monkeypatch):
    a = V["spawn"]["args"]
    ran = []

    class Done:
        returncode, stdout, stderr = 0, "", ""

    monkeypatch.setattr(_agent.subprocess, "run", lambda args, **kw: ran.append(args) or Done())
    _agent.spawn(a["namespace"], a["node"], a["socket"], a["extra"], binary="/bin/ddstore")
    assert ran == [["/bin/ddstore", *a["argv"]]]


@pytest.mark.parametrize("case", V["region_recovery"], ids=lambda c: c["case"])
def test_region_recovery(case):
    """Store._fetch (through LanePool.read) registers its receive buffers
    again and reads once more exactly when the agent's reply says it no
    longer holds the buffer."""
    if case["code"] == 0:
        return  # a read that succeeds recovers nothing
    msg = case["message"].encode()
    err = _wire.status_error(case["code"], struct.pack("<I", len(msg)) + msg)
    assert type(err) is error_class(case["code"])
    calls = []

    class Pool:
        read = _lanes.LanePool.read  # the retry under test; lanes faked below

        def with_lane(self, f):
            calls.append("read")
            if len(calls) == 1:
                raise err

        def renew_ctl(self):
            calls.append("register")

    region = type("R", (), {"id": 7, "size": 64})()
    s = object.__new__(store_mod.Store)
    s._pool = Pool()
    s._recv = type("Recv", (), {"region_of": lambda self, dst: (region, 0)})()
    s._timeout = 1.0
    s._direct = _direct.Pool(None, 1.0, False)  # reads through the agent only
    v = type("V", (), {"rb": 8, "name": "v", "id": 1})()
    dst = np.zeros((1, 8), np.uint8)
    try:
        s._fetch(v, dst, np.array([1]), np.array([0]))
    except Error as e:
        assert e is err
    assert (calls == ["read", "register", "read"]) == case["recover"], calls

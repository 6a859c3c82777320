"""Direct reads (docs/design.md, Reading): a small read of one other node's
rows goes straight to that node's agent over an authenticated, pooled TCP
connection; a forked child opens its own; a connection without the direct
key is refused; an idle one is closed; a variable freed and added again
never gives its old rows; direct=False reads through the own agent."""

import os

import numpy as np
import pytest

import ddstore
from conftest import SECRET, run_ranks, wait_until
from ddstore_bench.bench import _both

SCRIPT = r"""
import json, os, socket, subprocess, time
import numpy as np, ddstore
from ddstore import _direct

def agent_info(node):
    out = subprocess.run([os.environ["DDSTORE_BIN"], "info", "--json", "--namespace", os.environ["DDSTORE_NAMESPACE"],
                          "--node", node, "--run-dir", os.environ["DDSTORE_RUN_DIR"]],
                         check=True, capture_output=True, text=True).stdout
    return json.loads(out)

def wait(cond, what, timeout=20):
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, what
        time.sleep(0.01)

s = ddstore.Store()
r = s.rank
n = 50
def rows(shift):
    first = r * n
    return (np.arange(first, first + n, dtype=np.int64)[:, None] * 10 + np.arange(8) + shift).astype(np.int64)
def want(idx, shift):
    return np.asarray(idx, dtype=np.int64)[:, None] * 10 + np.arange(8) + shift
s.add("v", rows(0))
if r == 0:
    s._direct.idle_for = 0.05
    out = np.empty((4, 8), np.int64)
    idx = [55, 51, 99, 60]
    s.get_batch("v", out, idx)
    assert np.array_equal(out, want(idx, 0)), out
    s.get("v", out[:3], 70)
    assert np.array_equal(out[:3], want([70, 71, 72], 0))
    one = np.empty((1, 8), np.int64)
    s.get("v", one, 88)
    assert np.array_equal(one, want([88], 0))
    for start in (np.int32(89), np.int64(90), np.uint16(91)):  # numpy integers as the start
        s.get("v", one, start)
        assert np.array_equal(one, want([int(start)], 0)), start
    s.get("v", one, np.int64(2))  # and a row of this node
    assert np.array_equal(one, want([2], 0))
    # Rows of both nodes: this node's copied, the other's direct.
    s.get_batch("v", out, [3, 97, 4, 98])
    assert np.array_equal(out, want([3, 97, 4, 98], 0))
    p = s.get_profile("v")
    assert p["direct_rows"] == 4 + 3 + 1 + 3 + 2 and p["remote_rows"] == 13, p
    # The connection is closed once idle.
    wait(lambda: not s._direct.idle, "the direct connection idle-closed on the client")
    wait(lambda: agent_info("b")["counters"].get("direct_connections") == 0, "the direct connection gone at b's agent")
    # A forked child opens its own connection and reads the right rows.
    rd, wr = os.pipe()
    pid = os.fork()
    if pid == 0:
        ok = 0
        try:
            o = np.empty((5, 8), np.int64)
            s.get_batch("v", o, [90, 91, 92, 93, 94])
            ok = int(np.array_equal(o, want([90, 91, 92, 93, 94], 0)) and s.get_profile("v")["direct_rows"] == 18)
        finally:
            os.write(wr, bytes([ok]))
            os._exit(0)
    os.close(wr)
    assert os.read(rd, 1) == b"\x01", "forked child's direct read"
    os.waitpid(pid, 0)
    # A connection with a wrong key is refused, and counted.
    before = agent_info("b")["counters"]["refused_connections"]
    v = s._vars["v"]
    try:
        _direct.Conn(v.addrs[1], os.urandom(32), 10.0)
        raise AssertionError("a wrong direct key was accepted")
    except (_direct.Failed, OSError):
        pass
    wait(lambda: agent_info("b")["counters"]["refused_connections"] == before + 1, "the refusal counted")
    # direct=False: the same rows through the own agent.
    via = ddstore.Store(reader=True, direct=False)
    o = np.empty((4, 8), np.int64)
    via.get_batch("v", o, idx)
    assert np.array_equal(o, want(idx, 0)) and via.get_profile("v")["direct_rows"] == 0
    # A reader that keeps its table while the variable is freed and added
    # again with other rows: never the old rows.
    reader = ddstore.Store(reader=True)
    reader.get_batch("v", o, idx)
    assert reader.get_profile("v")["direct_rows"] == 4
s.fence()
s.free("v")
s.fence()
s.add("v", rows(1000))
s.fence()
if r == 0:
    for _ in range(3):
        reader.get_batch("v", o, idx)
        assert np.array_equal(o, want(idx, 1000)), o
        reader.get("v", o[:2], 60)
        assert np.array_equal(o[:2], want([60, 61], 1000)), o
    assert reader.get_profile("v")["direct_rows"] > 0
    reader.close()
    via.close()
s.fence()
s.free("v")
s.close()
print("ok", r)
"""


def test_direct_reads(job):
    outs = run_ranks(SCRIPT, ["a", "b"], job)
    assert [o.strip().splitlines()[-1] for o in outs] == ["ok 0", "ok 1"], outs


RAGGED = r"""
import numpy as np, ddstore

s = ddstore.Store()
r = s.rank
n = 20
def lengths(shift):
    return [(g + shift) % 5 for g in range(r * n, (r + 1) * n)]  # empty rows too
def values(shift):
    out = [(g * 1000 + shift + np.arange(k * 3)).reshape(k, 3) for g, k in zip(range(r * n, (r + 1) * n), lengths(shift))]
    return np.concatenate(out).astype(np.float32)
def want(idx, shift):
    ls = [(g + shift) % 5 for g in idx]
    vals = np.concatenate([(g * 1000 + shift + np.arange(k * 3)).reshape(k, 3) for g, k in zip(idx, ls)])
    return vals.astype(np.float32), np.asarray(ls)
def check(st, idx, shift):
    got, lens = st.get_ragged("g", idx)
    w, wl = want(idx, shift)
    assert np.array_equal(lens, wl), (idx, lens, wl)
    assert np.array_equal(got, w), (idx, got, w)
    return int(((wl > 0) & (np.asarray(idx) // n != r)).sum())  # rows of other nodes
def prof(st):
    p = st.get_profile("g")
    return p["direct_rows"], p["remote_rows"]
s.add_ragged("g", values(0), lengths(0))
s.fence()
if r == 0:
    # Rows of node b alone: direct, received in place.
    k = check(s, [21, 22, 23, 24, 26], 0)
    assert prof(s) == (k, k), prof(s)
    # This node's rows between b's: direct, then placed.
    k += check(s, [1, 27, 2, 28, 3, 29, 25], 0)
    assert prof(s) == (k, k), prof(s)
    # One row of node b into a destination of the caller's.
    out = np.full((9, 3), -1, np.float32)
    got, lens = s.get_ragged("g", [33], out=out)
    assert np.array_equal(got, want([33], 0)[0]) and (out[got.shape[0]:] == -1).all()
    k += 1
    assert prof(s) == (k, k), prof(s)
    # Rows of nodes b and c: through the own agent.
    m = check(s, [21, 41, 22, 42], 0)
    assert prof(s) == (k, k + m), prof(s)
    # Over the byte bound: through the own agent.
    bound, s._direct.max = s._direct.max, 12
    m += check(s, [23, 24], 0)
    assert prof(s) == (k, k + m), prof(s)
    s._direct.max = bound
    # A reader that keeps its table while the variable is freed and added
    # again with other rows: never the old rows.
    reader = ddstore.Store(reader=True)
    dk = check(reader, [21, 22, 23], 0)
    assert prof(reader)[0] == dk
s.fence()
s.free("g")
s.fence()
s.add_ragged("g", values(7), lengths(7))
s.fence()
if r == 0:
    for _ in range(3):
        check(reader, [21, 22, 23], 7)
        check(reader, [1, 24, 30], 7)
    assert prof(reader)[0] > dk
    reader.close()
s.fence()
s.free("g")
s.close()
print("ok", r)
"""


def test_direct_ragged(job):
    outs = run_ranks(RAGGED, ["a", "b", "c"], job)
    assert [o.strip().splitlines()[-1] for o in outs] == ["ok 0", "ok 1", "ok 2"], outs


def _agent(job, node, rendezvous):
    """A node's agent, started by the test (so that it can kill it and start
    it again: a new peer port each time)."""
    import subprocess
    return subprocess.Popen([job["DDSTORE_BIN"], "agent", "--namespace", job["DDSTORE_NAMESPACE"], "--node", node,
                             "--run-dir", job["DDSTORE_RUN_DIR"], "--rendezvous", rendezvous,
                             "--peer-listen", "127.0.0.1:0", "--timeout", "5s"],
                            env={**os.environ, "DDSTORE_SECRET": SECRET}, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)


def _serves(job, node):
    import subprocess
    return subprocess.run([job["DDSTORE_BIN"], "info", "--namespace", job["DDSTORE_NAMESPACE"], "--node", node,
                           "--run-dir", job["DDSTORE_RUN_DIR"]], capture_output=True).returncode == 0


def _two_ranks(job, monkeypatch):
    """Stores of ranks 0 (node a) and 1 (node b) in this process, on agents
    the test started; the coordinator is a's."""
    import socket
    with socket.socket() as sk:
        sk.bind(("127.0.0.1", 0))
        rendezvous = f"127.0.0.1:{sk.getsockname()[1]}"
    monkeypatch.setenv("DDSTORE_SECRET", SECRET)
    agents = {"a": _agent(job, "a", rendezvous)}
    wait_until(lambda: _serves(job, "a"), 20, "agent a serving")
    agents["b"] = _agent(job, "b", rendezvous)
    wait_until(lambda: _serves(job, "b"), 20, "agent b serving")
    stores = [ddstore.Store(rank=r, size=2, local_rank=0, local_size=1, node=n, spawn=False)
              for r, n in enumerate("ab")]
    return rendezvous, agents, stores


def _rows(r, n, shift):
    g = np.arange(r * n, (r + 1) * n, dtype=np.int64)
    return g[:, None] * 10 + np.arange(8) + shift


def _read_ok(s, idx, shift):
    """Whether rows idx read now are those of shift (a read that fails, as
    while the owner's agent is down, is not)."""
    out = np.empty((len(idx), 8), np.int64)
    try:
        s.get_batch("v", out, np.asarray(idx, dtype=np.int64))
    except ddstore.Error:
        return False
    assert np.array_equal(out, np.asarray(idx, dtype=np.int64)[:, None] * 10 + np.arange(8) + shift), out
    return True


def test_direct_owner_restart(job, monkeypatch):
    """The owner node's agent killed and started again (on a new peer
    port): reads of its rows fail while it is down, never give a stale or
    wrong row, are right once it has re-adopted its shard, and go direct
    again to its new address (the client refreshes the address it holds
    once a direct read fails and the read through its own agent works,
    without looking the variable up again by hand)."""
    rendezvous, agents, stores = _two_ranks(job, monkeypatch)
    s0, s1 = stores
    try:
        n = 50
        _both(stores, lambda r, s: s.add("v", _rows(r, n, 0)))
        # A ragged variable too: rows of 1 to 3 units of 2 items.
        lens = lambda r: [g % 3 + 1 for g in range(r * 10, r * 10 + 10)]  # noqa: E731
        vals = lambda r: np.concatenate([np.full((k, 2), g, np.int32) for g, k in  # noqa: E731
                                         zip(range(r * 10, r * 10 + 10), lens(r))])
        _both(stores, lambda r, s: s.add_ragged("g", vals(r), lens(r)))

        def ragged_ok(gidx):
            got, ls = s0.get_ragged("g", gidx)
            assert list(ls) == [g % 3 + 1 for g in gidx] and np.array_equal(
                got, np.concatenate([np.full((g % 3 + 1, 2), g, np.int32) for g in gidx])), (got, ls)
        ragged_ok([12, 15, 19])
        assert s0.get_profile("g")["direct_rows"] == 3
        idx = [55, 51, 99, 60]
        assert _read_ok(s0, idx, 0)
        one = np.empty((1, 8), np.int64)
        s0.get("v", one, 88)
        assert np.array_equal(one, _rows(1, n, 0)[38:39])
        assert s0.get_profile("v")["direct_rows"] == 5
        old = s0._vars["v"].addrs[1]

        agents["b"].kill()
        agents["b"].wait()
        # The owner is down: an error (its peer's), never a row.
        out = np.full((4, 8), -1, np.int64)
        with pytest.raises(ddstore.Error):
            s0.get_batch("v", out, np.asarray(idx, dtype=np.int64))
        with pytest.raises(ddstore.Error):
            s0.get("v", one, 70)

        agents["b"] = _agent(job, "b", rendezvous)
        wait_until(lambda: _read_ok(s0, idx, 0), 30, "rows of the restarted owner read")
        v = s0._vars["v"]
        assert v.addrs[1] != old and v.addrs[1], (old, v.addrs)
        # Direct again, at the new address, for a batch and for get().
        before = s0.get_profile("v")["direct_rows"]
        assert _read_ok(s0, idx, 0)
        s0.get("v", one, 61)
        assert np.array_equal(one, _rows(1, n, 0)[11:12])
        assert s0.get_profile("v")["direct_rows"] == before + 5, s0.get_profile("v")
        # The ragged variable's addresses likewise: its first read after the
        # restart through the own agent, the next direct.
        ragged_ok([11, 13])
        assert s0.get_profile("g")["direct_rows"] == 3
        ragged_ok([14, 18, 10])
        assert s0.get_profile("g")["direct_rows"] == 6, s0.get_profile("g")

        # The restarted agent serves the shard's live rows: rank 1 updates
        # them (its mapping of the re-adopted segment), a fence, and rank 0
        # reads the new rows straight from the new address.
        s1.update("v", _rows(1, n, 500))
        _both(stores, lambda r, s: s.fence())
        before = s0.get_profile("v")["direct_rows"]
        assert _read_ok(s0, idx, 500)
        s0.get("v", one, 99)
        assert np.array_equal(one, _rows(1, n, 500)[49:50])
        assert s0.get_profile("v")["direct_rows"] == before + 5
    finally:
        for s in stores:
            s.close()
        for p in agents.values():
            p.terminate()
            p.wait()


def test_direct_failure_record_cleared(job, monkeypatch):
    """A direct connection's failure is recorded against its address (so
    that a read through the own agent looks the owner's address up again);
    once a connection to that address serves a read, the record is gone:
    the address works, and the records of a long job stay bounded by the
    addresses that fail for good."""
    rendezvous, agents, stores = _two_ranks(job, monkeypatch)
    s0, _ = stores
    try:
        n = 20
        _both(stores, lambda r, s: s.add("v", _rows(r, n, 0)))
        assert _read_ok(s0, [25, 21], 0)
        addr = s0._vars["v"].addrs[1]
        pool = s0._direct
        # A failure noted as a broken connection or a refused dial notes it.
        pool._note_moved(addr)
        assert addr in pool.moved
        before = s0.get_profile("v")["direct_rows"]
        assert _read_ok(s0, [30, 22, 39], 0)
        assert s0.get_profile("v")["direct_rows"] == before + 3
        assert addr not in pool.moved and addr not in pool.bad, (pool.moved, pool.bad)
    finally:
        for s in stores:
            s.close()
        for p in agents.values():
            p.terminate()
            p.wait()


MANY = r"""
import threading
from concurrent.futures import ThreadPoolExecutor
import numpy as np, ddstore
from ddstore import Error

s = ddstore.Store()
r = s.rank
n = 20
def lengths(g):
    return g % 4  # empty rows too
s.add("v", (np.arange(r * n, (r + 1) * n, dtype=np.int64)[:, None] * 10 + np.arange(3)))
s.add_ragged("g", np.concatenate([np.full(lengths(g), g, np.int32) for g in range(r * n, (r + 1) * n)]),
             [lengths(g) for g in range(r * n, (r + 1) * n)])
s.add_ragged("h", np.concatenate([np.full((lengths(g + 1), 2), -g, np.float32) for g in range(r * n, (r + 1) * n)]),
             [lengths(g + 1) for g in range(r * n, (r + 1) * n)])
s.fence()

def check(idx, got):
    (v,), (g, gl), (h, hl) = [got[0]], got[1], got[2]
    idx = np.asarray(idx)
    assert np.array_equal(v, idx[:, None] * 10 + np.arange(3)), (idx, v)
    assert gl.tolist() == [lengths(i) for i in idx] and g.tolist() == [i for i in idx for _ in range(lengths(i))]
    assert hl.tolist() == [lengths(i + 1) for i in idx]
    assert np.array_equal(h, np.concatenate([np.full((lengths(i + 1), 2), -i, np.float32) for i in idx]))

def many(idx, out=None, overlap=None):
    idx = np.asarray(idx, np.int64)
    got = s._read_many([("batch", "v", np.empty((len(idx), 3), np.int64), idx), ("ragged", "g", idx, out),
                        ("ragged", "h", idx, None)], overlap)
    check(idx, got)
    return got

def direct():
    return [s.get_profile(k)["direct_rows"] for k in ("v", "g", "h")]

def remote():
    return [s.get_profile(k)["remote_rows"] for k in ("v", "g", "h")]

if r == 0:
    # Rows of node b and of this node: b's of the three variables in
    # requests pipelined on one connection to b's agent.
    idx = [21, 3, 22, 27, 5, 39]
    many(idx)
    nb = lambda f: sum(1 for i in idx if i >= n and f(i) > 0)  # noqa: E731
    assert direct() == [nb(lambda i: 1), nb(lengths), nb(lambda i: lengths(i + 1))] == remote(), (direct(), remote())
    assert sum(len(c) for c in s._direct.idle.values()) == 1, s._direct.idle
    # Whether a read would go straight to another node's agent (a read
    # ahead of use is started only then): rows of b, yes; of this node
    # alone, no.
    assert s._direct_worth("g", np.array(idx)) and not s._direct_worth("g", np.array([1, 2, 3]))
    # Into a destination of the caller's, larger than the batch.
    out = np.full(64, -1, np.int32)
    g, gl = many([23, 2, 26], out=out)[1]
    assert g.base is not None and (out[int(gl.sum()):] == -1).all()
    # Rows of nodes b and c: through the own agent, the reads overlapped on
    # the executor's threads.
    names = set()
    class Pool(ThreadPoolExecutor):
        def submit(self, fn, *a):
            def run():
                names.add(threading.current_thread().name)
                return fn(*a)
            return super().submit(run)
    d = direct()
    with Pool(2, thread_name_prefix="overlap") as pool:
        many([21, 41, 22, 42, 1], overlap=pool)
        assert direct() == d and names and all(x.startswith("overlap") for x in names), (direct(), names)
        # No direct reads at all (over the byte bound): the same rows.
        bound, s._direct.max = s._direct.max, 0
        many([21, 3, 25], overlap=pool)
        s._direct.max = bound
    assert direct() == d
    # A bad index fails the whole call, naming it; the store keeps working.
    try:
        many([21, 60])
        raise AssertionError("index 60 of 60 rows read")
    except Error as e:
        assert "60" in str(e), e
    many([21, 33])
    # Reads sent ahead to two nodes (v of b, g of c: two connections) whose
    # first finishes with an error: the second's connection, its reply
    # never to be read, is closed, not left for the collector.
    started = s._start_reads([("batch", "v", np.empty((2, 3), np.int64), np.array([21, 22])),
                              ("ragged", "g", np.array([41, 42]), None)], post=True)
    sent = started[4][0]
    assert len(sent) == 2 and sent[0][0] != sent[1][0], sent
    def fail():
        raise RuntimeError("placing failed")
    sent[0][3][0].done = fail
    try:
        s._finish_reads(started)
        raise AssertionError("a failing job finished")
    except RuntimeError:
        pass
    assert sent[1][1].sock.fileno() == -1, "the later connection left open"
    many([21, 33])
    # A ragged read of a fixed variable, and the reverse: refused.
    for reads in ([("ragged", "v", np.array([1]), None)], [("batch", "g", np.empty((1, 1), np.int32), np.array([1]))]):
        try:
            s._read_many(reads)
            raise AssertionError(f"{reads} read")
        except Error:
            pass
s.fence()
# A variable freed and added again with other rows under a reader that
# keeps its table: the batch is read again, never the old rows.
if r == 0:
    reader = ddstore.Store(reader=True)
    idx = np.array([21, 2, 30], np.int64)
    got = reader._read_many([("batch", "v", np.empty((3, 3), np.int64), idx)])
    assert np.array_equal(got[0], idx[:, None] * 10 + np.arange(3))
s.fence()
s.free("v")
s.fence()
s.add("v", (np.arange(r * n, (r + 1) * n, dtype=np.int64)[:, None] * 10 + np.arange(3)) + 1000)
s.fence()
if r == 0:
    for _ in range(3):
        got = reader._read_many([("batch", "v", np.empty((3, 3), np.int64), idx), ("ragged", "g", idx, None)])
        assert np.array_equal(got[0], idx[:, None] * 10 + np.arange(3) + 1000), got[0]
    # Reads started (their requests sent) before the variable is freed and
    # added again, finished after: read again, the new rows.
    started = reader._start_reads([("batch", "v", np.empty((3, 3), np.int64), idx)], post=True)
    assert started[4][0], "no request sent ahead"
s.fence()
s.free("v")
s.fence()
s.add("v", (np.arange(r * n, (r + 1) * n, dtype=np.int64)[:, None] * 10 + np.arange(3)) + 2000)
s.fence()
if r == 0:
    got = reader._finish_reads(started)
    assert np.array_equal(got[0], idx[:, None] * 10 + np.arange(3) + 2000), got[0]
    # Started and dropped: the connection it held is closed, the next read
    # dials afresh.
    dropped = reader._start_reads([("batch", "v", np.empty((3, 3), np.int64), idx)], post=True)
    reader._drop_reads(dropped)
    got = reader._read_many([("batch", "v", np.empty((3, 3), np.int64), idx)])
    assert np.array_equal(got[0], idx[:, None] * 10 + np.arange(3) + 2000), got[0]
    reader.close()
s.fence()
# A read started before an update of the owner's rows and the fence after
# it, finished after them: made again, the updated rows, never those the
# owner served before the update.
idx = np.array([21, 25, 30], np.int64)
if r == 0:
    started = s._start_reads([("batch", "v", np.empty((3, 3), np.int64), idx)], post=True)
    assert started[4][0], "no request sent ahead"
s.fence()
if r == 1:
    s.update("v", np.full((n, 3), -7, np.int64))
s.fence()
if r == 0:
    got = s._finish_reads(started)
    assert (got[0] == -7).all(), got[0]
s.fence()
s.close()
print("ok", r)
"""


def test_reads_made_together(job):
    outs = run_ranks(MANY, ["a", "b", "c"], job)
    assert [o.strip().splitlines()[-1] for o in outs] == ["ok 0", "ok 1", "ok 2"], outs


SHARED = r"""
import numpy as np, ddstore
from ddstore import _ragged

s = ddstore.Store()
r = s.rank
n = 10  # rows per rank; ranks 0 and 1 on node a, rank 2 on node b
def lengths(g):
    return g % 3  # empty rows too
def ragged(name, plus=0):
    s.add_ragged(name, np.concatenate([np.full(lengths(g), g + plus, np.int32) for g in range(r * n, (r + 1) * n)]),
                 [lengths(g) for g in range(r * n, (r + 1) * n)])
s.add("v", np.arange(r * n, (r + 1) * n, dtype=np.int64)[:, None] * 10 + np.arange(3))
ragged("g")
s.add_ragged("e", np.concatenate([np.full((lengths(g + 1), 2), -g, np.float32) for g in range(r * n, (r + 1) * n)]),
             [lengths(g + 1) for g in range(r * n, (r + 1) * n)])
# Another sharding of as many rows (5, 10, 15 a rank): not of the batch's plan.
lo = [0, 5, 15, 30]
s.add("w", np.arange(lo[r], lo[r + 1], dtype=np.int64)[:, None] * 7)
s.fence()

plans = []
of = _ragged.Plan.of
def counted(store, v, idx):
    p = of(store, v, idx)
    plans.append(p)
    return p
_ragged.Plan.of = counted

def reads(idx, out=None):
    return [("batch", "v", np.empty((len(idx), 3), np.int64), idx), ("ragged", "g", idx, out),
            ("ragged", "e", idx, None), ("batch", "w", np.empty((len(idx), 1), np.int64), idx)]

def check(idx, got, plus=0):
    v, (g, gl), (e, el), w = got
    assert np.array_equal(v, idx[:, None] * 10 + np.arange(3)), (idx, v)
    assert gl.tolist() == [lengths(i) for i in idx], gl
    assert g.tolist() == [i + plus for i in idx for _ in range(lengths(i))], (idx, g)
    assert el.tolist() == [lengths(i + 1) for i in idx]
    assert np.array_equal(e, np.concatenate([np.full((lengths(i + 1), 2), -i, np.float32) for i in idx]))
    assert np.array_equal(w[:, 0], idx * 7), w

def direct():
    return [s.get_profile(k)["direct_rows"] for k in ("v", "g", "e", "w")]

def read(idx, out=None):
    idx = np.asarray(idx, np.int64)
    del plans[:]
    d = direct()
    got = s._read_many(reads(idx, out))
    check(idx, got)
    far = [i for i in idx.tolist() if i >= 2 * n]
    # The rows of node b of every variable straight from its agent (empty
    # rows not asked for), w's by its own path.
    want = [len(far), sum(1 for i in far if lengths(i)), sum(1 for i in far if lengths(i + 1)),
            sum(1 for i in idx.tolist() if i >= lo[2])]
    assert [b - a for a, b in zip(d, direct())] == want, (idx, d, direct(), want)
    return got

if r == 0:
    # Every row of this node (two shards): no plan, each read its own path
    # (w's too: its rows here).
    read([0, 13, 5, 11, 2])
    assert plans == [None], plans
    # Every row of node b: one plan, shared by v, g and e; w (another
    # sharding) reads by its own path.
    read([21, 25, 29, 22])
    assert len(plans) == 1 and plans[0] is not None and plans[0].k == 4, plans
    # Mixed, g's rows of node b all empty (none asked for), e's not.
    read([21, 3, 24, 13, 27, 0])
    assert len(plans) == 1 and plans[0].k == 3, plans
    # Mixed, some of g's rows of node b empty: those left out of its
    # request, the others' shared.
    read([21, 22, 2, 23, 11])
    # Into a destination of the caller's, larger than the batch.
    out = np.full(64, -1, np.int32)
    g, gl = read([23, 2, 26, 12], out=out)[1]
    assert np.shares_memory(g, out) and (out[int(gl.sum()):] == -1).all()
    # Remote rows in a row of the batch (received in place) and apart.
    read([2, 28, 29, 25, 1])
    # Two index arrays (equal, not the same object): a plan each.
    a, b = np.array([21, 4], np.int64), np.array([21, 4], np.int64)
    del plans[:]
    got = s._read_many([("ragged", "g", a, None), ("ragged", "e", b, None)])
    assert len(plans) == 2 and got[0][1].tolist() == [0, 1] and got[1][1].tolist() == [1, 2]
    # A bad index among shared reads fails the call, naming it.
    try:
        s._read_many(reads(np.array([21, 30], np.int64)))
        raise AssertionError("index 30 of 30 rows read")
    except ddstore.Error as e:
        assert "30" in str(e), e
    read([21, 3])
    # Started (the requests sent) with a plan, g freed and added again with
    # other rows before the finish: g read again, its new rows.
    idx = np.array([21, 3, 22, 14, 23], np.int64)
    started = s._start_reads(reads(idx), post=True)
    assert started[4][0], "no request sent ahead"
s.fence()
s.free("g")
s.fence()
ragged("g", 1000)
s.fence()
if r == 0:
    check(idx, s._finish_reads(started), plus=1000)
s.fence()
s.close()
print("ok", r)
"""


def test_reads_share_a_batch_plan(job):
    outs = run_ranks(SHARED, ["a", "a", "b"], job)
    assert [o.strip().splitlines()[-1] for o in outs] == ["ok 0", "ok 1", "ok 2"], outs

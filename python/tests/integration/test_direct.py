"""Direct reads (docs/design.md, Reading): a small read of one other node's
rows goes straight to that node's agent over an authenticated, pooled TCP
connection; a forked child opens its own; a connection without the direct
key is refused; an idle one is closed; a variable freed and added again
never gives its old rows; direct=False reads through the own agent."""

from conftest import run_ranks

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
    # Rows of both nodes: this node's copied, the other's direct.
    s.get_batch("v", out, [3, 97, 4, 98])
    assert np.array_equal(out, want([3, 97, 4, 98], 0))
    p = s.get_profile("v")
    assert p["direct_rows"] == 4 + 3 + 1 + 2 and p["remote_rows"] == 10, p
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
            ok = int(np.array_equal(o, want([90, 91, 92, 93, 94], 0)) and s.get_profile("v")["direct_rows"] == 15)
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
s.close()
print("ok", r)
"""


def test_reads_made_together(job):
    outs = run_ranks(MANY, ["a", "b", "c"], job)
    assert [o.strip().splitlines()[-1] for o in outs] == ["ok 0", "ok 1", "ok 2"], outs

"""The Python Store against real agents: one process, and several ranks on
simulated nodes (one agent per node id, meeting over loopback)."""

import os
import signal
import threading

import numpy as np
import pytest

import ddstore
from conftest import run_ranks

DTYPES = ["bool", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64", "float16", "float32",
          "float64"]


def rows_of(dtype, n, disp, start=0):
    """Patterned rows: row g holds values derived from g."""
    g = np.arange(start, start + n, dtype=np.int64)[:, None] * 7 + np.arange(disp)[None, :]
    if dtype == "bool":
        return (g % 3 == 0)
    return (g % 100).astype(dtype)


@pytest.fixture
def store(job):
    s = ddstore.Store()
    yield s
    s.close()


@pytest.mark.parametrize("dtype", DTYPES)
def test_roundtrip_every_dtype(store, dtype):
    data = rows_of(dtype, 50, 3)
    store.add("v", data)
    assert store.info("v") == (50, 3, np.dtype(dtype).itemsize)
    assert store.describe("v")["dtype"] == dtype
    out = np.empty((4, 3), dtype)
    store.get_batch("v", out, [49, 0, 7, 49])
    np.testing.assert_array_equal(out, data[[49, 0, 7, 49]])
    store.get_batch("v", out, np.array([3, 48, 3, 0]))  # numpy indices: the fast path
    np.testing.assert_array_equal(out, data[[3, 48, 3, 0]])
    one = np.empty((1, 3), dtype)  # arr.shape[0] rows, as DDStore
    store.get("v", one, 12)
    np.testing.assert_array_equal(one[0], data[12])
    rng = np.empty((10, 3), dtype)
    store.get("v", rng, 40)
    np.testing.assert_array_equal(rng, data[40:50])


def test_nd_rows_and_init_update(store):
    data = np.arange(5 * 2 * 3, dtype=np.float64).reshape(5, 2, 3)
    store.add("cube", data)
    assert store.info("cube") == (5, 6, 8)
    out = np.empty((2, 2, 3))
    store.get_batch("cube", out, [4, 1])
    np.testing.assert_array_equal(out, data[[4, 1]])
    store.init("z", 6, 4, dtype="int32")
    z = np.ones((6, 4), np.int32)
    store.get("z", z, 0)
    assert not z.any()
    store.update("z", np.full((2, 4), 9, np.int32), 3)
    store.get("z", z, 0)
    assert z[3:5].tolist() == [[9] * 4] * 2 and not z[:3].any() and not z[5:].any()


@pytest.mark.parametrize("kw,match", [
    ({"method": "rdma"}, r"method 'rdma': want 'agent' or 'mpi'"),
    ({"method": "mpi"}, "method 'mpi' needs an mpi4py communicator as comm, not NoneType"),
    ({"method": "mpi", "reader": True}, "method 'mpi' with reader=True"),
])
def test_bad_method(job, kw, match):
    with pytest.raises(ddstore.ArgumentError, match=match):
        ddstore.Store(rank=0, size=1, **kw)


@pytest.mark.parametrize("kw,match", [
    ({"timeout": 0}, r"timeout 0: want a number of seconds above 0"),
    ({"timeout": -1.5}, r"timeout -1.5: want a number of seconds above 0"),
    ({"timeout": float("inf")}, r"timeout inf: want a number"),
    ({"timeout": "soon"}, r"timeout 'soon': want a number"),
    ({"publish_timeout": True}, r"publish_timeout True: want a number"),
    ({"publish_timeout": float("nan")}, r"publish_timeout nan: want a number"),
])
def test_bad_time_limits(job, kw, match):
    # 0 would reach the direct connections' SO_RCVTIMEO as "no limit".
    with pytest.raises(ddstore.ArgumentError, match=match):
        ddstore.Store(rank=0, size=1, **kw)


def test_errors_and_the_store_keeps_working(store):
    data = rows_of("int32", 10, 2)
    store.add("e", data)
    out = np.zeros((3, 2), np.int32)
    with pytest.raises(IndexError, match=r"indices\[1\] = 10 not in \[0, 10\)"):
        store.get_batch("e", out, [1, 10, 2])
    with pytest.raises(IndexError, match=r"-1"):
        store.get_batch("e", out, [-1, 0, 0])
    assert not out.any(), "a bad index must leave the destination untouched"
    with pytest.raises(IndexError):
        store.get("e", out, 8)
    with pytest.raises(ValueError, match="holds int32, destination is float32"):
        store.get_batch("e", np.zeros((3, 2), np.float32), [0, 1, 2])
    with pytest.raises(ValueError, match="int32, destination is uint32"):
        store.get_batch("e", np.zeros((3, 2), np.uint32), [0, 1, 2])  # same size, still refused
    with pytest.raises(ValueError, match="6 items for 2 rows"):
        store.get_batch("e", np.zeros((3, 2), np.int32), [0, 1])
    with pytest.raises(KeyError, match="nope"):
        store.get_batch("nope", out, [0, 1, 2])
    with pytest.raises(ValueError, match="already exists"):
        store.add("e", data)
    with pytest.raises(IndexError, match=r"rows \[9, 11\)"):
        store.update("e", np.zeros((2, 2), np.int32), 9)
    with pytest.raises(ValueError):
        store.add("bad", np.float32(3))
    store.get_batch("e", out, [9, 0, 9])
    np.testing.assert_array_equal(out, data[[9, 0, 9]])
    # The same errors with numpy indices into a numpy destination (get_batch's
    # fast path, once the variable is known), the destination untouched.
    for bad in ([1, 10, 2], [-1, 0, 0]):
        with pytest.raises(IndexError, match=str(bad[1])):
            store.get_batch("e", out, np.array(bad))
    np.testing.assert_array_equal(out, data[[9, 0, 9]])
    with pytest.raises(ValueError, match="6 items for 2 rows"):
        store.get_batch("e", out, np.array([0, 1]))
    with pytest.raises(ValueError, match="destination is float32"):
        store.get_batch("e", np.zeros((3, 2), np.float32), np.array([0, 1, 2]))
    for dt in (np.int64, np.int32, np.uint16):
        store.get_batch("e", out, np.array([3, 8, 3], dt))
        np.testing.assert_array_equal(out, data[[3, 8, 3]])
    # A receive buffer freed from two threads at once is freed once, and
    # the other buffers stay.
    keep, twice = store.alloc_recv((4, 2), np.int32), store.alloc_recv((4, 2), np.int32)
    errs = []

    def free_it():
        try:
            store.free_recv(twice)
        except ddstore.BadBuffer as e:
            errs.append(e)
    ts = [threading.Thread(target=free_it) for _ in range(2)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    assert len(errs) == 1, errs
    store.get_batch("e", keep, [1, 2, 3, 4])
    np.testing.assert_array_equal(keep, data[[1, 2, 3, 4]])
    store.free_recv(keep)
    store.free("e")
    store.free("e")  # twice is fine
    with pytest.raises(KeyError, match="freed"):
        store.get_batch("e", out, [0, 1, 2])
    store.close()
    with pytest.raises(ValueError, match="closed"):
        store.get_batch("e", out, [0, 1, 2])


def test_threads_share_a_store(store):
    data = rows_of("int64", 1000, 5)
    store.add("t", data)
    errors = []

    def reader(seed):
        rng = np.random.default_rng(seed)
        out = np.empty((64, 5), np.int64)
        try:
            for _ in range(200):
                idx = rng.integers(0, 1000, 64)
                store.get_batch("t", out, idx)
                np.testing.assert_array_equal(out, data[idx])
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(e)

    ts = [threading.Thread(target=reader, args=(i,)) for i in range(8)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    assert not errors, errors


def test_forked_child_reads(store):
    data = rows_of("float32", 100, 4)
    store.add("f", data)
    out = np.empty((3, 4), np.float32)
    store.get_batch("f", out, [1, 2, 3])  # the parent has live connections
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # child: must reconnect, never use the parent's sockets
        ok = 1
        try:
            o = np.empty((50, 4), np.float32)
            idx = np.arange(99, 49, -1)
            store.get_batch("f", o, idx)
            ok = int(np.array_equal(o, data[idx]))
            store.get("f", o[:1], 7)
            ok &= int(np.array_equal(o[0], data[7]))
        except BaseException:
            ok = 0
        os.write(w, bytes([ok]))
        os._exit(0)
    os.close(w)
    got = os.read(r, 1)
    os.waitpid(pid, 0)
    assert got == b"\x01"
    store.get_batch("f", out, [97, 98, 99])  # the parent still works
    np.testing.assert_array_equal(out, data[97:100])


def test_fork_while_another_thread_holds_the_store(store):
    """A thread of the parent in the middle of a request (holding the store's
    lock) when DataLoader forks a worker: the child must not inherit that
    lock held forever."""
    data = rows_of("int32", 20, 3)
    store.add("g", data)
    held, release = threading.Event(), threading.Event()

    def hold():
        with store._lock:
            held.set()
            release.wait(10)

    t = threading.Thread(target=hold)
    t.start()
    held.wait(10)
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        ok = 0
        try:
            signal.alarm(20)  # a deadlock fails the test instead of hanging it
            buf = store.alloc_recv((5, 3), np.int32)  # needs the control lane, under the lock
            store.get_batch("g", buf, [4, 3, 2, 1, 0])
            ok = int(np.array_equal(buf, data[4::-1]))
        finally:
            os.write(w, bytes([ok]))
            os._exit(0)
    release.set()
    t.join()
    os.close(w)
    got = os.read(r, 1)
    os.waitpid(pid, 0)
    assert got == b"\x01"


SCRIPT = r"""
import sys, numpy as np, ddstore
s = ddstore.Store()
r, n = s.rank, s.size
counts = [int(x) for x in sys.argv[1].split(",")]
first = sum(counts[:r])
total = sum(counts)
# Rows of 24 B, 2,400 B and 40,000 B: the client copies each size its own way.
for cols in (3, 300, 5000):
    name = f"v{cols}"
    rows = (np.arange(first, first + counts[r], dtype=np.int64)[:, None] * 10 + np.arange(cols)).astype(np.int64)
    s.add(name, rows)
    want = np.arange(total, dtype=np.int64)[:, None] * 10 + np.arange(cols)
    out = np.empty((total, cols), np.int64)
    s.get(name, out, 0)
    assert np.array_equal(out, want), (r, cols, out)
    rng = np.random.default_rng(r)
    for k in range(20):
        idx = rng.integers(0, total, 97)
        o = np.empty((97, cols), np.int64)
        s.get_batch(name, o, idx)
        assert np.array_equal(o, want[idx]), (r, cols, k)
    recv = s.alloc_recv((97, cols), np.int64)
    s.get_batch(name, recv, idx)
    assert np.array_equal(recv, want[idx])
p = s.get_profile("v3")
print("rank", r, "remote", p["remote_rows"], "local", p["local_rows"])
for cols in (3, 300, 5000):
    s.free(f"v{cols}")
s.close()
"""


@pytest.mark.parametrize("nodes,counts", [
    (["a", "b"], "30,17"),
    (["a", "a", "b", "b"], "5,0,12,9"),
])
def test_ranks_on_two_nodes(job, nodes, counts):
    outs = run_ranks(SCRIPT, nodes, job, args=(counts,))
    remote = [int(o.split()[3]) for o in outs]
    assert all(x > 0 for x in remote), outs  # every rank read rows of the other node


NODE_SPAN = r"""
import sys, numpy as np, ddstore
s = ddstore.Store()
r, n = s.rank, s.size
counts = [int(x) for x in sys.argv[1].split(",")]
first, total = sum(counts[:r]), sum(counts)
# Rows of 64 B (void items), 4 KiB (one chunk a row), 64 KiB (a page a
# chunk, or one a row), one gather over the shards; 3,000 B (no common
# chunk of 1 KiB: a gather per shard).
for rb in (64, 4096, 65536, 3000):
    name = f"n{rb}"
    rows = np.random.default_rng(rb + r).integers(0, 256, (counts[r], rb), dtype=np.uint8)
    rows[:, :8] = (np.arange(first, first + counts[r], dtype=np.int64)).view(np.uint8).reshape(-1, 8)
    s.add(name, rows)
    want = np.empty((total, rb), np.uint8)
    s.get(name, want, 0)
    assert (want[:, :8].copy().view(np.int64)[:, 0] == np.arange(total)).all(), (r, rb)
    sp = s._var(name).span
    if rb in (64, 4096, 65536):
        assert sp is not None, (r, rb)
    rng = np.random.default_rng(r)
    for k in range(30):
        idx = rng.integers(0, total, int(rng.integers(1, 300)))
        if k == 0:
            idx = np.array([0, total - 1, first, total - 1, 0])  # each end and repeats
        o = np.zeros((idx.shape[0], rb), np.uint8)
        s.get_batch(name, o, idx)
        assert np.array_equal(o, want[idx]), (r, rb, k)
    for bad in ([total], [-1], [0, total + 5]):
        try:
            s.get_batch(name, np.zeros((len(bad), rb), np.uint8), np.array(bad))
        except ddstore.IndexOutOfRange:
            pass
        else:
            raise AssertionError(("no error", bad))
    o = np.zeros((3, rb), np.uint8)
    s.get_batch(name, o, np.array([total - 1, 0, 1]))
    assert np.array_equal(o, want[[total - 1, 0, 1]])
    s.free(name)
print("rank", r, "ok")
s.close()
"""


@pytest.mark.parametrize("nodes,counts", [
    (["a", "a"], "37,21"),
    (["a", "a", "a"], "9,0,14"),
])
def test_batches_over_the_shards_of_one_node(job, nodes, counts):
    """get_batch of rows of several shards of this node, in one gather over
    the node's shards (_vars.node_span) or one per shard: the right rows,
    each end of every shard, an empty shard, repeats; bad indices named
    and the store keeps reading."""
    outs = run_ranks(NODE_SPAN, nodes, job, args=(counts,))
    assert all("ok" in o for o in outs), outs


def test_reader_store(store):
    data = rows_of("float64", 20, 2)
    store.add("pub", data)
    r = ddstore.Store(reader=True, spawn=False)
    try:
        out = np.empty((20, 2))
        r.get("pub", out, 0)
        np.testing.assert_array_equal(out, data)
        with pytest.raises(ValueError, match="reader"):
            r.add("mine", data)
        r.free("pub")  # gives nothing back: the publisher's variable stays
    finally:
        r.close()
    out = np.empty((1, 2))
    store.get("pub", out, 19)
    np.testing.assert_array_equal(out[0], data[19])


def test_reader_waits_for_publication(store):
    """Split mode: a reader started before the publisher waits for the
    variable, up to wait_published; a name never published fails saying
    how long it waited."""
    r = ddstore.Store(reader=True, spawn=False, wait_published=20)
    q = ddstore.Store(reader=True, spawn=False, wait_published=0.2)
    waiting = threading.Event()
    wait_for = r._wait_for

    def waiting_for(name, enc):  # the agent refused the first lookup: r waits
        waiting.set()
        return wait_for(name, enc)

    r._wait_for = waiting_for
    try:
        got = {}

        def read():
            out = np.empty((6, 2), np.float64)
            r.get("late", out, 0)
            got["rows"] = out

        t = threading.Thread(target=read)
        t.start()
        assert waiting.wait(20)
        assert t.is_alive()  # still waiting
        data = rows_of("float64", 6, 2)
        store.add("late", data)
        t.join(20)
        np.testing.assert_array_equal(got["rows"], data)
        with pytest.raises(ddstore.UnknownVariable, match="after waiting 0.2s"):
            q.get("never", np.empty((1, 2)), 0)
    finally:
        r.close()
        q.close()

"""get_batch where the node maps one shard of the variable (one rank per
node, as DDStore runs across nodes): its shortest path, a take straight
from that shard into the destination, against numpy's indexing of the
same rows; batches that leave the shard, bad indices and destinations
that path hands to the general one (the same errors, the destination
untouched), rows updated before a fence, a variable freed and added
again under a reader, and a forked child."""

import os
import socket

import numpy as np
import pytest

import ddstore
from ddstore_bench.bench import _both
from conftest import SECRET

# Rows of rank 0 (node a) and rank 1 (node b): global rows [0, 7) and [7, 12).
ROWS = (7, 5)
TOTAL = sum(ROWS)
FIRST = (0, ROWS[0])


@pytest.fixture
def nodes(job, monkeypatch):
    """Stores of rank 0 on node a and rank 1 on node b, in this process,
    their agents meeting through a rendezvous port."""
    with socket.socket() as sk:
        sk.bind(("127.0.0.1", 0))
        port = sk.getsockname()[1]
    monkeypatch.setenv("DDSTORE_SECRET", SECRET)
    args = ("--rendezvous", f"127.0.0.1:{port}", "--peer-listen", "127.0.0.1:0")
    stores = [ddstore.Store(rank=r, size=2, local_rank=0, local_size=1, node=n, agent_args=args)
              for r, n in enumerate("ab")]
    yield stores
    for s in stores:
        s.close()


def _data(dtype, disp, gen=0):
    return ((np.arange(TOTAL * disp).reshape(TOTAL, disp) + 1000 * gen) % 251).astype(dtype)


def _add(stores, name, data):
    _both(stores, lambda r, s: s.add(name, data[FIRST[r]:FIRST[r] + ROWS[r]]))


def _own(r, *ks):
    """Rows of rank r's shard, k-th from its first (negative: from its end)."""
    return [FIRST[r] + (k % ROWS[r]) for k in ks]


@pytest.mark.parametrize("dtype,disp", [("int32", 3), ("uint8", 64), ("float64", 600), ("float32", 1)])
def test_rows_of_the_one_shard(nodes, dtype, disp):
    data = _data(dtype, disp)
    _add(nodes, "v", data)
    for r, s in enumerate(nodes):
        assert s._var("v").quick is not None, "each node maps one shard: the shortest path applies"
        f, last = FIRST[r], FIRST[r] + ROWS[r] - 1
        batches = [
            np.array([f, last, f, f]),                              # the shard's edges, repeats
            np.array(_own(r, *range(ROWS[r]))[::-1]),
            np.arange(f, last + 1)[::-2],                            # not contiguous
            np.array([last, f], np.int32),                           # other integer types
            np.array([last, f + 1], np.uint32),
            np.array([f, last], np.int16),
            np.array([last, last], np.uint8),
            np.array([f + 1, last], np.uint64),
            np.array([last, f], ">i8"),
            np.array([f]),
        ]
        for idx in batches:
            out = np.zeros((idx.shape[0], disp), dtype)
            assert s.get_batch("v", out, idx) is out
            np.testing.assert_array_equal(out, data[idx.astype(np.int64)], err_msg=f"rank {r}: {idx!r}")
        # Destinations of other shapes of the same items: the general path.
        idx = np.array([last, f, last])
        for shape in ((3 * disp,), (3, disp, 1), (1, 3, disp)):
            out = np.zeros(shape, dtype)
            s.get_batch("v", out, idx)
            np.testing.assert_array_equal(out.reshape(3, disp), data[idx], err_msg=f"rank {r}: {shape}")
        if disp == 1:
            out = np.zeros(3, dtype)
            s.get_batch("v", out, idx)
            np.testing.assert_array_equal(out, data[idx, 0])
        p = s.get_profile("v")
        n = sum(len(b) for b in batches) + 3 * (3 + (disp == 1))
        assert p["local_rows"] == p["rows"] == n and p["calls"] == len(batches) + 3 + (disp == 1), p
        assert p["bytes"] == n * disp * np.dtype(dtype).itemsize and p["remote_rows"] == 0, p
    _both(nodes, lambda r, s: s.free("v"))


def test_batches_that_leave_the_shard(nodes):
    data = _data(np.int64, 4)
    _add(nodes, "v", data)
    for r, s in enumerate(nodes):
        f, end = FIRST[r], FIRST[r] + ROWS[r]
        other = FIRST[1 - r]
        for idx in (np.array([end - 1, end % TOTAL]), np.array([f, other]), np.array([other, f, other + 1])):
            out = np.zeros((idx.shape[0], 4), np.int64)
            s.get_batch("v", out, idx)
            np.testing.assert_array_equal(out, data[idx], err_msg=f"rank {r}: {idx!r}")
        p = s.get_profile("v")
        assert p["remote_rows"] == 4 and p["rows"] == 7, p
    _both(nodes, lambda r, s: s.free("v"))


def test_bad_indices_and_destinations(nodes):
    data = _data(np.int32, 3)
    _add(nodes, "v", data)
    for r, s in enumerate(nodes):
        f = FIRST[r]
        bad = ((np.array([f, TOTAL]), f"indices[1] = {TOTAL}"), (np.array([f, -1]), "indices[1] = -1"),
               (np.array([-5, f]), "indices[0] = -5"),
               (np.array([f, f + 5 * 10**12]), f"indices[1] = {f + 5 * 10**12}"),
               (np.array([f, 2**63 + 1], np.uint64), f"indices[1] = {2**63 + 1}"),
               (np.array([f, -2], np.int32), "indices[1] = -2"))
        for idx, shown in bad:
            out = np.zeros((2, 3), np.int32)
            with pytest.raises(ddstore.IndexOutOfRange, match=shown.replace("[", r"\[").replace("]", r"\]")):
                s.get_batch("v", out, idx)
            assert not out.any(), f"rank {r}: a bad index must leave the destination untouched: {idx!r}"
        idx = np.array([f, f + 1])
        wide = np.zeros((2, 6), np.int32)
        ro = np.zeros((2, 3), np.int32)
        ro.flags.writeable = False
        for out, shown in ((np.zeros((2, 3), np.int64), "holds int32, destination is int64"),
                           (np.zeros((2, 3), np.float32), "holds int32, destination is float32"),
                           (np.zeros((2, 3), np.uint32), "holds int32, destination is uint32"),
                           (wide[:, ::2], "C-contiguous and writable"),
                           (np.zeros((3, 2), np.int32).T, "C-contiguous and writable"),
                           (ro, "a read-only destination"),
                           (np.zeros((3, 3), np.int32), "destination of 9 items for 2 rows of 3"),
                           (np.zeros((2, 4), np.int32), "destination of 8 items for 2 rows of 3"),
                           (np.zeros((1, 3), np.int32), "destination of 3 items for 2 rows of 3")):
            with pytest.raises(ddstore.BadBuffer, match=shown):
                s.get_batch("v", out, idx)
            assert not out.any() and not wide.any(), f"rank {r}: a refused destination must stay untouched"
        with pytest.raises(ddstore.ArgumentError, match="want a 1-d sequence of integers"):
            s.get_batch("v", np.zeros((2, 3), np.int32), np.array([[f], [f + 1]]))
        with pytest.raises(ddstore.ArgumentError, match="want a 1-d sequence of integers"):
            s.get_batch("v", np.zeros((2, 3), np.int32), np.array([f, f + 1], np.float64))
        out = np.zeros((0, 3), np.int32)
        assert s.get_batch("v", out, np.array([], np.int64)) is out
    _both(nodes, lambda r, s: s.free("v"))


def test_rows_updated_before_a_fence(nodes):
    data = _data(np.float32, 8)
    _add(nodes, "v", data)
    idx = [np.array([FIRST[r] + ROWS[r] - 1, FIRST[r], FIRST[r] + 2]) for r in range(2)]
    for r, s in enumerate(nodes):
        out = np.zeros((3, 8), np.float32)
        s.get_batch("v", out, idx[r])
        np.testing.assert_array_equal(out, data[idx[r]])
    new = _data(np.float32, 8, gen=1)

    def update(r, s):
        s.update("v", new[FIRST[r] + 2:FIRST[r] + ROWS[r]], 2)
        s.fence()
    _both(nodes, update)
    want = data.copy()
    for r in range(2):
        want[FIRST[r] + 2:FIRST[r] + ROWS[r]] = new[FIRST[r] + 2:FIRST[r] + ROWS[r]]
    for r, s in enumerate(nodes):
        out = np.zeros((3, 8), np.float32)
        s.get_batch("v", out, idx[r])
        np.testing.assert_array_equal(out, want[idx[r]], err_msg=f"rank {r}")
    _both(nodes, lambda r, s: s.free("v"))


@pytest.mark.parametrize("op", ["get_batch", "get"])
def test_a_reader_after_the_variable_is_added_again(nodes, op):
    """A reader keeps the freed variable's segment mapped, old rows and all:
    the shortest path must see it dropped and read the new variable."""
    _add(nodes, "v", _data(np.int64, 2))
    rd = ddstore.Store(rank=0, size=2, local_rank=0, local_size=1, node="a", reader=True, spawn=False)
    idx = np.array([0, 6, 3]) if op == "get_batch" else np.arange(2, 5)

    def read(out):
        return rd.get_batch("v", out, idx) if op == "get_batch" else rd.get("v", out, 2)
    try:
        out = np.zeros((3, 2), np.int64)
        read(out)
        np.testing.assert_array_equal(out, _data(np.int64, 2)[idx])
        old = rd._var("v")
        assert old.quick is not None
        _both(nodes, lambda r, s: s.free("v"))
        _add(nodes, "v", _data(np.int64, 2, gen=1))
        assert old.quick[-1][0], "the old segment is marked dropped"
        read(out)
        np.testing.assert_array_equal(out, _data(np.int64, 2, gen=1)[idx])
        assert rd._var("v") is not old
    finally:
        rd.close()
    _both(nodes, lambda r, s: s.free("v"))


def test_forked_child(nodes):
    data = _data(np.uint8, 64)
    _add(nodes, "v", data)
    s = nodes[1]
    idx = np.array([11, 7, 9, 10])
    out = np.zeros((4, 64), np.uint8)
    s.get_batch("v", out, idx)
    rfd, wfd = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: its own copy of the store, the shard's mapping shared
        try:
            child = np.zeros((4, 64), np.uint8)
            s.get_batch("v", child, idx[::-1].copy())
            s.get_batch("v", child[:2], np.array([0, 8]))  # one row of the other node: the child's own connections
            s.get("v", child[3:], 11)
            os.write(wfd, child.tobytes())
        finally:
            os._exit(0)
    os.close(wfd)
    got = b""
    while True:
        b = os.read(rfd, 1 << 16)
        if not b:
            break
        got += b
    os.close(rfd)
    os.waitpid(pid, 0)
    want = data[[0, 8, 7, 11]]  # [10, 9, 7, 11], then rows 0 and 8, then 11
    assert np.frombuffer(got, np.uint8).reshape(4, 64).tolist() == want.tolist()
    s.get_batch("v", out, idx)  # the parent's store still reads
    np.testing.assert_array_equal(out, data[idx])
    _both(nodes, lambda r, s: s.free("v"))


def test_get_of_rows_of_the_one_shard(nodes):
    """get() of consecutive rows takes the same shortest path: rows at the
    shard's edges, starts of numpy integer types, ranges that leave the
    shard, and the general path's errors for the rest."""
    data = _data(np.int32, 3)
    _add(nodes, "v", data)
    one = _data(np.float32, 1)
    _add(nodes, "w", one)
    for r, s in enumerate(nodes):
        f, end = FIRST[r], FIRST[r] + ROWS[r]
        for start, k in ((f, 1), (end - 1, 1), (f, ROWS[r]), (np.int64(f + 1), 2), (np.uint32(end - 2), 2),
                         (np.int16(f), 3)):
            out = np.zeros((k, 3), np.int32)
            assert s.get("v", out, start) is out
            np.testing.assert_array_equal(out, data[int(start):int(start) + k], err_msg=f"rank {r}: {start!r}")
        out = np.zeros(2, np.float32)  # rows of one item into a 1-d destination
        s.get("w", out, end - 2)
        np.testing.assert_array_equal(out, one[end - 2:end, 0])
        out = np.zeros((2, 3), np.int32)
        s.get("v", out, ROWS[0] - 1)  # node a's last row and node b's first
        np.testing.assert_array_equal(out, data[ROWS[0] - 1:ROWS[0] + 1])
        p = s.get_profile("v")
        assert p["calls"] == 7 and p["rows"] == 1 + 1 + ROWS[r] + 2 + 2 + 3 + 2, p
        assert p["local_rows"] == p["rows"] - 1 and p["remote_rows"] == 1, p
        for start, shown in ((-1, r"rows \[-1, 1\) not in \[0, 12\)"),
                             (TOTAL - 1, r"rows \[11, 13\) not in \[0, 12\)")):
            out = np.zeros((2, 3), np.int32)
            with pytest.raises(ddstore.IndexOutOfRange, match=shown):
                s.get("v", out, start)
        wide = np.zeros((2, 6), np.int32)
        ro = np.zeros((2, 3), np.int32)
        ro.flags.writeable = False
        for out, shown in ((np.zeros((2, 3), np.int64), "holds int32, destination is int64"),
                           (np.zeros((2, 3), np.uint32), "holds int32, destination is uint32"),
                           (wide[:, ::2], "C-contiguous and writable"), (ro, "a read-only destination"),
                           (np.zeros((2, 4), np.int32), "destination of 8 items for 2 rows of 3"),
                           (np.zeros((1, 3, 2), np.int32), "destination of 6 items for 1 rows of 3")):
            with pytest.raises(ddstore.BadBuffer, match=shown):
                s.get("v", out, f)
            assert not out.any() and not wide.any(), f"rank {r}: a refused destination must stay untouched"
    _both(nodes, lambda r, s: s.free("v"))
    _both(nodes, lambda r, s: s.free("w"))

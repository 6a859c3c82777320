"""Ragged variables from Python against real agents: one process, and ranks
on two simulated nodes, their batches checked against a naive copy of the
same rows."""

import inspect

import numpy as np
import pytest

import ddstore
from conftest import run_ranks


def rows(first, lengths, trailing=(3,), dtype=np.float32):
    """Rank rows: row g's units hold g * 1000 + unit position, so a row from
    the wrong place or of the wrong length never passes."""
    out = []
    for i, n in enumerate(lengths):
        g = first + i
        u = np.arange(n * int(np.prod(trailing)), dtype=np.int64).reshape((n,) + tuple(trailing))
        out.append((g * 1000 + u).astype(dtype))
    return np.concatenate(out) if out else np.zeros((0,) + tuple(trailing), dtype)


@pytest.fixture
def store(job):
    s = ddstore.Store()
    yield s
    s.close()


def test_ragged_one_node(store):
    lengths = np.array([3, 0, 5, 1, 0, 7])
    vals = rows(0, lengths, (2, 3))
    store.add_ragged("g", vals, lengths)
    d = store.describe("g")
    assert d["kind"] == "ragged" and d["shape"] == [2, 3] and d["total_rows"] == 6 and d["total_items"] == 16
    assert d["bytes"] == 16 * 6 * 4
    idx = [5, 0, 1, 5, 2]
    sizes = store.ragged_sizes("g", idx)
    assert sizes.tolist() == [7, 3, 0, 7, 5]
    v, lens = store.get_ragged("g", idx)
    assert v.shape == (22, 2, 3) and v.dtype == np.float32
    off = np.concatenate(([0], np.cumsum(lengths)))
    want = np.concatenate([vals[off[g]:off[g + 1]] for g in idx])
    np.testing.assert_array_equal(v, want)
    assert lens.tolist() == sizes.tolist()
    np.testing.assert_array_equal(store.get_ragged_row("g", 3), vals[8:9])
    assert store.get_ragged_row("g", 1).shape == (0, 2, 3)
    # into a buffer given, larger than needed: the rows are its first units
    out = np.full((30, 2, 3), -1, np.float32)
    v2, _ = store.get_ragged("g", idx, out=out)
    np.testing.assert_array_equal(v2, want)
    assert np.shares_memory(v2, out) and (out[22:] == -1).all()


def test_ragged_offsets_and_bad_input(store):
    vals = np.arange(10, dtype=np.int64)
    store.add_ragged("s", vals, offsets=[0, 4, 4, 10])
    assert store.ragged_sizes("s", [0, 1, 2]).tolist() == [4, 0, 6]
    with pytest.raises(ddstore.BadBuffer, match=r"destination of 72 bytes for 2 ragged rows of 80 bytes"):
        store.get_ragged("s", [0, 2], out=np.empty(9, np.int64))
    with pytest.raises(ddstore.BadBuffer, match="holds int64"):
        store.get_ragged("s", [0], out=np.empty(10, np.float64))
    with pytest.raises(ddstore.IndexOutOfRange, match=r"indices\[1\] = 3 not in \[0, 3\)"):
        store.get_ragged("s", [0, 3])
    with pytest.raises(ddstore.ArgumentError, match="get_ragged"):
        store.get_batch("s", np.empty((1, 1), np.int64), [0])
    for bad, what in ((dict(lengths=[4, -1, 7]), r"lengths\[1\] = -1"),
                      (dict(lengths=[4, 4, 4]), "add up to 12 units, but the values have 10"),
                      (dict(offsets=[0, 5, 3, 10]), r"offsets\[2\] = 3 after offsets\[1\] = 5"),
                      (dict(offsets=[1, 10]), r"offsets\[0\] = 1")):
        with pytest.raises(ddstore.GeometryError, match=what):
            store.add_ragged("bad", vals, **bad)
    store.add_ragged("bad", vals, [10])  # the name still works, and so does the store
    np.testing.assert_array_equal(store.get_ragged("bad", [0])[0], vals)
    store.add("fixed", np.zeros((2, 2)))
    with pytest.raises(ddstore.ArgumentError, match="rows of one size"):
        store.get_ragged("fixed", [0])


SCRIPT = r"""
import sys, numpy as np, ddstore
""" + inspect.getsource(rows) + r"""
s = ddstore.Store()
r, n = s.rank, s.size
rng = np.random.default_rng(100)
counts = [int(x) for x in sys.argv[1].split(",")]
lengths = [rng.integers(0, 9, c) * (rng.random(c) > 0.2) for c in counts]  # zero-length rows too
first = np.concatenate(([0], np.cumsum(counts)))
s.add_ragged("pos", rows(int(first[r]), lengths[r]), lengths[r])
everything = np.concatenate([rows(int(first[k]), lengths[k]) for k in range(n)])
all_len = np.concatenate(lengths)
off = np.concatenate(([0], np.cumsum(all_len)))
total = int(first[-1])
rr = np.random.default_rng(r)
for k in range(20):
    idx = rr.integers(0, total, 1 + int(rr.integers(0, 64)))
    want = np.concatenate([everything[off[g]:off[g + 1]] for g in idx])
    if k % 2:
        buf = s.alloc_recv((int(s.ragged_sizes("pos", idx).sum()) + 1, 3), np.float32)
        v, lens = s.get_ragged("pos", idx, out=buf)
    else:
        v, lens = s.get_ragged("pos", idx)
    assert np.array_equal(v, want), (r, k, idx)
    assert np.array_equal(lens, all_len[idx])
# batches of this node's rows alone (one shard, or several), of the other
# node's alone (in order: the staged rows land in one piece; shuffled),
# each into a fresh array and into a receive buffer
nodes = sys.argv[2].split(",")
mine = np.concatenate([np.arange(first[k], first[k + 1]) for k in range(n) if nodes[k] == nodes[r]])
theirs = np.concatenate([np.arange(first[k], first[k + 1]) for k in range(n) if nodes[k] != nodes[r]])
own = np.arange(first[r], first[r + 1])
for idx in (mine, mine[::-1], own, theirs, theirs[::-1], rr.permutation(theirs), np.repeat(mine[:3], 2)):
    if not idx.size:
        continue
    want = np.concatenate([everything[off[g]:off[g + 1]] for g in idx])
    buf = s.alloc_recv((int(s.ragged_sizes("pos", idx).sum()) + 2, 3), np.float32)
    for v, lens in (s.get_ragged("pos", idx), s.get_ragged("pos", idx, out=buf)):
        assert np.array_equal(v, want), (r, idx)
        assert np.array_equal(lens, all_len[idx])
    s.free_recv(buf)
# a node reads the other's rows, and this node's own, in one batch
p = s.get_profile("pos")
print("rank", r, "remote", p["remote_rows"], "local", p["local_rows"])
# a rank that disagrees on the trailing shape fails the add on every rank
try:
    s.add_ragged("shape", np.zeros((4, 3 if r else 2), np.float32), [4])
except ddstore.GeometryError as e:
    assert "trailing shape" in str(e), e
else:
    raise AssertionError("a trailing shape differing between ranks was accepted")
s.free("pos")
s.close()
"""


@pytest.mark.parametrize("nodes,counts", [
    (["a", "b"], "30,17"),
    (["a", "a", "b"], "5,0,12"),
    (["a", "a", "b", "b"], "9,6,0,11"),
])
def test_ragged_two_nodes(job, nodes, counts):
    outs = run_ranks(SCRIPT, nodes, job, args=(counts, ",".join(nodes)))
    remote = [int(o.split()[3]) for o in outs]
    assert all(x > 0 for x in remote), outs

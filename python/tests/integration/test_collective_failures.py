"""A failure on one rank during a collective reaches every rank at once,
whatever its type, and everything works after it; bad destinations,
indices and names are refused with a ddstore.Error naming them. Ranks are
processes with real agents. The publish timeout is 300 s and each job's
deadline far shorter: a rank left waiting for the timeout fails the test
by hanging, not by a time bound."""

import array

import numpy as np
import pytest

import ddstore
from conftest import run_ranks

# Rank 1's first add fails before its shard is filled, with an error that
# is not a ddstore.Error (its rows cannot become an array); rank 0 must
# hear of it at once. Then both add a strided view (a column slice), which
# must simply work, and a retry of the failed name works on both.
FAILING_ADD = r"""
import os, sys
import numpy as np
import ddstore

class Unconvertible:
    def __array__(self, *args, **kwargs):
        raise RuntimeError("rows that cannot become an array")

r = int(os.environ["DDSTORE_RANK"])
s = ddstore.Store(publish_timeout=300.0)
base = np.arange(40, dtype=np.float64).reshape(10, 4) + 100 * r
try:
    s.add("x", Unconvertible() if r == 1 else base)
except ddstore.GeometryError as e:
    assert r == 0 and "rank 1 could not create its shard" in str(e), e
    print("rank", r, "add failed: GeometryError")
except RuntimeError as e:
    assert r == 1 and "cannot become an array" in str(e), e
    print("rank", r, "add failed: RuntimeError")
else:
    raise AssertionError(f"rank {r}: add succeeded")

# init with an item type ddstore has none of: BadBuffer on rank 1, before
# any shard; rank 0 hears of it at once.
try:
    s.init("z", 3, 2, dtype="int64" if r == 0 else "complex64")
except ddstore.GeometryError as e:
    assert r == 0 and "rank 1 could not create its shard" in str(e), e
except ddstore.BadBuffer as e:
    assert r == 1 and "complex64" in str(e), e
else:
    raise AssertionError(f"rank {r}: init succeeded")
s.init("z", 3, 2, dtype="int64")

strided = base[:, ::2]  # not C-contiguous
assert not strided.flags.c_contiguous
s.add("x", strided)  # the retry of the failed name, with a strided view
s.add("t", base.T)  # a transpose: 4 rows of 10
out = np.empty((20, 2))
s.get("x", out, 0)
want = np.concatenate([np.arange(40, dtype=np.float64).reshape(10, 4)[:, ::2] + 100 * k for k in (0, 1)])
assert np.array_equal(out, want), out
t = np.empty((8, 10))
s.get("t", t, 0)
assert np.array_equal(t[4 * r:4 * r + 4], base.T)
print("rank", r, "ok")
s.close()
"""


def test_a_failed_add_of_any_error_type_fails_every_rank_at_once(job):
    outs = run_ranks(FAILING_ADD, ["a", "b"], job, timeout=90)
    assert "rank 0 add failed: GeometryError" in outs[0], outs[0]
    assert "rank 1 add failed: RuntimeError" in outs[1], outs[1]
    for r, out in enumerate(outs):
        assert f"rank {r} ok" in out, out


@pytest.fixture
def store(job):
    s = ddstore.Store(publish_timeout=300.0)
    yield s
    s.close()


def test_a_destination_that_is_not_a_writable_buffer_is_refused(store):
    store.add("v", np.arange(12, dtype=np.uint8).reshape(6, 2))
    dst = [[0, 0], [0, 0]]
    with pytest.raises(ddstore.BadBuffer, match="destination of type list: want a writable buffer"):
        store.get_batch("v", dst, [1, 2])
    assert dst == [[0, 0], [0, 0]]
    with pytest.raises(ddstore.BadBuffer, match="destination of type tuple"):
        store.get("v", ((0, 0),), 0)
    with pytest.raises(ddstore.BadBuffer, match="read-only destination of type bytes"):
        store.get_batch("v", bytes(4), [1, 2])
    ro = np.zeros((2, 2), np.uint8)
    ro.flags.writeable = False
    with pytest.raises(ddstore.BadBuffer, match="read-only destination"):
        store.get_batch("v", ro, [1, 2])
    # Writable buffers are read into in place; and the store goes on.
    b = bytearray(4)
    store.get_batch("v", b, [1, 2])
    assert bytes(b) == bytes([2, 3, 4, 5])
    a = array.array("B", bytes(2))
    store.get_batch("v", a, [5])
    assert a.tolist() == [10, 11]
    out = np.empty((2, 2), np.uint8)
    store.get_batch("v", out, [0, 5])
    assert out.tolist() == [[0, 1], [10, 11]]


def test_a_uint64_index_is_named_as_given(store):
    store.add("v", np.arange(12, dtype=np.uint8).reshape(6, 2))
    out = np.empty((2, 2), np.uint8)
    big = np.array([1, 2**64 - 1], dtype=np.uint64)
    with pytest.raises(ddstore.IndexOutOfRange, match=r"indices\[1\] = 18446744073709551615"):
        store.get_batch("v", out, big)
    with pytest.raises(ddstore.IndexOutOfRange, match=r"indices\[0\] = 9223372036854775808"):
        store.get_batch("v", out[:1], np.array([2**63], dtype=np.uint64))
    store.get_batch("v", out, np.array([1, 5], dtype=np.uint64))
    assert out.tolist() == [[2, 3], [10, 11]]


def test_a_name_that_is_not_utf8_is_a_ddstore_error(store):
    bad = "x\udc80"
    with pytest.raises(ddstore.ArgumentError, match="not encodable as UTF-8"):
        store.add(bad, np.zeros((2, 2), np.uint8))
    with pytest.raises(ddstore.ArgumentError, match="not encodable as UTF-8"):
        store.get_batch(bad, np.zeros((1, 2), np.uint8), [0])
    with pytest.raises(ddstore.ArgumentError, match="not encodable as UTF-8"):
        store.init(bad, 2, 2)
    store.add("x", np.ones((2, 2), np.uint8))
    out = np.zeros((2, 2), np.uint8)
    store.get("x", out, 0)
    assert out.all()

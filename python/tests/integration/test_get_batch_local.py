"""get_batch of node-local rows on a node of two ranks, the batches of
its fast path (every row in one shard, the first's) and of the general
path beside them: the same rows as numpy's indexing, the same errors."""


import numpy as np
import pytest

import ddstore
from ddstore_bench.bench import _both


@pytest.fixture
def pair(job):
    stores = [None, None]

    def open_(r, _):
        stores[r] = ddstore.Store(rank=r, size=2, local_rank=r, local_size=2, node="n0")
    _both([None, None], open_)
    yield stores
    for s in stores:
        s.close()


@pytest.mark.parametrize("dtype,disp", [("int32", 3), ("uint8", 64), ("float64", 600)])
def test_batches_of_one_shard_and_of_both(pair, dtype, disp):
    data = (np.arange(12 * disp).reshape(12, disp) % 251).astype(dtype)
    _both(pair, lambda r, s: s.add("v", data[:7] if r == 0 else data[7:]))
    s = pair[0]
    batches = [
        np.array([7, 11, 8, 7]),          # all in rank 1's shard (its first row is 7)
        np.array([0, 6, 3, 3]),           # all in rank 0's
        np.array([8, 2, 11, 0]),          # both
        np.array([11, 7], np.int32),      # other integer types
        np.array([9, 10], ">i8"),
        np.arange(12)[::-3],              # not contiguous
        np.array([6, 7]),                 # the first in rank 0's, the next past it
        np.array([10, 3]),
    ]
    for idx in batches:
        out = np.zeros((idx.shape[0], disp), dtype)
        s.get_batch("v", out, idx)
        np.testing.assert_array_equal(out, data[idx.astype(np.int64)], err_msg=str(idx))
    for bad, shown in ((np.array([7, 12]), "indices[1] = 12"), (np.array([8, -1]), "indices[1] = -1"),
                       (np.array([-5, 8]), "indices[0] = -5"), (np.array([0, 7 + 5 * 10**12]), "indices[1]")):
        out = np.zeros((2, disp), dtype)
        with pytest.raises(IndexError, match=shown.replace("[", r"\[").replace("]", r"\]")):
            s.get_batch("v", out, bad)
        assert not out.any(), "a bad index must leave the destination untouched"
    s.get_batch("v", out, np.array([11, 10]))
    np.testing.assert_array_equal(out, data[[11, 10]])
    p = s.get_profile("v")
    assert p["remote_rows"] == 0 and p["local_rows"] == p["rows"] == sum(len(b) for b in batches) + 2, p
    _both(pair, lambda r, s: s.free("v"))

"""copy_rows, the node-local gather of every read: the same rows as numpy's
fancy indexing at each of its row-size regimes, with and without the
positions of a batch of several owners."""

import mmap

import numpy as np
import pytest

from ddstore._vars import below, copy_rows, distinct, node_span


@pytest.mark.parametrize("rb", [1, 8, 64, 1000, 1024, 4096, 32 << 10, 40000])
@pytest.mark.parametrize("with_pos", [False, True])
def test_copy_rows_matches_fancy_indexing(rb, with_pos):
    rng = np.random.default_rng(rb)
    n = 300
    src = rng.integers(0, 256, (n, rb), dtype=np.uint8)
    loc = rng.integers(0, n, 257)
    loc[:3] = (0, n - 1, n - 1)  # both ends, and a repeat
    dst = np.zeros((loc.shape[0] + 5, rb), np.uint8)
    if with_pos:
        pos = rng.permutation(dst.shape[0])[:loc.shape[0]]
        copy_rows(dst, src, loc, pos)
        want = np.zeros_like(dst)
        want[pos] = src[loc]
    else:
        copy_rows(dst, src, loc)
        want = np.zeros_like(dst)
        want[:loc.shape[0]] = src[loc]
    np.testing.assert_array_equal(dst, want)


def _at(nbytes, offset):
    """A zeroed uint8 array of nbytes starting offset bytes into a page."""
    raw = np.zeros(nbytes + 8192, np.uint8)
    start = (offset - raw.ctypes.data) % 4096
    return raw[start:start + nbytes]


@pytest.mark.parametrize("rb", [4096, 512 << 10, 8192, 64 << 10])
@pytest.mark.parametrize("dst_offset", [0, 16, 2048 + 16])
@pytest.mark.parametrize("with_pos", [False, True])
def test_copy_rows_any_alignment(rb, dst_offset, with_pos):
    # A destination 16 bytes past a page, as numpy's large arrays, from
    # page-aligned rows, as a shard's (glibc's slow memmove case, copied
    # straight all the same), and half a page past one.
    rng = np.random.default_rng(rb + dst_offset)
    n, k = (90, 70) if rb < (512 << 10) else (6, 5)
    src = _at(n * rb, 0).reshape(n, rb)
    src[...] = rng.integers(0, 256, (n, rb), dtype=np.uint8)
    loc = rng.integers(0, n, k)
    dst = _at(k * rb, dst_offset).reshape(k, rb)
    pos = rng.permutation(k) if with_pos else None
    copy_rows(dst, src, loc, pos)
    want = np.zeros((k, rb), np.uint8)
    if with_pos:
        want[pos] = src[loc]
    else:
        want[:] = src[loc]
    np.testing.assert_array_equal(dst, want)


@pytest.mark.parametrize("idx,n,want", [
    ([], 0, True), ([0], 1, True), ([1], 1, False), ([0, 5, 9], 10, True), ([0, 10, 9], 10, False),
    ([3, -1, 2], 10, False), ([-(2**63)], 10, False), ([2**63 - 1], 2**63 - 1, False), ([2**63 - 2], 2**63 - 1, True),
])
def test_below_is_one_pass_of_both_bounds(idx, n, want):
    a = np.array(idx, np.int64)
    assert below(a, n) is want
    assert below(np.repeat(a, 3)[::3], n) is want  # not contiguous


@pytest.mark.parametrize("rb,gaps,whole", [
    (64, (0, 4096), True), (4096, (4096, 8192), True), (65536, (4096, 12288), True), (65536, (0, 65536), True),
    (3000, (4096, 4096), False), (2048, (1024, 3072), True), (2048, (100, 0), False),
])
def test_node_span_reads_each_shard_row(rb, gaps, whole):
    """node_span: the node's shards at distances of their own in one
    mapping (as the agent's segments lie); row i of shard o is at
    i * m + c[o] of the span, for every row of every shard, an empty shard
    among them; None where no chunk of 1 KiB divides the distances."""
    counts = (5, 0, 7)
    void = np.dtype((np.void, rb)) if rb < 1024 else None
    mm = mmap.mmap(-1, (sum(counts) + 2) * rb + sum(gaps) + 8192)
    base, off, fast, want = np.frombuffer(mm, np.uint8), 4096, [], []
    rng = np.random.default_rng(rb)
    first = 0
    for o, k in enumerate(counts):
        rows = base[off:off + k * rb].reshape(k, rb)
        rows[:] = rng.integers(0, 256, rows.shape, dtype=np.uint8)
        fast.append((first, k, None, rows, None))
        want.append(rows.copy())
        first += k
        off += k * rb + (gaps[0] if o == 0 else gaps[1])
    sp = node_span(fast, counts, rb, void)
    if not whole:
        assert sp is None
        return
    span, c, m, chunks, items, lo, hi, held = sp
    assert len(held) == 2 and lo == fast[0][3].ctypes.data
    assert hi == fast[2][3].ctypes.data + counts[2] * rb
    idx = np.arange(sum(counts))
    owner = np.searchsorted(np.cumsum(counts), idx, side="right")
    at = idx * m + c.take(owner)
    got = np.empty((idx.shape[0], rb), np.uint8)
    if m == 1:
        span.take(at, axis=0, out=got, mode="clip")
    else:
        span.take(at[:, None] + chunks, axis=0, out=got.reshape(idx.shape[0], m, -1), mode="clip")
    assert np.array_equal(got, np.concatenate(want))
    if items is not None:
        assert np.array_equal(items.take(at).view(np.uint8).reshape(-1, rb), got)
    del span, items, held, sp, rows, fast, base


@pytest.mark.parametrize("n", [0, 1, 16, 512, 513, 5000])
def test_distinct_is_np_unique(n):
    """A batch's owners: the sorted distinct ranks, as np.unique gives them,
    from a set for small batches and a bincount for large ones."""
    rng = np.random.default_rng(n)
    owners = rng.integers(0, 37, n)
    assert distinct(owners) == np.unique(owners).tolist()
    assert distinct(tuple(owners.tolist()[:3])) == sorted(set(owners.tolist()[:3]))

"""add_ragged's pure part: row lengths from lengths or offsets, and the
errors that name what is wrong."""

import os
import sys

import numpy as np
import pytest

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from ddstore import ArgumentError, GeometryError  # noqa: E402
from ddstore._ragged import row_lengths as _ragged_lengths  # noqa: E402


def test_lengths_and_offsets_agree():
    rng = np.random.default_rng(0)
    for _ in range(50):
        lens = rng.integers(0, 5, rng.integers(0, 20))
        off = np.concatenate(([0], np.cumsum(lens)))
        assert _ragged_lengths("v", lens, None).tolist() == lens.tolist()
        assert _ragged_lengths("v", None, off).tolist() == lens.tolist()
        assert _ragged_lengths("v", None, off).dtype == np.int64


@pytest.mark.parametrize("lengths,offsets,exc,what", [
    ([1, -3, 2], None, GeometryError, r"lengths\[1\] = -3: want >= 0"),
    (None, [0, 2, 1], GeometryError, r"offsets\[2\] = 1 after offsets\[1\] = 2"),
    (None, [2, 3], GeometryError, r"offsets\[0\] = 2: want 0"),
    (None, [], ArgumentError, "rows \\+ 1 integers"),
    ([1.5], None, ArgumentError, "integers"),
    ([1], [0, 1], ArgumentError, "lengths or offsets, one of them"),
    (None, None, ArgumentError, "lengths or offsets, one of them"),
])
def test_bad_lengths(lengths, offsets, exc, what):
    with pytest.raises(exc, match=what):
        _ragged_lengths("v", lengths, offsets)

"""ddstore.schedule against the Go side: the epoch orders Go recorded in
testdata/vectors.json ("permutations", made by vectors_test.go), and the
properties every order has."""

import json
import os
import sys

import numpy as np
import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
# python/, two folders up: the package under test.
PY = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, PY)

import ddstore  # noqa: E402
from ddstore import schedule  # noqa: E402

VECTORS = os.path.join(os.path.dirname(PY), "testdata", "vectors.json")

with open(VECTORS, encoding="utf-8") as _f:
    CASES = json.load(_f)["permutations"]


def _id(c):
    return f"seed={c['seed']},epoch={c['epoch']},n={c['n']}"


def test_vectors_cover_edges():
    assert {c["n"] for c in CASES} >= {0, 1}
    assert max(c["seed"] for c in CASES) == 2**64 - 1
    assert any(c["n"] >= 1000 for c in CASES)


@pytest.mark.parametrize("case", CASES, ids=_id)
def test_permutation_matches_go(case):
    got = schedule.permutation(case["seed"], case["epoch"], case["n"])
    assert got.dtype == np.int64
    assert got.tolist() == case["permutation"]


@pytest.mark.parametrize("case", [c for c in CASES if "keys" in c], ids=_id)
def test_keys_match_go(case):
    got = schedule.sort_keys(case["seed"], case["epoch"], case["n"])
    assert got.dtype == np.uint64
    assert [int(k) for k in got] == case["keys"]


def test_is_a_permutation():
    rng = np.random.default_rng(0)
    for _ in range(50):
        seed = int(rng.integers(0, 2**63)) * 2 + int(rng.integers(0, 2))
        epoch, n = int(rng.integers(0, 10**6)), int(rng.integers(0, 3000))
        p = schedule.permutation(seed, epoch, n)
        assert len(p) == n
        assert np.array_equal(np.sort(p), np.arange(n))


def test_function_of_its_inputs_alone():
    a = schedule.permutation(5, 2, 500)
    assert np.array_equal(a, schedule.permutation(np.uint64(5), np.int32(2), 500))
    assert not np.array_equal(a, schedule.permutation(5, 3, 500))
    assert not np.array_equal(a, schedule.permutation(6, 2, 500))


@pytest.mark.parametrize("args", [(-1, 0, 10), (2**64, 0, 10), (0, -1, 10), (0, 0, -1), (0, 0, 2**31),
                                  (0.5, 0, 10), (0, "1", 10), (True, 0, 10)])
def test_bad_arguments(args):
    with pytest.raises(ddstore.ArgumentError) as ei:
        schedule.permutation(*args)
    assert str(ei.value).startswith("ddstore: bad argument: schedule: ")

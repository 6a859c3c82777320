"""Ragged variables with a backing file from Python: a pair of datasets, the
flat values and the offsets — two datasets of an HDF5 file written by h5py
(when the agent has -tags hdf5), two .npy files — the ranks holding only the
first rows; every row read through the store must equal the file's."""

import subprocess

import numpy as np
import pytest

import ddstore
from conftest import run_ranks


def ragged_data(n, seed=0, trailing=(3,)):
    """(values, offsets) of n rows of 0..20 units of shape trailing, row g's
    units holding g * 1000 + unit position."""
    rng = np.random.default_rng(seed)
    lengths = rng.integers(0, 21, n)
    lengths[rng.random(n) < 0.15] = 0
    off = np.concatenate(([0], np.cumsum(lengths))).astype(np.int64)
    width = int(np.prod(trailing))
    vals = np.empty((int(off[-1]),) + trailing, np.float32)
    for g in range(n):
        u = np.arange((off[g + 1] - off[g]) * width).reshape((-1,) + trailing)
        vals[off[g]:off[g + 1]] = g * 1000 + u
    return vals, off


def check_reads(s, name, vals, off, seed=1, batch=16):
    n = off.shape[0] - 1
    rng = np.random.default_rng(seed)
    perm = rng.permutation(n)
    for k in range(0, n, batch):
        if k + 2 * batch <= n:
            s.prefetch(name, perm[k + batch:k + 2 * batch])
        idx = np.concatenate((perm[k:k + batch], perm[k:k + 1]))  # a repeat
        got, lens = s.get_ragged(name, idx)
        want = np.concatenate([vals[off[g]:off[g + 1]] for g in idx])
        np.testing.assert_array_equal(got, want)
        assert lens.tolist() == (off[idx + 1] - off[idx]).tolist()
    for g in (0, n - 1, n // 2):
        np.testing.assert_array_equal(s.get_ragged_row(name, g), vals[off[g]:off[g + 1]])


def _agent_has_hdf5(binary):
    out = subprocess.run([binary, "version"], capture_output=True, text=True).stdout
    return "with HDF5" in out


@pytest.mark.parametrize("layout", ["contiguous", "chunked-gzip"])
def test_ragged_backed_hdf5(job, tmp_path, layout):
    h5py = pytest.importorskip("h5py")
    if not _agent_has_hdf5(job["DDSTORE_BIN"]):
        pytest.skip("this ddstore binary is built without HDF5 (make build with libhdf5-dev installed)")
    vals, off = ragged_data(300, seed=2)
    f = tmp_path / "graphs.h5"
    with h5py.File(f, "w") as h:
        kw = {} if layout == "contiguous" else {"chunks": (64, 3), "compression": "gzip"}
        h.create_dataset("pos/values", data=vals, **kw)
        h.create_dataset("pos/offsets", data=off)
        h.create_dataset("pos/offsets32", data=off.astype(np.int32))
        h.create_dataset("pos/floats", data=off.astype(np.float64))
        bad = off.copy()
        bad[10], bad[11] = off[11] + 1, off[11]
        h.create_dataset("pos/decreasing", data=bad)
        h.create_dataset("pos/short", data=off[:-1])
    held = 75
    backing = (f"{f}:/pos/values", f"{f}:/pos/offsets")
    with ddstore.Store() as s:
        s.add_ragged("pos", vals[:off[held]], offsets=off[:held + 1], backing=backing, total=300)
        d = s.describe("pos")
        assert d["total_rows"] == 300 and d["held_rows"] == held and d["total_items"] == int(off[-1])
        assert d["backing"] == backing[0] and d["backing_offsets"] == backing[1]
        check_reads(s, "pos", vals, off)
        prof = s.get_profile("pos")
        assert prof["storage_rows"] > 0 and prof["remote_rows"] == 0, prof
        # int32 offsets read the same.
        s.add_ragged("pos32", vals[:off[held]], offsets=off[:held + 1], backing=(backing[0], f"{f}:/pos/offsets32"),
                     total=300)
        check_reads(s, "pos32", vals, off, seed=3)
        # Bad input: each a clear error, and the store keeps working.
        cases = [
            ("/pos/values", "/pos/nope", ddstore.ArgumentError, "/pos/nope"),
            ("/pos/nope", "/pos/offsets", ddstore.ArgumentError, "/pos/nope"),
            ("/pos/values", "/pos/floats", ddstore.ArgumentError, "float64: want integers"),
            ("/pos/values", "/pos/decreasing", ddstore.GeometryError, "offsets must not decrease"),
            ("/pos/values", "/pos/short", ddstore.GeometryError, "299 rows: the variable has 300"),
        ]
        for v, o, err, words in cases:
            with pytest.raises(err, match=words):
                s.add_ragged("bad", vals[:off[held]], offsets=off[:held + 1], backing=(f"{f}:{v}", f"{f}:{o}"),
                             total=300)
        with pytest.raises(ddstore.ArgumentError, match="float32, not int32"):
            s.add_ragged("bad", vals[:off[held]].astype(np.int32), offsets=off[:held + 1], backing=backing, total=300)
        with pytest.raises(ddstore.ArgumentError, match="want a pair"):
            s.add_ragged("bad", vals[:off[held]], offsets=off[:held + 1], backing=backing[0], total=300)
        with pytest.raises(ddstore.ArgumentError, match="without a dataset"):
            s.add_ragged("bad", vals[:off[held]], offsets=off[:held + 1], backing=(str(f), backing[1]), total=300)
        check_reads(s, "pos", vals, off, seed=4)


SCRIPT = r"""
import sys, numpy as np, ddstore
vf, of, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
vals, off = np.load(vf, mmap_mode="r"), np.load(of)
s = ddstore.Store()
r, p = s.rank, s.size
held = n // 4
lo, hi = r * held // p, (r + 1) * held // p
s.add_ragged("pos", np.ascontiguousarray(vals[off[lo]:off[hi]]), offsets=off[lo:hi + 1] - off[lo],
             backing=(vf, of), total=n)
rng = np.random.default_rng(r)
perm = rng.permutation(n)
B = 16
for k in range(0, n, B):
    if k + 2 * B <= n:
        s.prefetch("pos", perm[k + B:k + 2 * B])
    idx = perm[k:k + B]
    got, lens = s.get_ragged("pos", idx)
    want = np.concatenate([vals[off[g]:off[g + 1]] for g in idx])
    assert np.array_equal(got, want), (r, k)
prof = s.get_profile("pos")
print("rank", r, "storage", prof["storage_rows"], "remote", prof["remote_rows"])
if r == 0:
    # A row of node b read direct; with a row only in the backing file, the
    # batch goes through the own agent.
    g = next(g for g in range(2 * held // p, 3 * held // p) if off[g + 1] > off[g])
    b = next(i for i in range(n - 1, held, -1) if off[i + 1] > off[i])
    for batch, more in (([g, b], 0), ([g], 1)):
        d = s.get_profile("pos")["direct_rows"]
        got, lens = s.get_ragged("pos", batch)
        assert np.array_equal(got, np.concatenate([vals[off[i]:off[i + 1]] for i in batch])), batch
        assert s.get_profile("pos")["direct_rows"] == d + more, (batch, d, s.get_profile("pos"))
s.close()
"""


def test_ragged_backed_npy_four_ranks_two_nodes(job, tmp_path):
    n = 400
    vals, off = ragged_data(n, seed=5)
    vf, of = tmp_path / "values.npy", tmp_path / "offsets.npy"
    np.save(vf, vals)
    np.save(of, off)
    outs = run_ranks(SCRIPT, ["a", "a", "b", "b"], job, args=(str(vf), str(of), str(n)))
    assert all(int(o.split()[3]) > 0 and int(o.split()[5]) > 0 for o in outs), outs

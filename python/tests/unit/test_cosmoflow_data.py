"""The CosmoFlow-like dataset generator (ddstore_bench.cosmoflow.data and
`python -m ddstore_bench.cosmoflow generate`): deterministic samples, the chunked
file and the per-sample files hold them, the targets follow the documented
formulas, existing files are reused, bad arguments are refused."""

import os
import subprocess
import sys

import h5py
import numpy as np
import pytest

from conftest import ROOT
from ddstore_bench.cosmoflow import data

PY = os.path.join(ROOT, "python")
N, S, C = 8, 8, 4


def read_chunked(path):
    with h5py.File(path, "r") as f:
        return f["x"][...], f["y"][...], dict(f.attrs), f["x"].chunks, f["x"].dtype, f["y"].dtype


def read_files(paths):
    xs, ys = [], []
    for p in paths:
        with h5py.File(p, "r") as f:
            xs.append(f["x"][...])
            ys.append(f["y"][...])
    return np.stack(xs), np.stack(ys)


@pytest.fixture(scope="module")
def made(tmp_path_factory):
    out = str(tmp_path_factory.mktemp("cf"))
    return out, data.generate(out, N, size=S, channels=C, seed=7, verbose=False)


def test_sample_is_deterministic_and_independent_of_order():
    a = [data.sample(3, i, S, C) for i in range(4)]
    b = [data.sample(3, i, S, C) for i in reversed(range(4))][::-1]
    for (xa, ya), (xb, yb) in zip(a, b):
        assert xa.dtype == np.int16 and xa.shape == (C, S, S, S)
        assert ya.dtype == np.float32 and ya.shape == (4,)
        np.testing.assert_array_equal(xa, xb)
        np.testing.assert_array_equal(ya, yb)
    assert not np.array_equal(a[0][0], a[1][0])
    assert not np.array_equal(data.sample(3, 0, S, C)[0], data.sample(4, 0, S, C)[0])


def test_two_runs_write_the_same(made, tmp_path):
    out, paths = made
    other = data.generate(str(tmp_path), N, size=S, channels=C, seed=7, verbose=False)
    a, b = read_chunked(paths["chunked"]), read_chunked(other["chunked"])
    np.testing.assert_array_equal(a[0], b[0])
    np.testing.assert_array_equal(a[1], b[1])
    fa, fb = read_files(paths["files"]), read_files(other["files"])
    np.testing.assert_array_equal(fa[0], fb[0])
    np.testing.assert_array_equal(fa[1], fb[1])


def test_chunked_and_files_hold_the_samples(made):
    out, paths = made
    assert paths["chunked"] == os.path.join(out, "cosmoflow.h5")
    assert paths["files"] == [os.path.join(out, "files", f"sample_{i:06d}.h5") for i in range(N)]
    assert sorted(os.listdir(os.path.join(out, "files"))) == [f"sample_{i:06d}.h5" for i in range(N)]
    x, y, attrs, chunks, xt, yt = read_chunked(paths["chunked"])
    assert x.shape == (N, C, S, S, S) and xt == np.int16
    assert y.shape == (N, 4) and yt == np.float32
    assert chunks == (1, C, S, S, S)
    assert attrs["seed"] == 7 and attrs["version"] == data.VERSION and attrs["samples"] == N
    fx, fy = read_files(paths["files"])
    for i in range(N):
        sx, sy = data.sample(7, i, S, C)
        np.testing.assert_array_equal(x[i], sx)
        np.testing.assert_array_equal(y[i], sy)
        np.testing.assert_array_equal(fx[i], sx)
        np.testing.assert_array_equal(fy[i], sy)
    assert x.min() >= 0 and x.max() > 0


def documented_targets(x):
    # The formulas of ddstore_bench.cosmoflow.data's doc, written again here.
    c = x.shape[0]
    m = np.array([x[k].astype(np.float64).mean() for k in range(c)])
    v = np.array([x[k].astype(np.float64).var() for k in range(c)])
    z = np.log(1 + m) - np.log(1 + 8.0)
    r = np.log(1 + v / (1 + m))
    w = np.linspace(-1, 1, c) if c > 1 else np.zeros(1)
    return np.array([z.mean() / 0.6, (r.mean() - 1.6) / 0.65, (w * z).mean() / 0.2,
                     ((w * r).mean() - 0.2) / 0.15])


@pytest.mark.parametrize("channels", [1, 4])
def test_targets_follow_the_documented_formulas(channels):
    ys = []
    for i in range(N):
        x, y = data.sample(11, i, S, channels)
        np.testing.assert_allclose(y, documented_targets(x), rtol=1e-5, atol=1e-6)
        ys.append(y)
    ys = np.array(ys)
    assert np.all(np.isfinite(ys)) and np.all(np.abs(ys) < 10)
    if channels == 4:
        assert np.all(ys.std(axis=0) > 0.1)  # every target varies across samples


def test_reuse_skips_generation(made, capsys):
    out, paths = made
    before = {p: os.stat(p).st_mtime_ns for p in [paths["chunked"], *paths["files"]]}
    again = data.generate(out, N, size=S, channels=C, seed=7, verbose=True)
    assert again == paths
    text = capsys.readouterr().out
    assert text.count("generation skipped") == 2 and "GB/s" not in text
    assert {p: os.stat(p).st_mtime_ns for p in before} == before


def test_changed_attrs_regenerate(tmp_path, capsys):
    out = str(tmp_path)
    p = data.generate(out, 4, size=S, channels=2, seed=1, fmt="chunked", verbose=False)["chunked"]
    data.generate(out, 4, size=S, channels=2, seed=2, fmt="chunked")
    assert "GB/s" in capsys.readouterr().out
    x, y, attrs, *_ = read_chunked(p)
    assert attrs["seed"] == 2
    np.testing.assert_array_equal(x[3], data.sample(2, 3, S, 2)[0])
    # Files: a partial set is completed; extra files of a larger run removed.
    fp = data.generate(out, 6, size=S, channels=2, seed=2, fmt="files", verbose=False)["files"]
    os.unlink(fp[2])
    fp = data.generate(out, 4, size=S, channels=2, seed=2, fmt="files")["files"]
    assert "reusing 3 of 4 files" in capsys.readouterr().out
    assert sorted(os.listdir(os.path.join(out, "files"))) == [f"sample_{i:06d}.h5" for i in range(4)]
    np.testing.assert_array_equal(read_files(fp)[0][2], data.sample(2, 2, S, 2)[0])
    assert not [n for n in os.listdir(out) if ".tmp-" in n]


def test_formats(tmp_path):
    assert set(data.generate(str(tmp_path / "a"), 2, size=4, fmt="chunked", verbose=False)) == {"chunked"}
    assert not os.path.exists(tmp_path / "a" / "files")
    assert set(data.generate(str(tmp_path / "b"), 2, size=4, fmt="files", verbose=False)) == {"files"}
    assert not os.path.exists(tmp_path / "b" / "cosmoflow.h5")


@pytest.mark.parametrize("kw, value", [({"size": 3}, "3"), ({"samples": 0}, "0"), ({"fmt": "zarr"}, "zarr"),
                                       ({"channels": 0}, "0"), ({"seed": -1}, "-1"), ({"size": 2.5}, "2.5")])
def test_bad_arguments(tmp_path, kw, value):
    args = {"samples": 2, "size": 4, **kw}
    with pytest.raises(ValueError, match=value):
        data.generate(str(tmp_path), verbose=False, **args)
    assert not os.listdir(tmp_path)


def cli(*args):
    return subprocess.run([sys.executable, "-m", "ddstore_bench.cosmoflow", "generate", *args], cwd=PY,
                          env={**os.environ, "PYTHONPATH": PY}, capture_output=True, text=True, timeout=120)


def test_cli(tmp_path):
    out = str(tmp_path)
    r = cli("--out", out, "--samples", "3", "--size", "8", "--seed", "5")
    assert r.returncode == 0, r.stderr
    assert "GB/s" in r.stdout
    x, y, attrs, *_ = read_chunked(os.path.join(out, "cosmoflow.h5"))
    assert x.shape == (3, 4, 8, 8, 8) and attrs["seed"] == 5
    np.testing.assert_array_equal(x[2], data.sample(5, 2, 8, 4)[0])
    fx, fy = read_files([os.path.join(out, "files", f"sample_{i:06d}.h5") for i in range(3)])
    np.testing.assert_array_equal(fy, y)
    r = cli("--out", out, "--samples", "3", "--size", "8", "--seed", "5")
    assert r.returncode == 0 and r.stdout.count("generation skipped") == 2, r.stdout + r.stderr
    r = cli("--out", out, "--format", "tar")
    assert r.returncode == 2 and "tar" in r.stderr
    r = cli("--out", out, "--size", "2")
    assert r.returncode == 2 and "size" in r.stderr and "2" in r.stderr

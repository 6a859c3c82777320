"""The atomistic GNN job (`python -m ddstore_bench.gnn train`) at a toy size,
two ranks on two simulated nodes: every loader hands each structure of an
epoch to exactly one rank, with its own rows (energy, atom and edge counts
checked against the flat file); the losses of the loaders that hold the set
in memory (pyddstore's byte records, ragged variables) are the baseline's,
epoch by epoch (the same batches in the same order), and ddstore-locality,
holding the prefix that fills half the bytes, reads the rest from the
flat file as its schedule plans, for the same global batches."""

import json
import math
import os
import subprocess
import sys

import pytest

from conftest import ROOT

pytest.importorskip("ase")
pytest.importorskip("h5py")
pytest.importorskip("torch")

N, E, B, P = 24, 2, 4, 2


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    from ddstore_bench.gnn import data
    out = tmp_path_factory.mktemp("gnn")
    data.generate(str(out), N, verbose=False)
    return out


def test_loaders_agree(job, dataset):
    out = subprocess.run([job["DDSTORE_BIN"], "version"], capture_output=True, text=True).stdout
    if "with HDF5" not in out:
        pytest.skip("this ddstore binary is built without HDF5 (make build with libhdf5-dev installed)")
    cmd = [sys.executable, "-m", "ddstore_bench.gnn", "train", "--json", "--samples", str(N), "--epochs", str(E),
           "--batch", str(B), "--ranks", str(P), "--nodes", "2", "--threads", "1", "--data", str(dataset)]
    env = {**os.environ, "PYTHONPATH": os.path.join(ROOT, "python")}
    r = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-4000:]
    res = json.loads(r.stdout)
    loaders = res["loaders"]
    assert list(loaders) == ["baseline", "pyddstore-bytes", "ddstore", "ddstore-locality"]
    base = loaders["baseline"]
    per_epoch = N // P // B * B * P
    for name, s in loaders.items():
        assert s["samples_per_epoch"] == [per_epoch] * E, name
        assert s["repeated_per_epoch"] == [0] * E, name
        assert s["content_errors"] == 0, name
        assert all(math.isfinite(x) for x in s["train_loss_per_epoch"]), name
    for name in ("pyddstore-bytes", "ddstore"):
        s = loaders[name]
        assert s["train_loss_per_epoch"] == pytest.approx(base["train_loss_per_epoch"], rel=1e-9), name
        assert s["storage_reads_per_epoch"] == [0] * E and s["setup_storage_reads"] == N, name
    assert base["storage_reads_per_epoch"] == [per_epoch] * E
    # Half the bytes in memory: the pinned prefix loaded, the other
    # structures read from the file as planned, the same global batches
    # (losses equal but for the order of the sums).
    loc = loaders["ddstore-locality"]
    sc = loc["schedule"]
    held = sc["pinned_samples"]
    assert 0 < held < N and loc["setup_storage_reads"] == held
    assert sc["capacity_bytes"] == int(0.5 * sc["total_bytes"]) and sc["pinned_bytes"] <= sc["capacity_bytes"]
    assert all(0 < r < per_epoch for r in loc["storage_reads_per_epoch"]), loc["storage_reads_per_epoch"]
    assert all(0 < h < 1 for h in loc["planned_byte_hit_rate_per_epoch"])
    assert all(h <= sc["byte_bound"] + 1e-12 for h in loc["planned_byte_hit_rate_per_epoch"])
    assert loc["train_loss_per_epoch"] == pytest.approx(base["train_loss_per_epoch"], rel=1e-5)


def test_bad_arguments(job, dataset):
    cmd = [sys.executable, "-m", "ddstore_bench.gnn", "train", "--samples", "4", "--batch", "4", "--ranks", "2",
           "--data", str(dataset)]
    env = {**os.environ, "PYTHONPATH": os.path.join(ROOT, "python")}
    r = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "--batch 4 x 2 ranks above --samples 4" in r.stderr
    r = subprocess.run(cmd[:4] + ["--loaders", "nope"], env=env, capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "loader 'nope'" in r.stderr
    r = subprocess.run(cmd[:4] + ["--threads", "-1"], env=env, capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "--threads -1: want >= 0" in r.stderr

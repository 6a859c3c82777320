"""The atomistic GNN job (`python -m ddstore_bench.gnn train`) at a toy size,
two ranks on two simulated nodes: every loader hands each structure of an
epoch to exactly one rank, with its own rows (energy, atom and edge counts
checked against the flat file), and the losses of the loaders that hold
the set in memory (pyddstore's byte records, ragged variables) are the
baseline's, epoch by epoch (the same batches in the same order)."""

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
    cmd = [sys.executable, "-m", "ddstore_bench.gnn", "train", "--json", "--samples", str(N), "--epochs", str(E),
           "--batch", str(B), "--ranks", str(P), "--nodes", "2", "--data", str(dataset)]
    env = {**os.environ, "PYTHONPATH": os.path.join(ROOT, "python")}
    r = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-4000:]
    res = json.loads(r.stdout)
    loaders = res["loaders"]
    assert list(loaders) == ["baseline", "pyddstore-bytes", "ddstore"]
    base = loaders["baseline"]
    per_epoch = N // P // B * B * P
    for name, s in loaders.items():
        assert s["samples_per_epoch"] == [per_epoch] * E, name
        assert s["repeated_per_epoch"] == [0] * E, name
        assert s["content_errors"] == 0, name
        assert all(math.isfinite(x) for x in s["train_loss_per_epoch"]), name
        if name != "baseline":
            assert s["train_loss_per_epoch"] == pytest.approx(base["train_loss_per_epoch"], rel=1e-9), name
            assert s["storage_reads_per_epoch"] == [0] * E and s["setup_storage_reads"] == N, name
    assert base["storage_reads_per_epoch"] == [per_epoch] * E


def test_bad_arguments(job, dataset):
    cmd = [sys.executable, "-m", "ddstore_bench.gnn", "train", "--samples", "4", "--batch", "4", "--ranks", "2",
           "--data", str(dataset)]
    env = {**os.environ, "PYTHONPATH": os.path.join(ROOT, "python")}
    r = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "--batch 4 x 2 ranks above --samples 4" in r.stderr
    r = subprocess.run(cmd[:4] + ["--loaders", "nope"], env=env, capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "loader 'nope'" in r.stderr

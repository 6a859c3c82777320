"""The atomistic GNN job (`python -m ddstore_bench.gnn train`) at a toy size,
two ranks on two simulated nodes: every loader hands each structure of an
epoch to exactly one rank, with its own rows (energy, atom and edge counts
checked against the flat file), and the ddstore loader's losses are the
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
    base, ours = res["loaders"]["baseline"], res["loaders"]["ddstore"]
    per_epoch = N // P // B * B * P
    for s in (base, ours):
        assert s["samples_per_epoch"] == [per_epoch] * E
        assert s["repeated_per_epoch"] == [0] * E
        assert s["content_errors"] == 0
        assert all(math.isfinite(x) for x in s["train_loss_per_epoch"])
    assert ours["train_loss_per_epoch"] == pytest.approx(base["train_loss_per_epoch"], rel=1e-9)
    assert base["storage_reads_per_epoch"] == [per_epoch] * E
    assert ours["storage_reads_per_epoch"] == [0] * E and ours["setup_storage_reads"] == N


def test_bad_arguments(job, dataset):
    cmd = [sys.executable, "-m", "ddstore_bench.gnn", "train", "--samples", "4", "--batch", "4", "--ranks", "2",
           "--data", str(dataset)]
    env = {**os.environ, "PYTHONPATH": os.path.join(ROOT, "python")}
    r = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "--batch 4 x 2 ranks above --samples 4" in r.stderr
    r = subprocess.run(cmd[:4] + ["--loaders", "nope"], env=env, capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "loader 'nope'" in r.stderr

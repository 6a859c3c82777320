"""The atomistic dataset (ddstore_bench.gnn.data and `python -m
ddstore_bench.gnn generate`): structures are deterministic by (seed, index),
of 8 to 256 atoms, with EMT's energies and forces and the edges within the
cutoff; the flat file's rows and offsets and the per-structure files hold the
same structures; files are reused; bad arguments are refused. The network
(ddstore_bench.gnn.model) sums its atoms' energies per structure."""

import os
import subprocess
import sys

import numpy as np
import pytest

pytest.importorskip("ase")
from conftest import ROOT  # noqa: E402
from ddstore_bench.gnn import data  # noqa: E402

PY = os.path.join(ROOT, "python")
N = 12


@pytest.fixture(scope="module")
def generated(tmp_path_factory):
    out = str(tmp_path_factory.mktemp("gnn"))
    return out, data.generate(out, N, seed=3, verbose=False)


def test_structures_are_deterministic_and_physical():
    from ase import Atoms
    from ase.calculators.emt import EMT
    a, b = data.structure(3, 5), data.structure(3, 5)
    for k in a:
        assert np.array_equal(a[k], b[k]), k
    c = data.structure(4, 5)  # another seed, another structure
    assert c["pos"].shape != a["pos"].shape or not np.array_equal(c["pos"], a["pos"])
    sizes = [len(data.structure(0, i)["z"]) for i in range(24)]
    assert min(sizes) >= data.MIN_ATOMS and max(sizes) <= data.MAX_ATOMS
    assert len(set(sizes)) > 12, sizes  # sizes of their own, not a few fixed ones
    s = data.structure(0, 7)
    n, e = len(s["z"]), len(s["dist"])
    assert s["pos"].shape == (n, 3) and s["forces"].shape == (n, 3) and s["edge_index"].shape == (e, 2)
    assert s["edge_index"].min() >= 0 and s["edge_index"].max() < n
    assert (s["edge_index"][:, 0] != s["edge_index"][:, 1]).all()
    assert (s["dist"] > 0).all() and (s["dist"] < 3.0).all()
    # Each pair both ways: the neighbour list is symmetric.
    pairs = {tuple(p) for p in s["edge_index"].tolist()}
    assert all((j, i) in pairs for i, j in pairs)
    # The energy is EMT's for the stored atoms (a free cluster: positions
    # alone define it).
    for i in range(24):
        t = data.structure(0, i)
        if np.abs(t["pos"]).max() < 30 and t["dist"].size and _is_cluster(t):
            atoms = Atoms(t["z"].astype(int), positions=t["pos"].astype(np.float64), pbc=False)
            atoms.calc = EMT()
            assert atoms.get_potential_energy() == pytest.approx(float(t["energy"]), abs=1e-3)
            break
    else:
        pytest.fail("no cluster among the first 24 structures")


def _is_cluster(t):
    # Positions of a cluster are centred on the origin; a bulk cell's start
    # at its corner.
    return t["pos"].min() < -1.0


def test_flat_file_and_per_structure_files_agree(generated):
    out, paths = generated
    f = data.read_flat(paths["flat"])
    assert f["atom_offsets"].shape == (N + 1,) and f["edge_offsets"].shape == (N + 1,)
    assert f["atom_offsets"][-1] == len(f["z"]) == len(f["pos"])
    assert f["edge_offsets"][-1] == len(f["dist"]) == len(f["edge_index"])
    assert len(paths["files"]) == N
    for i in range(N):
        s = data.read_file(paths["files"][i])
        want = data.structure(3, i)
        a0, a1 = f["atom_offsets"][i:i + 2]
        e0, e1 = f["edge_offsets"][i:i + 2]
        for k in data.ATOM_FIELDS:
            assert np.array_equal(f[k][a0:a1], want[k]) and np.array_equal(s[k], want[k]), (i, k)
        for k in data.EDGE_FIELDS:
            assert np.array_equal(f[k][e0:e1], want[k]) and np.array_equal(s[k], want[k]), (i, k)
        assert f["energy"][i] == want["energy"] == s["energy"]


def test_generate_reuses_files(generated, capsys):
    out, paths = generated
    mtime = os.stat(paths["flat"]).st_mtime_ns
    again = data.generate(out, N, seed=3, verbose=True)
    assert again == paths
    assert os.stat(paths["flat"]).st_mtime_ns == mtime
    assert "generation skipped" in capsys.readouterr().out


@pytest.mark.parametrize("kw,what", [
    ({"samples": 0}, "samples = 0"), ({"samples": 2.5}, "samples = 2.5"), ({"seed": -1}, "seed = -1"),
    ({"cutoff": 0.1}, "cutoff = 0.1"), ({"fmt": "zip"}, "format = 'zip'"),
])
def test_bad_arguments(tmp_path, kw, what):
    args = {"samples": 2, "seed": 0, "cutoff": 3.0, "fmt": "both", **kw}
    with pytest.raises(ValueError, match=what.replace(".", r"\.")):
        data.generate(str(tmp_path), args["samples"], seed=args["seed"], cutoff=args["cutoff"], fmt=args["fmt"],
                      verbose=False)
    assert os.listdir(tmp_path) == []


def test_command_line(tmp_path):
    r = subprocess.run([sys.executable, "-m", "ddstore_bench.gnn", "generate", "--out", str(tmp_path),
                        "--samples", "2", "--format", "flat"], cwd=PY, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert os.listdir(tmp_path) == [data.FLAT_NAME]
    r = subprocess.run([sys.executable, "-m", "ddstore_bench.gnn", "generate", "--out", str(tmp_path),
                        "--samples", "-3"], cwd=PY, capture_output=True, text=True)
    assert r.returncode == 2 and "samples = -3" in r.stderr


def test_model_sums_atom_energies_per_structure():
    torch = pytest.importorskip("torch")
    from ddstore_bench.gnn.model import EnergyNet
    torch.manual_seed(0)
    net = EnergyNet()
    graphs = [data.structure(0, i) for i in range(3)]
    one = [float(net(torch.from_numpy(g["z"]), torch.from_numpy(g["edge_index"].T.astype(np.int64)),
                     torch.from_numpy(g["dist"]), torch.zeros(len(g["z"]), dtype=torch.long), 1)) for g in graphs]
    # The same three as one batch: atoms concatenated, edges shifted.
    shift = np.cumsum([0] + [len(g["z"]) for g in graphs[:-1]])
    z = torch.from_numpy(np.concatenate([g["z"] for g in graphs]))
    ei = torch.from_numpy(np.concatenate([g["edge_index"] + s for g, s in zip(graphs, shift)]).T.astype(np.int64))
    dist = torch.from_numpy(np.concatenate([g["dist"] for g in graphs]))
    batch = torch.from_numpy(np.repeat(np.arange(3), [len(g["z"]) for g in graphs]))
    many = net(z, ei, dist, batch, 3)
    assert many.shape == (3,)
    assert many.detach().numpy() == pytest.approx(one, rel=1e-4, abs=1e-4)

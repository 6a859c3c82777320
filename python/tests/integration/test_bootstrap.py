"""PyDDStore(comm) on two simulated nodes with nothing in the environment
about where agents meet: no DDSTORE_RENDEZVOUS, DDSTORE_SECRET,
DDSTORE_PEER_LISTEN or DDSTORE_HANDSHAKE_DIR. The communicator (mpi4py under
Open MPI's mpirun, or a torch.distributed gloo group) carries the rendezvous
and the secret rank 0 makes. Besides what mpirun sets, the ranks see
DDSTORE_BIN (the binary under test), DDSTORE_RUN_DIR and DDSTORE_NAMESPACE
(a private run directory and namespace per test), PYTHONPATH, and each
script sets DDSTORE_NODE_ID itself to simulate its node."""

import os
import shutil
import subprocess
import sys

import pytest

from conftest import ROOT

pytestmark = pytest.mark.skipif(shutil.which("mpirun") is None, reason="Open MPI (mpirun) is not installed")

_MEET = ("DDSTORE_RENDEZVOUS", "DDSTORE_SECRET", "DDSTORE_PEER_LISTEN", "DDSTORE_HANDSHAKE_DIR")


def mpirun_plain(job, tmp_path, script, np_, *args, timeout=150, expect_ok=True):
    """script as np_ ranks of mpirun with none of the variables of _MEET;
    returns (returncode, output)."""
    path = tmp_path / "rank.py"
    path.write_text(script)
    env = {k: v for k, v in os.environ.items() if k not in _MEET}
    env.update(job)
    env["PYTHONPATH"] = os.path.join(ROOT, "python")
    cmd = ["mpirun", "--allow-run-as-root", "--oversubscribe", "-np", str(np_)]
    for k in ("PYTHONPATH", *job):
        cmd += ["-x", k]
    try:
        r = subprocess.run(cmd + [sys.executable, str(path), *args], env=env, capture_output=True, text=True,
                           timeout=timeout)
    except subprocess.TimeoutExpired as e:
        raise AssertionError(f"the ranks hang (no answer within {timeout}s):\n{e.stdout}\n{e.stderr}") from None
    out = r.stdout + r.stderr
    if expect_ok:
        assert r.returncode == 0, out
        oks = sorted(line for line in r.stdout.splitlines() if line.startswith("ok"))
        assert oks == [f"ok {i}" for i in range(np_)], out
    return r.returncode, out


WORLD = r"""
import os, sys
import numpy as np
from mpi4py import MPI
comm = MPI.COMM_WORLD
rank, size = comm.Get_rank(), comm.Get_size()
node = rank * 2 // size                       # two simulated nodes: ranks in halves
os.environ["DDSTORE_NODE_ID"] = "n%d" % node
import pyddstore
dds = pyddstore.PyDDStore(comm, publish_timeout=60)
nrows = 5 + rank
first = sum(5 + r for r in range(rank))
dds.add("x", (np.arange(first, first + nrows, dtype=np.float64)[:, None] * np.ones(3)))
total = sum(5 + r for r in range(size))
assert dds.info("x") == (total, 3, 8)
dds.epoch_begin()
out = np.empty((total, 3))
dds.get("x", out, 0)                          # every rank's rows, half of them from the other node
assert (out[:, 0] == np.arange(total)).all()
idx = np.random.default_rng(rank).integers(0, total, 50)
o = np.empty((50, 3))
dds.get_batch("x", o, idx)
assert (o[:, 1] == idx).all()
assert dds.get_profile("x")["remote_rows"] > 0
dds.epoch_end()
dds.free()
sys.stdout.write(f"ok {rank}\n"); sys.stdout.flush()
"""


@pytest.mark.parametrize("np_", [2, 4])
def test_world_on_two_nodes(job, tmp_path, np_):
    mpirun_plain(job, tmp_path, WORLD, np_)


GROUPS = r"""
import os, sys
import numpy as np
from mpi4py import MPI
w = MPI.COMM_WORLD
rank, size = w.Get_rank(), w.Get_size()
how, hs = sys.argv[1], sys.argv[2]
# Every group of two spans both nodes, and one group has no world rank 0:
# split groups {0, 2} and {1, 3} over nodes {0, 1} and {2, 3}; width groups
# {0, 1} and {2, 3} over alternating nodes.
os.environ["DDSTORE_NODE_ID"] = "n%d" % (rank * 2 // size if how == "split" else rank % 2)
import pyddstore
from pyddstore.torch import _group_store
kw = {"handshake_dir": hs} if hs != "-" else {}
if how == "split":
    sub = w.Split(rank % 2, rank)             # groups {0, 2} and {1, 3}
    dds = pyddstore.PyDDStore(sub, publish_timeout=60, **kw)
    grank, gsize, gid = sub.Get_rank(), sub.Get_size(), rank % 2
else:                                         # DDStore's ddstore_width: groups {0, 1} and {2, 3}
    dds = _group_store(w, 2, 2 if hs != "-" else 0, hs if hs != "-" else None)
    grank, gsize, gid = rank % 2, 2, rank // 2
assert (dds.rank, dds.size) == (grank, gsize), (dds.rank, dds.size)
n = 4
dds.add("v", np.full((n, 2), 100 * gid + grank, np.int64))   # each group its own copy
out = np.empty((n * gsize, 2), np.int64)
dds.get("v", out, 0)
want = np.repeat(100 * gid + np.arange(gsize), n)
assert (out[:, 0] == want).all(), (out[:, 0], want)
dds.epoch_begin()
dds.epoch_end()
dds.free()
sys.stdout.write(f"ok {rank}\n"); sys.stdout.flush()
"""


@pytest.mark.parametrize("how", ["split", "width"])
@pytest.mark.parametrize("where", ["handshake-dir", "communicator"])
def test_groups_on_two_nodes(job, tmp_path, how, where):
    hs = str(tmp_path / "hs") if where == "handshake-dir" else "-"
    if where == "handshake-dir":
        os.makedirs(hs)
    mpirun_plain(job, tmp_path, GROUPS, 4, how, hs)


DISAGREE = r"""
import os, sys
from mpi4py import MPI
comm = MPI.COMM_WORLD
rank = comm.Get_rank()
os.environ["DDSTORE_NODE_ID"] = "n%d" % rank
if rank == 1:
    os.environ["DDSTORE_HANDSHAKE_DIR"] = sys.argv[1]
import ddstore, pyddstore
try:
    pyddstore.PyDDStore(comm)
except ddstore.ArgumentError as e:
    assert "ranks 0 have no handshake directory or rendezvous address" in str(e), e
    assert "ranks 1 have a handshake directory" in str(e), e
    sys.stdout.write(f"ok {rank}\n"); sys.stdout.flush()
"""


def test_ranks_disagree(job, tmp_path):
    """A rank with a handshake directory and one with nothing: an error on
    both at once, naming them, not agents waiting for each other."""
    os.makedirs(tmp_path / "hs")
    mpirun_plain(job, tmp_path, DISAGREE, 2, str(tmp_path / "hs"))


TORCH = r"""
import os, sys
import numpy as np
import torch.distributed as dist
rank, size = int(os.environ["OMPI_COMM_WORLD_RANK"]), int(os.environ["OMPI_COMM_WORLD_SIZE"])
dist.init_process_group("gloo", init_method="file://" + sys.argv[1], rank=rank, world_size=size)
os.environ["DDSTORE_NODE_ID"] = "n%d" % rank
import pyddstore
dds = pyddstore.PyDDStore(dist.group.WORLD, publish_timeout=60)
dds.add("t", np.full((3, 4), rank, np.float32))
out = np.empty((3, 4), np.float32)
dds.get("t", out, 3 * ((rank + 1) % size))
assert (out == (rank + 1) % size).all()
dds.free()
dist.destroy_process_group()
sys.stdout.write(f"ok {rank}\n"); sys.stdout.flush()
"""


def test_torch_group_on_two_nodes(job, tmp_path):
    pytest.importorskip("torch")
    mpirun_plain(job, tmp_path, TORCH, 2, str(tmp_path / "pg"))

"""Replica groups (DDStore's ddstore_width, or a split communicator): each
group holds a whole copy and reads stay inside it."""

import shutil

import pytest

from conftest import mpirun_ranks, run_ranks

WIDTH = r"""
import numpy as np, ddstore, torch
from ddstore.torch import DistDataset
s = ddstore.Store(width=2)
world = int(__import__("os").environ["DDSTORE_RANK"])
assert (s.group, s.rank, s.size) == (world // 2 * 2, world % 2, 2), (s.group, s.rank, s.size)
n = 50
data = np.arange(n * 3, dtype=np.float32).reshape(n, 3)
lo, hi = s.rank * n // s.size, (s.rank + 1) * n // s.size
s.add("x", data[lo:hi])
out = np.empty((n, 3), np.float32)
s.get("x", out, 0)
assert np.array_equal(out, data)
p = s.get_profile("x")
assert p["remote_rows"] == 0, p  # the group lies on this rank's node
ds = DistDataset(torch.utils.data.TensorDataset(torch.from_numpy(data)), "ds", ddstore_width=2)
assert torch.equal(ds[n - 1][0], torch.from_numpy(data[n - 1]))
assert ds.store.get_profile("ds/0")["remote_rows"] == 0
ds.close()
s.free("x")
print("ok", world)
s.close()
"""


def test_width(job):
    outs = run_ranks(WIDTH, ["a", "a", "b", "b"], job)
    assert [o.split()[-1] for o in outs] == ["0", "1", "2", "3"], outs


SPLIT = r"""
import os, sys
import numpy as np
from mpi4py import MPI
w = MPI.COMM_WORLD
rank = w.Get_rank()
os.environ["DDSTORE_NODE_ID"] = "n%d" % (rank // 2)
import ddstore
sub = w.Split(rank // 2, rank)          # groups {0, 1} and {2, 3}, as DDStore users split
s = ddstore.Store(sub, agent_wait=30)
assert (s.group, s.rank, s.size) == (rank // 2 * 2, rank % 2, 2), (s.group, s.rank, s.size)
n = 40 + rank // 2                       # the groups' copies differ: each reads its own
data = (np.arange(n, dtype=np.int64)[:, None] * 10 + rank // 2).repeat(2, axis=1)
lo, hi = s.rank * n // 2, (s.rank + 1) * n // 2
s.add("v", data[lo:hi])
out = np.empty((n, 2), np.int64)
s.get("v", out, 0)
assert np.array_equal(out, data), out[:3]
assert s.info("v")[0] == n
sub.Barrier()
s.free("v")
s.close()
sys.stdout.write(f"ok {rank}\n"); sys.stdout.flush()
"""


@pytest.mark.skipif(shutil.which("mpirun") is None, reason="Open MPI (mpirun) is not installed")
def test_split_communicator(job, tmp_path):
    pytest.importorskip("mpi4py")
    mpirun_ranks(job, tmp_path, SPLIT, 4)

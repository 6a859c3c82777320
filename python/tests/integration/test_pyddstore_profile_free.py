"""DDStore's get_profile(name) keys and free() from __del__ after
MPI_Finalize (DDStore's docs/api-pyddstore.md), under plain mpirun at 2 and 4
ranks on two simulated nodes: the counters count what was read, and a free()
(or close()) that runs once MPI is finalised neither crashes nor hangs, and
leaves no share of the store's variables with the agents."""

import shutil

import pytest

pytestmark = pytest.mark.skipif(shutil.which("mpirun") is None, reason="Open MPI (mpirun) is not installed")

SCRIPT = r"""
import gc, json, os, subprocess, sys, time
import numpy as np
from mpi4py import MPI
comm = MPI.COMM_WORLD
rank, size = comm.Get_rank(), comm.Get_size()
node = "n%d" % (rank * 2 // size)
os.environ["DDSTORE_NODE_ID"] = node   # two simulated nodes
import ddstore, pyddstore
how = sys.argv[1]

dds = pyddstore.PyDDStore(comm)
dds.add("x", np.full((4, 3), rank, np.float32))
dds.epoch_begin()
out = np.empty((1, 3), np.float32)
for i in range(4 * size):
    dds.get("x", out, i)
    assert (out == i // 4).all()
b = np.empty((5, 3), np.float32)
dds.get_batch("x", b, [0, 4 * size - 1, 1, 2, 3])
assert b[:, 0].tolist() == [0, size - 1, 0, 0, 0]
dds.epoch_end()
p = dds.get_profile("x")
DDSTORE_KEYS = {"calls": int, "rows": int, "lock_wait": float, "mr": float, "mr_miss": int, "read": float,
                "cq": float, "py_gets": int, "py_get": float, "py_sync": float}
for k, t in DDSTORE_KEYS.items():
    assert isinstance(p[k], t), (k, p[k])
assert p["calls"] == 4 * size + 1 and p["rows"] == 4 * size + 5, p
assert p["py_gets"] == 4 * size + 1 and p["py_get"] > 0 and p["read"] > 0, p  # rows of the other node waited for
assert p["lock_wait"] == p["mr"] == p["cq"] == p["py_sync"] == 0 and p["mr_miss"] == 0, p
assert p["remote_rows"] == 4 * (size // 2) + (1 if rank < size // 2 else 4), p  # ddstore's own counters too
try:
    dds.get_profile("nope")
except KeyError:
    pass
else:
    raise AssertionError("a profile of an unknown variable")

# A dataset's reads count in its store's Python counters, as DDStore's
# (they go through PyDDStore.get_batch there): a call per field read.
import torch, pyddstore.torch as pt
ds = pt.DistDataset(torch.utils.data.TensorDataset(torch.arange(20.).reshape(10, 2), torch.arange(10)), "ds", comm)
before = ds.ddstore.get_profile("ds/0")
got = ds.__getitems__([0, 9])
x, y = ds[3]
assert int(y) == 3 and [int(s[1]) for s in got] == [0, 9]
after = ds.ddstore.get_profile("ds/0")
assert after["py_gets"] == before["py_gets"] + 4 and after["py_get"] > before["py_get"], (before, after)
assert after["rows"] == before["rows"] + 3 and after["calls"] == before["calls"] + 2, (before, after)

# Stores whose close would need MPI: one-sided windows, a replica group's
# own fence communicator.
win = ddstore.Store(comm, method="mpi")
win.add("w", np.full((2, 2), rank, np.int64))
grp = ddstore.Store(comm, width=2)
grp.add("g", np.full((2, 1), rank, np.int64))
win.fence(); grp.fence()


class Holder:
    # HydraGNN's pattern: the store freed when its owner goes.
    def __init__(self, *stores):
        self.stores = stores

    def __del__(self):
        for s in self.stores:
            s.free()
            if how == "close":
                s.close()


h = Holder(dds, win, grp, ds.ddstore)
del dds, win, grp, ds
comm.Barrier()
MPI.Finalize()
del h
gc.collect()


def left():
    r = subprocess.run([os.environ["DDSTORE_BIN"], "info", "--json", "--namespace", os.environ["DDSTORE_NAMESPACE"],
                        "--node", node, "--run-dir", os.environ["DDSTORE_RUN_DIR"]], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    return [v["name"] for v in json.loads(r.stdout)["variables"] or []]


# Every rank freed its shares while every process still lives: the agents
# drop each variable once all ranks have.
deadline = time.monotonic() + 60
while left():
    assert time.monotonic() < deadline, left()
    time.sleep(0.02)
sys.stdout.write("ok %d\n" % rank); sys.stdout.flush()
"""


@pytest.mark.parametrize("np_,how", [(2, "free"), (4, "close")])
def test_profile_and_free_after_finalize(job, tmp_path, np_, how):
    from test_bootstrap import mpirun_plain
    mpirun_plain(job, tmp_path, SCRIPT, np_, how, timeout=180)

"""A variable belongs to its store, as in DDStore: several stores on one
communicator (HydraGNN's train, validation and test sets) or on different
ones each add a variable of the same name, a store's variables go when it
is collected, and a job run again after a crash never meets its
predecessor's: the agent frees what its dead processes held. Launched by Open MPI's mpirun with nothing in the
environment about where agents meet (see test_bootstrap.py for what the
ranks see)."""

import os
import shutil

import pytest

import ddstore
from conftest import wait_until
from test_bootstrap import mpirun_plain

pytestmark = pytest.mark.skipif(shutil.which("mpirun") is None, reason="Open MPI (mpirun) is not installed")

STORES = r"""
import os, sys
import numpy as np
from mpi4py import MPI
w = MPI.COMM_WORLD
rank, size = w.Get_rank(), w.Get_size()
os.environ["DDSTORE_NODE_ID"] = "n%d" % (rank * int(sys.argv[1]) // size)
import pyddstore
sets = {}
for k, label in enumerate(("trainset", "valset", "testset")):   # HydraGNN's three stores, one name
    dds = pyddstore.PyDDStore(w, publish_timeout=60)
    dds.add("record_array", np.full((3 + k, 2), 1000 * k + rank, np.int64))
    sets[label] = dds
sub = w.Split(rank % 2, rank)                                   # and one more on another communicator
other = pyddstore.PyDDStore(sub, publish_timeout=60)
other.add("record_array", np.full((2, 2), -1 - rank, np.int64))
for k, label in enumerate(("trainset", "valset", "testset")):
    dds = sets[label]
    assert dds.info("record_array") == ((3 + k) * size, 2, 8), dds.info("record_array")
    out = np.empty(((3 + k) * size, 2), np.int64)
    dds.get("record_array", out, 0)
    assert (out[:, 0] == 1000 * k + np.repeat(np.arange(size), 3 + k)).all(), (label, out[:, 0])
out = np.empty((2 * sub.Get_size(), 2), np.int64)
other.get("record_array", out, 0)
assert (out[:, 0] == -1 - np.repeat(np.arange(rank % 2, size, 2), 2)).all(), out[:, 0]
try:                                                           # errors name the variable as its user does
    other.get("record_array", np.zeros((1, 2), np.float64), 0)
    raise AssertionError("read into a float64 buffer")
except ValueError as e:
    assert "'record_array' holds int64" in str(e) and "@s" not in str(e), e
for dds in (*sets.values(), other):
    dds.free()
sys.stdout.write(f"ok {rank}\n"); sys.stdout.flush()
"""


@pytest.mark.parametrize("nodes", [1, 2])
@pytest.mark.parametrize("np_", [2, 4])
def test_stores_of_one_name(job, tmp_path, np_, nodes):
    mpirun_plain(job, tmp_path, STORES, np_, str(nodes))


CRASH = r"""
import os, sys
import numpy as np
from mpi4py import MPI
w = MPI.COMM_WORLD
rank, size = w.Get_rank(), w.Get_size()
import pyddstore
dds = pyddstore.PyDDStore(w, publish_timeout=60)
assert dds.namespace == "default", dds.namespace
dds.add("x", np.full((4, 3), rank, np.float32))
out = np.empty((4, 3), np.float32)
dds.get("x", out, 4 * (size - 1 - rank))
assert (out == size - 1 - rank).all()
w.Barrier()
if rank == 0:
    sys.stdout.write(f"token {dds.store.scope}\n")
sys.stdout.write(f"ok {rank}\n"); sys.stdout.flush()
if sys.argv[1] == "crash":
    MPI.Finalize()
    os._exit(0)                      # no free, no close, no collection: as a crash leaves it
dds.free()
"""


@pytest.mark.parametrize("np_", [2, 4])
def test_rerun_after_crash(job, tmp_path, np_):
    """Plain mpirun, namespace "default": a job that died without freeing
    its variable, then the same job at once, on the same agent."""
    env = {k: v for k, v in job.items() if k != "DDSTORE_NAMESPACE"}
    os.environ.pop("DDSTORE_NAMESPACE", None)
    _, out = mpirun_plain(env, tmp_path, CRASH, np_, "crash")
    token = [line.split()[1] for line in out.splitlines() if line.startswith("token ")][0]
    # The dead job's variable goes by itself: its processes are gone.

    def gone():
        look = ddstore.Store(reader=True, rank=0, size=1, namespace="default", scope=token, spawn=False)
        try:
            look.info("x")
        except ddstore.UnknownVariable:
            return True
        finally:
            look.close()
        return False

    wait_until(gone, 60, "the variable of a dead job gone")
    mpirun_plain(env, tmp_path, CRASH, np_, "clean")


COLLECTED = r"""
import gc, os, sys
import numpy as np
from mpi4py import MPI
w = MPI.COMM_WORLD
rank, size = w.Get_rank(), w.Get_size()
os.environ["DDSTORE_NODE_ID"] = "n%d" % (rank * 2 // size)
import ddstore, pyddstore
dds = pyddstore.PyDDStore(w, publish_timeout=60)
dds.add("y", np.full((2, 2), rank, np.int32))
token, node = dds.store.scope, dds.store.node
look = ddstore.Store(reader=True, rank=rank, size=size, scope=token)   # sees the store's variables by its token
assert look.info("y") == (2 * size, 2, 4)
look.close()
w.Barrier()
# Another store of this process stays connected: the store's going frees,
# not the process's (the agent frees what a gone process published).
keep = ddstore.Store(reader=True, rank=rank, size=size, scope=token)
if sys.argv[1] == "close":
    dds.store.close()                # ddstore.Store.close, not PyDDStore's (which frees first anyway)
del dds
gc.collect()
w.Barrier()                          # every rank's store closed or collected: the variable is gone on every node
look = ddstore.Store(reader=True, rank=rank, size=size, scope=token)
try:
    look.info("y")
    raise AssertionError("the variable of a collected store is still there")
except ddstore.UnknownVariable:
    pass
look.close()
sys.stdout.write(f"ok {rank}\n"); sys.stdout.flush()
"""


@pytest.mark.parametrize("how", ["collect", "close"])
@pytest.mark.parametrize("np_", [2, 4])
def test_collected_store_frees(job, tmp_path, np_, how):
    mpirun_plain(job, tmp_path, COLLECTED, np_, how)


TORCH_DATASET = r"""
import os, sys
import numpy as np
import torch
from mpi4py import MPI
w = MPI.COMM_WORLD
rank, size = w.Get_rank(), w.Get_size()
os.environ["DDSTORE_NODE_ID"] = "n%d" % (rank * 2 // size)
from ddstore.torch import DistDataset, DistDatasetReader
if sys.argv[1] == "publish":
    data = torch.arange(40 * 3, dtype=torch.float32).reshape(40, 3)
    ds = DistDataset(torch.utils.data.TensorDataset(data), "pub", comm=w)
    rd = DistDatasetReader("pub", comm=w)                      # of this job, with a store of its own
    assert torch.equal(rd[39][0], data[39])
    rd.close()
    w.Barrier()
    sys.stdout.write(f"ok {rank}\n"); sys.stdout.flush()
    MPI.Finalize()
    os._exit(0)                                                # left published, for the next job
else:
    rd = DistDatasetReader("pub", comm=w)                      # of another job
    assert torch.equal(rd[7][0], torch.arange(21, 24, dtype=torch.float32))
    rd.close()
    sys.stdout.write(f"ok {rank}\n"); sys.stdout.flush()
"""


def test_torch_dataset_is_the_namespaces(job, tmp_path):
    """ddstore.torch's DistDataset publishes by name: a DistDatasetReader of
    the same job or of a later one, each with a communicator, finds it."""
    pytest.importorskip("torch")
    mpirun_plain(job, tmp_path, TORCH_DATASET, 2, "publish")
    mpirun_plain(job, tmp_path, TORCH_DATASET, 2, "read")

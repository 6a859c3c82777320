"""Ranks launched by Open MPI's mpirun, on two simulated nodes (node id by
rank), with an mpi4py communicator and with the launcher's environment."""

import shutil

import pytest

from conftest import mpirun_ranks

pytestmark = pytest.mark.skipif(shutil.which("mpirun") is None, reason="Open MPI (mpirun) is not installed")

SCRIPT = r"""
import os, sys
import numpy as np
from mpi4py import MPI
comm = MPI.COMM_WORLD
rank, size = comm.Get_rank(), comm.Get_size()
# With a communicator, two simulated nodes (node id by rank); with the
# launcher's environment, Open MPI's local ranks are those of this machine,
# so one node.
nodes = 2 if sys.argv[1] == "comm" else 1
os.environ["DDSTORE_NODE_ID"] = "n%d" % (rank * nodes // size)
import ddstore
s = ddstore.Store(comm if sys.argv[1] == "comm" else None, agent_wait=30)
assert (s.rank, s.size) == (rank, size), (s.rank, s.size)
assert s.local_rank == rank % (size // nodes), s.local_rank
n = 10 + rank
first = sum(10 + r for r in range(rank))
s.add("v", (np.arange(first, first + n, dtype=np.float64)[:, None] * np.ones(5)).astype(np.float64))
total = sum(10 + r for r in range(size))
out = np.empty((total, 5))
s.get("v", out, 0)
assert (out[:, 0] == np.arange(total)).all()
idx = np.random.default_rng(rank).integers(0, total, 300)
o = np.empty((300, 5))
s.get_batch("v", o, idx)
assert (o[:, 3] == idx).all()
comm.Barrier()
s.free("v")
s.close()
sys.stdout.write(f"ok {rank}\n"); sys.stdout.flush()
"""


@pytest.mark.parametrize("np_,how", [(2, "comm"), (4, "comm"), (4, "env")])
def test_mpirun(job, np_, how, tmp_path):
    mpirun_ranks(job, tmp_path, SCRIPT, np_, how)


ONESIDED = r"""
import os, sys
import numpy as np
from mpi4py import MPI
comm = MPI.COMM_WORLD
rank, size = comm.Get_rank(), comm.Get_size()
how = sys.argv[1]
# Two simulated nodes: ranks in halves, or alternating (so that each replica
# group of two spans both nodes).
node = rank % 2 if how == "width" else rank * 2 // size
os.environ["DDSTORE_NODE_ID"] = "n%d" % node
import ddstore
s = ddstore.Store(comm, agent_wait=30, method="mpi", width=2 if how == "width" else None)
assert s.method == "mpi"
R, C = s.size, 700  # rows of 5,600 bytes
counts = [10 + 3 * r for r in range(R)]
first, total = sum(counts[:s.rank]), sum(counts)
want = np.arange(total, dtype=np.float64)[:, None] * 1000 + np.arange(C)
for round_ in range(2):  # the second after free: a new window
    s.add("v", want[first:first + counts[s.rank]])
    out = np.empty((total, C))
    s.get("v", out, 0)
    assert (out == want).all(), "get of every row"
    rng = np.random.default_rng(rank + 10 * round_)
    for k in range(5):
        idx = rng.integers(0, total, 97)
        o = np.empty((97, C))
        s.get_batch("v", o, idx)
        assert (o == want[idx]).all(), ("batch", k)
    for i in rng.integers(0, total, 20).tolist():
        one = np.empty((1, C))
        s.get("v", one, i)
        assert (one[0] == want[i]).all(), ("row", i)
    p = s.get_profile("v")
    assert p["remote_rows"] > 0 and p["onesided_rows"] == p["remote_rows"], p
    if round_ == 0:
        # A forked child (a DataLoader worker) reads through the agent.
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:
            ok = 0
            try:
                idx = np.arange(total)[::-1].copy()
                o = np.empty((total, C))
                s.get_batch("v", o, idx)
                ok = int((o == want[idx]).all() and s.get_profile("v")["onesided_rows"] == p["onesided_rows"])
            finally:
                os.write(w, bytes([ok]))
                os._exit(0)
        os.close(w)
        assert os.read(r, 1) == b"\x01", "forked child"
        os.waitpid(pid, 0)
    comm.Barrier()
    s.free("v")
    comm.Barrier()  # every rank freed it: the name is free again
s.close()
if how == "plain":
    # DistDataset(method="mpi") opens its store so.
    from ddstore.torch import DistDataset
    src = [np.full(6, i, np.float32) for i in range(40)]
    ds = DistDataset(src, "dd", comm=comm, method="mpi")
    assert ds.store.method == "mpi"
    assert all((ds[i] == i).all() for i in range(40))  # numpy in, numpy out
    p = ds.store.get_profile("dd/0")
    assert p["onesided_rows"] == p["remote_rows"] > 0, p
    comm.Barrier()
    ds.close()
sys.stdout.write(f"ok {rank}\n"); sys.stdout.flush()
"""


NO_WINDOW = r"""
import os, sys
import numpy as np
from mpi4py import MPI
comm = MPI.COMM_WORLD
rank = comm.Get_rank()
os.environ["DDSTORE_NODE_ID"] = "n%d" % rank
import ddstore
s = ddstore.Store(comm, agent_wait=30, method="mpi")
try:
    s.add("v", np.ones((10, 4)))
    raise SystemExit("add made a window without single-copy")
except ddstore.ArgumentError as e:
    assert "method 'mpi': MPI could not make a window" in str(e) and "method='agent'" in str(e), e
try:
    s.get_batch("v", np.empty((2, 4)), [0, 1])  # nothing half-made is left
    raise SystemExit("the variable is still there")
except ddstore.FreedVariable:
    pass
comm.Barrier()
s.close()
sys.stdout.write(f"ok {rank}\n"); sys.stdout.flush()
"""


@pytest.mark.parametrize("np_,how", [(2, "plain"), (4, "plain"), (4, "width"), (2, "no-window")])
def test_mpirun_onesided(job, np_, how, tmp_path):
    """Store(method="mpi"): every rank reads every row of the other node with
    MPI gets from its own process (none through the agents), over a
    communicator and over the replica groups width=2 splits it into; where
    MPI cannot make the window, add fails clearly and leaves nothing."""
    # Without single-copy between its processes, Open MPI cannot make a
    # window of existing memory on one machine: a clear error.
    mpirun_ranks(job, tmp_path, NO_WINDOW if how == "no-window" else ONESIDED, np_, how, cma=how != "no-window")

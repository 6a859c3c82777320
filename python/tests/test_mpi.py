"""Ranks launched by Open MPI's mpirun, on two simulated nodes (node id by
rank), with an mpi4py communicator and with the launcher's environment."""

import os
import shutil
import socket
import subprocess
import sys

import pytest

from conftest import ROOT, SECRET

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
    with socket.socket() as sk:
        sk.bind(("127.0.0.1", 0))
        port = sk.getsockname()[1]
    script = tmp_path / "rank.py"
    script.write_text(SCRIPT)
    env = {**os.environ, **job, "DDSTORE_RENDEZVOUS": f"127.0.0.1:{port}", "DDSTORE_PEER_LISTEN": "127.0.0.1:0",
           "DDSTORE_SECRET": SECRET, "PYTHONPATH": os.path.join(ROOT, "python"),
           "OMPI_MCA_btl_vader_single_copy_mechanism": "none"}
    cmd = ["mpirun", "--allow-run-as-root", "--oversubscribe", "-np", str(np_)]
    for k in ("DDSTORE_RENDEZVOUS", "DDSTORE_PEER_LISTEN", "DDSTORE_SECRET", "PYTHONPATH", "DDSTORE_BIN",
              "DDSTORE_RUN_DIR", "DDSTORE_NAMESPACE"):
        cmd += ["-x", k]
    r = subprocess.run(cmd + [sys.executable, str(script), how], env=env, capture_output=True, text=True, timeout=180)
    assert r.returncode == 0, r.stdout + r.stderr
    assert sorted(line for line in r.stdout.splitlines() if line.startswith("ok")) == [f"ok {i}" for i in range(np_)]

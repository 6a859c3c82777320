"""DDStore's method 2 across two jobs that share only the handshake directory
(its split mode): a core job under plain mpirun (2 and 4 ranks, two simulated
nodes) publishes, a reading job of another namespace, on a third simulated
node, joins and reads, each told nothing but the directory. And an agent
already running in the namespace with another directory, or none, is an
error that names it."""

import multiprocessing
import os
import shutil
import subprocess
import sys
import uuid

import numpy as np
import pytest

import ddstore
import pyddstore
from conftest import ROOT

CORE = r"""
import os, sys, time
import numpy as np
from mpi4py import MPI
comm = MPI.COMM_WORLD
rank, size = comm.Get_rank(), comm.Get_size()
os.environ["DDSTORE_NODE_ID"] = "n%d" % (rank * 2 // size)   # two simulated nodes
os.environ["DDSTORE_PEER_LISTEN"] = "127.0.0.1:0"             # their traffic stays on loopback
import torch, pyddstore, pyddstore.torch as pt
hs, done = sys.argv[1], sys.argv[2]
dds = pyddstore.PyDDStore(comm, method=2, handshake_dir=hs)
assert dds.namespace != os.environ["DDSTORE_NAMESPACE"] and dds.namespace.startswith("hs-"), dds.namespace
dds.add("x", np.arange(10 * rank, 10 * rank + 10, dtype=np.int64).reshape(5, 2))
ds = pt.DistDataset(torch.utils.data.TensorDataset(torch.arange(60.).reshape(20, 3), torch.arange(20)), "train", comm,
                    method=2, handshake_dir=hs)
deadline = time.monotonic() + 120
while not os.path.exists(done):    # the reading job reads while the store lives
    assert time.monotonic() < deadline, "the reading job did not finish"
    time.sleep(0.02)
comm.Barrier()
dds.free(); ds.free()
sys.stdout.write("ok %d\n" % rank); sys.stdout.flush()
"""

READER = r"""
import os, sys
import numpy as np, torch, pyddstore, pyddstore.torch as pt
hs, done, n_core = sys.argv[1], sys.argv[2], int(sys.argv[3])
d = pyddstore.PyDDStore(None, method=2, handshake_dir=hs, n_core=n_core)   # DDStore's extra member
assert d.reader and d.namespace != os.environ["DDSTORE_NAMESPACE"]
d.join("x")
assert d.info("x") == (5 * n_core, 2, 8), d.info("x")
out = np.empty((5 * n_core, 2), np.int64)
d.get("x", out, 0)
assert (out.reshape(-1) == np.arange(10 * n_core)).all(), out
rd = pt.DistDatasetReader("train", hs, n_core)
for i, (x, y) in enumerate(rd.__getitems__(list(range(20)))):
    assert torch.equal(x, torch.arange(3. * i, 3. * i + 3)) and int(y) == i
remote = rd.store.get_profile("train/0")["remote_rows"]
rd.close(); d.close()
open(done, "w").close()
print("reader", remote)
"""


@pytest.mark.skipif(shutil.which("mpirun") is None, reason="Open MPI (mpirun) is not installed")
@pytest.mark.parametrize("np_", [2, 4])
def test_two_jobs_meet_through_the_directory_alone(job, tmp_path, np_):
    from test_bootstrap import mpirun_plain
    hs, done = str(tmp_path / "hs"), str(tmp_path / "done")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DDSTORE_", "OMPI_", "PMIX_", "RANK", "WORLD"))}
    env.update(DDSTORE_BIN=job["DDSTORE_BIN"], DDSTORE_RUN_DIR=job["DDSTORE_RUN_DIR"],
               DDSTORE_NAMESPACE="other-" + uuid.uuid4().hex[:8], DDSTORE_NODE_ID="c",
               DDSTORE_PEER_LISTEN="127.0.0.1:0", PYTHONPATH=os.path.join(ROOT, "python"))
    reader = subprocess.Popen([sys.executable, "-c", READER, hs, done, str(np_)], env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True)
    try:
        mpirun_plain(job, tmp_path, CORE, np_, hs, done, timeout=200)
        out, _ = reader.communicate(timeout=60)
    finally:
        if reader.poll() is None:
            reader.kill()
        open(done, "w").close()
    assert reader.returncode == 0, out
    words = out.split()
    assert words[0] == "reader" and int(words[1]) == 20, out  # node c holds nothing: every row came over TCP


def _namespace_of(hs, q):
    q.put(pyddstore.dir_namespace(hs))


def test_the_directory_names_one_namespace(tmp_path):
    hs = str(tmp_path / "hs")
    ctx = multiprocessing.get_context("fork")
    q = ctx.Queue()
    procs = [ctx.Process(target=_namespace_of, args=(hs, q)) for _ in range(6)]
    for p in procs:
        p.start()
    names = [q.get(timeout=30) for _ in procs]
    for p in procs:
        p.join(30)
    assert len(set(names)) == 1 and names[0].startswith("hs-"), names
    assert pyddstore.dir_namespace(hs) == names[0]
    assert pyddstore.dir_namespace(str(tmp_path / "other")) != names[0]


def test_an_agent_of_another_directory_says_so(job, tmp_path):
    a, b = str(tmp_path / "a"), str(tmp_path / "b")
    ns = job["DDSTORE_NAMESPACE"] + ".hs"
    first = pyddstore.PyDDStore(None, method=2, handshake_dir=a, rank=0, size=1, namespace=ns)
    try:
        first.add("v", np.arange(4, dtype=np.int64).reshape(4, 1))
        with pytest.raises(ValueError, match=rf"handshake directory '{b}'.*already runs with handshake directory "
                                             rf"'{a}'"):
            pyddstore.PyDDStore(None, method=2, handshake_dir=b, rank=0, size=1, namespace=ns)
        # The same directory, named another way, is the same.
        same = pyddstore.PyDDStore(None, method=2, handshake_dir=os.path.join(a, ".", ""), rank=0, size=1,
                                   namespace=ns, reader=True)
        same.close()
        out = np.empty((4, 1), np.int64)
        first.get("v", out, 0)  # the first store goes on
        assert out.reshape(-1).tolist() == [0, 1, 2, 3]
    finally:
        first.close()
    plain = ddstore.Store(rank=0, size=1, namespace=job["DDSTORE_NAMESPACE"])
    try:
        with pytest.raises(ValueError, match="already runs without a handshake directory"):
            pyddstore.PyDDStore(None, method=2, handshake_dir=b, rank=0, size=1,
                                namespace=job["DDSTORE_NAMESPACE"])
    finally:
        plain.close()

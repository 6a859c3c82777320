"""DDStore users' read patterns through pyddstore, unchanged, on two
simulated nodes under Open MPI's mpirun (see test_bootstrap.py for what the
ranks see): a uint8 variable of records concatenated, read a record at a
time with get(name, buf, offset) of its bytes (a range read: one request
for the record's rows of another node, not one index per byte), and the
feature-first pattern, values concatenated along the varying dimension and
read with get(name, np.zeros(count, ...), offset) into an N-d buffer."""

import shutil

import pytest

from test_bootstrap import mpirun_plain

pytestmark = pytest.mark.skipif(shutil.which("mpirun") is None, reason="Open MPI (mpirun) is not installed")

BYTES = r"""
import os, sys
import numpy as np
from mpi4py import MPI
comm = MPI.COMM_WORLD
rank, size = comm.Get_rank(), comm.Get_size()
os.environ["DDSTORE_NODE_ID"] = "n%d" % (rank * 2 // size)
import pyddstore

def records(r):
    rng = np.random.default_rng(r)
    sizes = rng.integers(1024, 10 * 1024 + 1, 12 + r)
    return [np.frombuffer(rng.bytes(int(n)), np.uint8) for n in sizes]

dds = pyddstore.PyDDStore(comm, publish_timeout=60)
mine = records(rank)
dds.add("recs", np.concatenate(mine))                     # a row is a byte
every = [records(r) for r in range(size)]
sizes = [len(x) for rs in every for x in rs]
offsets = np.concatenate(([0], np.cumsum(sizes)))
flat = np.concatenate([x for rs in every for x in rs])
assert dds.info("recs") == (len(flat), 1, 1)
dds.epoch_begin()
for i, n in enumerate(sizes):                             # every record, of this node and of the other
    buf = np.zeros(n, dtype=np.uint8)
    dds.get("recs", buf, int(offsets[i]))
    assert np.array_equal(buf, flat[offsets[i]:offsets[i] + n]), i
whole = np.zeros(len(flat), np.uint8)                      # every shard: runs of both nodes, of several ranks each
dds.get("recs", whole, 0)
assert np.array_equal(whole, flat)
lo = int(offsets[len(every[0]) - 1]) + 7                  # across the first two ranks' shards
part = np.zeros(5000, np.uint8)
dds.get("recs", part, lo)
assert np.array_equal(part, flat[lo:lo + 5000])
recv = dds.store.alloc_recv((3000,), np.uint8)            # into a receive buffer: the agent writes it in place
far = int(offsets[-1]) - 3000 if rank < size // 2 else 0  # the other node's rows
dds.get("recs", recv, far)
assert np.array_equal(recv, flat[far:far + 3000])
dds.store.free_recv(recv)
p = dds.get_profile("recs")
assert p["remote_rows"] > 0 and p["local_rows"] > 0, p
try:
    dds.get("recs", np.zeros(10, np.uint8), len(flat) - 5)
    raise AssertionError("a range past the end was read")
except IndexError:
    pass
dds.epoch_end()

# Feature-first: graphs of n_i atoms, positions (n_i, 3) and per-atom
# features (n_i, 2, 4) concatenated along the atoms, one scalar per atom.
rng = np.random.default_rng(100 + rank)
natoms = [int(n) for n in rng.integers(1, 30, 9)]
all_natoms = comm.allgather(natoms)
first = sum(sum(a) for a in all_natoms[:rank])
tot = sum(sum(a) for a in all_natoms)
ids = np.arange(first, first + sum(natoms), dtype=np.float32)
dds.add("pos", np.repeat(ids[:, None], 3, axis=1))
dds.add("feat", np.repeat(ids, 8).reshape(-1, 2, 4))
dds.add("y", ids.astype(np.float64))
starts = np.concatenate(([0], np.cumsum([n for a in all_natoms for n in a])))
for g, n in enumerate(n for a in all_natoms for n in a):
    off = int(starts[g])
    pos = np.zeros((n, 3), np.float32)
    dds.get("pos", pos, off)
    feat = np.zeros((n, 2, 4), np.float32)
    dds.get("feat", feat, off)
    y = np.zeros(n, np.float64)
    dds.get("y", y, off)
    want = np.arange(off, off + n)
    assert (pos[:, 2] == want).all() and (feat[:, 1, 3] == want).all() and (y == want).all(), g
assert dds.info("feat") == (tot, 8, 4)
dds.free()
sys.stdout.write(f"ok {rank}\n"); sys.stdout.flush()
"""


@pytest.mark.parametrize("np_", [2, 4])
def test_byte_records_and_feature_first(job, tmp_path, np_):
    mpirun_plain(job, tmp_path, BYTES, np_)

"""epoch_begin()/epoch_end() are fences, as DDStore's (an MPI window fence):
collective over the store's ranks (its communicator, or its replica group),
and once every rank has updated its shard and passed a fence, every rank
reads the updated rows, of its own node and of the others. A rank that
never reaches a fence makes the others' fail within the store's collective
timeout, naming what is missing."""

import os
import shutil

import numpy as np  # noqa: F401  (the scripts' import, checked here first)
import pytest

import pyddstore
from conftest import mpirun_ranks, run_ranks
from ddstore.launch import agent_pids

ROUNDS = 60

# Every rank updates its shard with a pattern of (its rank, the round),
# passes epoch_begin, reads every rank's rows and checks them, then passes
# epoch_end before the next round's update. The last rank waits a little
# before each update: without a fence the others read its old rows (zeros
# in the first round) nearly every round; with one they never can.
UPDATE_READ = r"""
import os, sys, time
import numpy as np
mode, rounds = sys.argv[1], int(sys.argv[2])
MPI_MODES = ("pyddstore", "split", "width-mpi", "windows")
if mode in MPI_MODES:
    from mpi4py import MPI
    world = MPI.COMM_WORLD
    wrank, wsize = world.Get_rank(), world.Get_size()
    os.environ["DDSTORE_NODE_ID"] = "n%d" % (wrank % 2)   # even ranks on n0, odd on n1
else:
    wrank, wsize = int(os.environ["DDSTORE_RANK"]), int(os.environ["DDSTORE_SIZE"])
import ddstore, pyddstore

if mode == "pyddstore":
    s = pyddstore.PyDDStore(world)
elif mode == "split":             # HydraGNN's groups: a communicator of its own per group
    s = pyddstore.PyDDStore(world.Split(wrank // 2, wrank))
elif mode == "width-mpi":         # replica groups of one communicator
    s = ddstore.Store(world, width=2)
elif mode == "windows":           # DDStore's method 0: other nodes' rows by MPI gets
    s = ddstore.Store(world, method="mpi")
elif mode == "env":               # no communicator: the fence goes through the agents
    s = pyddstore.PyDDStore()
elif mode == "width-env":
    s = ddstore.Store(width=2)
else:
    raise SystemExit("unknown mode " + mode)
r, n = s.rank, s.size
if mode in ("split", "width-mpi", "width-env"):
    assert n == 2 and wsize == 4, (n, wsize)
disp = 4
counts = [3 + q for q in range(n)]                # shards of different sizes
first = np.concatenate([[0], np.cumsum(counts)])
s.init("v", counts[r], disp, 8, dtype="int64")


def pattern(q, k):
    return (np.arange(counts[q] * disp, dtype=np.int64).reshape(counts[q], disp) + 1000 * q + 100000 * (k + 1))


want_remote = len({q % 2 for q in range(n)}) > 1 if mode in ("split", "width-env") else n > 1
out = np.empty((int(first[-1]), disp), np.int64)
for k in range(rounds):
    if r == n - 1:
        time.sleep(0.002)   # widens the race the fence closes; no rank waits on it
    s.update("v", pattern(r, k), 0)
    s.epoch_begin()
    s.get("v", out, 0)      # every rank's rows: this node's from shared memory, the other node's from afar
    for q in range(n):
        got = out[first[q]:first[q + 1]]
        if not (got == pattern(q, k)).all():
            raise AssertionError("mode %s round %d: rank %d read rank %d's rows %s, want %s" % (
                mode, k, r, q, got[0].tolist(), pattern(q, k)[0].tolist()))
    s.epoch_end()
p = s.get_profile("v")
assert (p["remote_rows"] > 0) == want_remote, (p, want_remote)
s.free("v")
s.close()
sys.stdout.write("ok %d\n" % wrank); sys.stdout.flush()
"""

needs_mpirun = pytest.mark.skipif(shutil.which("mpirun") is None, reason="Open MPI (mpirun) is not installed")
needs_mpi4py = pytest.mark.skipif(not pyddstore.HAVE_MPI, reason="mpi4py is not installed")


def kill_agents(ns):
    import signal
    for pid in agent_pids(ns, subspaces=True):
        try:
            os.kill(pid, signal.SIGTERM)
        except ProcessLookupError:
            pass


@needs_mpirun
@needs_mpi4py
@pytest.mark.parametrize("np_", [2, 4])
@pytest.mark.parametrize("mode", ["pyddstore", "windows"])
def test_update_then_fence_then_read_under_mpirun(job, tmp_path, mode, np_):
    try:
        mpirun_ranks(job, tmp_path, UPDATE_READ, np_, mode, str(ROUNDS), cma=mode == "windows", timeout=240)
    finally:
        kill_agents(job["DDSTORE_NAMESPACE"])


@needs_mpirun
@needs_mpi4py
@pytest.mark.parametrize("mode", ["split", "width-mpi"])
def test_fence_of_a_replica_group_under_mpirun(job, tmp_path, mode):
    """The fence is over the store's group only: groups fence apart."""
    try:
        mpirun_ranks(job, tmp_path, UPDATE_READ, 4, mode, str(ROUNDS), timeout=240)
    finally:
        kill_agents(job["DDSTORE_NAMESPACE"])


@pytest.mark.parametrize("mode,nodes", [("env", ["a", "b"]), ("env", ["a", "b", "a", "b"]),
                                        ("width-env", ["a", "b", "a", "b"])])
def test_fence_through_the_agents(job, mode, nodes):
    """No communicator (ranks from the launcher's environment): the fence is
    a round on the coordinator, of the job or of the store's group."""
    try:
        outs = run_ranks(UPDATE_READ, nodes, {**job, "DDSTORE_MPI": "0"}, timeout=180, args=(mode, str(ROUNDS)))
    finally:
        kill_agents(job["DDSTORE_NAMESPACE"])
    assert sorted(o.split()[0] for o in outs) == ["ok"] * len(nodes), outs


# One rank never reaches the second fence: it fails there (mpi: it skips the
# fence, as a rank whose step raised would; agents: its process dies). The
# others' fence fails rather than hang: with TimeoutError once
# publish_timeout has passed; through the agents the error names the
# missing rank, and is a PeerError at once when the others were already
# waiting as the agent saw the process go (which comes first is a race).
MISSING = r"""
import os, sys
import numpy as np
mode = sys.argv[1]
if mode == "mpi":
    from mpi4py import MPI
    world = MPI.COMM_WORLD
    os.environ["DDSTORE_NODE_ID"] = "n%d" % (world.Get_rank() % 2)
    wrank = world.Get_rank()
else:
    wrank = int(os.environ["DDSTORE_RANK"])
import ddstore, pyddstore
s = pyddstore.PyDDStore(world if mode == "mpi" else None, publish_timeout=3)
r, n = s.rank, s.size
s.init("v", 2, 1, 8, dtype="int64")
s.update("v", np.full((2, 1), r, np.int64), 0)
s.epoch_begin()
if r == n - 1:
    if mode != "mpi":
        os._exit(0)      # dies: no goodbye to its agent or the others
    s.close()
    sys.stdout.write("ok %d\n" % wrank); sys.stdout.flush()
    sys.exit(0)
try:
    s.epoch_end()
except (TimeoutError, ConnectionError) as e:
    if isinstance(e, ddstore.PeerError):
        assert mode != "mpi" and "rank %d (process" % (n - 1) in str(e) and "went away" in str(e), e
    else:
        assert isinstance(e, ddstore.Timeout), type(e)
        if mode != "mpi":
            assert "missing ranks %d" % (n - 1) in str(e), e
    s.close()
    sys.stdout.write("ok %d\n" % wrank); sys.stdout.flush()
else:
    raise AssertionError("the fence passed without rank %d" % (n - 1))
"""


@needs_mpirun
@needs_mpi4py
@pytest.mark.parametrize("np_", [2, 4])
def test_a_rank_missing_from_the_fence_under_mpirun(job, tmp_path, np_):
    try:
        mpirun_ranks(job, tmp_path, MISSING, np_, "mpi", timeout=120)
    finally:
        kill_agents(job["DDSTORE_NAMESPACE"])


@pytest.mark.parametrize("nodes", [["a", "b"], ["a", "b", "a", "b"]])
def test_a_rank_dead_before_the_fence_through_the_agents(job, nodes):
    try:
        outs = run_ranks(MISSING, nodes, {**job, "DDSTORE_MPI": "0"}, timeout=120, args=("env",))
    finally:
        kill_agents(job["DDSTORE_NAMESPACE"])
    assert [o.split()[:1] for o in outs[:-1]] == [["ok"]] * (len(nodes) - 1), outs
    assert outs[-1] == "", outs

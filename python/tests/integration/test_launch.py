"""python -m ddstore.launch and the DDP example (examples/ddp_train.py): the
example trains 2 ranks whose data come from DistDataset and its loss falls,
under the launcher (one node and two simulated nodes), under mpirun and with
Slurm's environment; the launcher's environment, output prefixes, exit codes,
and its cleanup of ranks and agents."""

import importlib.util
import os
import re
import shutil
import signal
import subprocess
import sys
import time

import pytest

from conftest import ROOT
from ddstore.launch import agent_pids, rank_env

PY = os.path.join(ROOT, "python")
EXAMPLE = os.path.join(PY, "examples", "ddp_train.py")


def env_of(job, **extra):
    return {**os.environ, **job, "PYTHONPATH": PY, **extra}


def launch(job, *args, timeout=120, **extra):
    return subprocess.run([sys.executable, "-m", "ddstore.launch", *args], env=env_of(job, **extra), cwd=PY,
                          capture_output=True, text=True, timeout=timeout)


def losses(out, prefix=r"\[rank 0\] "):
    return [float(m) for m in re.findall(prefix + r"epoch \d+ loss ([0-9.eE+-]+)", out)]


def assert_trained(r, epochs, prefix=r"\[rank 0\] "):
    assert r.returncode == 0, r.stdout + r.stderr
    ls = losses(r.stdout, prefix)
    assert len(ls) == epochs, r.stdout
    assert ls[-1] < 0.5 * ls[0] and all(b < a for a, b in zip(ls, ls[1:])), ls
    return ls


# -- the launcher's environment ---------------------------------------------------------

def test_rank_env_blocks_of_ranks():
    envs = [rank_env(r, 5, 2, 1234, "127.0.0.1:9", base={}) for r in range(5)]
    got = [(e["RANK"], e["WORLD_SIZE"], e["LOCAL_RANK"], e["LOCAL_WORLD_SIZE"], e["DDSTORE_NODE_ID"]) for e in envs]
    assert got == [("0", "5", "0", "2", "node0"), ("1", "5", "1", "2", "node0"), ("2", "5", "0", "3", "node1"),
                   ("3", "5", "1", "3", "node1"), ("4", "5", "2", "3", "node1")]
    assert all(e["MASTER_ADDR"] == "127.0.0.1" and e["MASTER_PORT"] == "1234" and
               e["DDSTORE_RENDEZVOUS"] == "127.0.0.1:9" for e in envs)
    one = rank_env(1, 2, 1, 1, base={})
    assert "DDSTORE_NODE_ID" not in one and "DDSTORE_RENDEZVOUS" not in one and one["LOCAL_RANK"] == "1"


SHOW = r"""
import os, sys
keys = ["RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "DDSTORE_NODE_ID",
        "DDSTORE_RENDEZVOUS", "DDSTORE_NAMESPACE"]
print(" ".join(os.environ.get(k, "-") for k in keys))
print("to stderr", file=sys.stderr)
"""


def test_environment_and_prefixes(job, tmp_path):
    script = tmp_path / "show.py"
    script.write_text(SHOW)
    r = launch(job, "-n", "4", "--nodes", "2", str(script), timeout=60)
    assert r.returncode == 0, r.stdout + r.stderr
    rows = sorted(line.split() for line in r.stdout.splitlines())
    assert [row[0] for row in rows] == ["[rank"] * 4
    port, rdv = rows[0][7], rows[0][9]
    assert port.isdigit() and re.fullmatch(r"127\.0\.0\.1:\d+", rdv)
    assert [row[:2] + row[2:7] + [row[8]] + [row[10]] for row in rows] == [
        ["[rank", f"{i}]", str(i), "4", str(i % 2), "2", "127.0.0.1", f"node{i // 2}", job["DDSTORE_NAMESPACE"]]
        for i in range(4)]
    assert all(row[7] == port and row[9] == rdv for row in rows)
    assert sorted(r.stderr.splitlines()) == [f"[rank {i}] to stderr" for i in range(4)]


def test_a_failing_rank_stops_the_others_and_sets_the_exit_code(job, tmp_path):
    script = tmp_path / "fail.py"
    # The other ranks sleep past launch's timeout (and end on their own
    # should the test fail): the launcher returning at all is its stopping
    # them.
    script.write_text("import os, sys, time\n"
                      "d = sys.argv[1]\n"
                      "if os.environ['RANK'] == '1':\n"
                      "    while len(os.listdir(d)) < 2:  # the others have started\n"
                      "        time.sleep(0.01)\n"
                      "    print('rank one gives up', flush=True)\n"
                      "    sys.exit(3)\n"
                      "print('pid', os.getpid(), flush=True)\n"
                      "open(os.path.join(d, os.environ['RANK']), 'w').close()\n"
                      "time.sleep(600)\n")
    (tmp_path / "up").mkdir()
    r = launch(job, "-n", "3", str(script), str(tmp_path / "up"), timeout=60)
    assert r.returncode == 3, r.stdout + r.stderr
    assert "[rank 1] rank one gives up" in r.stdout
    assert "rank 1 exited with status 3" in r.stderr
    pids = [int(line.split()[-1]) for line in r.stdout.splitlines() if " pid " in line]
    assert len(pids) == 2
    for pid in pids:  # the sleeping ranks were stopped
        assert not os.path.exists(f"/proc/{pid}") or open(f"/proc/{pid}/stat").read().split()[2] == "Z"


def test_ctrl_c_stops_every_rank(job, tmp_path):
    script = tmp_path / "sleep.py"
    # A rank that runs until stopped (and ends on its own should the test fail).
    script.write_text("import os, time\nprint('pid', os.getpid(), flush=True)\ntime.sleep(600)\n")
    p = subprocess.Popen([sys.executable, "-m", "ddstore.launch", "-n", "2", str(script)], env=env_of(job), cwd=PY,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    lines = []
    deadline = time.monotonic() + 30
    while len(lines) < 2 and time.monotonic() < deadline:
        lines.append(p.stdout.readline())
    p.send_signal(signal.SIGINT)
    out, err = p.communicate(timeout=30)
    assert p.returncode == 130, (lines, out, err)
    for pid in [int(line.split()[-1]) for line in lines]:
        assert not os.path.exists(f"/proc/{pid}") or open(f"/proc/{pid}/stat").read().split()[2] == "Z"


# -- the DDP example ---------------------------------------------------------------------

torch_needed = pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason="torch is not installed")


@torch_needed
def test_ddp_example_two_ranks(job):
    r = launch(job, "-n", "2", "examples/ddp_train.py", "--epochs", "3")
    assert_trained(r, 3)
    assert "[rank 0] torchrun: 2 ranks, 2048 samples" in r.stdout
    assert agent_pids(job["DDSTORE_NAMESPACE"]) == []  # the launcher stopped the agent the job started


@torch_needed
def test_ddp_example_two_nodes_with_threads(job):
    r = launch(job, "-n", "2", "--nodes", "2", "examples/ddp_train.py", "--epochs", "3", "--threads", "2")
    assert_trained(r, 3)
    remote = [int(m) for m in re.findall(r"read (\d+) rows held on other nodes", r.stdout)]
    assert len(remote) == 2 and all(x > 0 for x in remote), r.stdout
    assert agent_pids(job["DDSTORE_NAMESPACE"]) == []


@torch_needed
def test_ddp_example_failing_propagates(job):
    """An example that cannot reach its goal (one epoch: no fall to measure
    against is fine; a learning rate of 0 never falls) exits 1 through the
    launcher."""
    r = launch(job, "-n", "2", "examples/ddp_train.py", "--epochs", "2", "--lr", "0")
    assert r.returncode == 1, r.stdout + r.stderr
    assert "loss did not fall" in r.stderr


@torch_needed
@pytest.mark.skipif(shutil.which("mpirun") is None, reason="Open MPI (mpirun) is not installed")
def test_ddp_example_under_mpirun(job):
    env = env_of(job, OMPI_MCA_btl_vader_single_copy_mechanism="none")
    cmd = ["mpirun", "--allow-run-as-root", "--oversubscribe", "-np", "2"]
    for k in ("PYTHONPATH", "DDSTORE_BIN", "DDSTORE_RUN_DIR", "DDSTORE_NAMESPACE"):
        cmd += ["-x", k]
    from ddstore.launch import free_port
    cmd += ["-x", f"MASTER_PORT={free_port()}"]
    r = subprocess.run(cmd + [sys.executable, EXAMPLE, "--epochs", "3"], env=env, capture_output=True, text=True,
                       timeout=120)
    assert "openmpi: 2 ranks" in r.stdout, r.stdout + r.stderr
    assert_trained(r, 3, prefix="")


# Runs a script, reporting on stderr, at each fork, how many threads the
# process has and how many of them Python started.
COUNT_FORK_THREADS = r"""
import os, runpy, sys, threading
def before():
    sys.__stderr__.write(f"fork: {len(os.listdir('/proc/self/task'))} threads, "
                         f"{threading.active_count()} of Python\n")
os.register_at_fork(before=before)
sys.argv = sys.argv[1:]
runpy.run_path(sys.argv[0], run_name="__main__")
"""


@torch_needed
def test_ddp_example_forks_workers_before_gloo_starts_threads(job):
    # CPython before 3.12 (Debian's 3.11.2) deadlocks a forked child in
    # PyOS_AfterFork_Child when another thread held the interpreter's head
    # lock (HEAD_LOCK) at the fork. Threads Python started take it only
    # with the GIL, which the forking thread holds; a thread of C++ takes it
    # without: torch 1.13's gloo threads do when they drop the last
    # reference to a tensor whose Python object is gone (TensorImpl::
    # destroy_pyobj_if_needed makes a thread state for them). A DataLoader
    # worker forked after init_process_group so hangs now and then, and its
    # rank and the job with it. The example forks its workers once, before
    # gloo's threads exist: at each fork, every thread is one of Python's
    # (with numpy's BLAS on one thread: OpenBLAS's own threads never enter
    # Python, and it stops them at fork).
    from ddstore.launch import free_port
    r = subprocess.run([sys.executable, "-c", COUNT_FORK_THREADS, EXAMPLE, "--epochs", "2", "--workers", "2"],
                       env=env_of(job, MASTER_PORT=str(free_port()), OPENBLAS_NUM_THREADS="1", OMP_NUM_THREADS="1"),
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    forks = [tuple(map(int, m)) for m in re.findall(r"^fork: (\d+) threads, (\d+) of Python$", r.stderr, re.M)]
    assert forks and all(n == py for n, py in forks), forks
    assert len(forks) == 2, forks  # each worker forked once, not once an epoch


@torch_needed
def test_ddp_example_with_slurm_environment(job):
    from ddstore.launch import free_port
    port = str(free_port())
    procs = [subprocess.Popen([sys.executable, EXAMPLE, "--epochs", "3", "--workers", "2"],
                              env=env_of(job, SLURM_PROCID=str(r), SLURM_NTASKS="2", SLURM_LOCALID=str(r),
                                         SLURM_NTASKS_PER_NODE="2", SLURM_NODEID="0", MASTER_PORT=port),
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) for r in range(2)]
    outs = []
    try:
        for p in procs:
            outs.append(p.communicate(timeout=120)[0])
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    assert [p.returncode for p in procs] == [0, 0], outs
    assert "slurm: 2 ranks" in outs[0]
    ls = losses(outs[0], prefix="")
    assert len(ls) == 3 and ls[-1] < 0.5 * ls[0], outs[0]

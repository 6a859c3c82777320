"""Shared fixtures: the ddstore binary built from this commit, and a private
run directory and namespace per test so agents never meet across tests."""

import os
import subprocess
import sys
import time
import uuid

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# The DDSTORE_SECRET of jobs on several (simulated) nodes: agents that meet
# through a rendezvous address refuse to start without one.
SECRET = "ddstore-python-test-secret-0123456789"


def wait_until(cond, timeout, what):
    """Poll cond() until it is true; after timeout seconds fail naming what
    was waited for."""
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, f"{what}: not so after {timeout} s"
        time.sleep(0.01)


@pytest.fixture(scope="session")
def ddstore_bin(tmp_path_factory):
    b = os.environ.get("DDSTORE_BIN")
    if b:
        return b
    out = str(tmp_path_factory.mktemp("bin") / "ddstore")
    subprocess.run(["go", "build", "-o", out, "./cmd/ddstore"], cwd=ROOT, check=True,
                   env={**os.environ, "PATH": "/usr/local/go/bin:" + os.environ.get("PATH", "")})
    return out


@pytest.fixture
def job(ddstore_bin, tmp_path, monkeypatch):
    """Environment for a job of this test: binary, run dir, namespace."""
    ns = "py-" + uuid.uuid4().hex[:10]
    env = {"DDSTORE_BIN": ddstore_bin, "DDSTORE_RUN_DIR": str(tmp_path / "run"), "DDSTORE_NAMESPACE": ns}
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "DDSTORE_RANK", "DDSTORE_SIZE",
              "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "PMI_RANK", "PMI_SIZE", "SLURM_PROCID",
              "DDSTORE_NODE_ID", "DDSTORE_RENDEZVOUS", "DDSTORE_SECRET"):
        monkeypatch.delenv(k, raising=False)
    yield env
    # Stop the agents this test started: they would idle 30 s otherwise.
    subprocess.run(["pkill", "-f", "--", f"--namespace {ns} "], check=False)


def run_ranks(script, nodes, env, timeout=120, args=()):
    """Run `script` as len(nodes) ranks (nodes[r] is rank r's node id), with
    agents meeting through a rendezvous port; returns their outputs."""
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    size = len(nodes)
    procs = []
    for r, node in enumerate(nodes):
        local = [i for i, n in enumerate(nodes) if n == node]
        e = {**os.environ, **env, "DDSTORE_RANK": str(r), "DDSTORE_SIZE": str(size),
             "DDSTORE_LOCAL_RANK": str(local.index(r)), "DDSTORE_LOCAL_SIZE": str(len(local)),
             "DDSTORE_NODE_ID": node, "DDSTORE_RENDEZVOUS": f"127.0.0.1:{port}", "DDSTORE_PEER_LISTEN": "127.0.0.1:0",
             "DDSTORE_SECRET": SECRET, "PYTHONPATH": os.path.join(ROOT, "python")}
        procs.append(subprocess.Popen([sys.executable, "-c", script, *args], env=e, stdout=subprocess.PIPE,
                                      stderr=subprocess.STDOUT, text=True))
    outs = []
    for r, p in enumerate(procs):
        try:
            out, _ = p.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
            raise AssertionError(f"rank {r} hangs")
        outs.append(out)
        assert p.returncode == 0, f"rank {r} failed:\n{out}"
    return outs


def mpirun_ranks(job, tmp_path, script, np_, *args, cma=False, timeout=180):
    """Run script as np_ ranks of Open MPI's mpirun (arguments: args) with
    agents meeting at a rendezvous port; every rank must print "ok RANK".
    Open MPI's single-copy (CMA) between the ranks only with cma."""
    import socket
    with socket.socket() as sk:
        sk.bind(("127.0.0.1", 0))
        port = sk.getsockname()[1]
    path = tmp_path / "rank.py"
    path.write_text(script)
    env = {**os.environ, **job, "DDSTORE_RENDEZVOUS": f"127.0.0.1:{port}", "DDSTORE_PEER_LISTEN": "127.0.0.1:0",
           "DDSTORE_SECRET": SECRET, "PYTHONPATH": os.path.join(ROOT, "python")}
    if not cma:
        env["OMPI_MCA_btl_vader_single_copy_mechanism"] = "none"
    cmd = ["mpirun", "--allow-run-as-root", "--oversubscribe", "-np", str(np_)]
    for k in ("DDSTORE_RENDEZVOUS", "DDSTORE_PEER_LISTEN", "DDSTORE_SECRET", "PYTHONPATH", "DDSTORE_BIN",
              "DDSTORE_RUN_DIR", "DDSTORE_NAMESPACE"):
        cmd += ["-x", k]
    r = subprocess.run(cmd + [sys.executable, str(path), *args], env=env, capture_output=True, text=True,
                       timeout=timeout)
    assert r.returncode == 0, r.stdout + r.stderr
    assert sorted(line for line in r.stdout.splitlines() if line.startswith("ok")) == [f"ok {i}" for i in range(np_)]


def run_steps(ss, epoch, steps=None):
    """Samplers ss of one job (one per rank): every rank's batches of `epoch` from where each sampler stands, at
    most `steps` of them; the ranks' batches of a step side by side."""
    its = []
    for s in ss:
        s.set_epoch(epoch)
        its.append(iter(s))
    out = []
    while steps is None or len(out) < steps:
        step = [next(it, None) for it in its]
        if step[0] is None:
            assert all(b is None for b in step)  # every rank runs the same number of steps
            break
        out.append(step)
    return out

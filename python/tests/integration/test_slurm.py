"""The Slurm examples (examples/slurm/) on a real, single-node Slurm cluster
that this module starts by hand: munged, slurmctld and slurmd from Debian,
each in the foreground, with their configuration, keys, sockets, state and
logs in one temporary directory (no systemd, nothing in /etc), on free ports.

Each test submits a batch script with sbatch (2 tasks on the one node) and
checks what its steps printed: every rank read every row right, the reader
step of split mode too, and the agents stopped cleanly (no segment of the
job left in /dev/shm). Without Slurm the packages slurmctld, slurmd,
slurm-client and munge are installed with apt-get (as root; Debian's
services are kept from starting meanwhile). The module is skipped, with the
reason, where that cannot be done or the cluster does not come up (not
root, no apt-get, a container where slurmd cannot run); set
DDSTORE_SLURM_TEST=0 to skip it anyway. A job that fails fails its test.
"""

import json
import os
import random
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time

import pytest

from conftest import ROOT

PACKAGES = ["slurmctld", "slurmd", "slurm-client", "munge"]
# What the cluster needs, by package; the daemons live in /usr/sbin, which a
# non-login PATH may lack.
COMMANDS = ["slurmctld", "slurmd", "munged", "sbatch", "srun", "sinfo", "squeue", "scontrol", "scancel"]
SBIN = ["/usr/sbin", "/usr/local/sbin", "/sbin"]


def which(cmd):
    return shutil.which(cmd) or shutil.which(cmd, path=os.pathsep.join(SBIN))


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def tail(path, n=20):
    try:
        with open(path, errors="replace") as f:
            return "".join(f.readlines()[-n:])
    except OSError as e:
        return f"({path}: {e.strerror})"


def install():
    """Install the packages, or return why not. A policy-rc.d that refuses
    keeps their maintainer scripts from starting Debian's own munge and
    Slurm services, which would take the default ports and /run paths."""
    if os.geteuid() != 0:
        return "not root: cannot install " + " ".join(PACKAGES) + " (apt-get install them, or run as root)"
    if shutil.which("apt-get") is None:
        return "no apt-get to install " + " ".join(PACKAGES) + " with"
    policy = "/usr/sbin/policy-rc.d"
    ours = not os.path.exists(policy)
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    cmd = ["apt-get", "install", "-y", "-q", "--no-install-recommends", *PACKAGES]
    try:
        if ours:
            with open(policy, "w") as f:
                f.write("#!/bin/sh\n# written by ddstore's test_slurm.py during apt-get install\nexit 101\n")
            os.chmod(policy, 0o755)
        r = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
        if r.returncode != 0:  # stale package lists: update once and retry
            subprocess.run(["apt-get", "update", "-q"], env=env, capture_output=True, timeout=300)
            r = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    except (OSError, subprocess.TimeoutExpired) as e:
        return f"apt-get install {' '.join(PACKAGES)} failed: {e}"
    finally:
        if ours and os.path.exists(policy):
            os.remove(policy)
    if r.returncode != 0:
        return f"apt-get install {' '.join(PACKAGES)} failed ({r.returncode}): {(r.stdout + r.stderr)[-1500:]}"
    missing = [c for c in COMMANDS if which(c) is None]
    if missing:
        return "installed " + " ".join(PACKAGES) + " but found no " + " ".join(missing)
    return None


class Cluster:
    """A one-node Slurm cluster in a temporary directory."""

    def __init__(self):
        self.dir = tempfile.mkdtemp(prefix="ddstore-slurm-")
        os.chmod(self.dir, 0o755)  # munged wants its socket's directory searchable
        self.procs = []
        self.jobs = []
        self.node = socket.gethostname().split(".")[0] or "localhost"
        self.conf = os.path.join(self.dir, "slurm.conf")
        self.env = {**os.environ, "SLURM_CONF": self.conf,
                    "PATH": os.pathsep.join([os.environ.get("PATH", "/usr/bin:/bin"), *SBIN])}

    def path(self, *p):
        return os.path.join(self.dir, *p)

    def daemon(self, name, args):
        out = open(self.path(name + ".out"), "w")
        p = subprocess.Popen(args, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                             env=self.env, start_new_session=True)
        out.close()
        self.procs.append((name, p))
        return p

    def start(self):
        """Start munged, slurmctld and slurmd; returns why the cluster did not
        come up, or None once sinfo shows the node idle."""
        d = self.path
        for sub in ("state", "spool"):
            os.mkdir(d(sub), 0o700)
        with open(d("munge.key"), "wb") as f:
            f.write(os.urandom(1024))
        os.chmod(d("munge.key"), 0o600)
        munged = self.daemon("munged", [which("munged"), "--foreground", "--force", "--socket", d("munge.sock"),
                                        "--key-file", d("munge.key"), "--log-file", d("munged.log"),
                                        "--pid-file", d("munged.pid"), "--seed-file", d("munged.seed")])
        if not self.wait(lambda: os.path.exists(d("munge.sock")), 10, munged):
            return "munged did not start: " + tail(d("munged.out")) + tail(d("munged.log"))
        cpus = max(2, os.cpu_count() or 2)
        with open(self.conf, "w") as f:
            f.write(f"""# A one-node cluster for ddstore's test_slurm.py: no cgroups, no accounting.
ClusterName=ddstoretest
SlurmctldHost={self.node}(127.0.0.1)
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket={d("munge.sock")}
SlurmctldPort={free_port()}
SlurmdPort={free_port()}
StateSaveLocation={d("state")}
SlurmdSpoolDir={d("spool")}
SlurmctldPidFile={d("slurmctld.pid")}
SlurmdPidFile={d("slurmd.pid")}
SlurmctldLogFile={d("slurmctld.log")}
SlurmdLogFile={d("slurmd.log")}
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
MpiDefault=none
SwitchType=switch/none
MailProg=/bin/true
ReturnToService=2
SlurmdParameters=config_overrides
KillWait=5
MinJobAge=600
FirstJobId={random.randrange(100000, 10000000)}
NodeName={self.node} NodeAddr=127.0.0.1 CPUs={cpus} State=UNKNOWN
PartitionName=test Nodes={self.node} Default=YES MaxTime=10 State=UP OverSubscribe=YES
""")
        ctld = self.daemon("slurmctld", [which("slurmctld"), "-D", "-f", self.conf])
        slurmd = self.daemon("slurmd", [which("slurmd"), "-D", "-f", self.conf, "-N", self.node])

        def idle():
            r = subprocess.run([which("sinfo"), "-h", "-N", "-o", "%T"], env=self.env, capture_output=True, text=True)
            return r.returncode == 0 and r.stdout.strip().startswith("idle")

        if not self.wait(idle, 30, ctld, slurmd):
            exited = [f"{n} exited ({p.returncode})" for n, p in self.procs if p.poll() is not None]
            return ((", ".join(exited) or "the node is not idle after 30 s") + "; last lines of their logs:\n" +
                    "".join(tail(d(f), 6) for f in ("slurmctld.out", "slurmctld.log", "slurmd.out", "slurmd.log")))
        return None

    @staticmethod
    def wait(ready, seconds, *procs):
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            if ready():
                return True
            if any(p.poll() is not None for p in procs):
                return False
            time.sleep(0.1)
        return False

    def run(self, cmd, env=None, **kw):
        return subprocess.run([which(cmd[0]), *cmd[1:]], env=env or self.env, capture_output=True, text=True, **kw)

    def sbatch(self, script, args=(), env=None, timeout=120):
        """Submit script (2 tasks on the node) from the repository root and
        wait for it; returns (state, exit code, output, job id)."""
        out = self.path("job-%j.out")
        r = subprocess.run([which("sbatch"), "--parsable", "-N1", "-n2", "--ntasks-per-node=2", "--time=5",
                            "-o", out, script, *args], cwd=ROOT, env=env or self.env,
                           capture_output=True, text=True, timeout=30)
        assert r.returncode == 0, f"sbatch {script}: {r.stdout}{r.stderr}"
        job = r.stdout.strip().split(";")[0]
        self.jobs.append(job)
        deadline = time.monotonic() + timeout
        state = code = ""
        while time.monotonic() < deadline:
            s = self.run(["scontrol", "show", "job", "-o", job]).stdout
            m = re.search(r"JobState=(\S+)", s)
            state = m.group(1) if m else ""
            if state and state not in ("PENDING", "CONFIGURING", "RUNNING", "COMPLETING", "SUSPENDED"):
                code = re.search(r"ExitCode=(\S+)", s).group(1)
                break
            time.sleep(0.2)
        else:
            self.run(["scancel", job])
            state = "TIMEOUT (test)"
        return state, code, tail(out.replace("%j", job), 200), job

    def stop(self):
        for job in self.jobs:
            self.run(["scancel", job])
        # slurmd first, so that no step is started meanwhile; each daemon
        # gets SIGTERM, then SIGKILL after 10 s.
        for name, p in sorted(self.procs, key=lambda np: ["slurmd", "slurmctld", "munged"].index(np[0])):
            if p.poll() is None:
                p.terminate()
                try:
                    p.wait(10)
                except subprocess.TimeoutExpired:
                    p.kill()
                    p.wait()
        shutil.rmtree(self.dir, ignore_errors=True)


@pytest.fixture(scope="module")
def slurm():
    if os.environ.get("DDSTORE_SLURM_TEST") == "0":
        pytest.skip("DDSTORE_SLURM_TEST=0")
    if not sys.platform.startswith("linux"):
        pytest.skip("Slurm tests need Linux")
    if any(which(c) is None for c in COMMANDS):
        why = install()
        if why:
            pytest.skip("Slurm is not installed and cannot be: " + why)
    if os.geteuid() != 0:
        pytest.skip("not root: this test's slurmd runs jobs as root (SlurmUser=root)")
    c = Cluster()
    try:
        why = c.start()
        if why:
            pytest.skip("Slurm does not start here: " + why)
        yield c
    finally:
        c.stop()


@pytest.fixture
def job_env(slurm, ddstore_bin, tmp_path):
    """The environment sbatch passes to the job: this tree's binary and
    Python, a private run directory, free ports, and none of the caller's
    launcher or ddstore variables."""
    drop = ("SLURM_", "DDSTORE_", "OMPI_", "PMI_", "PMIX_", "TORCHELASTIC_")
    env = {k: v for k, v in slurm.env.items()
           if not k.startswith(drop) and k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE",
                                                   "MASTER_ADDR", "MASTER_PORT", "PYTHONPATH")}
    env.update({"SLURM_CONF": slurm.conf, "DDSTORE_BIN": ddstore_bin, "DDSTORE_RUN_DIR": str(tmp_path / "run"),
                "DDSTORE_PORT": str(free_port()),
                "MASTER_PORT": str(free_port()), "PYTHON": sys.executable})
    if os.geteuid() == 0:
        env.update({"OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1"})
    return env


def left_in_shm(job):
    return sorted(n for n in os.listdir("/dev/shm") if n.startswith(f"ddstore.slurm-{job}."))


def check_split(state, code, out, job, rows):
    assert (state, code) == ("COMPLETED", "0:0"), f"job {job}: {state}, exit {code}:\n{out}"
    total = 2 * rows + 1  # rank r adds rows + r rows
    for r in range(2):
        assert re.search(rf"^rank {r}/2 on .*: published {rows + r} rows of 'rows' \(namespace slurm-{job}\), "
                         rf"read all {total} back in .*: ok$", out, re.M), out
        assert re.search(rf"^reader {r}/2 on .*: read all {total} rows of 'rows' \(namespace slurm-{job}\) .*: ok$",
                         out, re.M), out
    assert left_in_shm(job) == [], f"job {job} left shared memory behind:\n{out}"


def test_split_mode(slurm, job_env, tmp_path):
    """split_mode.sbatch: an agent step (handshake directory), a publishing
    step of 2 ranks, a reader step of 2 ranks; each reads every row."""
    hs = tmp_path / "hs"
    state, code, out, job = slurm.sbatch("examples/slurm/split_mode.sbatch", ["--rows", "20000"],
                                         {**job_env, "DDSTORE_HANDSHAKE_DIR": str(hs)})
    check_split(state, code, out, job, 20000)
    assert os.listdir(hs) == [], "the job's handshake directory is left"


@pytest.mark.skipif(shutil.which("mpirun") is None, reason="Open MPI (mpirun) is not installed")
def test_split_mode_mpirun(slurm, job_env):
    """mpirun.sbatch: the same with mpirun launching the agents (rendezvous
    address, job secret) and both steps."""
    state, code, out, job = slurm.sbatch("examples/slurm/mpirun.sbatch", ["--rows", "20000"], job_env)
    check_split(state, code, out, job, 20000)


def test_agents_and_train(slurm, job_env):
    """agents_and_train.sbatch: an agent step meeting at a rendezvous
    address with the job's secret, then ddp_train.py on 2 ranks."""
    pytest.importorskip("torch")
    state, code, out, job = slurm.sbatch("examples/slurm/agents_and_train.sbatch", ["--epochs", "3"], job_env)
    assert (state, code) == ("COMPLETED", "0:0"), f"job {job}: {state}, exit {code}:\n{out}"
    assert re.search(r"^slurm: 2 ranks, 2048 samples loaded", out, re.M), out
    assert re.search(r"^epoch 2 loss ", out, re.M), out
    assert left_in_shm(job) == [], f"job {job} left shared memory behind:\n{out}"


def test_srun_starts_agent(slurm, job_env, tmp_path):
    """A bare `srun -n2` with no agent step: local rank 0 starts the node's
    agent itself, every rank adds its rows and reads every row back."""
    r = slurm.run(["srun", "-N1", "-n2", "--time=2", "--chdir", ROOT, sys.executable,
                   os.path.join(ROOT, "examples/slurm/rows.py"), "publish", "--rows", "5000"],
                  timeout=60, env={**job_env, "PYTHONPATH": os.path.join(ROOT, "python")})
    out = r.stdout + r.stderr
    try:
        assert r.returncode == 0, out
        assert len(re.findall(r"^rank [01]/2 on .*: published \d+ rows .* read all 10001 back .*: ok$", out, re.M)) == 2, out
    finally:
        # The agent outlives the step here (proctrack/linuxproc loses a
        # process that left the step's process tree; proctrack/cgroup would
        # kill it): stop it by its pid.
        run_dir = tmp_path / "run"
        for sock in run_dir.glob("slurm-*.sock") if run_dir.exists() else []:
            q = subprocess.run([job_env["DDSTORE_BIN"], "info", "--json", "--socket", str(sock),
                                "--namespace", sock.name.split(".")[0], "--node", slurm.node],
                               capture_output=True, text=True, env=job_env)
            if q.returncode == 0:
                os.kill(json.loads(q.stdout)["pid"], signal.SIGTERM)

"""Start N local processes of a script the way torchrun does, for ddstore jobs
on one machine:

    python -m ddstore.launch -n 2 train.py --epochs 3
    python -m ddstore.launch -n 4 --nodes 2 train.py     # 2 simulated nodes

Each process gets torchrun's variables: RANK, WORLD_SIZE, LOCAL_RANK,
LOCAL_WORLD_SIZE, MASTER_ADDR=127.0.0.1 and MASTER_PORT (a free port), so
torch.distributed.init_process_group() and ddstore.Store() find their rank
with no arguments. With --nodes K > 1 the ranks are split into K blocks of
consecutive ranks, each a simulated node: DDSTORE_NODE_ID=node<k>, LOCAL_*
counted per node, DDSTORE_RENDEZVOUS=127.0.0.1:<free port> so that the
nodes' agents meet, and DDSTORE_SECRET (the environment's, or a random one
for the job) that they prove to each other.

Every line a process writes comes out prefixed "[rank r] " (stdout to
stdout, stderr to stderr). When a process fails, the others are stopped
(SIGTERM, then SIGKILL) and the launcher exits with the first nonzero status
(128+N for a process killed by signal N); Ctrl-C or SIGTERM stops them all
(exit 130 / 143). The job runs in a namespace of its own (DDSTORE_NAMESPACE:
the environment's, or launch-<random>; --namespace to choose): at the end the
agents of that namespace (and of its sub-namespaces NS.*, see pyddstore) that
the job started are stopped, and the launcher returns once they have exited
(SIGKILL after 15 s), so none idles on.

Debian's torchrun (torch 1.13) does the same job but loses the processes'
output unless it is given `--redirects 1 --tee 1 --log_dir DIR`:

    torchrun --standalone --nproc_per_node 2 --redirects 1 --tee 1 --log_dir /tmp/tr train.py
"""

import argparse
import os
import secrets
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid

from ._errors import ArgumentError

__all__ = ["main", "launch", "free_port", "agent_pids"]


def free_port():
    """A TCP port of 127.0.0.1 free at the time of the call."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def rank_env(rank, nproc, nodes, master_port, rendezvous=None, base=None):
    """The environment of rank `rank` of `nproc` on `nodes` simulated nodes
    (consecutive blocks of ranks, the first ones one rank larger when nproc
    is not a multiple of nodes)."""
    env = dict(os.environ if base is None else base)
    bounds = [k * nproc // nodes for k in range(nodes + 1)]
    node = max(k for k in range(nodes) if bounds[k] <= rank)
    env.update(RANK=str(rank), WORLD_SIZE=str(nproc), LOCAL_RANK=str(rank - bounds[node]),
               LOCAL_WORLD_SIZE=str(bounds[node + 1] - bounds[node]), GROUP_RANK=str(node),
               MASTER_ADDR="127.0.0.1", MASTER_PORT=str(master_port), PYTHONUNBUFFERED="1")
    if nodes > 1:
        env["DDSTORE_NODE_ID"] = f"node{node}"
        env["DDSTORE_RENDEZVOUS"] = rendezvous
    return env


def agent_pids(namespace, subspaces=False):
    """The pids of ddstore agents of `namespace` on this machine (their
    command lines hold `--namespace NAMESPACE`), and with subspaces those of
    `NAMESPACE.*` too (sub-groups' stores, see pyddstore)."""
    out = []
    want = b"\0--namespace\0" + os.fsencode(namespace)
    ends = (b"\0", b".") if subspaces else (b"\0",)
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open(f"/proc/{d}/cmdline", "rb") as f:
                cmd = f.read()
        except OSError:
            continue
        i = cmd.find(want)
        if i >= 0 and b"\0agent\0" in cmd and cmd[i + len(want):i + len(want) + 1] in ends:
            out.append(int(d))
    return out


def _kill(pid, sig):
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        pass


class _Pump(threading.Thread):
    """Copies one pipe of a process line by line, prefixed."""

    def __init__(self, pipe, out, prefix, lock):
        super().__init__(daemon=True)
        self.pipe, self.out, self.prefix, self.lock = pipe, out, prefix, lock

    def run(self):
        for line in iter(self.pipe.readline, b""):
            if not line.endswith(b"\n"):
                line += b"\n"
            with self.lock:
                self.out.write(self.prefix + line)
                self.out.flush()
        self.pipe.close()


def launch(cmd, nproc, nodes=1, namespace=None, grace=5.0, stdout=None, stderr=None):
    """Run `cmd` (a list, e.g. [sys.executable, "train.py", ...]) as nproc
    ranks; returns the exit status of the job (0, or the first failure)."""
    if nproc < 1 or nodes < 1 or nodes > nproc:
        raise ArgumentError(f"ddstore: bad argument: launch -n {nproc} --nodes {nodes}: want 1 <= nodes <= n")
    stdout = stdout or sys.stdout.buffer
    stderr = stderr or sys.stderr.buffer
    namespace = namespace or os.environ.get("DDSTORE_NAMESPACE") or "launch-" + uuid.uuid4().hex[:12]
    before = set(agent_pids(namespace, subspaces=True))
    base = dict(os.environ, DDSTORE_NAMESPACE=namespace)
    master, rendezvous = free_port(), None
    if nodes > 1:
        rendezvous = f"127.0.0.1:{free_port()}"
        # Agents that meet through a rendezvous address prove a shared secret.
        if not base.get("DDSTORE_SECRET"):
            base["DDSTORE_SECRET"] = secrets.token_hex(32)
    procs, pumps, lock = [], [], threading.Lock()
    status = 0
    stop = []

    def on_signal(signum, frame):
        stop.append(signum)

    old = {}
    if threading.current_thread() is threading.main_thread():
        for s in (signal.SIGINT, signal.SIGTERM):
            old[s] = signal.signal(s, on_signal)
    try:
        for r in range(nproc):
            env = rank_env(r, nproc, nodes, master, rendezvous, base)
            # A session of its own: a terminal's Ctrl-C reaches the launcher
            # only, which stops the ranks in order.
            p = subprocess.Popen(cmd, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                 stderr=subprocess.PIPE, start_new_session=True)
            procs.append(p)
            for pipe, out in ((p.stdout, stdout), (p.stderr, stderr)):
                t = _Pump(pipe, out, f"[rank {r}] ".encode(), lock)
                t.start()
                pumps.append(t)
        running = set(range(nproc))
        while running and not stop:
            for r in sorted(running):
                rc = procs[r].poll()
                if rc is None:
                    continue
                running.discard(r)
                if rc != 0 and status == 0:
                    status = rc if rc > 0 else 128 - rc
                    with lock:
                        stderr.write(f"ddstore.launch: rank {r} exited with status {status}; stopping the other "
                                     f"ranks\n".encode())
                        stderr.flush()
            if status:
                break
            time.sleep(0.02)
        if stop and not status:
            status = 128 + stop[0]
        _stop(procs, grace)
    except BaseException:
        _stop(procs, grace)
        raise
    finally:
        for s, h in old.items():
            signal.signal(s, h)
        for t in pumps:
            t.join(timeout=2)
        # The agents this job started: they would idle on for their
        # --idle-exit otherwise. The launcher returns once they are gone
        # (an agent drains its requests for up to 10 s on SIGTERM), so
        # that a job started right after finds none of them.
        _stop_agents(set(agent_pids(namespace, subspaces=True)) - before, _AGENT_GRACE)
    return status


# _AGENT_GRACE is how long a stopped agent may take to exit before it is
# killed: longer than its own drain (10 s).
_AGENT_GRACE = 15.0


def _alive(pid):
    """Whether pid is a process that has not exited (a zombie has)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rsplit(b")", 1)[1].split()[0] != b"Z"
    except (OSError, IndexError):
        return False


def _stop_agents(pids, grace):
    """SIGTERM each agent, wait until all have exited, SIGKILL those still
    there after grace seconds. The agents are not the launcher's children
    (they run as daemons), so their exit is watched in /proc."""
    for pid in pids:
        _kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + grace
    pause = 0.001
    while pids:
        pids = [pid for pid in pids if _alive(pid)]
        if not pids or time.monotonic() > deadline:
            break
        time.sleep(pause)
        pause = min(2 * pause, 0.05)
    for pid in pids:
        _kill(pid, signal.SIGKILL)


def _stop(procs, grace):
    """SIGTERM each live rank's process group, SIGKILL after grace seconds."""
    live = [p for p in procs if p.poll() is None]
    for p in live:
        try:
            os.killpg(p.pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
    deadline = time.monotonic() + grace
    for p in live:
        try:
            p.wait(max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            try:
                os.killpg(p.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            p.wait()


def main(argv=None):
    ap = argparse.ArgumentParser(prog="python -m ddstore.launch", description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-n", "--nproc", type=int, required=True, help="number of processes (ranks)")
    ap.add_argument("--nodes", type=int, default=1, help="simulated nodes (blocks of consecutive ranks)")
    ap.add_argument("--namespace", default=None,
                    help="ddstore namespace of the job (default: $DDSTORE_NAMESPACE, else a new one)")
    ap.add_argument("-m", dest="module", action="store_true", help="run the script argument as a module (python -m)")
    ap.add_argument("script", help="the Python script (or module, with -m)")
    ap.add_argument("args", nargs=argparse.REMAINDER, help="its arguments")
    a = ap.parse_args(argv)
    if a.nproc < 1 or a.nodes < 1 or a.nodes > a.nproc:
        ap.error(f"-n {a.nproc} --nodes {a.nodes}: want 1 <= nodes <= n")
    cmd = [sys.executable] + (["-m", a.script] if a.module else [a.script]) + a.args
    return launch(cmd, a.nproc, a.nodes, a.namespace)


if __name__ == "__main__":
    sys.exit(main())

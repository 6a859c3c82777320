"""Finding, starting and reaching the node agent, with the same rules as the
Go library (internal/agent/paths.go, spawn.go)."""

import hashlib
import os
import shutil
import subprocess

from ._errors import EXIT_AGENT_RUNS, ArgumentError, NoAgent


def escape(s):
    """The file-name form of a name: [A-Za-z0-9_-] kept, other bytes %XX."""
    out = []
    for c in s.encode():
        ch = chr(c)
        if ch.isascii() and (ch.isalnum() or ch in "-_"):
            out.append(ch)
        else:
            out.append("%%%02X" % c)
    return "".join(out)


def check_name(what, name):
    """A namespace or node name must name files and sockets unambiguously:
    1 to 255 bytes without NUL (Go's CheckName)."""
    b = name.encode() if isinstance(name, str) else None
    if b is None or not 1 <= len(b) <= 255 or b"\0" in b:
        raise ArgumentError(f"ddstore: bad argument: {what} {name!r}: want 1 to 255 bytes without NUL")


def default_run_dir():
    d = os.environ.get("DDSTORE_RUN_DIR")
    if d:
        return d
    return os.path.join(os.environ.get("TMPDIR") or "/tmp", "ddstore-%d" % os.geteuid())


def socket_path(run_dir, namespace, node):
    p = os.path.join(run_dir, escape(namespace) + "." + escape(node) + ".sock")
    if len(p.encode()) > 100:
        h = hashlib.sha256((namespace + "\x00" + node).encode()).hexdigest()[:24]
        p = os.path.join(run_dir, h + ".sock")
    return p


def default_namespace():
    for v in (os.environ.get("DDSTORE_NAMESPACE"),):
        if v:
            return v
    j = os.environ.get("SLURM_JOB_ID")
    if j:
        return "slurm-" + j
    r = os.environ.get("TORCHELASTIC_RUN_ID")
    if r and r != "none":
        return "torch-" + r
    return "default"


def find_binary():
    """DDSTORE_BIN, then a copy bundled in this package, then PATH."""
    b = os.environ.get("DDSTORE_BIN")
    if b:
        return b
    bundled = os.path.join(os.path.dirname(__file__), "bin", "ddstore")
    if os.access(bundled, os.X_OK):
        return bundled
    p = shutil.which("ddstore")
    if p:
        return p
    raise NoAgent("ddstore: no agent: no ddstore binary to start an agent with: set DDSTORE_BIN or put ddstore on PATH")


def spawn(namespace, node, socket, agent_args=(), binary=None, env=None):
    """Start `ddstore agent --daemon`, which returns once the socket serves.
    Losing the race to another rank's agent is fine: it serves us. env: the
    agent's environment (None: this process's)."""
    binary = binary or find_binary()
    args = [binary, "agent", "--daemon", "--namespace", namespace, "--node", node, "--socket", socket,
            "--idle-exit", "30s", *agent_args]
    r = subprocess.run(args, stdin=subprocess.DEVNULL, capture_output=True, text=True, env=env)
    if r.returncode == EXIT_AGENT_RUNS:
        return
    if r.returncode != 0:
        msg = (r.stdout + r.stderr).strip()
        raise NoAgent(f"ddstore: no agent: starting `{' '.join(args)}` failed ({r.returncode}): {msg}")

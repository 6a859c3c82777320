"""What the training jobs of ddstore_bench (cosmoflow, gnn) share: their
messages, the start of their ranks on this machine, the node agent's
counters, the heap setting, and the report's number lists."""

import json
import os
import subprocess
import sys
import tempfile

__all__ = ["say", "parse_loaders", "under_launcher", "launch_ranks", "write_result", "print_result", "start_rank",
           "end_rank", "NodeAgent", "keep_heap", "fmt_list", "table", "BAR"]

BAR = "*" * 40
# How many ranks launch_ranks started on this machine (all of its simulated
# nodes'): what start_rank shares the cores among.
RANKS_HERE = "DDSTORE_BENCH_RANKS_HERE"
# DDSTORE_BENCH_STACKS_AFTER=SECONDS: each rank writes every thread's Python
# stack to its stderr once it has run that long (faulthandler), to see where
# a job that does not end waits.
STACKS_AFTER = "DDSTORE_BENCH_STACKS_AFTER"


def say(msg):
    sys.stderr.write(msg + "\n")
    sys.stderr.flush()


def parse_loaders(names, known):
    """--loaders L ... (commas work too) -> the names in order, each once."""
    out = []
    for n in names:
        for part in n.split(","):
            if part:
                if part not in known:
                    raise ValueError(f"loader {part!r}: want one of {', '.join(known)}")
                if part not in out:
                    out.append(part)
    if not out:
        raise ValueError("no loader to run")
    return out


def under_launcher():
    """Whether this process is one rank of a launcher's job (torchrun, srun,
    mpirun: RANK and WORLD_SIZE set)."""
    return bool(os.environ.get("RANK")) and bool(os.environ.get("WORLD_SIZE"))


def launch_ranks(cfg, module, nodes, what):
    """Start cfg["ranks"] ranks of `python -m module CONFIG` on this machine
    (ddstore.launch: torchrun's variables, one agent per simulated node),
    their output on stderr; return (status, the result rank 0 wrote)."""
    from ddstore.launch import launch
    pkg_root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    with tempfile.TemporaryDirectory(prefix=f"ddstore-{what}-") as tmp:
        cfg = dict(cfg, result=os.path.join(tmp, "result.json"))
        path = os.path.join(tmp, "config.json")
        with open(path, "w") as f:
            json.dump(cfg, f)
        saved = {k: os.environ.get(k) for k in ("PYTHONPATH", RANKS_HERE)}
        old = saved["PYTHONPATH"]
        os.environ["PYTHONPATH"] = pkg_root + (os.pathsep + old if old else "")
        os.environ[RANKS_HERE] = str(cfg["ranks"])
        try:
            rc = launch([sys.executable, "-m", module, path], cfg["ranks"], nodes,
                        stdout=sys.stderr.buffer, stderr=sys.stderr.buffer)
        finally:
            for k, v in saved.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v
        if rc != 0:
            return rc, None
        with open(cfg["result"]) as f:
            return 0, json.load(f)


def write_result(cfg, out):
    """Rank 0's result, where launch_ranks reads it (when cfg names a file)."""
    if cfg.get("result"):
        with open(cfg["result"] + ".tmp", "w") as f:
            json.dump(out, f)
        os.replace(cfg["result"] + ".tmp", cfg["result"])


def print_result(result, as_json, report):
    sys.stdout.write(json.dumps(result) + "\n" if as_json else report(result))
    sys.stdout.flush()


def start_rank():
    """Join the job's gloo process group (torchrun's variables) with the
    heap kept and torch's threads shared among the node's ranks; returns
    (rank, ranks, local_rank). With DDSTORE_BENCH_STACKS_AFTER=SECONDS the
    rank writes every thread's stack to stderr after that long."""
    import torch
    import torch.distributed as dist
    after = os.environ.get(STACKS_AFTER)
    if after:
        import faulthandler
        faulthandler.dump_traceback_later(float(after), exit=False)
    keep_heap()
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29500")
    dist.init_process_group("gloo")
    rank, ranks = dist.get_rank(), dist.get_world_size()
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    # The ranks that share this machine's cores: launch_ranks's simulated
    # nodes are all here (each node's LOCAL_WORLD_SIZE counts only its own).
    here = int(os.environ.get(RANKS_HERE) or os.environ.get("LOCAL_WORLD_SIZE") or ranks)
    torch.set_num_threads(max(1, _cores() // max(1, here)))
    return rank, ranks, local_rank


def end_rank(models):
    """Leave the job's process group (start_rank's), after the job's last
    collective: each DDP model of `models` (None skipped) lets go of the
    group, then the group is destroyed. The models cannot train any more.

    The order matters with gloo (torch 1.13): a DDP model's reducer holds a
    C++ reference to the group, and were it the last one (the model freed
    after destroy_process_group), the group's destructor would run there
    with the GIL held and join the group's worker threads, while a worker
    that still drops a finished collective's tensor waits for the GIL: the
    rank never exits. Dropped before, the reducer's reference is not the
    last; destroy_process_group lets go of the group from Python, which
    releases the GIL while the workers are joined."""
    import gc

    import torch.distributed as dist
    for m in models:
        if m is None:
            continue
        for attr in ("logger", "reducer"):  # the logger holds the reducer too
            if hasattr(m, attr):
                delattr(m, attr)
    gc.collect()
    dist.destroy_process_group()


def _cores():
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


class NodeAgent:
    """The node's agent counters (`ddstore info --json`), read by the
    first rank of each node; None elsewhere or when the agent cannot say."""

    KEYS = ("storage_rows", "storage_reads", "storage_bytes", "staged_rows", "prefetch_rows", "prefetch_dropped",
            "prefetch_late", "prefetch_evicted", "storage_errors")

    def __init__(self, store, local_rank):
        from ddstore import _agent
        self.store, self.on = store, local_rank == 0
        self.binary = _agent.find_binary() if self.on else None

    def counters(self):
        if not self.on:
            return None
        try:
            r = subprocess.run([self.binary, "info", "--json", "--socket", self.store.socket_path],
                               capture_output=True, text=True, timeout=30)
            c = json.loads(r.stdout)["counters"]
            return {k: int(c.get(k, 0)) for k in self.KEYS}
        except (OSError, ValueError, KeyError, subprocess.SubprocessError):
            return None

    @staticmethod
    def delta(a, b):
        if a is None or b is None:
            return None
        return {k: b[k] - a[k] for k in a}


def keep_heap():
    """Have glibc keep freed memory instead of returning it to the kernel:
    torch's CPU tensors of a few MiB are otherwise mmapped and unmapped every
    step, and faulting their pages in again costs a third of a step here.
    The same for every loader; a no-op where mallopt is missing."""
    import ctypes
    try:
        libc = ctypes.CDLL(None)
        libc.mallopt(-3, 32 << 20)  # M_MMAP_THRESHOLD: glibc's largest
        libc.mallopt(-1, 1 << 30)   # M_TRIM_THRESHOLD
    except (OSError, AttributeError):
        pass


def fmt_list(xs, f):
    return "[" + ", ".join("-" if x is None else format(x, f) for x in xs) + "]"


def table(rows):
    """Rows of strings as aligned lines: the first column left, the others
    right, a rule under the header row."""
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    lines = []
    for k, row in enumerate(rows):
        lines.append("  ".join(v.ljust(w) if i == 0 else v.rjust(w) for i, (v, w) in enumerate(zip(row, widths))))
        if k == 0:
            lines.append("  ".join("-" * w for w in widths))
    return lines

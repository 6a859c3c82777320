"""Rank, size, local rank and node from a launcher's environment: the same
rules as the Go side (internal/rendezvous/env.go); tests/unit/test_vectors.py checks
both against vectors Go writes."""

import os
import re
import socket

from ._errors import ArgumentError

_FAMILIES = [
    ("explicit", "DDSTORE_RANK", "DDSTORE_SIZE", "DDSTORE_LOCAL_RANK", "DDSTORE_LOCAL_SIZE"),
    ("torchrun", "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE"),
    ("openmpi", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_SIZE"),
    ("mpich", "PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID", "MPI_LOCALNRANKS"),
]


class Identity:
    __slots__ = ("rank", "size", "local_rank", "local_size", "node", "launcher")

    def __init__(self, rank, size, local_rank, local_size, node, launcher):
        self.rank, self.size, self.local_rank, self.local_size = rank, size, local_rank, local_size
        self.node, self.launcher = node, launcher

    def as_tuple(self):
        return (self.rank, self.size, self.local_rank, self.local_size, self.node, self.launcher)

    def __repr__(self):
        return "Identity(rank=%d, size=%d, local_rank=%d, local_size=%d, node=%r, launcher=%r)" % self.as_tuple()


def _bad(var, value, want):
    return ArgumentError(f"ddstore: bad environment: {var}={value!r}: want {want}")


def _int(s):
    """An integer as Go's strconv.Atoi reads it (64-bit), else None."""
    if not re.fullmatch(r"[+-]?[0-9]+", s):
        return None
    n = int(s)
    return n if -(1 << 63) <= n < (1 << 63) else None


def _rank_and_size(env, rank_var, size_var):
    rs, ss = env.get(rank_var, ""), env.get(size_var, "")
    if ss == "":
        raise ArgumentError(f"ddstore: bad environment: {rank_var} is set but {size_var} is not")
    if rs == "":
        raise ArgumentError(f"ddstore: bad environment: {size_var} is set but {rank_var} is not")
    size = _int(ss)
    if size is None or size < 1:
        raise _bad(size_var, ss, "an integer >= 1")
    rank = _int(rs)
    if rank is None or rank < 0 or rank >= size:
        raise _bad(rank_var, rs, f"an integer in [0, {size_var}={size})")
    return rank, size


def _with_local(rank, size, env, local_rank_var, size_var, local_size_var, local_size, launcher, node):
    s = env.get(local_rank_var, "")
    if s == "" and local_size > 0:
        raise ArgumentError(f"ddstore: bad environment: {local_size_var} is set but {local_rank_var} is not")
    if s == "" and size == 1:
        return Identity(rank, size, 0, 1, node, launcher)
    if s == "":
        return Identity(rank, size, -1, local_size, node, launcher)
    bound, bound_var = (local_size, local_size_var) if local_size > 0 else (size, size_var)
    n = _int(s)
    if n is None or n < 0 or n >= bound:
        raise _bad(local_rank_var, s, f"an integer in [0, {bound_var}={bound})")
    return Identity(rank, size, n, 1 if size == 1 else local_size, node, launcher)


def _tasks_per_node(s):
    out = []
    for item in s.split(","):
        m = re.fullmatch(r"([+-]?[0-9]+)(?:\(x([+-]?[0-9]+)\))?", item)
        if not m:
            return None
        tasks, nodes = _int(m.group(1)), _int(m.group(2) or "1")
        if tasks is None or tasks < 0 or nodes is None or nodes < 1:
            return None
        out.append((tasks, nodes))
    return out


def _slurm_local_size(env):
    list_var = "SLURM_STEP_TASKS_PER_NODE" if env.get("SLURM_STEP_TASKS_PER_NODE") else "SLURM_TASKS_PER_NODE"
    lst = env.get(list_var, "")
    counts = None
    if lst:
        counts = _tasks_per_node(lst)
        if counts is None:
            raise _bad(list_var, lst, 'a list like "4(x2),3"')
    nid = env.get("SLURM_NODEID", "")
    if nid and counts is not None:
        node = _int(nid)
        if node is None or node < 0:
            raise _bad("SLURM_NODEID", nid, "an integer >= 0")
        for tasks, nodes in counts:
            if node < nodes:
                return tasks, list_var
            node -= nodes
        raise ArgumentError(f"ddstore: bad environment: {list_var}={lst!r} has no entry for SLURM_NODEID={nid}")
    s = env.get("SLURM_NTASKS_PER_NODE", "")
    if s:
        n = _int(s)
        if n is None or n < 1:
            raise _bad("SLURM_NTASKS_PER_NODE", s, "an integer >= 1")
        return n, "SLURM_NTASKS_PER_NODE"
    if counts is not None and len(counts) == 1:
        return counts[0][0], list_var
    return 0, ""


def node_from_env(env=None):
    env = os.environ if env is None else env
    return env.get("DDSTORE_NODE_ID") or env.get("SLURMD_NODENAME") or socket.gethostname()


def from_env(env=None, hostname=None):
    """The Identity the environment gives, like rendezvous.FromEnv."""
    env = os.environ if env is None else env
    node = env.get("DDSTORE_NODE_ID") or env.get("SLURMD_NODENAME") or hostname or socket.gethostname()
    for i, (launcher, rv, sv, lrv, lsv) in enumerate(_FAMILIES):
        present = env.get(rv, "") != "" or env.get(sv, "") != ""
        if i == 0:
            present = present or env.get(lrv, "") != "" or env.get(lsv, "") != ""
        if present:
            rank, size = _rank_and_size(env, rv, sv)
            local_size = 0
            s = env.get(lsv, "")
            if s:
                n = _int(s)
                if n is None or n < 1 or n > size:
                    raise _bad(lsv, s, f"an integer in [1, {sv}={size}]")
                local_size = n
            return _with_local(rank, size, env, lrv, sv, lsv, local_size, launcher, node)
    if env.get("SLURM_PROCID", ""):
        size_var = "SLURM_STEP_NUM_TASKS" if env.get("SLURM_STEP_NUM_TASKS") else "SLURM_NTASKS"
        rank, size = _rank_and_size(env, "SLURM_PROCID", size_var)
        local_size, local_size_var = _slurm_local_size(env)
        if local_size > size:
            local_size = 0
        return _with_local(rank, size, env, "SLURM_LOCALID", size_var, local_size_var, local_size, "slurm", node)
    return Identity(0, 1, 0, 1, node, "single")

"""How the agents of a job meet when nothing in the environment says: the
job's communicator carries it.

A store made from an mpi4py communicator or a torch.distributed process
group whose ranks sit on several nodes needs its agents to meet: through a
handshake directory (--handshake-dir, DDSTORE_HANDSHAKE_DIR) or a rendezvous
address (--rendezvous, DDSTORE_RENDEZVOUS) shared with a secret
(DDSTORE_SECRET). When neither is given, rank 0 makes them: a rendezvous
address on its host (a free TCP port; 127.0.0.1 when every rank runs on one
machine, as with simulated nodes) and a random secret, and the communicator
carries both to every rank, whose node's agent is started with them (the
secret in the agent's environment, never on its command line). A rendezvous
given without a secret gets the secret alone. Rank 0 decides for every rank,
so that a job whose ranks disagree (a directory on some, nothing on others)
fails on every rank at once, naming the ranks and what they lack, instead of
waiting for agents that never meet."""

import os
import secrets
import socket

from ._auth import SECRET_ENV
from ._errors import ArgumentError

_DIR, _RV, _NONE = "handshake directory", "rendezvous address", "nothing"


def _flag(args, name):
    """The value of --name (or -name) in an agent's arguments: None when
    absent, "" when given empty (--name=)."""
    val = None
    i = 0
    while i < len(args):
        a = str(args[i])
        for p in ("--" + name, "-" + name):
            if a == p and i + 1 < len(args):
                val = str(args[i + 1])
                i += 1
            elif a.startswith(p + "="):
                val = a[len(p) + 1:]
        i += 1
    return val


def _how(agent_args):
    """How this rank's agent would meet the others, from its arguments, then
    the environment the agent reads."""
    hs = _flag(agent_args, "handshake-dir")
    if hs is None:
        hs = os.environ.get("DDSTORE_HANDSHAKE_DIR", "")
    if hs:
        return _DIR
    rv = _flag(agent_args, "rendezvous")
    if rv is None:
        rv = os.environ.get("DDSTORE_RENDEZVOUS", "")
    return _RV if rv else _NONE


def _collectives(comm):
    """(allgather, bcast-from-rank-0) over an mpi4py communicator or a
    torch.distributed group; None for anything else."""
    if hasattr(comm, "Split_type") and hasattr(comm, "bcast"):
        return comm.allgather, lambda obj: comm.bcast(obj, root=0)
    if type(comm).__module__.startswith("torch"):
        import torch.distributed as dist
        n = dist.get_world_size(comm)

        def allgather(obj):
            out = [None] * n
            dist.all_gather_object(out, obj, group=comm)
            return out

        def bcast(obj):
            box = [obj]
            src = dist.get_global_rank(comm, 0) if hasattr(dist, "get_global_rank") else 0
            dist.broadcast_object_list(box, src=src, group=comm)
            return box[0]

        return allgather, bcast
    return None


def _host(hosts):
    """The address rank 0's agent listens on for the rendezvous: loopback
    when every rank runs on this machine, else the address this host uses
    to reach another rank's host."""
    mine = hosts[0]
    others = [h for h in hosts if h != mine]
    if not others:
        return "127.0.0.1"
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.connect((socket.gethostbyname(others[0]), 9))  # UDP: no packet is sent
            return s.getsockname()[0]
    except OSError:
        return socket.gethostbyname(mine)


def _free_port(host):
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def _plan(seen):
    """Rank 0's decision from every rank's (node, host, how, has secret):
    {"rendezvous": address or None, "secret": str or None, "error": str or
    None}."""
    nodes = {s[0] for s in seen}
    hows = {s[2] for s in seen}
    plan = {"rendezvous": None, "secret": None, "error": None}
    if len(hows) > 1:
        parts = []
        for how in sorted(hows):
            ranks = [r for r, s in enumerate(seen) if s[2] == how]
            parts.append(f"ranks {_ranks(ranks)} have {'no handshake directory or rendezvous address' if how == _NONE else 'a ' + how}")
        plan["error"] = ("ddstore: bad argument: the ranks disagree on how their agents meet: " + "; ".join(parts) +
                         ": give every rank the same DDSTORE_HANDSHAKE_DIR (or handshake_dir=), or the same "
                         "DDSTORE_RENDEZVOUS, or neither (the communicator then carries a rendezvous and a secret)")
        return plan
    how = hows.pop()
    if how == _DIR or (how == _NONE and len(nodes) == 1):
        return plan  # the directory carries the key; one node needs nothing
    if how == _NONE:
        host = _host([s[1] for s in seen])
        plan["rendezvous"] = f"{host}:{_free_port(host)}"
    if not all(s[3] for s in seen):
        plan["secret"] = secrets.token_hex(32)
    return plan


def _ranks(ranks):
    s = ", ".join(str(r) for r in ranks[:8])
    return s + (f" and {len(ranks) - 8} more" if len(ranks) > 8 else "")


def agree(comm, node, agent_args):
    """Collective over comm: (agent_args, environment for the agent) so that
    the job's agents meet; (agent_args, None) when nothing is to add.
    Raises ArgumentError on every rank when the ranks disagree."""
    coll = _collectives(comm)
    if coll is None:
        return tuple(agent_args), None
    allgather, bcast = coll
    mine = (node, socket.gethostname(), _how(agent_args), bool(os.environ.get(SECRET_ENV, "")))
    seen = allgather(mine)
    plan = None
    if comm_rank(comm) == 0:
        try:
            plan = _plan(seen)
        except OSError as e:
            plan = {"rendezvous": None, "secret": None,
                    "error": f"ddstore: bad argument: rank 0 could not make a rendezvous address for the agents: {e}"}
    plan = bcast(plan)
    if plan["error"]:
        raise ArgumentError(plan["error"])
    args, env = tuple(agent_args), None
    if plan["rendezvous"]:
        args += ("--rendezvous", plan["rendezvous"])
    if plan["secret"]:
        env = {**os.environ, SECRET_ENV: plan["secret"]}
    return args, env


def comm_rank(comm):
    if hasattr(comm, "Get_rank"):
        return comm.Get_rank()
    import torch.distributed as dist
    return dist.get_rank(comm)

"""Where a rank stands: from an mpi4py communicator, a torch.distributed
process group, a FileComm, explicit numbers, or the launcher's environment."""

import json
import os
import time

from . import _env
from ._errors import ArgumentError, Timeout


class FileComm:
    """A communicator made of files in a directory on a shared filesystem:
    rank and size are given, agents meet through `dir` (their handshake
    directory), and barrier/allgather go through files named by `ns`."""

    def __init__(self, dir, rank, size, ns="default", timeout=300.0):
        if not 0 <= rank < size:
            raise ArgumentError(f"ddstore: bad argument: rank {rank} of {size}: want 0 <= rank < size")
        self.dir, self.rank, self.size, self.ns, self.timeout = os.fspath(dir), rank, size, ns, timeout
        os.makedirs(self.dir, mode=0o700, exist_ok=True)
        self._round = 0

    def Get_rank(self):
        return self.rank

    def Get_size(self):
        return self.size

    def allgather(self, obj):
        """Every rank's obj, in rank order (JSON-serializable objects)."""
        self._round += 1
        tag = f"{self.ns}.gather{self._round}"
        path = os.path.join(self.dir, f"{tag}.{self.rank}.json")
        tmp = path + f".tmp{os.getpid()}"
        with open(tmp, "w") as f:
            json.dump(obj, f)
            f.flush()
            os.fsync(f.fileno())
        os.rename(tmp, path)
        out, deadline, wait = [], time.monotonic() + self.timeout, 0.002
        for r in range(self.size):
            p = os.path.join(self.dir, f"{tag}.{r}.json")
            while True:
                try:
                    with open(p) as f:
                        out.append(json.load(f))
                    break
                except FileNotFoundError:
                    if time.monotonic() > deadline:
                        raise Timeout(f"ddstore: timed out: rank {r} did not reach {tag} in {self.dir} within "
                                      f"{self.timeout}s") from None
                    time.sleep(wait)
                    wait = min(2 * wait, 0.05)
        return out

    def barrier(self):
        self.allgather(None)


def world_of(comm, rank, size):
    """(world rank, world size, first world rank of the group) when comm is
    a communicator split from a larger job (mpi4py, torch.distributed),
    else None."""
    if comm is None:
        return None
    if hasattr(comm, "Split_type"):  # mpi4py
        from mpi4py import MPI
        w = MPI.COMM_WORLD
        if comm.Get_size() >= w.Get_size():
            return None
        return w.Get_rank(), w.Get_size(), min(comm.allgather(w.Get_rank()))
    if type(comm).__module__.startswith("torch"):
        import torch.distributed as dist
        if dist.get_world_size(comm) >= dist.get_world_size():
            return None
        ranks = [None] * dist.get_world_size(comm)
        dist.all_gather_object(ranks, dist.get_rank(), group=comm)
        return dist.get_rank(), dist.get_world_size(), min(ranks)
    return None


def identity(comm=None, rank=None, size=None, local_rank=None, local_size=None, node=None):
    """The _env.Identity of this rank."""
    env = _env.from_env() if comm is None and (rank is None or size is None) else None
    if node is None:
        node = env.node if env else _env.node_from_env()
    if rank is not None and size is not None:
        if not 0 <= rank < size:
            raise ArgumentError(f"ddstore: bad argument: rank {rank} of {size}: want 0 <= rank < size")
        lr = -1 if local_rank is None else local_rank
        ls = 0 if local_size is None else local_size
        if size == 1 and local_rank is None:
            lr, ls = 0, 1
        return _env.Identity(rank, size, lr, ls, node, "explicit")
    if comm is None:
        return env
    if hasattr(comm, "Split_type"):  # mpi4py
        # Local ranks are the ranks of the same node id (not of the same
        # shared-memory domain: DDSTORE_NODE_ID may split one machine).
        nodes = comm.allgather(node)
        r = comm.Get_rank()
        same = [i for i, n in enumerate(nodes) if n == node]
        return _env.Identity(r, comm.Get_size(), same.index(r), len(same), node, "mpi4py")
    if type(comm).__module__.startswith("torch"):
        import torch.distributed as dist
        r, s = dist.get_rank(comm), dist.get_world_size(comm)
        lr = int(os.environ.get("LOCAL_RANK", "-1")) if s > 1 else 0
        ls = int(os.environ.get("LOCAL_WORLD_SIZE", "0")) if s > 1 else 1
        return _env.Identity(r, s, lr, ls, node, "torch")
    if hasattr(comm, "Get_rank") and hasattr(comm, "Get_size"):
        r, s = comm.Get_rank(), comm.Get_size()
        # Ranks of one FileComm on one node: the lowest starts the agent.
        return _env.Identity(r, s, -1 if s > 1 else 0, 0 if s > 1 else 1, node, type(comm).__name__)
    raise ArgumentError(f"ddstore: bad argument: comm of type {type(comm).__name__}: want an mpi4py communicator, "
                        f"a torch.distributed process group, a FileComm or None")

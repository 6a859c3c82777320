"""The fence (Store.fence, DDStore's epoch_begin/epoch_end, an MPI window
fence there): a barrier of the store's ranks, its replica group. Rows are
written straight into shared memory (update) and read from it, by this
node's ranks or, for other nodes, by the owners' agents, so a reader needs
only that every writer finished first; the barrier gives that, and the
system calls and atomics it is made of order the memory accesses around it.
With an mpi4py communicator it is an MPI barrier of the group (after
MPI_Win_sync of the store's windows, which makes this rank's updates
visible to other ranks' one-sided gets); otherwise a round on the
coordinator agent (Barrier in docs/protocol.md)."""

import os
import threading
import time

from . import _wire
from ._errors import Timeout

# Each rank's count of fences per namespace, agent and group, for the
# agents' rounds: per rank, not per store, so that two stores of one group
# fence as one sequence (each fence is a barrier of the same ranks).
_SEQS = {}
_SEQS_LOCK = threading.Lock()

# MPI requests of fences that timed out: never freed while MPI may still
# complete them (a late rank reaching its fence does).
_PENDING = []

# How long a rank polls a barrier without sleeping before it backs off,
# and the longest sleep between polls: a fence of ranks that are all there
# costs no sleep; one that waits for a slow rank leaves the cores to it.
_SPIN_S = 2e-3
_MAX_NAP_S = 1e-3


def group_comm(comm, group, world_rank):
    """The communicator of the store's group, for MPI barriers: comm itself,
    or (replica groups of one communicator, Store(width=)) one split from it
    (collective over comm)."""
    if group is None:
        return comm
    return comm.Split(group, world_rank)


def _after_fork_in_child():
    # Another thread of the parent may have held the lock at the fork:
    # its copy here would stay locked.
    global _SEQS_LOCK
    _SEQS_LOCK = threading.Lock()


os.register_at_fork(after_in_child=_after_fork_in_child)


def next_seq(ident):
    with _SEQS_LOCK:
        n = _SEQS.get(ident, 0) + 1
        _SEQS[ident] = n
        return n


def barrier_request(key, rank, size, seq, timeout_s, client=0, client_age_ms=0):
    """The body of a Barrier request (client, client_age_ms: the agent's
    fields, which a client sends as 0)."""
    return _wire.Encoder().string(key).i64(rank, size, seq, int(timeout_s * 1000)).u64(client).i64(client_age_ms)


def mpi_fence(comm, windows, lock, timeout_s, rank, size):
    """An MPI barrier of comm, bounded by timeout_s: raises Timeout when some
    rank does not reach it in time (the barrier stays posted: a late rank
    completes it, and the ranks' next fences meet as they should)."""
    if windows:
        with lock:
            for w in windows:
                w.Sync()
    req = comm.Ibarrier()
    if req.Test():
        return
    t0 = time.monotonic()
    deadline, nap = t0 + timeout_s, 0.0
    while not req.Test():
        now = time.monotonic()
        if now >= deadline:
            _PENDING.append(req)
            raise Timeout(f"ddstore: timed out: fence of rank {rank} of {size}: not every rank of the communicator "
                          f"reached it within {timeout_s:g}s (publish_timeout)")
        if now - t0 > _SPIN_S:
            nap = min(max(2 * nap, 1e-5), _MAX_NAP_S, deadline - now)
            time.sleep(nap)

"""One-sided reads over MPI (Store(method="mpi"), DDStore's method 0):
every variable is also exposed as an MPI window of the ranks' shards, and
this process reads other nodes' rows itself with passive-target gets, the
owners taking no part. Only the process that made the windows uses them:
a forked child reads through the agent."""

import os
import sys
import threading

import numpy as np

from ._errors import ArgumentError

# From this many rows a one-sided read moves each owner's rows with one get
# of indexed datatypes rather than a get per row.
_MPI_TYPED_ROWS = 8

# Variables whose MPI window a store closed without its ranks together
# (garbage collection) left open: kept, mapped, until the process ends.
_KEPT_WINDOWS = []


def check_method(method, comm, reader):
    """The read method Store(method=) names: "agent" or "mpi"."""
    if method is None or method == "agent":
        return "agent"
    if method != "mpi":
        raise ArgumentError(f"ddstore: bad argument: method {method!r}: want 'agent' or 'mpi'")
    if reader:
        raise ArgumentError("ddstore: bad argument: method 'mpi' with reader=True: a reader is not in the publishing "
                            "job's communicator; it reads through the agent")
    if not hasattr(comm, "Split_type"):
        raise ArgumentError(f"ddstore: bad argument: method 'mpi' needs an mpi4py communicator as comm, not "
                            f"{type(comm).__name__}")
    return "mpi"


class Windows:
    """The MPI windows of one store's variables, over comm.

    Windows span the communicator given, so rank r of the store is rank
    base + r there: the group's first rank when width splits it into replica
    groups. (Not one communicator per group: Open MPI 4.1 names a window's
    shared-memory state by its communicator's context id, which sibling
    groups share, so two groups with ranks on one host and windows at once
    collide.)"""

    def __init__(self, comm, base):
        self.comm, self.base = comm, base
        self.lock = threading.Lock()
        self.pid = os.getpid()  # windows are this process's: not a forked child's

    def usable(self):
        return self.pid == os.getpid()

    def open(self, v):
        """Collective over the communicator: expose this rank's shard of v
        in an MPI window, locked for every target at once, as v.win (left
        None when no group has rows on more than one node). Returns the MPI
        error of a window that some rank could not make, which then none
        made; "" when another rank failed; None on success."""
        from mpi4py import MPI
        comm = self.comm
        if not comm.allreduce(int(len(set(v.nodes)) > 1), op=MPI.MAX):
            return None
        mem = v.own if v.own is not None and v.own.nbytes else MPI.BOTTOM
        win, err = None, None
        try:
            win = MPI.Win.Create(mem, 1, comm=comm)
        except MPI.Exception as e:
            err = e
        if comm.allreduce(int(win is not None), op=MPI.MIN):
            win.Lock_all(MPI.MODE_NOCHECK)
            v.win = win
            return None
        if win is not None:
            win.Free()
        return err if err is not None else ""

    def close(self, v):
        """Collective: free v's window (before its shards are unmapped).
        After MPI_Finalize a window can no longer be freed, nor be read:
        it is let go (DDStore's free() skips it too)."""
        win, v.win = v.win, None
        if win is not None and self.usable() and not finalized():
            with self.lock:
                win.Unlock_all()
                win.Free()

    def get_shard(self, v, arr, r, lo, n):
        """n rows of shard r from its row lo into arr: one get."""
        from mpi4py import MPI
        with self.lock:
            t = r + self.base
            v.win.Get([arr, MPI.BYTE], t, (lo * v.rb, n * v.rb, MPI.BYTE))
            v.win.Flush(t)

    def get_rows(self, v, dst, idx, pos, owner):
        """Rows idx[pos] of other nodes' shards into dst[pos]: a get per
        row, or from _MPI_TYPED_ROWS rows one get per owner of indexed
        datatypes; then one flush. Returns the positions left for the agent
        (rows only the backing file holds)."""
        from mpi4py import MPI
        own = owner[pos]
        mem = own < len(v.shard_rows)
        p, o = pos[mem], own[mem]
        k = p.shape[0]
        if k:
            rb, win, byte = v.rb, v.win, MPI.BYTE
            offs = (idx[p] - v.prefix[o]) * rb
            o = o + self.base  # ranks in the window's communicator
            with self.lock:
                if k < _MPI_TYPED_ROWS:
                    get = win.Get
                    for i, r, off in zip(p.tolist(), o.tolist(), offs.tolist()):
                        get([dst[i], byte], r, (off, rb, byte))
                else:
                    # One get per owner: rows gathered at both ends by
                    # indexed datatypes (far fewer calls into MPI).
                    base = dst.reshape(-1)
                    for r in np.unique(o).tolist():
                        sel = o == r
                        here = MPI.BYTE.Create_hindexed_block(rb, (p[sel] * rb).tolist()).Commit()
                        there = MPI.BYTE.Create_hindexed_block(rb, offs[sel].tolist()).Commit()
                        try:
                            win.Get([base, 1, here], r, (0, 1, there))
                        finally:
                            here.Free()
                            there.Free()
                win.Flush_all()
            v.profile["onesided_rows"] += k
        return pos[~mem]


def finalized():
    """MPI has been finalised in this process (mpi4py loaded, and
    MPI_Finalize called, by the program or at exit)."""
    mod = sys.modules.get("mpi4py.MPI")
    try:
        return mod is not None and mod.Is_finalized()
    except Exception:
        return False


def keep_open(v):
    """Keep v's window and the mapping it exposes until the process ends: a
    store closed without its ranks together (collected as garbage), whose
    window other ranks may still read."""
    _KEPT_WINDOWS.append(v)

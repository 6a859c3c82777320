"""Receive buffers: numpy arrays in shared memory registered with the
node's agent, which writes rows of other nodes (and of backing files) into
them directly, so that a read into one skips the staging copy.

They are registered on the control lane's session: when the agent drops
that session (it restarted), the pool registers them again on the new one
(reregister)."""

import weakref

import numpy as np

from . import _wire
from ._errors import ArgumentError, Error
from ._lanes import register
from ._shm import Region


class RecvBuffers:
    """The receive buffers of one store, under the pool's lock."""

    def __init__(self, pool, timeout):
        self.pool, self.timeout = pool, timeout
        pool.on_reconnect = self.reregister
        self.regions = []  # (Region, address of its first byte)
        # Buffers made for the library's own reuse (reusable) whose arrays
        # were collected: released at the next allocation.
        self.dead = []

    def __len__(self):
        return len(self.regions)

    def alloc(self, shape, dtype):
        dt = np.dtype(dtype)
        n = int(np.prod(shape, dtype=np.int64)) * dt.itemsize
        if n <= 0:
            raise ArgumentError(f"ddstore: bad argument: receive buffer of shape {shape}: want > 0 bytes")
        self.release_dead()
        r = Region(n)
        a = r.array()[:n].view(dt).reshape(shape)
        try:
            with self.pool.lock:
                self.pool.ensure_ctl()
                r.id = register(self.pool.ctl, r, self.timeout)
                self.regions.append((r, a.__array_interface__["data"][0]))
        except BaseException:
            r.close()
            raise
        return a

    def reusable(self, shape, dtype):
        """A receive buffer released by itself once its array and every view
        of it are gone: for buffers the library reuses (a data loader's
        batches). The release waits for the next allocation, as a collector
        may run it while this thread holds the lock."""
        a = self.alloc(shape, dtype)
        weakref.finalize(a, self.dead.append, a.__array_interface__["data"][0])
        return a

    def release_dead(self):
        while self.dead:
            try:
                self.drop(self.dead.pop())  # False: freed already (close, fork)
            except Error:
                pass  # the agent is gone or restarting: nothing to unregister

    def drop(self, p):
        """Unregister and unmap the receive buffer at address p; False if
        there is none. Found and taken out under the lock: freed twice at
        once, freed once."""
        with self.pool.lock:
            i = next((i for i, (_, base_ptr) in enumerate(self.regions) if base_ptr == p), None)
            r = self.regions.pop(i)[0] if i is not None else None
        if r is None:
            return False
        try:
            self.pool.control(_wire.OP_UNREGISTER, _wire.Encoder().u32(r.id).i64(0), self.timeout)
        finally:
            r.close()
        return True

    def region_of(self, dst):
        """(region, offset of dst in it) of the buffer dst lies in, or
        (None, 0)."""
        if not self.regions:
            return None, 0
        p = dst.__array_interface__["data"][0]
        n = dst.nbytes
        for r, base_ptr in self.regions:
            if base_ptr <= p and p + n <= base_ptr + r.size:
                return r, p - base_ptr
        return None, 0

    def reregister(self, ctl):
        """Register every buffer again on a new control session. Holds the
        pool's lock."""
        for r, _ in self.regions:
            r.id = register(ctl, r, self.timeout)

    def take_all(self):
        """Take every buffer out, to be closed by close_regions. Holds the
        pool's lock."""
        regions, self.regions = self.regions, []
        return regions

    def forked(self):
        """A forked child: the parent owns the buffers."""
        self.regions, self.dead = [], []


def close_regions(regions):
    for r, _ in regions:
        r.close()

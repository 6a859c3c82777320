"""Prefetch: telling the node's agent which rows of a variable with a backing
file this rank reads soon, so that it reads them from the file into staging
memory before the get_batch that wants them. The requests go from a
background thread of the store, so that prefetch() returns at once."""

import queue
import threading

from . import _wire
from ._errors import ArgumentError, Error
from ._vars import check_rows, row_indices


def request(v, indices):
    """The Prefetch request for rows `indices` of v (a _Var), or None when
    none of them is only in the backing file. Bad arguments raise here."""
    if not v.backing:
        raise ArgumentError(f"ddstore: bad argument: variable {v.label!r} has no backing file: its rows are all in "
                            f"memory, there is nothing to prefetch")
    idx = check_rows(row_indices(indices), v.total, v.label)
    idx = idx[idx >= v.held]
    if not idx.size:
        return None
    return _wire.Encoder().string(v.name).i64(v.id).i64s(idx)


class Prefetcher:
    """The background sender of one store's Prefetch requests, started on
    first use. An error the agent answers is kept and raised by the next
    prefetch (take_error)."""

    def __init__(self, name):
        self.name = name
        self.queue, self.thread, self.error = None, None, None

    def take_error(self):
        err, self.error = self.error, None
        return err

    def submit(self, enc, lock, send):
        """Queue enc (the requests of one announcement), starting the
        thread under lock (the store's) if it is not running yet; the
        thread sends each with send(enc) (on a lane of the store's pool),
        and keeps the store alive until close."""
        with lock:
            if self.queue is None:
                self.queue = queue.SimpleQueue()
                self.thread = threading.Thread(target=self._run, args=(self.queue, send), daemon=True,
                                               name=self.name)
                self.thread.start()
            q = self.queue
        q.put(enc)

    def _run(self, q, send):
        """Sends the requests submit queues, until close()."""
        while True:
            enc = q.get()
            if enc is None:
                return
            try:
                send(enc)
            except Error as e:
                self.error = e

    def close(self, timeout):
        """Send what was queued, then end the thread (waiting at most
        timeout seconds for it)."""
        q, t = self.queue, self.thread
        if q is not None:
            q.put(None)
            t.join(timeout)

    def forked(self):
        """A forked child: the parent's thread is not in it."""
        self.queue = self.thread = None

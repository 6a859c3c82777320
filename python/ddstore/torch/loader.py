"""ThreadDataLoader: torch's DataLoader with worker threads instead of
processes, and a fast path for the datasets of this package (a batch read
into per-field arrays that become the batch tensors)."""

import queue
import threading
import weakref

import numpy as np
import torch
import torch.utils.data as _tud

from .._errors import ArgumentError, ArgumentTypeError, LoaderTimeout

# torch >= 1.11 exports these; older builds keep them in _utils only.
_default_collate = getattr(_tud, "default_collate", None) or _tud._utils.collate.default_collate
_default_convert = getattr(_tud, "default_convert", None) or _tud._utils.collate.default_convert

# DataLoader arguments that mean nothing for threads (a thread shares the
# process, so there is nothing to pin, spawn or keep alive); in_order: batches
# always come in sampler order.
_IGNORED = {"pin_memory", "pin_memory_device", "multiprocessing_context", "persistent_workers", "in_order"}


class ThreadDataLoader:
    """torch's DataLoader with worker threads instead of processes: a read
    of a DistDataset waits on the agent's socket (rows of other nodes) or
    copies with numpy (rows of this node), both mostly outside the GIL, so
    threads overlap reads without forking the trainer or pickling batches.

    Takes DataLoader's arguments and yields the same batches in the same
    order (shuffling draws the same numbers from `generator`, or torch's
    global generator, as DataLoader does). At most num_workers *
    prefetch_factor batches are in flight. A worker's exception is raised in
    the consumer, which ends the iteration. Dropping the iterator, close(),
    or the end of the epoch stops and joins the threads. num_workers=0 reads
    in the consumer's thread. worker_init_fn(worker_id) runs in each thread
    at start; timeout (seconds, 0 = none) bounds the wait for one batch.
    pin_memory, multiprocessing_context, persistent_workers and in_order are
    accepted and ignored.

    With the default collate_fn, a dataset of this module is read a batch at
    a time into per-field arrays that become the batch tensors directly;
    with ragged fields (see DistDataset), the batch is ddstore.torch.collate's
    Packed (values and offsets per ragged field). A collate of that module
    (Packed, Padded, Graphs) given as collate_fn collates the batch as read,
    without cutting it into samples first.

    reuse_buffers (DDStore's): True reads every batch into one of a fixed
    pool of buffer sets (one per worker, from dataset.alloc(batch size),
    receive buffers the agent writes into directly), which the collate
    copies the batch out of: batches stay valid for as long as they are
    kept, as DataLoader's (list(loader) is DataLoader's list). It needs a
    dataset with alloc(), batches (batch_size or batch_sampler), and the
    default collate_fn, a collate of ddstore.torch.collate, or
    collate_copies=True to declare that a collate_fn of yours copies; it
    refuses anything else. Whatever of a batch still lies in a pool's
    buffer (tensors and arrays in dicts, lists and tuples) is copied anyway.
    "lend" (ddstore's): the batch is the buffers themselves, no copy: a
    yielded batch is valid until the next one is requested (the last one of
    an iteration, until the next iteration starts); keep it longer only as a
    copy. num_workers * prefetch_factor + 1 sets, kept from one iteration to
    the next; datasets of other packages are read as without it.
    collate_copies: with reuse_buffers=True, says the collate_fn copies
    what it is given; with "lend", each sample (or, on the fast path, the
    batch) is copied before it is collated or yielded, so that nothing
    yielded shares memory with a reused buffer.
    close() stops every iteration's threads and lets go of the buffer sets.

    state_dict() / load_state_dict(): torchdata's StatefulDataLoader's
    protocol. The state is that of the batches the consumer got (not those
    the workers fetched ahead): the sampler's state after them when the
    sampler has one (ScheduledSampler, BudgetSampler, MixtureSampler: the
    epoch and position, which resume on another number of ranks, and with
    any number of workers), else the count of batches to skip; the
    dataset's when it has one (DistDataset: its name and length, checked
    on load). Loaded, it applies to the next iteration.
    """

    def __init__(self, dataset, batch_size=1, shuffle=False, sampler=None, batch_sampler=None, num_workers=0,
                 collate_fn=None, drop_last=False, prefetch_factor=2, reuse_buffers=False, collate_copies=False,
                 generator=None, timeout=0, worker_init_fn=None, **ignored):
        unknown = set(ignored) - _IGNORED
        if unknown:
            raise ArgumentTypeError(f"ThreadDataLoader got unexpected keyword arguments {sorted(unknown)}")
        if num_workers < 0:
            raise ArgumentError("num_workers option should be non-negative")
        if timeout < 0:
            raise ArgumentError("timeout option should be non-negative")
        if prefetch_factor is None:  # torch 2's default when num_workers == 0
            prefetch_factor = 2
        if prefetch_factor < 1:
            raise ArgumentError("prefetch_factor option should be positive")
        if sampler is not None and shuffle:
            raise ArgumentError("sampler option is mutually exclusive with shuffle")
        if batch_sampler is not None:
            if batch_size != 1 or shuffle or sampler is not None or drop_last:
                raise ArgumentError("batch_sampler option is mutually exclusive with batch_size, shuffle, sampler, "
                                    "and drop_last")
            batch_size, drop_last = None, False
        elif batch_size is None and drop_last:
            raise ArgumentError("batch_size=None option disables auto-batching and is mutually exclusive with "
                                "drop_last")
        if reuse_buffers not in (False, True, "lend"):
            raise ArgumentError(f"reuse_buffers {reuse_buffers!r}: want False, True or \"lend\"")
        if reuse_buffers is True:
            if not callable(getattr(dataset, "alloc", None)) or not getattr(dataset, "_ddstore_fast", True):
                raise ArgumentTypeError(f"reuse_buffers needs a dataset with alloc() (DistDataset, "
                                        f"DistDatasetReader, WindowedDataset over them), not a "
                                        f"{type(dataset).__name__}")
            if batch_size is None and batch_sampler is None:
                raise ArgumentError("reuse_buffers needs batches (batch_size or batch_sampler): with "
                                    "batch_size=None nothing copies a sample out of the reused buffers")
            if (collate_fn is not None and collate_fn is not _default_collate
                    and not hasattr(collate_fn, "_ddstore_batch") and not collate_copies):
                raise ArgumentError("reuse_buffers with a collate_fn of yours: pass collate_copies=True if it "
                                    "copies the samples (their buffers are reused right after it)")
        if sampler is None:
            sampler = (_tud.RandomSampler(dataset, generator=generator) if shuffle
                       else _tud.SequentialSampler(dataset))
        if batch_size is not None and batch_sampler is None:
            batch_sampler = _tud.BatchSampler(sampler, batch_size, drop_last)
        self.dataset, self.batch_size, self.drop_last = dataset, batch_size, drop_last
        self.sampler, self.batch_sampler, self.generator = sampler, batch_sampler, generator
        self.num_workers, self.prefetch_factor, self.timeout = num_workers, prefetch_factor, timeout
        self.worker_init_fn, self.collate_fn = worker_init_fn, collate_fn
        self.reuse_buffers, self.collate_copies = reuse_buffers, collate_copies
        # Buffer sets ("lend") an ended iteration handed back, for the next
        # one: an epoch starts on buffers already touched, not on fresh
        # pages, each of which costs a fault on first write.
        self._spare_slots = []
        self._current = None      # the latest iteration (a weak reference)
        self._skip = 0            # batches the next iteration skips (a loaded count)
        # The pool of buffer sets of reuse_buffers=True, one per worker,
        # made at the first iteration.
        self._pool = None
        self._iters = weakref.WeakSet()

    @property
    def _auto_collation(self):
        return self.batch_sampler is not None

    def __len__(self):
        return len(self.batch_sampler if self._auto_collation else self.sampler)

    def __iter__(self):
        it = _LoaderIter(self)
        self._current = weakref.ref(it)
        self._iters.add(it)
        return it

    def _index_sampler(self):
        return self.batch_sampler if self._auto_collation else self.sampler

    def state_dict(self):
        """The loader's state: {"format", "sampler", "batches", "dataset"}
        (JSON-serialisable when the sampler's and dataset's are). During
        an iteration, after the batches the consumer got from it."""
        it = self._current() if self._current is not None else None
        done = it._yielded if it is not None else 0
        sampler = self._index_sampler()
        out = {"format": 1, "sampler": None, "batches": 0, "dataset": None}
        pass_ = getattr(it, "_sampler_iter", None) if it is not None else None
        if hasattr(pass_, "state_at"):
            out["sampler"] = pass_.state_at(done)
        elif hasattr(sampler, "state_dict"):
            out["sampler"] = sampler.state_dict()
        else:
            out["batches"] = (it._skipped if it is not None else self._skip) + done
        if hasattr(self.dataset, "state_dict"):
            out["dataset"] = self.dataset.state_dict()
        return out

    def load_state_dict(self, state):
        """Resume from state_dict() of a loader over the same dataset and
        sampler kind: the next iteration starts after the batches saved."""
        if not isinstance(state, dict) or state.get("format") != 1:
            raise ArgumentError(f"ddstore: bad argument: ThreadDataLoader: state "
                                f"{state.get('format') if isinstance(state, dict) else type(state).__name__!r}: "
                                f"want the dict of state_dict(), format 1")
        sampler = self._index_sampler()
        if state.get("dataset") is not None and hasattr(self.dataset, "load_state_dict"):
            self.dataset.load_state_dict(state["dataset"])
        if state.get("sampler") is not None:
            if not hasattr(sampler, "load_state_dict"):
                raise ArgumentError(f"ddstore: bad argument: ThreadDataLoader: the state has a sampler's state, "
                                    f"the sampler of type {type(sampler).__name__} takes none")
            sampler.load_state_dict(state["sampler"])
            self._skip = 0
        else:
            b = state.get("batches", 0)
            if isinstance(b, bool) or not isinstance(b, int) or b < 0:
                raise ArgumentError(f"ddstore: bad argument: ThreadDataLoader: batches {b!r} in the state: want "
                                    f"a count >= 0")
            self._skip = b

    def close(self):
        """Stop and join the threads of every iteration of this loader (a
        further next() ends them) and let go of the buffer sets
        (dataset.release); a later iteration makes new ones."""
        for it in list(self._iters):
            it.close()
        pool, self._pool = self._pool, None
        sets = []
        if pool is not None:
            while not pool.empty():
                sets.append(pool.get_nowait())
        sets += self._spare_slots
        self._spare_slots = []
        release = getattr(self.dataset, "release", None)
        for slot in sets:
            bufs = slot.get("buffers")
            if bufs is not None and release is not None and self.reuse_buffers is True:
                try:
                    release(bufs)
                except Exception:  # the store was closed first: nothing left to let go of
                    pass
            slot.clear()

    def _sets(self):
        """The pool of reuse_buffers=True: one buffer set per worker (grown
        to the largest batch), taken by a fetch for its read and its copy."""
        if self._pool is None:
            self._pool = queue.SimpleQueue()
            for _ in range(max(self.num_workers, 1)):
                self._pool.put({})
        return self._pool

    def _fetcher(self):
        """fetch(indices, slot) -> batch, for the worker threads. It holds no
        reference to the iterator, so that dropping the iterator frees it."""
        ds, copies = self.dataset, self.collate_copies
        if not self._auto_collation:
            convert = self.collate_fn or _default_convert
            return lambda i, slot: convert(_copy(ds[i]) if copies else ds[i])
        fast = getattr(ds, "_ddstore_fast", False)
        reuse = self.reuse_buffers == "lend" and fast
        ours = self.collate_fn if hasattr(self.collate_fn, "_ddstore_batch") else None
        default = self.collate_fn is None or self.collate_fn is _default_collate
        if self.reuse_buffers is True:
            return self._pooled_fetcher(ds, fast, ours, default)

        def buffers(slot, n):
            if not reuse:
                return None
            # One set per slot, grown to the largest batch: smaller batches
            # read into its leading rows.
            if slot.get("rows", -1) < n:
                slot["buffers"], slot["rows"] = ds._ddstore_buffers(n), n
            return slot["buffers"]

        # A collate of ddstore.torch.collate gets the batch as read, not
        # samples cut from it.
        if fast and (self.collate_fn is None or ours is not None):
            def fetch(indices, slot):
                batch = ds._ddstore_collated(indices, buffers(slot, len(indices)), ours)
                return _copy(batch) if copies and reuse else batch
            return fetch
        collate = self.collate_fn or _plain_default

        def fetch(indices, slot):
            if fast:
                samples = ds._ddstore_samples(indices, buffers(slot, len(indices)))
            else:
                getitems = getattr(ds, "__getitems__", None)
                samples = getitems(indices) if getitems else [ds[i] for i in indices]
            if copies and reuse:
                samples = [_copy(s) for s in samples]
            return collate(samples)
        return fetch

    def _pooled_fetcher(self, ds, fast, ours, default):
        """fetch for reuse_buffers=True: the batch read into a set of the
        pool, collated, and what of it still lies in the set copied out,
        before the set goes back."""
        pool = self._sets()
        collate = self.collate_fn or _default_collate

        def fetch(indices, slot):
            n = len(indices)
            got = pool.get()
            try:
                if got.get("rows", -1) < n:
                    got["buffers"], got["rows"] = ds.alloc(n), n
                bufs = got["buffers"]
                if fast and (default or ours is not None):
                    batch = ds._ddstore_collated(indices, bufs, ours)
                else:
                    batch = collate(ds.__getitems__(indices, out=bufs))
                return _detach(batch, [b for b in bufs.values() if isinstance(b, np.ndarray)])
            finally:
                pool.put(got)
        return fetch


def _plain_default(samples):
    """The default collate of samples not read by this package: torch's,
    but Packed for windows (WindowedDataset) whose fields vary in shape, as
    over a DistDataset with ragged fields."""
    from .collate import Packed, _plain_window_rows
    if _plain_window_rows(samples[:1]) is not None:
        return Packed()(samples)
    return _default_collate(samples)


def _span(ptr, shape, strides, itemsize):
    """[lo, hi) of the bytes an array of that geometry touches."""
    if any(d == 0 for d in shape):
        return ptr, ptr
    lo = hi = ptr
    for d, st in zip(shape, strides):
        if st >= 0:
            hi += (d - 1) * st
        else:
            lo += (d - 1) * st
    return lo, hi + itemsize


def _detach(x, bufs):
    """x with every tensor and array that lies in one of the arrays bufs
    copied (dicts, lists and tuples walked; anything else as it is)."""
    if not bufs:
        return x
    spans = [_span(b.__array_interface__["data"][0], b.shape, b.strides, b.itemsize) for b in bufs]

    def inside(lo, hi):
        return hi > lo and any(lo < b_hi and b_lo < hi for b_lo, b_hi in spans)

    def walk(v):
        if isinstance(v, torch.Tensor):
            es = v.element_size()
            lo, hi = _span(v.data_ptr(), v.shape, [st * es for st in v.stride()], es)
            return v.clone() if v.device.type == "cpu" and inside(lo, hi) else v
        if isinstance(v, np.ndarray):
            lo, hi = _span(v.__array_interface__["data"][0], v.shape, v.strides, v.itemsize)
            return v.copy() if inside(lo, hi) else v
        if isinstance(v, np.void):  # a record of a structured array: a view of it
            base = v.base if isinstance(v.base, np.ndarray) else None
            return v.copy() if base is not None and inside(*_span(
                base.__array_interface__["data"][0], base.shape, base.strides, base.itemsize)) else v
        if isinstance(v, dict):
            return {k: walk(e) for k, e in v.items()}
        if isinstance(v, list):
            return [walk(e) for e in v]
        if isinstance(v, tuple):
            return type(v)(*(walk(e) for e in v)) if hasattr(v, "_fields") else tuple(walk(e) for e in v)
        return v
    return walk(x)


def _copy(x):
    if isinstance(x, torch.Tensor):
        return x.clone()
    if isinstance(x, np.ndarray):
        return x.copy()
    if isinstance(x, dict):
        return {k: _copy(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return type(x)(_copy(v) for v in x) if not hasattr(x, "_fields") else type(x)(*(_copy(v) for v in x))
    return x


class _Shared:
    """The state the consumer shares with the worker threads."""

    def __init__(self):
        self.cond = threading.Condition()
        self.tasks = queue.SimpleQueue()
        self.results = {}
        self.threads = []
        self.stopped = False

    def stop(self):
        """Stops and joins the threads: True when none runs any more."""
        with self.cond:
            if self.stopped:
                return False
            self.stopped = True
            self.results.clear()
        for _ in self.threads:
            self.tasks.put(None)
        me = threading.current_thread()
        for t in self.threads:
            # A cycle collected in a worker may end the iterator there: that
            # worker ends on its own after its current task.
            if t is not me:
                t.join()
        return me not in self.threads


class _Slots:
    """The buffer sets of one iteration (see reuse_buffers): the free ones,
    those of batches in flight (by sequence number) and the one whose batch
    the consumer holds. They come from and go back to the loader's spares."""

    def __init__(self, spare, n):
        self.spare = spare
        self.free = [spare.pop() if spare else {} for _ in range(n)]
        self.busy = {}
        self.held = None

    def give_back(self):
        sets = self.free + list(self.busy.values()) + ([self.held] if self.held is not None else [])
        self.free, self.busy, self.held = [], {}, None
        self.spare.extend(s for s in sets if s)


def _end(shared, slots):
    """Ends an iteration: its threads stopped and joined, then its buffer
    sets handed back for the loader's next iteration; not when a thread is
    ending it from inside (it may still write into its set)."""
    if shared.stop():
        slots.give_back()


def _worker(shared, fetch, wid, init_fn):
    err = None
    if init_fn is not None:
        try:
            init_fn(wid)
        except BaseException as e:  # reported for each task this worker takes
            err = e
    while True:
        task = shared.tasks.get()
        if task is None:
            return
        seq, indices, slot = task
        if shared.stopped:
            continue
        if err is not None:
            ok, value = False, err
        else:
            try:
                ok, value = True, fetch(indices, slot)
            except BaseException as e:  # re-raised in the consumer
                ok, value = False, e
        with shared.cond:
            if not shared.stopped:
                shared.results[seq] = (ok, value)
                shared.cond.notify_all()
        del value, task


class _LoaderIter:
    def __init__(self, loader):
        self._fetch = loader._fetcher()
        self._timeout = loader.timeout
        index_sampler = loader.batch_sampler if loader._auto_collation else loader.sampler
        self._index_sampler = index_sampler
        self._sampler_iter = iter(index_sampler)
        # DataLoader draws a base seed for its workers here, before the
        # sampler's first draw; drawing it too keeps shuffles identical.
        self._base_seed = torch.empty((), dtype=torch.int64).random_(generator=loader.generator).item()
        # A loaded count of batches to skip (samplers without a state):
        # drawn from the sampler and dropped, not read.
        self._skipped, loader._skip = loader._skip, 0
        for _ in range(self._skipped):
            if next(self._sampler_iter, None) is None:
                break
        self._yielded = 0  # batches the consumer got
        self._workers = loader.num_workers
        self._limit = loader.num_workers * loader.prefetch_factor
        # One buffer set per batch that may be alive at once: those in flight
        # plus the one the consumer holds.
        self._slots = _Slots(loader._spare_slots, max(self._limit, 1) + 1)
        self._sent = self._received = 0
        self._exhausted = False
        self._shared = _Shared()
        self._closed = False
        if self._workers:
            for wid in range(self._workers):
                t = threading.Thread(target=_worker, args=(self._shared, self._fetch, wid, loader.worker_init_fn),
                                     name=f"ddstore-loader-{wid}", daemon=True)
                t.start()
                self._shared.threads.append(t)
        # Runs on close(), or when the iterator is collected (or at exit)
        # without keeping it alive: the workers reference only `_shared`.
        self._finalizer = weakref.finalize(self, _end, self._shared, self._slots)
        if self._workers:
            self._submit_or_close()
        elif loader.worker_init_fn is not None:
            loader.worker_init_fn(0)

    def __iter__(self):
        return self

    def __len__(self):
        return len(self._index_sampler)

    def _submit(self):
        while not self._exhausted and self._sent - self._received < self._limit:
            try:
                indices = next(self._sampler_iter)
            except StopIteration:
                self._exhausted = True
                return
            slot = self._slots.busy[self._sent] = self._slots.free.pop()
            self._shared.tasks.put((self._sent, indices, slot))
            self._sent += 1

    def _submit_or_close(self):
        try:
            self._submit()
        except BaseException:  # the sampler failed: nothing more can come
            self.close()
            raise

    def __next__(self):
        if self._closed:
            raise StopIteration
        slots = self._slots
        if slots.held is not None:  # the consumer is done with the last batch
            slots.free.append(slots.held)
            slots.held = None
        if not self._workers:
            try:
                indices = next(self._sampler_iter)
            except StopIteration:
                self.close()
                raise
            slot = slots.free.pop()
            try:
                batch = self._fetch(indices, slot)
            except BaseException:
                self.close()
                raise
            slots.held = slot
            self._yielded += 1
            return batch
        self._submit_or_close()
        if self._received == self._sent:
            self.close()
            raise StopIteration
        seq, shared = self._received, self._shared
        with shared.cond:
            if not shared.cond.wait_for(lambda: seq in shared.results, self._timeout or None):
                timed_out = True
            else:
                timed_out = False
                ok, value = shared.results.pop(seq)
        if timed_out:
            self.close()
            raise LoaderTimeout(f"ddstore: timed out: DataLoader timed out after {self._timeout} seconds")
        self._received += 1
        if not ok:
            self.close()
            raise value
        # The batch keeps its slot's buffers until the next call.
        slots.held = slots.busy.pop(seq)
        self._submit_or_close()
        self._yielded += 1
        return value

    def close(self):
        """Stop and join the worker threads; further next() stops. The
        buffer sets go back to the loader for its next iteration: once the
        threads are joined, none is written any more, and the batch the
        consumer held last is, by reuse_buffers' contract, done with."""
        self._closed = True
        self._finalizer()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

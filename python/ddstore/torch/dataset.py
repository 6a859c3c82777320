"""The datasets of the torch layer: DistDataset (samples loaded once into
the store, every rank its share), DistDatasetReader (a published dataset
read without a shard of it), WindowedDataset (windows of rows over any
dataset) and row_of.

How a dataset is stored: field k of the samples (the tuple position, the dict
key, or 0 for a bare tensor) is the variable `{name}/{k}`, one row per sample,
rows in index order, rank r holding indices [r*N//P, (r+1)*N//P). After the
fields, rank 0 publishes `{name}/__meta__`: one row of JSON bytes (uint8) with
the schema, length, and every field's key, sample shape, dtype and kind
(torch or numpy), so that a reader learns everything from one lookup. It is
published last, which makes it the commit mark: once it exists, every row is
in place. Dict datasets also get `{name}/__fields__` (their keys, as JSON
bytes) for readers that only know DDStore's conventions.
"""

import json
import operator
import os

import numpy as np
import torch
import torch.utils.data as _tud

from .._errors import (ArgumentError, ArgumentTypeError, BadDataset, Error, IndexOutOfRange, UnknownVariable)
from ..store import Store
from ._schema import _FIELDS, _META, _Field, _Schema, _check_index, _check_indices, _items

def _backing_specs(name, schema, backing):
    """{field key: spec} from DistDataset's backing argument."""
    keys = [f.key for f in schema.fields]
    if isinstance(backing, (str, os.PathLike)):
        if len(keys) != 1:
            raise ArgumentError(f"ddstore: bad argument: dataset {name!r}: one backing file {backing!r} for fields "
                                f"{keys}: give a dict field key -> file, or a list in field order")
        return {keys[0]: os.fspath(backing)}
    if isinstance(backing, dict):
        specs = dict(backing)
    elif isinstance(backing, (list, tuple)):
        if len(backing) != len(keys):
            raise ArgumentError(f"ddstore: bad argument: dataset {name!r}: {len(backing)} backing files for fields "
                                f"{keys}")
        specs = dict(zip(keys, backing))
    else:
        raise ArgumentTypeError(f"ddstore: bad argument: dataset {name!r}: backing of type {type(backing).__name__}: "
                                f"want a file name, a dict or a list")
    missing = [k for k in keys if specs.get(k) is None]
    extra = [k for k in specs if k not in keys]
    if missing or extra:
        raise ArgumentError(f"ddstore: bad argument: dataset {name!r}: backing files for {list(specs)}, fields are "
                            f"{keys}")
    return {k: os.fspath(specs[k]) for k in keys}


def _read_json(store, var):
    total, disp, _ = store.info(var)
    buf = np.empty((total, disp), np.uint8)
    store.get(var, buf, 0)
    return json.loads(buf[:1].tobytes().decode())


def _json_rows(obj, holder):
    """obj as one row of JSON bytes on the holding rank, none elsewhere: add
    is collective, so every rank passes the same row width."""
    b = np.frombuffer(json.dumps(obj, sort_keys=True).encode(), np.uint8)
    return b.reshape(1, -1) if holder else np.empty((0, b.size), np.uint8)


# -- datasets in the store --------------------------------------------------------

class _StoredDataset(_tud.Dataset):
    """What DistDataset and DistDatasetReader share: reads of a dataset whose
    fields are variables of `store`.

    The `_ddstore_*` methods are the fast path ThreadDataLoader and
    WindowedDataset take: whole batches read into per-field arrays, collated
    without stacking samples one by one."""

    _ddstore_fast = True

    def _setup(self, name, store, owns_store, schema, length, device):
        self.name, self.store, self._owns_store = name, store, owns_store
        self._schema, self._len, self.device = schema, length, device

    def __len__(self):
        return self._len

    @property
    def fields(self):
        """The field keys, in order."""
        return [f.key for f in self._schema.fields]

    def __getitem__(self, index):
        i = _check_index(index, self._len, self.name)
        arrays = []
        for f in self._schema.fields:
            a = np.empty((1, *f.shape), f.npdtype)
            self.store.get(f.var, f.dest(a), i)
            arrays.append(a.reshape(f.shape))
        return self._schema.sample(arrays, self.device)

    def __getitems__(self, indices):
        """The samples `indices` (DataLoader fetches a batch this way when a
        dataset has it): one get_batch per field; the samples are views into
        the batch arrays."""
        return self._ddstore_samples(indices)

    def _ddstore_read(self, idx, keys=None, out=None):
        """Per-field arrays (len(idx), *shape) of rows idx (checked int64),
        in `out` (from _ddstore_buffers) when given."""
        schema = self._schema.select(keys)
        arrays = []
        n = idx.shape[0]
        for f in schema.fields:
            a = out[f.key][:n] if out is not None else np.empty((n, *f.shape), f.npdtype)
            if n:
                self.store.get_batch(f.var, f.dest(a), idx)
            arrays.append(a)
        return schema, arrays

    def _ddstore_buffers(self, n, keys=None):
        """Arrays for n samples of each field, reused by the caller: receive
        buffers the agent writes into directly when reads may go through it
        (rows of other nodes or of backing files: no staging copy), else
        plain memory."""
        fields = self._schema.select(keys).fields
        if any(self.store._through_agent(f.var) for f in fields):
            return {f.key: self.store._recv_buffer((n, *f.shape), f.npdtype) for f in fields}
        return {f.key: np.empty((n, *f.shape), f.npdtype) for f in fields}

    def prefetch(self, indices):
        """Tell the agents which samples this rank reads soon (ScheduledSampler
        does, steps ahead): those only the backing files hold are read from
        them now, into staging memory. Samples in memory are skipped, and so
        are datasets without backing files. Returns at once."""
        idx = _check_indices(indices, self._len, self.name)
        if not idx.size:
            return
        for f in self._schema.fields:
            if self.store.describe(f.var)["backing"]:
                self.store.prefetch(f.var, idx)

    def _ddstore_samples(self, indices, buffers=None):
        idx = _check_indices(indices, self._len, self.name)
        schema, arrays = self._ddstore_read(idx, out=buffers)
        return schema.samples(arrays, idx.shape[0], self.device)

    def _ddstore_collated(self, indices, buffers=None):
        idx = _check_indices(indices, self._len, self.name)
        schema, arrays = self._ddstore_read(idx, out=buffers)
        return schema.collated(arrays, self.device)

    def close(self):
        """Close the store if this dataset opened it (the variables stay
        with the agents: see free())."""
        if self._owns_store:
            self.store.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __repr__(self):
        return f"{type(self).__name__}({self.name!r}, len={self._len}, fields={self.fields})"


class DistDataset(_StoredDataset):
    """A map-style dataset of fixed-shape samples, loaded once into the job's
    memory and readable by every rank (DDStore's DistDataset).

    source: any map-style dataset whose samples are a tensor or ndarray, or a
    tuple, list or dict (str keys) of them, every sample of the same shapes
    and dtypes as source[0]. Construction is collective: every rank passes the
    same source and name; rank r of P reads source[i] for i in
    [r*N//P, (r+1)*N//P) only. Samples come back in the source's structure,
    fields as torch tensors (numpy arrays where the source gave numpy).

    store: an open ddstore.Store to use (it stays the caller's); otherwise one
    is made from comm (an mpi4py communicator, a torch.distributed group, a
    ddstore.FileComm, or None for the launcher's environment) and closed by
    close(). chunk_size: load through init + update, chunk_size samples at a
    time, so that loading holds one chunk rather than the whole share twice.
    device: tensors are moved there (e.g. "cuda:0").

    ddstore_width: replica groups, as DDStore's: ranks [k*w, (k+1)*w) form
    group k, which holds a whole copy of the dataset (rank r reads its group's
    copy only, node-local rows first); a communicator split from the job's
    does the same. method="mpi", with an mpi4py comm: the store reads rows of
    other nodes with MPI one-sided gets from this process (ddstore.Store's
    method; DDStore's method 0). Accepted for DDStore code: method as an int
    (ignored: rows of other nodes come through the agents), handshake_dir
    (ignored: to meet through a directory, pass
    comm=ddstore.FileComm(handshake_dir, rank, size)).

    capacity, backing: for a dataset larger than the memory the job gives
    it, keep only samples [0, capacity) in memory (rank r its share of them)
    and read the others from backing files, through the agents: backing
    names, for every field, the file that holds it whole, in the source's
    order — a .npy file, or an HDF5 dataset as "FILE:DATASET" (a str for a
    single-field dataset, else a dict field key -> spec, or a list in field
    order). ScheduledSampler(capacity=...) then deals samples so that each
    step's reads from the files are few, spread evenly and prefetched.

    Indices are 0..N-1; negative ones raise IndexError, as in DDStore.
    Forked DataLoader workers can read (the store reconnects after fork);
    spawned ones cannot, as the dataset does not pickle.
    """

    def __init__(self, source, name, comm=None, store=None, ddstore_width=None, device=None, method=None,
                 handshake_dir=None, chunk_size=None, capacity=None, backing=None):
        if chunk_size is not None and chunk_size < 1:
            raise ArgumentError(f"ddstore: bad argument: chunk_size {chunk_size}: want >= 1")
        n = len(source)
        if n == 0:
            raise ArgumentError(f"ddstore: bad argument: dataset {name!r}: the source is empty")
        # Every rank derives the schema from the same sample, so all agree on
        # each field's row geometry before any collective call.
        schema = _Schema.of_sample(name, source[0])
        if capacity is None:
            capacity = n
        if isinstance(capacity, bool) or not isinstance(capacity, (int, np.integer)) or not 0 <= capacity <= n:
            raise ArgumentError(f"ddstore: bad argument: dataset {name!r}: capacity {capacity!r}: want 0 to {n} "
                                f"samples")
        self.capacity = int(capacity)
        self._backing = _backing_specs(name, schema, backing) if backing is not None else None
        if self.capacity < n and self._backing is None:
            raise ArgumentError(f"ddstore: bad argument: dataset {name!r}: capacity {capacity} below its {n} samples "
                                f"needs backing files for the others (backing=...)")
        owns = store is None
        if owns:
            # A dataset is published: readers of this job and of others
            # find it by name, so its variables are the namespace's.
            store = Store(comm, width=ddstore_width if ddstore_width and ddstore_width > 0 else None,
                          method="mpi" if method == "mpi" else None, scope="namespace")
        try:
            whole = store.group is None
            if not owns and ddstore_width is not None and ddstore_width > 0 and (
                    (whole and ddstore_width < store.size) or (not whole and store.size > ddstore_width)):
                raise ArgumentError(f"ddstore: bad argument: ddstore_width {ddstore_width} but the store given is a "
                                    f"group of {store.size} ranks: open it with width={ddstore_width}")
            self.rank, self.size = store.rank, store.size
            held = self.capacity if self._backing is not None else n
            self.lo, self.hi = self.rank * held // self.size, (self.rank + 1) * held // self.size
            self._setup(name, store, owns, schema, n, device)
            if chunk_size is None:
                self._load_whole(source)
            else:
                self._load_chunked(source, chunk_size)
        except BaseException:
            if owns:
                store.close()
            raise

    def _rows(self, source, lo, hi, bufs):
        """Samples [lo, hi) of the source into per-field arrays."""
        getitems = getattr(source, "__getitems__", None)
        samples = getitems(list(range(lo, hi))) if getitems else (source[i] for i in range(lo, hi))
        for j, s in enumerate(samples):
            for b, a in zip(bufs, self._schema.split(s, lo + j)):
                b[j] = a

    def _load_whole(self, source):
        fields = self._schema.fields
        try:
            bufs = [np.empty((self.hi - self.lo, *f.shape), f.npdtype) for f in fields]
            self._rows(source, self.lo, self.hi, bufs)
        except BaseException:
            # The other ranks are about to add the first field: fail that add
            # for all of them rather than leave them waiting for this rank.
            self._fail_collective(fields[0].var)
            raise
        done = []
        try:
            for f, b in zip(fields, bufs):
                self.store.add(f.var, f.dest(b), **self._backing_of(f))
                done.append(f.var)
            del bufs
            self._publish_meta()
        except BaseException:
            self._free_quietly(done)
            raise

    def _load_chunked(self, source, chunk):
        fields = self._schema.fields
        done = []
        try:
            for f in fields:
                self.store.init(f.var, self.hi - self.lo, int(np.prod(f.shape, dtype=np.int64)), dtype=f.dtype,
                                **self._backing_of(f))
                done.append(f.var)
            try:
                bufs = [np.empty((min(chunk, self.hi - self.lo), *f.shape), f.npdtype) for f in fields]
                for lo in range(self.lo, self.hi, chunk):
                    hi = min(lo + chunk, self.hi)
                    part = [b[:hi - lo] for b in bufs]
                    self._rows(source, lo, hi, part)
                    for f, b in zip(fields, part):
                        self.store.update(f.var, f.dest(b), lo - self.lo)
            except BaseException:
                # The metadata add that follows is the barrier the other ranks
                # wait in: fail it for them.
                self._fail_collective(f"{self.name}/{_META}")
                raise
            # Publishing the metadata is collective, so it returns only when
            # every rank has written its rows: a read after construction never
            # sees a zero row another rank has yet to fill.
            self._publish_meta()
        except BaseException:
            self._free_quietly(done)
            raise

    def _backing_of(self, f):
        if self._backing is None:
            return {}
        return {"backing": self._backing[f.key], "total": self._len}

    def _free_quietly(self, names):
        # Cleanup after a failed load: the first error is the one to report.
        for v in names:
            try:
                self.store.free(v)
            except Error:
                pass

    def _fail_collective(self, var):
        # A 0-d array is refused by add, which publishes this rank's failure
        # to the variable's other ranks: their add raises instead of waiting.
        try:
            self.store.add(var, np.zeros((), np.uint8))
        except Error:
            pass

    def _publish_meta(self):
        holder = self.rank == 0
        if self._schema.kind == "dict":
            self.store.add(f"{self.name}/{_FIELDS}", _json_rows(self.fields, holder))
        self.store.add(f"{self.name}/{_META}", _json_rows(self._schema.to_json(self._len), holder))

    def free(self):
        """Free the dataset's variables on this rank (every rank calls it;
        the agents drop the rows once every rank has)."""
        for v in [f.var for f in self._schema.fields] + [f"{self.name}/{_FIELDS}", f"{self.name}/{_META}"]:
            self.store.free(v)


class DistDatasetReader(_StoredDataset):
    """A dataset published by DistDataset (in this job or another job of the
    same namespace), read without holding any shard of it: DDStore's split
    mode. The structure comes from `{name}/__meta__` in one lookup; for data
    published otherwise, fields are found as `{name}/__fields__` (dict keys)
    or `{name}/0`, `{name}/1`, ... and come back as a tuple of flat rows.

    store: an open ddstore.Store (stays the caller's); otherwise one is made
    from comm and closed by close(). n_core and handshake_dir are accepted for
    DDStore code and ignored: the agents find each other (for a directory,
    pass comm=ddstore.FileComm(...)). The dataset must be published before a
    reader attaches.
    """

    def __init__(self, name, store=None, comm=None, n_core=None, handshake_dir=None, device=None):
        owns = store is None
        if owns:
            store = Store(comm, scope="namespace")  # a published dataset is the namespace's
        try:
            schema, n = self._discover(store, name)
        except BaseException:
            if owns:
                store.close()
            raise
        self._setup(name, store, owns, schema, n, device)

    @staticmethod
    def _discover(store, name):
        try:
            meta = _read_json(store, f"{name}/{_META}")
        except UnknownVariable:
            meta = None
        if meta is not None:
            schema = _Schema.from_json(name, meta)
            n = int(meta["len"])
        else:
            try:
                keys, kind = _read_json(store, f"{name}/{_FIELDS}"), "dict"
            except UnknownVariable:
                keys, kind = [], "tuple"
                while True:
                    try:
                        store.info(f"{name}/{len(keys)}")
                    except UnknownVariable:
                        break
                    keys.append(len(keys))
            if not keys:
                raise UnknownVariable(f"ddstore: unknown variable: no dataset {name!r} (neither {name}/{_META} nor "
                                      f"{name}/0 exists)")
            fields = []
            for k in keys:
                d = store.describe(f"{name}/{k}")
                if d["dtype"]:
                    # torch has no wider unsigned types: those stay numpy.
                    is_torch = d["dtype"] not in ("uint16", "uint32", "uint64")
                    fields.append(_Field(k, f"{name}/{k}", (d["disp"],), d["dtype"], is_torch))
                elif d["itemsize"] in (1, 2, 4, 8):  # untyped rows: their bytes as unsigned items
                    fields.append(_Field(k, f"{name}/{k}", (d["disp"],), f"uint{8 * d['itemsize']}", False))
                else:
                    raise BadDataset(f"ddstore: bad geometry: dataset variable {name}/{k} holds untyped items of "
                                     f"{d['itemsize']} bytes")
            schema, n = _Schema(kind, fields), None
        for f in schema.fields:
            total, _, _ = store.info(f.var)
            if n is None:
                n = total
            if total != n:
                raise BadDataset(f"ddstore: bad geometry: dataset variable {f.var} holds {total} rows, the dataset {n}")
        return schema, n


# -- windows ---------------------------------------------------------------------

class WindowedDataset(_tud.Dataset):
    """Sample i is the rows s + k*dilation (k < window) of ds, with
    s = starts[i] when starts are given, else i*stride; each field comes
    stacked over the window (shape (window, *field shape)).

    fields picks fields by key or position: a list keeps the sample's
    structure with those fields only, a single key gives that field alone.
    Over a DistDataset or DistDatasetReader a window (and a batch of windows
    through __getitems__) is one get_batch per field; over other datasets the
    rows are fetched with ds.__getitems__ when it has one, else one by one.
    """

    def __init__(self, ds, window, stride=1, dilation=1, starts=None, fields=None):
        for what, v in (("window", window), ("stride", stride), ("dilation", dilation)):
            if operator.index(v) < 1:
                raise ArgumentError(f"ddstore: bad argument: {what} {v}: want >= 1")
        self.ds, self.window, self.stride, self.dilation, self.fields = ds, window, stride, dilation, fields
        self._offsets = np.arange(window, dtype=np.int64) * dilation
        span = (window - 1) * dilation + 1
        n = len(ds)
        if starts is not None:
            s = np.asarray(starts, dtype=np.int64).reshape(-1)
            bad = (s < 0) | (s + span > n)
            if bad.any():
                k = int(np.flatnonzero(bad)[0])
                raise ArgumentError(f"ddstore: bad argument: starts[{k}] = {int(s[k])}: a window of {span} rows must "
                                    f"lie in [0, {n})")
            self.starts = s
            self._len = s.shape[0]
        else:
            self.starts = None
            self._len = max(0, (n - span) // stride + 1)
        self._ddstore_fast = bool(getattr(ds, "_ddstore_fast", False))
        if self._ddstore_fast:
            ds._schema.select(fields)  # an unknown field fails here, not at the first read

    def __len__(self):
        return self._len

    def _rows(self, idx):
        s = self.starts[idx] if self.starts is not None else idx * self.stride
        return (s[:, None] + self._offsets[None, :]).reshape(-1)

    def __getitem__(self, index):
        i = _check_index(index, self._len, "window")
        if self._ddstore_fast:
            schema, arrays = self.ds._ddstore_read(self._rows(np.array([i], np.int64)), self.fields)
            return schema.sample(arrays, self.ds.device)
        return self._stack(self._fetch(self._rows(np.array([i], np.int64)).tolist()))

    def __getitems__(self, indices):
        return self._ddstore_samples(indices)

    def _ddstore_buffers(self, n):
        return self.ds._ddstore_buffers(n * self.window, self.fields)

    def _ddstore_windows(self, indices, buffers):
        idx = _check_indices(indices, self._len, "window")
        schema, arrays = self.ds._ddstore_read(self._rows(idx), self.fields, buffers)
        n = idx.shape[0]
        return schema, [a.reshape(n, self.window, *a.shape[1:]) for a in arrays], n

    def _ddstore_samples(self, indices, buffers=None):
        if not self._ddstore_fast:
            idx = _check_indices(indices, self._len, "window")
            rows = self._fetch(self._rows(idx).tolist())
            w = self.window
            return [self._stack(rows[j * w:(j + 1) * w]) for j in range(idx.shape[0])]
        schema, arrays, n = self._ddstore_windows(indices, buffers)
        return schema.samples(arrays, n, self.ds.device)

    def _ddstore_collated(self, indices, buffers=None):
        schema, arrays, _ = self._ddstore_windows(indices, buffers)
        return schema.collated(arrays, self.ds.device)

    def _fetch(self, rows):
        getitems = getattr(self.ds, "__getitems__", None)
        return list(getitems(rows)) if getitems else [self.ds[r] for r in rows]

    def _stack(self, samples):
        kind, items = _items(samples[0])
        cols = [[v] for _, v in items]
        for s in samples[1:]:
            for c, (_, v) in zip(cols, _items(s)[1]):
                c.append(v)
        keys = [k for k, _ in items]
        schema = _Schema(kind, [_Field(k, "", (), "uint8", False) for k in keys]).select(self.fields)
        stacked = {k: _stack(c) for k, c in zip(keys, cols)}
        return schema.pack([stacked[f.key] for f in schema.fields])


def _stack(values):
    if isinstance(values[0], torch.Tensor):
        return torch.stack(values)
    return np.stack([np.asarray(v) for v in values])


def row_of(concat, source, index):
    """The row of source[index] in the ConcatDataset `concat` (nested ones
    are searched too; the first occurrence of source counts)."""
    index = operator.index(index)
    if not 0 <= index < len(source):
        raise IndexOutOfRange(f"ddstore: index out of range: index {index} not in [0, {len(source)})")
    row = _row_of(concat, source, index)
    if row is None:
        raise ArgumentError("ddstore: bad argument: the dataset is not part of the ConcatDataset")
    return row


def _row_of(concat, source, index):
    for k, d in enumerate(concat.datasets):
        base = concat.cumulative_sizes[k - 1] if k else 0
        if d is source:
            return base + index
        if isinstance(d, _tud.ConcatDataset):
            r = _row_of(d, source, index)
            if r is not None:
                return base + r
    return None


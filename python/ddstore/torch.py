"""The PyTorch layer of ddstore (DDStore's `pyddstore.torch`): a map-style
dataset whose samples live sharded in the memory of the job's nodes, readers
that attach to it by name, windows over it, and a DataLoader whose workers are
threads.

    import torch, ddstore
    from ddstore.torch import DistDataset, DistDatasetReader, ThreadDataLoader

    source = torch.utils.data.TensorDataset(features, labels)  # fixed-shape samples
    ds = DistDataset(source, "train")         # collective: each rank loads its share
    x, y = ds[12345]                          # any rank reads any sample
    loader = ThreadDataLoader(ds, batch_size=256, shuffle=True, num_workers=4)
    for x, y in loader:                       # one get_batch per field per batch
        ...
    # elsewhere, in a process that loaded nothing:
    rd = DistDatasetReader("train", store=ddstore.Store())

How a dataset is stored: field k of the samples (the tuple position, the dict
key, or 0 for a bare tensor) is the variable `{name}/{k}`, one row per sample,
rows in index order, rank r holding indices [r*N//P, (r+1)*N//P). After the
fields, rank 0 publishes `{name}/__meta__`: one row of JSON bytes (uint8) with
the structure, length, and every field's key, sample shape, dtype and kind
(torch or numpy), so that a reader learns everything from one lookup. It is
published last, which makes it the commit mark: once it exists, every row is
in place. Dict datasets also get `{name}/__fields__` (their keys, as JSON
bytes) for readers that only know DDStore's conventions.
"""

import json
import operator
import os
import queue
import threading
import weakref

import numpy as np
import torch
import torch.utils.data as _tud

from ._errors import Error, IndexOutOfRange, UnknownVariable
from .dtypes import as_array, numpy_dtype
from .sampler import ScheduledSampler
from .store import Store

__all__ = ["DistDataset", "DistDatasetReader", "WindowedDataset", "row_of", "ThreadDataLoader", "ScheduledSampler"]

# torch >= 1.11 exports these; older builds keep them in _utils only.
_default_collate = getattr(_tud, "default_collate", None) or _tud._utils.collate.default_collate
_default_convert = getattr(_tud, "default_convert", None) or _tud._utils.collate.default_convert

_META, _FIELDS = "__meta__", "__fields__"
_FORMAT = "ddstore.torch/1"


# -- the structure of a sample --------------------------------------------------

class _Field:
    """One field of the samples: where it is stored and what a row holds."""

    __slots__ = ("key", "var", "shape", "dtype", "npdtype", "torch")

    def __init__(self, key, var, shape, dtype, is_torch):
        self.key, self.var, self.shape, self.dtype, self.torch = key, var, tuple(shape), dtype, is_torch
        # bfloat16 rows are kept in int16 arrays: numpy has no bfloat16.
        self.npdtype = numpy_dtype(dtype)

    def dest(self, a):
        """The buffer to hand the store: its dtype check must see bfloat16,
        not the int16 array that carries it."""
        return torch.from_numpy(a).view(torch.bfloat16) if self.dtype == "bfloat16" else a

    def tensor(self, a, device):
        t = torch.from_numpy(a)
        if self.dtype == "bfloat16":
            t = t.view(torch.bfloat16)
        return t if device is None else t.to(device)

    def value(self, a, device):
        """A field as the source gave it: a tensor, or a numpy array."""
        return self.tensor(a, device) if self.torch else a


class _Layout:
    """The structure of a sample: kind ("tensor", "tuple", "list", "dict", or
    "bare" for one field picked by WindowedDataset) and its fields in order."""

    def __init__(self, kind, fields):
        self.kind, self.fields = kind, list(fields)
        self.by_key = {f.key: f for f in self.fields}

    @classmethod
    def of_sample(cls, name, sample):
        kind, items = _items(sample)
        if not items:
            raise ValueError(f"ddstore: bad argument: dataset {name!r}: a sample with no fields")
        fields = []
        for key, v in items:
            if kind == "dict":
                if not isinstance(key, str):
                    raise TypeError(f"ddstore: bad argument: dataset {name!r}: dict key {key!r}: want str keys "
                                    f"(they name variables and travel as JSON)")
                if key in (_META, _FIELDS):
                    raise ValueError(f"ddstore: bad argument: dataset {name!r}: dict key {key!r} is reserved")
            a, dt, is_torch = _field_array(v)
            if a.size == 0:
                raise ValueError(f"ddstore: bad argument: dataset {name!r}: field {key!r} of shape {a.shape} holds "
                                 f"no items")
            fields.append(_Field(key, f"{name}/{key}", a.shape, dt, is_torch))
        return cls(kind, fields)

    def to_json(self, length):
        return {"format": _FORMAT, "kind": self.kind, "len": length,
                "fields": [{"key": f.key, "shape": list(f.shape), "dtype": f.dtype, "torch": f.torch}
                           for f in self.fields]}

    @classmethod
    def from_json(cls, name, meta):
        if meta.get("format") != _FORMAT:
            raise ValueError(f"ddstore: bad dataset: {name!r}: metadata of format {meta.get('format')!r}: "
                             f"want {_FORMAT!r}")
        return cls(meta["kind"], [_Field(f["key"], f"{name}/{f['key']}", f["shape"], f["dtype"], f["torch"])
                                  for f in meta["fields"]])

    def select(self, keys):
        """The layout of the fields `keys` (a list keeps the kind; a single
        key gives that field bare; None keeps everything)."""
        if keys is None:
            return self
        single = not isinstance(keys, (list, tuple))
        want = [keys] if single else list(keys)
        missing = [k for k in want if k not in self.by_key]
        if missing:
            raise KeyError(f"ddstore: unknown field {missing[0]!r}: fields are {list(self.by_key)}")
        fields = [self.by_key[k] for k in want]
        return _Layout("bare" if single or self.kind == "tensor" else self.kind, fields)

    def pack(self, vals):
        if self.kind in ("tensor", "bare"):
            return vals[0]
        if self.kind == "tuple":
            return tuple(vals)
        if self.kind == "list":
            return list(vals)
        return {f.key: v for f, v in zip(self.fields, vals)}

    def split(self, sample, index):
        """The fields of a source sample as arrays in storage dtype, checked
        against the layout (every row of a variable has one shape)."""
        kind, items = _items(sample)
        if kind != self.kind or [k for k, _ in items] != [f.key for f in self.fields]:
            raise ValueError(f"ddstore: bad sample: index {index}: its structure ({kind}, fields "
                             f"{[k for k, _ in items]}) differs from sample 0's ({self.kind}, fields "
                             f"{[f.key for f in self.fields]})")
        out = []
        for f, (_, v) in zip(self.fields, items):
            a, dt, _ = _field_array(v)
            if a.shape != f.shape or dt != f.dtype:
                raise ValueError(f"ddstore: bad sample: index {index}, field {f.key!r}: {dt} of shape {a.shape}, "
                                 f"sample 0 has {f.dtype} of shape {f.shape}: samples must have fixed shapes")
            out.append(a)
        return out

    def sample(self, arrays, device):
        return self.pack([f.value(a, device) for f, a in zip(self.fields, arrays)])

    def samples(self, arrays, n, device):
        """n samples as views into per-field batch arrays."""
        cols = []
        for f, a in zip(self.fields, arrays):
            b = f.value(a, device)
            # a[j, ...] keeps a 0-d row an array; a[j] would give a numpy scalar.
            cols.append(b.unbind(0) if f.torch else [b[j, ...] for j in range(n)])
        return [self.pack([c[j] for c in cols]) for j in range(n)]

    def collated(self, arrays, device):
        """What default_collate makes of the samples: tensors (numpy fields
        too), a tuple's fields as a list."""
        vals = [f.tensor(a, device) for f, a in zip(self.fields, arrays)]
        return list(vals) if self.kind == "tuple" else self.pack(vals)


def _items(sample):
    """(kind, [(key, value)]) of a source sample."""
    if isinstance(sample, dict):
        return "dict", list(sample.items())
    if isinstance(sample, tuple):  # a namedtuple comes back as a plain tuple
        return "tuple", list(enumerate(sample))
    if isinstance(sample, list):
        return "list", list(enumerate(sample))
    return "tensor", [(0, sample)]


def _field_array(v):
    """(numpy array in storage dtype, ddstore dtype name, came from torch)."""
    if isinstance(v, torch.Tensor):
        if v.device.type != "cpu":
            v = v.cpu()
        a, dt = as_array(v)
        return a, dt, True
    if isinstance(v, (np.ndarray, np.generic, int, float, bool)):
        a, dt = as_array(np.asarray(v))
        return a, dt, False
    raise TypeError(f"ddstore: bad sample: a field of type {type(v).__name__}: want a tensor, a numpy array, or a "
                    f"tuple, list or dict of them")


def _check_indices(indices, n, name):
    """indices as a 1-d int64 array, every one in [0, n) (negative ones are
    refused, as DDStore refuses them)."""
    idx = np.asarray(indices)
    if idx.ndim != 1:
        raise TypeError(f"ddstore: bad argument: indices of shape {idx.shape}: want a 1-d sequence of integers")
    if idx.size == 0:
        return np.empty(0, np.int64)
    if idx.dtype.kind not in "iu":
        raise TypeError(f"ddstore: bad argument: indices of type {idx.dtype}: want integers")
    idx = idx.astype(np.int64, copy=False)
    bad = (idx < 0) | (idx >= n)
    if bad.any():
        k = int(np.flatnonzero(bad)[0])
        raise IndexOutOfRange(f"ddstore: index out of range: dataset {name!r}: indices[{k}] = {int(idx[k])} "
                              f"not in [0, {n})")
    return idx


def _check_index(i, n, name):
    i = operator.index(i)
    if not 0 <= i < n:
        raise IndexOutOfRange(f"ddstore: index out of range: dataset {name!r}: index {i} not in [0, {n})")
    return i


def _backing_specs(name, layout, backing):
    """{field key: spec} from DistDataset's backing argument."""
    keys = [f.key for f in layout.fields]
    if isinstance(backing, (str, os.PathLike)):
        if len(keys) != 1:
            raise ValueError(f"ddstore: bad argument: dataset {name!r}: one backing file {backing!r} for fields "
                             f"{keys}: give a dict field key -> file, or a list in field order")
        return {keys[0]: os.fspath(backing)}
    if isinstance(backing, dict):
        specs = dict(backing)
    elif isinstance(backing, (list, tuple)):
        if len(backing) != len(keys):
            raise ValueError(f"ddstore: bad argument: dataset {name!r}: {len(backing)} backing files for fields "
                             f"{keys}")
        specs = dict(zip(keys, backing))
    else:
        raise TypeError(f"ddstore: bad argument: dataset {name!r}: backing of type {type(backing).__name__}: want "
                        f"a file name, a dict or a list")
    missing = [k for k in keys if specs.get(k) is None]
    extra = [k for k in specs if k not in keys]
    if missing or extra:
        raise ValueError(f"ddstore: bad argument: dataset {name!r}: backing files for {list(specs)}, fields are "
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

    def _setup(self, name, store, owns_store, layout, length, device):
        self.name, self.store, self._owns_store = name, store, owns_store
        self._layout, self._len, self.device = layout, length, device

    def __len__(self):
        return self._len

    @property
    def fields(self):
        """The field keys, in order."""
        return [f.key for f in self._layout.fields]

    def __getitem__(self, index):
        i = _check_index(index, self._len, self.name)
        arrays = []
        for f in self._layout.fields:
            a = np.empty((1, *f.shape), f.npdtype)
            self.store.get(f.var, f.dest(a), i)
            arrays.append(a.reshape(f.shape))
        return self._layout.sample(arrays, self.device)

    def __getitems__(self, indices):
        """The samples `indices` (DataLoader fetches a batch this way when a
        dataset has it): one get_batch per field; the samples are views into
        the batch arrays."""
        return self._ddstore_samples(indices)

    def _ddstore_read(self, idx, keys=None, out=None):
        """Per-field arrays (len(idx), *shape) of rows idx (checked int64),
        in `out` (from _ddstore_buffers) when given."""
        layout = self._layout.select(keys)
        arrays = []
        n = idx.shape[0]
        for f in layout.fields:
            a = out[f.key][:n] if out is not None else np.empty((n, *f.shape), f.npdtype)
            if n:
                self.store.get_batch(f.var, f.dest(a), idx)
            arrays.append(a)
        return layout, arrays

    def _ddstore_buffers(self, n, keys=None):
        """Arrays for n samples of each field, reused by the caller: receive
        buffers the agent writes into directly when reads may go through it
        (rows of other nodes or of backing files: no staging copy), else
        plain memory."""
        fields = self._layout.select(keys).fields
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
        for f in self._layout.fields:
            if self.store.describe(f.var)["backing"]:
                self.store.prefetch(f.var, idx)

    def _ddstore_samples(self, indices, buffers=None):
        idx = _check_indices(indices, self._len, self.name)
        layout, arrays = self._ddstore_read(idx, out=buffers)
        return layout.samples(arrays, idx.shape[0], self.device)

    def _ddstore_collated(self, indices, buffers=None):
        idx = _check_indices(indices, self._len, self.name)
        layout, arrays = self._ddstore_read(idx, out=buffers)
        return layout.collated(arrays, self.device)

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
            raise ValueError(f"ddstore: bad argument: chunk_size {chunk_size}: want >= 1")
        n = len(source)
        if n == 0:
            raise ValueError(f"ddstore: bad argument: dataset {name!r}: the source is empty")
        # Every rank derives the layout from the same sample, so all agree on
        # each field's row geometry before any collective call.
        layout = _Layout.of_sample(name, source[0])
        if capacity is None:
            capacity = n
        if isinstance(capacity, bool) or not isinstance(capacity, (int, np.integer)) or not 0 <= capacity <= n:
            raise ValueError(f"ddstore: bad argument: dataset {name!r}: capacity {capacity!r}: want 0 to {n} samples")
        self.capacity = int(capacity)
        self._backing = _backing_specs(name, layout, backing) if backing is not None else None
        if self.capacity < n and self._backing is None:
            raise ValueError(f"ddstore: bad argument: dataset {name!r}: capacity {capacity} below its {n} samples "
                             f"needs backing files for the others (backing=...)")
        owns = store is None
        if owns:
            store = Store(comm, width=ddstore_width if ddstore_width and ddstore_width > 0 else None,
                          method="mpi" if method == "mpi" else None)
        try:
            whole = store.group is None
            if not owns and ddstore_width is not None and ddstore_width > 0 and (
                    (whole and ddstore_width < store.size) or (not whole and store.size > ddstore_width)):
                raise ValueError(f"ddstore: bad argument: ddstore_width {ddstore_width} but the store given is a group "
                                 f"of {store.size} ranks: open it with width={ddstore_width}")
            self.rank, self.size = store.rank, store.size
            held = self.capacity if self._backing is not None else n
            self.lo, self.hi = self.rank * held // self.size, (self.rank + 1) * held // self.size
            self._setup(name, store, owns, layout, n, device)
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
            for b, a in zip(bufs, self._layout.split(s, lo + j)):
                b[j] = a

    def _load_whole(self, source):
        fields = self._layout.fields
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
        fields = self._layout.fields
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
        if self._layout.kind == "dict":
            self.store.add(f"{self.name}/{_FIELDS}", _json_rows(self.fields, holder))
        self.store.add(f"{self.name}/{_META}", _json_rows(self._layout.to_json(self._len), holder))

    def free(self):
        """Free the dataset's variables on this rank (every rank calls it;
        the agents drop the rows once every rank has)."""
        for v in [f.var for f in self._layout.fields] + [f"{self.name}/{_FIELDS}", f"{self.name}/{_META}"]:
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
            store = Store(comm)
        try:
            layout, n = self._discover(store, name)
        except BaseException:
            if owns:
                store.close()
            raise
        self._setup(name, store, owns, layout, n, device)

    @staticmethod
    def _discover(store, name):
        try:
            meta = _read_json(store, f"{name}/{_META}")
        except UnknownVariable:
            meta = None
        if meta is not None:
            layout = _Layout.from_json(name, meta)
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
                    raise ValueError(f"ddstore: bad dataset: {name}/{k} holds untyped items of {d['itemsize']} bytes")
            layout, n = _Layout(kind, fields), None
        for f in layout.fields:
            total, _, _ = store.info(f.var)
            if n is None:
                n = total
            if total != n:
                raise ValueError(f"ddstore: bad dataset: {f.var} holds {total} rows, the dataset {n}")
        return layout, n


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
                raise ValueError(f"ddstore: bad argument: {what} {v}: want >= 1")
        self.ds, self.window, self.stride, self.dilation, self.fields = ds, window, stride, dilation, fields
        self._offsets = np.arange(window, dtype=np.int64) * dilation
        span = (window - 1) * dilation + 1
        n = len(ds)
        if starts is not None:
            s = np.asarray(starts, dtype=np.int64).reshape(-1)
            bad = (s < 0) | (s + span > n)
            if bad.any():
                k = int(np.flatnonzero(bad)[0])
                raise ValueError(f"ddstore: bad argument: starts[{k}] = {int(s[k])}: a window of {span} rows must "
                                 f"lie in [0, {n})")
            self.starts = s
            self._len = s.shape[0]
        else:
            self.starts = None
            self._len = max(0, (n - span) // stride + 1)
        self._ddstore_fast = bool(getattr(ds, "_ddstore_fast", False))
        if self._ddstore_fast:
            ds._layout.select(fields)  # an unknown field fails here, not at the first read

    def __len__(self):
        return self._len

    def _rows(self, idx):
        s = self.starts[idx] if self.starts is not None else idx * self.stride
        return (s[:, None] + self._offsets[None, :]).reshape(-1)

    def __getitem__(self, index):
        i = _check_index(index, self._len, "window")
        if self._ddstore_fast:
            layout, arrays = self.ds._ddstore_read(self._rows(np.array([i], np.int64)), self.fields)
            return layout.sample(arrays, self.ds.device)
        return self._stack(self._fetch(self._rows(np.array([i], np.int64)).tolist()))

    def __getitems__(self, indices):
        return self._ddstore_samples(indices)

    def _ddstore_buffers(self, n):
        return self.ds._ddstore_buffers(n * self.window, self.fields)

    def _ddstore_windows(self, indices, buffers):
        idx = _check_indices(indices, self._len, "window")
        layout, arrays = self.ds._ddstore_read(self._rows(idx), self.fields, buffers)
        n = idx.shape[0]
        return layout, [a.reshape(n, self.window, *a.shape[1:]) for a in arrays], n

    def _ddstore_samples(self, indices, buffers=None):
        if not self._ddstore_fast:
            idx = _check_indices(indices, self._len, "window")
            rows = self._fetch(self._rows(idx).tolist())
            w = self.window
            return [self._stack(rows[j * w:(j + 1) * w]) for j in range(idx.shape[0])]
        layout, arrays, n = self._ddstore_windows(indices, buffers)
        return layout.samples(arrays, n, self.ds.device)

    def _ddstore_collated(self, indices, buffers=None):
        layout, arrays, _ = self._ddstore_windows(indices, buffers)
        return layout.collated(arrays, self.ds.device)

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
        layout = _Layout(kind, [_Field(k, "", (), "uint8", False) for k in keys]).select(self.fields)
        stacked = {k: _stack(c) for k, c in zip(keys, cols)}
        return layout.pack([stacked[f.key] for f in layout.fields])


def _stack(values):
    if isinstance(values[0], torch.Tensor):
        return torch.stack(values)
    return np.stack([np.asarray(v) for v in values])


def row_of(concat, source, index):
    """The row of source[index] in the ConcatDataset `concat` (nested ones
    are searched too; the first occurrence of source counts)."""
    index = operator.index(index)
    if not 0 <= index < len(source):
        raise IndexError(f"ddstore: index out of range: index {index} not in [0, {len(source)})")
    row = _row_of(concat, source, index)
    if row is None:
        raise ValueError("ddstore: bad argument: the dataset is not part of the ConcatDataset")
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


# -- the loader ------------------------------------------------------------------

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
    a time into per-field arrays that become the batch tensors directly.

    reuse_buffers: batches are read into preallocated arrays that are reused
    (num_workers * prefetch_factor + 1 sets of them, kept from one
    iteration to the next) instead of fresh ones per batch. The contract: a
    yielded batch is valid until the next one is requested (the last one of
    an iteration, until the next iteration starts); keep it longer only as a
    copy. Only datasets of this module support it; others are read as
    without it.
    collate_copies: each sample (or, on the fast path, the batch) is copied
    before it is collated or yielded, so that nothing yielded shares memory
    with a reused buffer.
    """

    def __init__(self, dataset, batch_size=1, shuffle=False, sampler=None, batch_sampler=None, num_workers=0,
                 collate_fn=None, drop_last=False, prefetch_factor=2, reuse_buffers=False, collate_copies=False,
                 generator=None, timeout=0, worker_init_fn=None, **ignored):
        unknown = set(ignored) - _IGNORED
        if unknown:
            raise TypeError(f"ThreadDataLoader got unexpected keyword arguments {sorted(unknown)}")
        if num_workers < 0:
            raise ValueError("num_workers option should be non-negative")
        if timeout < 0:
            raise ValueError("timeout option should be non-negative")
        if prefetch_factor is None:  # torch 2's default when num_workers == 0
            prefetch_factor = 2
        if prefetch_factor < 1:
            raise ValueError("prefetch_factor option should be positive")
        if sampler is not None and shuffle:
            raise ValueError("sampler option is mutually exclusive with shuffle")
        if batch_sampler is not None:
            if batch_size != 1 or shuffle or sampler is not None or drop_last:
                raise ValueError("batch_sampler option is mutually exclusive with batch_size, shuffle, sampler, and "
                                 "drop_last")
            batch_size, drop_last = None, False
        elif batch_size is None and drop_last:
            raise ValueError("batch_size=None option disables auto-batching and is mutually exclusive with drop_last")
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
        # Buffer sets (see reuse_buffers) an ended iteration handed back, for
        # the next one: an epoch starts on buffers already touched, not on
        # fresh pages, each of which costs a fault on first write.
        self._spare_slots = []

    @property
    def _auto_collation(self):
        return self.batch_sampler is not None

    def __len__(self):
        return len(self.batch_sampler if self._auto_collation else self.sampler)

    def __iter__(self):
        return _LoaderIter(self)

    def _fetcher(self):
        """fetch(indices, slot) -> batch, for the worker threads. It holds no
        reference to the iterator, so that dropping the iterator frees it."""
        ds, copies = self.dataset, self.collate_copies
        if not self._auto_collation:
            convert = self.collate_fn or _default_convert
            return lambda i, slot: convert(_copy(ds[i]) if copies else ds[i])
        fast = getattr(ds, "_ddstore_fast", False)
        reuse = self.reuse_buffers and fast

        def buffers(slot, n):
            if not reuse:
                return None
            # One set per slot, grown to the largest batch: smaller batches
            # read into its leading rows.
            if slot.get("rows", -1) < n:
                slot["buffers"], slot["rows"] = ds._ddstore_buffers(n), n
            return slot["buffers"]

        if fast and self.collate_fn is None:
            def fetch(indices, slot):
                batch = ds._ddstore_collated(indices, buffers(slot, len(indices)))
                return _copy(batch) if copies else batch
            return fetch
        collate = self.collate_fn or _default_collate

        def fetch(indices, slot):
            if fast:
                samples = ds._ddstore_samples(indices, buffers(slot, len(indices)))
            else:
                getitems = getattr(ds, "__getitems__", None)
                samples = getitems(indices) if getitems else [ds[i] for i in indices]
            if copies:
                samples = [_copy(s) for s in samples]
            return collate(samples)
        return fetch


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
            raise RuntimeError(f"DataLoader timed out after {self._timeout} seconds")
        self._received += 1
        if not ok:
            self.close()
            raise value
        # The batch keeps its slot's buffers until the next call.
        slots.held = slots.busy.pop(seq)
        self._submit_or_close()
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

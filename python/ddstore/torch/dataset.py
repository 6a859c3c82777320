"""The datasets of the torch layer: DistDataset (samples loaded once into
the store, every rank its share), DistDatasetReader (a published dataset
read without a shard of it), WindowedDataset (windows of rows over any
dataset) and row_of.

How a dataset is stored: field k of the samples (the tuple position, the dict
key, or 0 for a bare tensor) is the variable `{name}/{k}`, one row per sample,
rows in index order, rank r holding indices [r*N//P, (r+1)*N//P). A field
of one shape in every sample is a variable of fixed rows (read with
get_batch); a field whose size along one axis varies (a graph's nodes
[n_i, F], its edges [2, e_i], a sequence's tokens) is a ragged variable,
that axis moved to the front (edges are stored as [e_i, 2] units of shape
(2,)) and moved back on read; str and bytes fields are ragged variables of
uint8 units (text as UTF-8). Before storing anything the ranks exchange,
through one small ragged variable `{name}/__census__.K` (freed at once),
each share's shapes and any error its loading met: every rank then learns
which fields are ragged, and a bad sample on one rank fails the load on
every rank with the same message. After the fields, rank 0 publishes
`{name}/__meta__`: one row of JSON bytes (uint8) with the schema, length,
and every field's key, sample shape, dtype and kind (torch or numpy), and
for a field that is not fixed its layout and varying axis, so that a reader learns everything from one lookup. It is
published last, which makes it the commit mark: once it exists, every row is
in place. Dict datasets also get `{name}/__fields__` (their keys, as JSON
bytes) for readers that only know DDStore's conventions.
"""

import collections
import concurrent.futures as _futures
import json
import operator
import os
import threading
import weakref

import numpy as np
import torch
import torch.utils.data as _tud

from .. import _ragged
from .._errors import (ArgumentError, ArgumentTypeError, BadBuffer, BadDataset, Error, IndexOutOfRange,
                       UnknownVariable, Unsupported)
from ..store import Store
from ._schema import (_CENSUS, _FIELDS, _META, WindowValues, _Field, _Schema, _check_index, _check_indices, _items,
                      _shape_words)

_default_collate = getattr(_tud, "default_collate", None) or _tud._utils.collate.default_collate

# Loads per store and dataset name: each load's census is a variable of its
# own (`{name}/__census__.{k}`), so that a load right after a failed one
# never meets the previous census while a slower rank still frees it. Every
# rank makes the same loads, so all count alike.
_LOADS = weakref.WeakKeyDictionary()
# Announced batches (prefetch) whose reads are kept sent, the oldest dropped
# past it.
READ_AHEAD = 4
# Announced reads dropped unused in a row after which a process reads no
# more ahead (it announces batches that others read).
_GIVE_UP = 2 * READ_AHEAD
# What the start of a read counts in a variable's profile (rows of this
# node; those of others when they are counted, at the finish).
_COUNTED = ("calls", "rows", "bytes", "local_rows", "remote_rows", "storage_rows", "remote_calls", "wait_s")
_counts = operator.itemgetter(*_COUNTED)  # a profile's _COUNTED values, as one tuple


def _census_name(store, name):
    counts = _LOADS.setdefault(store, {})
    k = counts[name] = counts.get(name, 0) + 1
    return f"{name}/{_CENSUS}.{k}"

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
    out = {}
    for k in keys:
        v = specs[k]
        if isinstance(v, (list, tuple)):
            if len(v) != 2 or not all(isinstance(x, (str, os.PathLike)) for x in v):
                raise ArgumentError(f"ddstore: bad argument: dataset {name!r}: backing of field {k!r} is {v!r}: want "
                                    f"a file, or for a ragged field a pair (VALUES, OFFSETS)")
            out[k] = (os.fspath(v[0]), os.fspath(v[1]))
        elif isinstance(v, (str, os.PathLike)):
            out[k] = os.fspath(v)
        else:
            raise ArgumentTypeError(f"ddstore: bad argument: dataset {name!r}: backing of field {k!r} of type "
                                    f"{type(v).__name__}: want a file name, or a pair of them")
    return out


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


def _declared_ragged(name, schema, ragged):
    """{field key: varying axis} from DistDataset's ragged argument."""
    if ragged is None:
        return {}
    if isinstance(ragged, dict):
        want = dict(ragged)
    elif isinstance(ragged, (list, tuple)):
        want = {k: 0 for k in ragged}
    else:
        raise ArgumentTypeError(f"ddstore: bad argument: dataset {name!r}: ragged of type {type(ragged).__name__}: "
                                f"want a dict field key -> varying axis, or a list of keys (axis 0)")
    for k, axis in want.items():
        f = schema.by_key.get(k)
        if f is None:
            raise ArgumentError(f"ddstore: bad argument: dataset {name!r}: ragged field {k!r}: fields are "
                                f"{[g.key for g in schema.fields]}")
        if f.layout in ("str", "bytes"):
            continue
        ndim = len(f.user_shape)
        if isinstance(axis, bool) or not isinstance(axis, (int, np.integer)) or not 0 <= axis < ndim:
            raise ArgumentError(f"ddstore: bad argument: dataset {name!r}: ragged field {k!r} along axis {axis!r}: "
                                f"sample 0 has shape {_shape_words(f.user_shape)}, want an axis in [0, {ndim})")
        want[k] = int(axis)
    return want


class _Column:
    """One field of this rank's share as the load reads it: rows of one
    shape into a preallocated array, until a row of another shape comes;
    from then on, the rows kept one by one (copies: a source may reuse its
    memory)."""

    __slots__ = ("buf", "row", "parts", "rows")

    def __init__(self, f, n):
        self.buf = np.empty((n, *f.shape), f.npdtype) if f.layout == "fixed" else None
        self.row = self.buf.shape[1:] if self.buf is not None else None
        self.parts = [] if self.buf is None else None
        self.rows = 0  # rows put (the whole load sets it once at the end)

    def put(self, j, a):
        self.rows = j + 1
        if self.buf is not None:
            if a.shape == self.row:
                self.buf[j] = a
                return
            self.parts = [self.buf[k] for k in range(j)]
            self.buf = None
        self.parts.append(np.array(a))

    @property
    def shape(self):
        """The rows' common shape, None on the axes that varied (None for
        no rows)."""
        if not self.rows:
            return None
        if self.buf is not None:
            return list(self.buf.shape[1:])
        shape = list(self.parts[0].shape)
        for p in self.parts[1:]:
            shape = [d if d == e else None for d, e in zip(shape, p.shape)]
        return shape

    def fixed(self, f):
        return self.buf

    def ragged(self, f):
        """(values, lengths): the rows' units concatenated, the varying axis
        first."""
        axis, trailing = f.axis or 0, f.trailing
        if self.buf is not None:
            n = self.buf.shape[0]
            length = self.buf.shape[axis + 1] if n else 0
            v = np.ascontiguousarray(np.moveaxis(self.buf, axis + 1, 1)).reshape(n * length, *trailing)
            return v, np.full(n, length, np.int64)
        if not self.parts:
            return np.empty((0, *trailing), f.npdtype), np.empty(0, np.int64)
        lengths = np.array([p.shape[axis] for p in self.parts], np.int64)
        v = np.concatenate([np.moveaxis(p, axis, 0) if axis else p for p in self.parts])
        return v.reshape(v.shape[0], *trailing), lengths

    def clear(self):
        self.buf = self.parts = None


def _settle_field(name, f, shapes, declared):
    """Field f of sample 0 as every rank stores it, from every share's
    common shape (None for an empty share or a field not gathered): fixed,
    or ragged along the one axis whose size varies."""
    if f.layout in ("str", "bytes"):
        return f
    if f.layout == "ragged":  # declared for a chunked load
        declared = f.axis
    ndim = len(f.shape)
    seen = [list(f.shape)] + [s for s in shapes if s is not None]
    varying = sorted({k for s in seen for k in range(ndim) if s[k] is None or s[k] != f.shape[k]})
    if declared is not None:
        if varying and varying != [declared]:
            raise ArgumentError(f"ddstore: bad argument: dataset {name!r}: field {f.key!r} (sample 0: "
                                f"{_shape_words(f.shape)}) varies in axes {varying}, declared ragged along axis "
                                f"{declared}")
        varying = [declared]
    if not varying:
        if int(np.prod(f.shape, dtype=np.int64)) == 0:
            raise ArgumentError(f"ddstore: bad argument: dataset {name!r}: field {f.key!r} of shape {f.shape} holds "
                                f"no items in every sample")
        return f
    if len(varying) > 1:
        others = [_shape_words(s) for s in seen if s != list(f.shape)][:3]
        raise ArgumentError(f"ddstore: bad argument: dataset {name!r}: field {f.key!r} varies in axes {varying} "
                            f"(sample 0 {_shape_words(f.shape)}, others {', '.join(others)}): want one varying axis "
                            f"(store such a field flattened, with its shape in another field, or through encode)")
    axis = varying[0]
    shape = tuple(None if k == axis else d for k, d in enumerate(f.shape))
    g = f.like(shape, "ragged", axis)
    if any(d == 0 for d in g.trailing):
        raise ArgumentError(f"ddstore: bad argument: dataset {name!r}: field {f.key!r} of shape "
                            f"{_shape_words(shape)}: its fixed axes must not be empty")
    return g


# -- datasets in the store --------------------------------------------------------

class _StoredDataset(_tud.Dataset):
    """What DistDataset and DistDatasetReader share: reads of a dataset whose
    fields are variables of `store`.

    The `_ddstore_*` methods are the fast path ThreadDataLoader and
    WindowedDataset take: whole batches read into per-field arrays, collated
    without stacking samples one by one."""

    _ddstore_fast = True

    def _setup(self, name, store, owns_store, schema, length, device, decode=None):
        self.name, self.store, self._owns_store = name, store, owns_store
        self._schema, self._len, self.device = schema, length, device
        if decode is not None and not callable(decode):
            raise ArgumentTypeError(f"ddstore: bad argument: dataset {name!r}: decode of type "
                                    f"{type(decode).__name__}: want a function (stored sample, index) -> sample")
        self.decode = decode
        self._backed = None  # the variables with a backing file (_backed_vars)
        self._far = {}  # variable -> whether its reads may need the agent
        self._readers = None  # (pid, executor): overlapped field reads
        self._ahead = None  # (pid, lock, deque of _Ahead, [misses]): reads of announced batches, sent (_read_ahead)

    def __len__(self):
        return self._len

    @property
    def fields(self):
        """The field keys, in order."""
        return [f.key for f in self._schema.fields]

    @property
    def ragged_fields(self):
        """The keys of the fields stored ragged (ragged, str and bytes)."""
        return [f.key for f in self._schema.fields if f.ragged]

    def __getitem__(self, index):
        i = _check_index(index, self._len, self.name)
        arrays = []
        for f in self._schema.fields:
            if f.ragged:
                arrays.append(self.store.get_ragged(f.var, [i]))
                continue
            a = np.empty((1, *f.shape), f.npdtype)
            self.store.get(f.var, f.dest(a), i)
            arrays.append(a.reshape(f.shape))
        sample = self._schema.sample(arrays, self.device)
        return sample if self.decode is None else self.decode(sample, i)

    def sizes(self, field=None, indices=None):
        """Per sample (all of them, or `indices`), the size of `field` along
        its varying axis (default: the first ragged field): atoms, tokens,
        bytes. Read from the node's index of the ragged variable, with no
        request to the agents. A fixed field's size is its first
        dimension (1 for a 0-d field)."""
        if field is None:
            ragged = self.ragged_fields
            if not ragged:
                raise ArgumentError(f"ddstore: bad argument: dataset {self.name!r} has no ragged field: name the "
                                    f"field whose sizes to read (fields are {self.fields})")
            field = ragged[0]
        f = self._schema.select(field).fields[0]
        idx = np.arange(self._len, dtype=np.int64) if indices is None else _check_indices(indices, self._len,
                                                                                           self.name)
        if f.ragged:
            return self.store.ragged_sizes(f.var, idx)
        return np.full(idx.shape[0], f.shape[0] if f.shape else 1, np.int64)

    @property
    def shapes(self):
        """Each field's shape, in the structure of a sample (a tuple per
        field; None on the axis whose size varies; (None,) for str and
        bytes), as DDStore's."""
        return self._schema.pack([f.user_shape for f in self._schema.fields])

    @property
    def dtypes(self):
        """Each field's dtype, in the structure of a sample: a name
        ("float32", "bfloat16"), a record's structured numpy dtype, or "str"
        / "bytes"."""
        return self._schema.pack([f.user_dtype for f in self._schema.fields])

    def __getitems__(self, indices, out=None):
        """The samples `indices` (DataLoader fetches a batch this way when a
        dataset has it): one get_batch per field (one get_ragged per ragged
        field); the samples are views into the batch arrays, or into `out`
        (buffers from alloc(), at least len(indices) rows) when given."""
        return self._ddstore_samples(indices, self._checked_out(out, None, len(indices)) if out is not None
                                     else None)

    def read_rows(self, rows, fields=None, out=None):
        """Stored rows `rows` (sample indices, any order, repeats allowed) of
        the fields `fields` (keys, default all), one get_batch per field,
        without decode: a dict field key -> the rows' values, shape
        (len(rows), *field shape): a tensor for torch fields, a numpy array
        for numpy fields and numbers (1-d), structured arrays for records;
        a ragged, str or bytes field gives a list of len(rows) values. out:
        buffers from alloc() (at least len(rows) rows); the values are then
        views into them."""
        idx = _check_indices(rows, self._len, self.name)
        keys = self._keys(fields)
        schema, arrays = self._ddstore_read(idx, keys, self._checked_out(out, keys, idx.shape[0]) if out is not None
                                            else None)
        got = {}
        for f, a in zip(schema.fields, arrays):
            if f.ragged:
                got[f.key] = [s[0] for s in _Schema("list", [f]).samples([a], idx.shape[0], self.device)]
            else:
                got[f.key] = f.batch_value(a, self.device)
        return got

    def alloc(self, n, fields=None):
        """Buffers for reads of n rows of the fields `fields` (keys, default
        all): a dict field key -> buffer, for read_rows(out=) and
        __getitems__(out=). They are receive buffers the agent writes rows
        of other nodes into directly when reads may need the agent, else
        plain memory; a ragged field's is sized for n rows of the mean
        length and grows (in the dict) when a batch needs more. Values read
        into them are views of them: the caller decides when to reuse one."""
        n = operator.index(n)
        if n < 1:
            raise ArgumentError(f"ddstore: bad argument: alloc of {n} rows: want >= 1")
        keys = self._keys(fields)
        bufs = self._ddstore_buffers(n, keys)
        for f in self._schema.select(keys).fields:
            if f.layout in ("ragged", "str", "bytes"):
                units = int(self.store.describe(f.var)["total_items"])
                per_row = -(-units // max(self._len, 1))
                shape = (max(1, n * per_row), *f.trailing)
                bufs[f.key] = (self.store._recv_buffer(shape, f.npdtype) if self.store._through_agent(f.var)
                               else np.empty(shape, f.npdtype))
        return bufs

    def release(self, bufs):
        """Let go of buffers from alloc(): the dict is emptied, and each
        receive buffer is unregistered from the agent once no array refers
        to it any more (never under a live view). free() and close() of the
        store release every one."""
        if not isinstance(bufs, dict):
            raise ArgumentTypeError(f"ddstore: bad argument: release of a {type(bufs).__name__}: want the dict "
                                    f"alloc() returned")
        self._keys(list(bufs))
        bufs.clear()

    def _keys(self, fields):
        """fields= of read_rows and alloc as a list of keys (None: all)."""
        if fields is None:
            return None
        keys = list(fields) if isinstance(fields, (list, tuple)) else [fields]
        self._schema.select(keys)  # an unknown key fails here
        return keys

    def _checked_out(self, out, keys, n):
        """out (from alloc) for a read of n rows of the fields keys: a buffer
        for every fixed field, of its row shape and dtype, of n rows at least."""
        if not isinstance(out, dict):
            raise ArgumentTypeError(f"ddstore: bad argument: out of type {type(out).__name__}: want the dict alloc() "
                                    f"returned")
        for f in self._schema.select(keys).fields:
            b = out.get(f.key)
            if f.ragged:
                if b is not None and (not isinstance(b, np.ndarray) or b.dtype != f.npdtype
                                      or tuple(b.shape[1:]) != f.trailing):
                    raise BadBuffer(f"ddstore: bad buffer: out[{f.key!r}]: want a buffer from alloc()")
                continue
            if b is None:
                raise BadBuffer(f"ddstore: bad buffer: out has no buffer for field {f.key!r} (keys {list(out)}): "
                                f"want alloc(n) of every field read")
            if (not isinstance(b, np.ndarray) or b.dtype != f.npdtype or tuple(b.shape[1:]) != f.shape
                    or b.shape[0] < n):
                got = f"{b.dtype} of shape {tuple(b.shape)}" if isinstance(b, np.ndarray) else type(b).__name__
                raise BadBuffer(f"ddstore: bad buffer: out[{f.key!r}] is {got}: want {np.dtype(f.npdtype)} rows of "
                                f"shape {f.shape}, {n} or more (alloc({n}) gives them)")
        return out

    def _ddstore_read(self, idx, keys=None, out=None):
        """Per-field arrays (len(idx), *shape) of rows idx (checked int64),
        in `out` (from _ddstore_buffers) when given. When several fields'
        reads may need the agent (rows of other nodes or of backing files),
        they are made together (Store._read_many): the rows each needs from
        one other node go to its agent in requests pipelined on one
        connection, in this thread; the requests for the own agent overlap,
        all but the first on the dataset's reader threads. A batch waits
        about one round trip instead of one per field."""
        schema = self._schema.select(keys)
        fields = schema.fields
        ahead = self._take_ahead(idx, out) if keys is None and self._ahead is not None else None
        if ahead is not None:
            return schema, [ahead[f.key] if f.key in ahead else self._read_field(f, idx, out) for f in fields]
        far = [k for k, f in enumerate(fields) if self._needs_agent(f.var)] if idx.shape[0] else []
        if len(far) < 2:
            return schema, [self._read_field(f, idx, out) for f in fields]
        arrays = [None if k in far else self._read_field(f, idx, out) for k, f in enumerate(fields)]
        reads = []
        for k in far:
            f = fields[k]
            if f.ragged:
                reads.append(("ragged", f.var, idx, self._ragged_dest(f, idx, out)))
            else:
                a = out[f.key][:idx.shape[0]] if out is not None else np.empty((idx.shape[0], *f.shape), f.npdtype)
                arrays[k] = a
                reads.append(("batch", f.var, f.dest(a), idx))
        got = self.store._read_many(reads, self._reader_pool())
        for k, r in zip(far, got):
            f = fields[k]
            if f.ragged:
                arrays[k] = self._ragged_values(f, r) if out is not None else r
        return schema, arrays

    def _read_field(self, f, idx, out):
        if f.ragged:
            return self._read_ragged(f, idx, out)
        n = idx.shape[0]
        a = out[f.key][:n] if out is not None else np.empty((n, *f.shape), f.npdtype)
        if n:
            self.store.get_batch(f.var, f.dest(a), idx)
        return a

    def _needs_agent(self, var):
        """Whether reads of var may need the agent, looked up once."""
        far = self._far.get(var)
        if far is None:
            far = self._far[var] = self.store._through_agent(var)
        return far

    def _reader_pool(self):
        """The dataset's reader threads: up to one per field but one, each
        started when a read first needs it; made on first use and again in
        a forked child (whose copy has no threads). Two loader threads that
        make one at once each use their own; the one not kept ends its
        threads when it is collected."""
        pool = self._readers
        if pool is None or pool[0] != os.getpid():
            self._readers = pool = (os.getpid(), _futures.ThreadPoolExecutor(
                max(1, len(self._schema.fields) - 1), thread_name_prefix=f"ddstore-fields-{self.name}"))
        return pool[1]

    def _stop_readers(self):
        self._drop_ahead()
        pool, self._readers = self._readers, None
        if pool is not None and pool[0] == os.getpid():
            pool[1].shutdown(wait=True)

    def _read_ragged(self, f, idx, out):
        """(values, lengths) of rows idx of a ragged field: one get_ragged,
        into out's buffer for the field when given (see _ragged_dest)."""
        dest = self._ragged_dest(f, idx, out)
        if dest is None:
            return self.store.get_ragged(f.var, idx)
        return self._ragged_values(f, self.store.get_ragged(f.var, idx, out=dest))

    def _ragged_dest(self, f, idx, out):
        """Where rows idx of ragged field f go: out's buffer for the field
        (grown when a batch's units outgrow it, and kept in out for the next
        batch), chosen by the read once it has the rows' extents (no second
        lookup of them), or None without out."""
        if out is None:
            return None
        return _ragged.Alloc(lambda units: self._ragged_buffer(f, out, units))

    def _ragged_buffer(self, f, out, units):
        """out's buffer for ragged field f, of `units` units or more."""
        buf = out.get(f.key)
        if buf is None or buf.shape[0] < units:
            rows = max(units, 1)
            rows = max(rows, (buf.shape[0] * 3) // 2 if buf is not None else 0)
            shape = (rows, *f.trailing)
            buf = (self.store._recv_buffer(shape, f.npdtype) if self.store._through_agent(f.var)
                   else np.empty(shape, f.npdtype))
            out[f.key] = buf
        return f.dest(buf)

    @staticmethod
    def _ragged_values(f, got):
        values, lengths = got
        if isinstance(values, torch.Tensor):
            values = values.numpy()
        return values.view(f.npdtype), lengths

    def _ddstore_buffers(self, n, keys=None):
        """Arrays for n samples of each field, reused by the caller: receive
        buffers the agent writes into directly when reads may go through it
        (rows of other nodes or of backing files: no staging copy), else
        plain memory."""
        fields = [f for f in self._schema.select(keys).fields if not f.ragged]  # ragged: sized at the read
        if any(self.store._through_agent(f.var) for f in fields):
            return {f.key: self.store._recv_buffer((n, *f.shape), f.npdtype) for f in fields}
        return {f.key: np.empty((n, *f.shape), f.npdtype) for f in fields}

    def prefetch(self, indices):
        """Tell the agents which samples this rank reads soon (ScheduledSampler
        does, steps ahead): those only the backing files hold are read from
        them now, into staging memory; and when the batch holds samples of
        other nodes (in memory there) and none only the files hold, its read
        is started: the samples of this node copied, the requests for the
        others sent, their replies left to wait in the socket until the
        batch is read (by __getitems__ or a loader: the same indices in the
        same order, within READ_AHEAD announcements; with out=, copied
        into it). Returns without waiting for an agent."""
        idx = _check_indices(indices, self._len, self.name)
        if not idx.size:
            return
        backed = self._backed_vars()
        if backed:
            self.store._prefetch_many(backed, idx)
        self._read_ahead(idx)

    def _read_ahead(self, idx):
        """Start the read of rows idx of the fields that need the agent
        (Store._start_reads with post), kept for _take_ahead."""
        fields = [f for f in self._schema.fields if self._needs_agent(f.var)]
        if not fields or not self.store._direct_worth(fields[0].var, idx):
            return
        reads = []
        arrays = {}
        for f in fields:
            if f.ragged:
                reads.append(("ragged", f.var, idx, None))
            else:
                a = arrays[f.key] = np.empty((idx.shape[0], *f.shape), f.npdtype)
                reads.append(("batch", f.var, f.dest(a), idx))
        st = self._ahead_state()
        if st[3][0] >= _GIVE_UP:
            return
        _, lock, queue, misses = st
        with lock:
            profiles = [self.store._var(f.var).profile for f in fields]
            before = [_counts(p) for p in profiles]
            try:
                started = self.store._start_reads(reads, post=True)
            except Error:  # the read itself, when it comes, says what is wrong
                return
            # What the rows of this node cost is counted when the batch is
            # read, not now: a read dropped unused counts nothing (the
            # counts before and after the start, told apart only then).
            counted = (before, [_counts(p) for p in profiles])
            ahead = _Ahead(idx, fields, arrays, started, profiles, counted)
            if not started[4][0]:  # no request sent ahead (none direct): nothing gained by it
                self._drop(ahead)
                return
            queue.append(ahead)
            while len(queue) > READ_AHEAD:
                self._drop(queue.popleft())
                misses[0] += 1

    def _drop(self, ahead):
        self.store._drop_reads(ahead.started)
        before, after = ahead.counted
        for p, b, a in zip(ahead.profiles, before, after):
            for k, x, y in zip(_COUNTED, b, a):
                if y != x:
                    p[k] -= y - x

    def _ahead_state(self):
        st = self._ahead
        if st is None or st[0] != os.getpid():  # a forked child: none of the parent's
            # misses: reads dropped unused since the last one used (a
            # process that announces batches others read, as a DataLoader's
            # main process whose worker processes read them, stops).
            st = self._ahead = (os.getpid(), threading.Lock(), collections.deque(), [0])
        return st

    def _take_ahead(self, idx, out):
        """[array per field] of the announced read of rows idx, finished (the
        others left as they are), into out's buffers when given
        (copied), or None when there is none (no array for a field that
        needs no agent: the caller reads it)."""
        st = self._ahead
        if st is None or not st[2] or st[0] != os.getpid():
            return None
        _, lock, queue, _ = st
        with lock:
            key = idx.tobytes()  # both checked int64: equal bytes, equal indices
            for k, a in enumerate(queue):
                if a.idx.shape == idx.shape and a.idx.tobytes() == key:
                    break
            else:
                return None
            # Only this one: those announced before it may still be read
            # (a loader's threads take batches out of order); unused ones
            # go when READ_AHEAD newer are kept.
            del queue[k]
            st[3][0] = 0
            got = self.store._finish_reads(a.started, self._reader_pool())
        arrays = a.arrays
        for f, r in zip(a.fields, got):
            if f.ragged:
                arrays[f.key] = r
        if out is not None:
            n = idx.shape[0]
            for f in a.fields:
                if f.ragged:
                    values, lengths = arrays[f.key]
                    dest = self._ragged_buffer(f, out, values.shape[0])
                    d = dest.reshape(-1)[:values.size].reshape(values.shape)
                    d[...] = values
                    arrays[f.key] = self._ragged_values(f, (d, lengths))
                else:
                    o = out[f.key][:n]
                    o[...] = arrays[f.key]
                    arrays[f.key] = o
        return arrays

    def _drop_ahead(self):
        st, self._ahead = self._ahead, None
        if st is not None and st[0] == os.getpid():
            with st[1]:
                while st[2]:
                    self._drop(st[2].popleft())

    def _backed_vars(self):
        """The variables of fields with a backing file, looked up once (a
        sampler announces every step's samples; a variable keeps its
        backing for as long as it lives)."""
        backed = self._backed
        if backed is None:
            backed = self._backed = [f.var for f in self._schema.fields if self.store.describe(f.var)["backing"]]
        return backed

    def _ddstore_samples(self, indices, buffers=None):
        idx = _check_indices(indices, self._len, self.name)
        schema, arrays = self._ddstore_read(idx, out=buffers)
        samples = schema.samples(arrays, idx.shape[0], self.device)
        if self.decode is not None:
            samples = [self.decode(s, i) for s, i in zip(samples, idx.tolist())]
        return samples

    def _ddstore_collated(self, indices, buffers=None, collate=None):
        """A batch: collated from the per-field arrays as read (see
        _Schema.collated), or with decode, collate (default_collate when
        None) over the decoded samples."""
        if self.decode is not None:
            return (collate or _default_collate)(self._ddstore_samples(indices, buffers))
        idx = _check_indices(indices, self._len, self.name)
        schema, arrays = self._ddstore_read(idx, out=buffers)
        return schema.collated(arrays, self.device, collate)

    def state_dict(self):
        """What a loader's state records of the dataset (torchdata's
        protocol): its name, length and fields. The samples are the
        store's; a loader resumes over the same ones."""
        return {"format": 1, "name": self.name, "n": self._len, "fields": [str(k) for k in self.fields]}

    def load_state_dict(self, state):
        """Check that `state` (state_dict()) is of this dataset: another
        name, length or fields raise ValueError naming both values."""
        if not isinstance(state, dict) or state.get("format") != 1:
            raise ArgumentError(f"ddstore: bad argument: dataset {self.name!r}: state "
                                f"{state.get('format') if isinstance(state, dict) else type(state).__name__!r}: "
                                f"want the dict of state_dict(), format 1")
        mine = self.state_dict()
        for k in ("name", "n", "fields"):
            if state.get(k) != mine[k]:
                raise ArgumentError(f"ddstore: bad argument: dataset {self.name!r}: {k} {state.get(k)!r} in the "
                                    f"state, {mine[k]!r} here: the state is of another dataset")

    def close(self):
        """Stop the dataset's reader threads (those that overlap a batch's
        field reads) and close the store if this dataset opened it (the
        variables stay with the agents: see free())."""
        self._stop_readers()
        if self._owns_store:
            self.store.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __repr__(self):
        return f"{type(self).__name__}({self.name!r}, len={self._len}, fields={self.fields})"


class _Ahead:
    """The read of an announced batch, sent (DistDataset.prefetch): its rows,
    the fields read, the fixed fields' arrays, Store._start_reads's handle,
    and what it counted in the variables' profiles so far."""

    __slots__ = ("idx", "fields", "arrays", "started", "profiles", "counted")

    def __init__(self, idx, fields, arrays, started, profiles, counted):
        self.idx, self.fields, self.arrays, self.started = idx, fields, arrays, started
        self.profiles, self.counted = profiles, counted


class DistDataset(_StoredDataset):
    """A map-style dataset loaded once into the job's memory and readable by
    every rank (DDStore's DistDataset).

    source: any map-style dataset whose samples are a tensor, ndarray,
    number, numpy structured record (an np.void, a structured array, an
    np.recarray), str or bytes, or a tuple, list or dict (str keys) of them, every
    sample of the structure of source[0] and each field of its dtype and
    rank. A field's sizes may vary between samples along one axis (a graph's
    x [n_i, F] and edge_index [2, e_i], a sequence [L_i]): it is then stored
    ragged (see the module's docstring) and read with one get_ragged per
    batch; fields of one shape stay fixed rows, read with get_batch as
    before. Which fields vary is found while loading (every rank agrees);
    ragged={key: axis} (or a list of keys: axis 0) declares it, which
    chunk_size needs (a chunked load stores fixed fields before it has seen
    every sample). Construction is collective: every rank passes the same
    source and name; rank r of P reads source[i] for i in
    [r*N//P, (r+1)*N//P) only. Samples come back in the source's structure,
    each field as the source gave it: torch tensors, numpy arrays, Python
    and numpy numbers, records of the same layout, str and bytes (`shapes`
    and `dtypes` describe the fields; read_rows, alloc and
    __getitems__(out=) read rows into buffers of yours). Batches of ragged
    fields need a collate of ddstore.torch.collate (Packed, Padded, Graphs;
    ThreadDataLoader's default is Packed) or a collate_fn of yours.

    encode, decode (DDStore's hooks): encode(sample) runs on every source
    sample before it is stored and returns what to store (e.g. labels as
    numbers, an object as pickle.dumps bytes); decode(stored, index) runs on
    every sample read (ds[i], __getitems__, and so in loaders) and rebuilds
    the sample (e.g. pickle.loads). decode runs on the reading rank: what it
    looks up must exist there. WindowedDataset reads stored rows, without
    decode. A sample that encode fails on, or whose encoding cannot be
    stored, fails the load on every rank, naming the sample and the value.

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
    order); for a ragged field, a pair (VALUES, OFFSETS) of such specs: its
    rows concatenated along the varying axis, which comes first in the file
    (an edge_index [2, e_i] is a file of shape (sum e, 2)), and the N + 1
    offsets (Store.add_ragged's backing). ScheduledSampler(capacity=...) then deals samples so that each
    step's reads from the files are few, spread evenly and prefetched.

    Indices are 0..N-1; negative ones raise IndexError, as in DDStore.
    Forked DataLoader workers can read (the store reconnects after fork);
    spawned ones cannot, as the dataset does not pickle. Under CPython
    before 3.12, fork them before init_process_group (persistent_workers=
    True, and iter(loader) once): a child forked while gloo's threads run
    can deadlock at the fork (examples/ddp_train.py).
    """

    def __init__(self, source, name, comm=None, store=None, ddstore_width=None, device=None, method=None,
                 handshake_dir=None, chunk_size=None, capacity=None, backing=None, encode=None, decode=None,
                 ragged=None):
        if chunk_size is not None and chunk_size < 1:
            raise ArgumentError(f"ddstore: bad argument: chunk_size {chunk_size}: want >= 1")
        if encode is not None and not callable(encode):
            raise ArgumentTypeError(f"ddstore: bad argument: dataset {name!r}: encode of type "
                                    f"{type(encode).__name__}: want a function sample -> what to store")
        n = len(source)
        if n == 0:
            raise ArgumentError(f"ddstore: bad argument: dataset {name!r}: the source is empty")
        self.encode = encode
        # Every rank derives the schema from the same sample, so all agree on
        # each field's row geometry before any collective call (which fields
        # are ragged, the census settles).
        schema = _Schema.of_sample(name, self._encoded(source[0], 0, name))
        self._declared = _declared_ragged(name, schema, ragged)
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
            self._setup(name, store, owns, schema, n, device, decode)
            self._census = _census_name(store, name)
            if chunk_size is None:
                self._load_whole(source)
            else:
                self._load_chunked(source, chunk_size)
        except BaseException:
            if owns:
                store.close()
            raise

    def _encoded(self, sample, index, name=None):
        if self.encode is None:
            return sample
        try:
            return self.encode(sample)
        except Exception as e:
            raise ArgumentError(f"ddstore: bad argument: dataset {name or self.name!r}: encode failed on the sample "
                                f"at index {index} (a {type(sample).__name__}): {type(e).__name__}: {e}: want encode "
                                f"to return tensors, arrays, numbers, str or bytes") from e

    def _samples(self, source, lo, hi):
        """(index, split fields) of samples [lo, hi) of the source."""
        getitems = getattr(source, "__getitems__", None)
        samples = getitems(list(range(lo, hi))) if getitems else (source[i] for i in range(lo, hi))
        for j, s in enumerate(samples):
            yield lo + j, self._schema.split(self._encoded(s, lo + j), lo + j)

    def _columns(self, fields, n):
        return [_Column(f, n) for f in fields]

    def _load_whole(self, source):
        fields = self._schema.fields
        n = self.hi - self.lo
        err = None
        cols = []
        try:
            cols = self._columns(fields, n)
            getitems = getattr(source, "__getitems__", None)
            lo, split, encode = self.lo, self._schema.split, self.encode
            samples = getitems(list(range(lo, self.hi))) if getitems else (source[i] for i in range(lo, self.hi))
            for j, sample in enumerate(samples):
                if encode is not None:
                    sample = self._encoded(sample, lo + j)
                for c, a in zip(cols, split(sample, lo + j)):
                    # Rows of the shape so far go straight to the column's array.
                    if c.buf is not None and a.shape == c.row:
                        c.buf[j] = a
                    else:
                        c.put(j, a)
            for c in cols:
                c.rows = n
        except Exception as e:
            err = e
        except BaseException:
            # The other ranks are about to exchange what they found: fail
            # that for all of them rather than leave them waiting.
            self._fail_collective(self._census)
            raise
        self._settle(err, cols, [])
        done = []
        try:
            for f, c in zip(self._schema.fields, cols):
                if f.ragged:
                    values, lengths = c.ragged(f)
                    c.clear()
                    self.store.add_ragged(f.var, f.dest(values), lengths, **self._backing_of(f))
                else:
                    self.store.add(f.var, f.dest(c.fixed(f)), **self._backing_of(f))
                    c.clear()
                done.append(f.var)
            del cols
            self._publish_meta()
        except BaseException:
            self._free_quietly(done)
            raise

    def _load_chunked(self, source, chunk):
        # Fields of one shape are stored chunk by chunk; ragged ones (they
        # must be declared, or be str or bytes) are gathered whole and added
        # once every sample is read.
        fields = [f.like(layout="ragged", axis=self._declared[f.key])
                  if f.key in self._declared and not f.ragged else f for f in self._schema.fields]
        self._schema = _Schema(self._schema.kind, fields)
        fixed = [k for k, f in enumerate(fields) if not f.ragged]
        ragged = [k for k, f in enumerate(fields) if f.ragged]
        self._check_backing(fields)
        done = []
        try:
            for k in fixed:
                f = fields[k]
                self.store.init(f.var, self.hi - self.lo, max(1, int(np.prod(f.shape, dtype=np.int64))),
                                dtype=f.dtype, **self._backing_of(f))
                done.append(f.var)
            err = None
            cols = []
            try:
                if fixed and any(np.prod(fields[k].shape, dtype=np.int64) == 0 for k in fixed):
                    k = next(k for k in fixed if np.prod(fields[k].shape, dtype=np.int64) == 0)
                    raise ArgumentError(f"ddstore: bad argument: dataset {self.name!r}: field {fields[k].key!r} of "
                                        f"shape {fields[k].shape} holds no items (a field whose sizes vary needs "
                                        f"ragged= with chunk_size)")
                cols = self._columns([fields[k] for k in ragged], self.hi - self.lo)
                bufs = {k: np.empty((min(chunk, self.hi - self.lo), *fields[k].shape), fields[k].npdtype)
                        for k in fixed}
                for lo in range(self.lo, self.hi, chunk):
                    hi = min(lo + chunk, self.hi)
                    for i, arrays in self._samples(source, lo, hi):
                        for k in fixed:
                            a, f = arrays[k], fields[k]
                            if a.shape != f.shape:
                                raise ArgumentError(
                                    f"ddstore: bad argument: sample at index {i}, field {f.key!r}: shape "
                                    f"{_shape_words(a.shape)}, sample 0 has {_shape_words(f.shape)}: a field whose "
                                    f"sizes vary is stored ragged: declare it, ragged=[{f.key!r}] (a chunked load "
                                    f"stores fixed fields before it has seen every sample)")
                            bufs[k][i - lo] = a
                        for c, k in zip(cols, ragged):
                            c.put(i - self.lo, arrays[k])
                    for k in fixed:
                        self.store.update(fields[k].var, fields[k].dest(bufs[k][:hi - lo]), lo - self.lo)
                del bufs
            except Exception as e:
                err = e
            except BaseException:
                self._fail_collective(self._census)
                raise
            all_cols = [None] * len(fields)
            for c, k in zip(cols, ragged):
                all_cols[k] = c
            self._settle(err, all_cols, done)
            for k, c in zip(ragged, cols):
                f = self._schema.fields[k]
                values, lengths = c.ragged(f)
                c.clear()
                self.store.add_ragged(f.var, f.dest(values), lengths, **self._backing_of(f))
                done.append(f.var)
            del cols, all_cols
            # Publishing the metadata is collective, so it returns only when
            # every rank has written its rows: a read after construction never
            # sees a zero row another rank has yet to fill.
            self._publish_meta()
        except BaseException:
            self._free_quietly(done)
            raise

    def _settle(self, err, cols, done):
        """The census: every rank tells the others the shapes its share's
        fields had (None on the axes that varied) and the error it met, if
        any, in one row of a ragged variable; each then reads every row.
        On an error anywhere every rank raises (the rank that met it, its
        own exception; the others, one naming that rank and its message),
        having freed `done`. Otherwise every rank settles the same schema:
        a field is ragged along the one axis its sizes vary in."""
        row = {"error": None if err is None else str(err),
               "shapes": [None if c is None else c.shape for c in cols]}
        census = self._census
        try:
            b = np.frombuffer(json.dumps(row).encode(), np.uint8)
            self.store.add_ragged(census, b, [b.shape[0]])
            try:
                values, lengths = self.store.get_ragged(census, np.arange(self.size))
            finally:
                self.store.free(census)
            off = np.concatenate(([0], np.cumsum(lengths)))
            rows = [json.loads(values[off[r]:off[r + 1]].tobytes()) for r in range(self.size)]
            failed = [(r, x["error"]) for r, x in enumerate(rows) if x["error"] is not None]
            if err is not None:
                raise err
            if failed:
                r, msg = failed[0]
                raise ArgumentError(f"ddstore: bad argument: dataset {self.name!r}: rank {r} could not load its "
                                    f"share: {msg}")
            fields = [_settle_field(self.name, f, [x["shapes"][k] for x in rows], self._declared.get(f.key))
                      for k, f in enumerate(self._schema.fields)]
            self._check_backing(fields)
        except BaseException:
            self._free_quietly(done)
            raise
        self._schema = _Schema(self._schema.kind, fields)

    def _check_backing(self, fields):
        """A ragged field's backing is a pair, a fixed one's one file."""
        if self._backing is None:
            return
        for f in fields:
            spec = self._backing[f.key]
            pair = isinstance(spec, tuple)
            if f.ragged != pair:
                want = ("a pair (VALUES, OFFSETS): its rows' units, the varying axis first, and the offsets"
                        if f.ragged else "one file of its rows")
                raise ArgumentError(f"ddstore: bad argument: dataset {self.name!r}: field {f.key!r} is "
                                    f"{'ragged' if f.ragged else 'fixed'}, its backing {spec!r} is "
                                    f"{'a pair' if pair else 'one file'}: want {want}")

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
        self._stop_readers()
        for v in [f.var for f in self._schema.fields] + [f"{self.name}/{_FIELDS}", f"{self.name}/{_META}"]:
            self.store.free(v)


class DistDatasetReader(_StoredDataset):
    """A dataset published by DistDataset (in this job or another job of the
    same namespace), read without holding any shard of it: DDStore's split
    mode. The structure comes from `{name}/__meta__` in one lookup; for data
    published otherwise, fields are found as `{name}/__fields__` (dict keys)
    or `{name}/0`, `{name}/1`, ... and come back as a tuple of flat rows
    (a ragged variable: as arrays of shape (length, *its trailing shape)).
    decode(stored, index), as DistDataset's, rebuilds each sample read.

    store: an open ddstore.Store (stays the caller's); otherwise one is made
    from comm and closed by close(). n_core and handshake_dir are accepted for
    DDStore code and ignored: the agents find each other (for a directory,
    pass comm=ddstore.FileComm(...)). The dataset must be published before a
    reader attaches.
    """

    def __init__(self, name, store=None, comm=None, n_core=None, handshake_dir=None, device=None, decode=None):
        owns = store is None
        if owns:
            store = Store(comm, scope="namespace")  # a published dataset is the namespace's
        try:
            schema, n = self._discover(store, name)
        except BaseException:
            if owns:
                store.close()
            raise
        self._setup(name, store, owns, schema, n, device, decode)

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
                if d.get("kind") == "ragged" and d["dtype"]:
                    is_torch = d["dtype"] not in ("uint16", "uint32", "uint64")
                    fields.append(_Field(k, f"{name}/{k}", (None, *d["shape"]), d["dtype"], is_torch, "ragged", 0))
                elif d["dtype"]:
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

    fields picks fields by key or position: a list gives a dict of those
    fields (as DDStore's), a single key that field alone. Window indices
    may be negative (-1 is the last window). Over a DistDataset or
    DistDatasetReader a window (and a batch of windows through
    __getitems__) is one get_batch per field; over other datasets the rows
    are fetched with ds.__getitems__ when it has one, else one by one.
    A start whose window does not lie in ds is an IndexError.

    A field of varying size (ragged, str, bytes: of a DistDataset or
    DistDatasetReader; over other datasets, a field whose values in the
    window differ in shape, or are str or bytes, as a WindowValues) comes as
    a list of the window's values, row after row, each what the dataset's
    sample holds; a batch of windows is one
    get_ragged per such field. Collated (ThreadDataLoader, or a collate of
    ddstore.torch.collate given ds=this dataset), B windows are the batch
    of their B * window rows, window after window: every field as the
    collate makes it of that many samples (a fixed field [B * window,
    *shape]). Over other datasets so are B windows of which the first holds
    a WindowValues (ThreadDataLoader's default collate is then Packed).
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
                raise IndexOutOfRange(f"ddstore: index out of range: starts[{k}] = {int(s[k])}: a window of {span} "
                                      f"rows must lie in [0, {n})")
            self.starts = s
            self._len = s.shape[0]
        else:
            self.starts = None
            self._len = max(0, (n - span) // stride + 1)
        self._ddstore_fast = bool(getattr(ds, "_ddstore_fast", False))
        # With fields of varying size: the schema of the rows (the collates
        # of ddstore.torch.collate cut window samples into rows by it).
        self._ddstore_window = None
        if self._ddstore_fast:
            schema = ds._schema.select(fields)  # an unknown field fails here
            if schema.ragged:
                self._ddstore_window = schema

    def __len__(self):
        return self._len

    def _rows(self, idx):
        s = self.starts[idx] if self.starts is not None else idx * self.stride
        return (s[:, None] + self._offsets[None, :]).reshape(-1)

    def _schema_of(self, schema):
        """The schema of a window: each field stacked over the rows, a list
        of fields as a dict of them (DDStore's windows)."""
        kind = "dict" if isinstance(self.fields, (list, tuple)) else schema.kind
        return _Schema(kind, [f.stacked() for f in schema.fields])

    def _windows(self, indices):
        """Window indices as checked int64, negative ones from the end."""
        idx = np.asarray(indices)
        if idx.ndim == 1 and idx.size and idx.dtype.kind == "i":
            idx = np.where(idx < 0, idx + self._len, idx)
        return _check_indices(idx, self._len, "window")

    def __getitem__(self, index):
        i = operator.index(index)
        if -self._len <= i < 0:
            i += self._len
        i = _check_index(i, self._len, "window")
        if self._ddstore_window is not None:
            return self._ddstore_samples(np.array([i], np.int64))[0]
        if self._ddstore_fast:
            schema, arrays = self.ds._ddstore_read(self._rows(np.array([i], np.int64)), self.fields)
            schema = self._schema_of(schema)
            return schema.pack([f.batch_value(a, self.ds.device) for f, a in zip(schema.fields, arrays)])
        return self._stack(self._fetch(self._rows(np.array([i], np.int64)).tolist()))

    def __getitems__(self, indices, out=None):
        """The windows `indices`; out: buffers from alloc() (at least
        len(indices) windows), which the windows are then views of."""
        return self._ddstore_samples(indices, out)

    def alloc(self, n, fields=None):
        """Buffers for n windows (the rows of the underlying dataset's
        alloc), for __getitems__(out=) and ThreadDataLoader's reuse_buffers."""
        if not self._ddstore_fast:
            raise Unsupported(f"ddstore: bad argument: windows over a {type(self.ds).__name__} have no buffers to "
                              f"allocate: want a DistDataset or a DistDatasetReader")
        return self.ds.alloc(operator.index(n) * self.window, self.fields if fields is None else fields)

    def release(self, bufs):
        """Let go of buffers from alloc() (see DistDataset.release)."""
        self.ds.release(bufs)

    def _ddstore_buffers(self, n):
        return self.ds._ddstore_buffers(n * self.window, self.fields)

    def _ddstore_windows(self, indices, buffers):
        idx = self._windows(indices)
        schema, arrays = self.ds._ddstore_read(self._rows(idx), self.fields, buffers)
        n = idx.shape[0]
        return self._schema_of(schema), [a.reshape(n, self.window, *a.shape[1:]) for a in arrays], n

    def _ddstore_samples(self, indices, buffers=None):
        if not self._ddstore_fast:
            idx = self._windows(indices)
            rows = self._fetch(self._rows(idx).tolist())
            w = self.window
            return [self._stack(rows[j * w:(j + 1) * w]) for j in range(idx.shape[0])]
        if self._ddstore_window is not None:
            return self._ragged_windows(indices, buffers)
        schema, arrays, n = self._ddstore_windows(indices, buffers)
        return schema.samples(arrays, n, self.ds.device)

    def _ragged_windows(self, indices, buffers):
        """Window samples with fields of varying size: their rows read in one
        get_ragged or get_batch per field, a fixed field stacked over the
        window, any other a list of the window's values."""
        idx = self._windows(indices)
        schema, arrays = self.ds._ddstore_read(self._rows(idx), self.fields, buffers)
        n, w, device = idx.shape[0], self.window, self.ds.device
        cols = []
        for f, a in zip(schema.fields, arrays):
            if f.ragged:
                rows = schema.column(f, a, n * w, device)
                cols.append([list(rows[j * w:(j + 1) * w]) for j in range(n)])
            else:
                cols.append(schema.column(f.stacked(), a.reshape(n, w, *a.shape[1:]), n, device))
        windows = self._schema_of(schema)  # a list of fields: a dict of them
        return [windows.pack([c[j] for c in cols]) for j in range(n)]

    def _ddstore_collated(self, indices, buffers=None, collate=None):
        if self._ddstore_window is not None:  # the batch of the windows' rows
            idx = self._windows(indices)
            schema, arrays = self.ds._ddstore_read(self._rows(idx), self.fields, buffers)
            return schema.collated(arrays, self.ds.device, collate)
        schema, arrays, _ = self._ddstore_windows(indices, buffers)
        return schema.collated(arrays, self.ds.device, collate)

    def _fetch(self, rows):
        getitems = getattr(self.ds, "__getitems__", None)
        return list(getitems(rows)) if getitems else [self.ds[r] for r in rows]

    def _stack(self, samples):
        kind, items = _items(samples[0])
        cols = [[v] for _, v in items]
        for j, s in enumerate(samples[1:], 1):
            k2, it = _items(s)
            if k2 != kind or [k for k, _ in it] != [k for k, _ in items]:
                raise BadDataset(f"ddstore: bad geometry: row {j} of a window ({k2}, fields {[k for k, _ in it]}) "
                                 f"differs from its first ({kind}, fields {[k for k, _ in items]})")
            for c, (_, v) in zip(cols, it):
                c.append(v)
        keys = [k for k, _ in items]
        schema = self._schema_of(_Schema(kind, [_Field(k, "", (), "uint8", False) for k in keys]).select(self.fields))
        stacked = {k: _stack(c) for k, c in zip(keys, cols)}
        return schema.pack([stacked[f.key] for f in schema.fields])


def _stack(values):
    """A field's values over a window: stacked (window, *shape), or, when
    they vary in shape or are str or bytes, their WindowValues (as a ragged
    field of a DistDataset comes)."""
    first = values[0]
    if isinstance(first, (str, bytes)):
        return WindowValues(values)
    if isinstance(first, torch.Tensor):
        if any(not isinstance(v, torch.Tensor) or v.shape != first.shape for v in values):
            return WindowValues(values)
        return torch.stack(values)
    arrays = [np.asarray(v) for v in values]
    if any(a.shape != arrays[0].shape for a in arrays):
        return WindowValues(values)
    return np.stack(arrays)


def row_of(concat, source, index):
    """The row of sample `index` of a source in the ConcatDataset `concat`:
    its index in a DistDataset built over concat. source is the source's
    position in concat.datasets (DDStore's), or the dataset itself (nested
    ConcatDatasets are searched too; its first occurrence counts)."""
    index = operator.index(index)
    if isinstance(source, (int, np.integer)) and not isinstance(source, bool):
        k = operator.index(source)
        if not 0 <= k < len(concat.datasets):
            raise IndexOutOfRange(f"ddstore: index out of range: source {k} not in [0, {len(concat.datasets)}) (the "
                                  f"ConcatDataset's datasets)")
        first = concat.cumulative_sizes[k - 1] if k else 0
        n = concat.cumulative_sizes[k] - first
        if not 0 <= index < n:
            raise IndexOutOfRange(f"ddstore: index out of range: index {index} of source {k} not in [0, {n})")
        return first + index
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

"""The schema of a dataset's samples: their kind (a bare tensor, a tuple,
list or dict of fields) and each field's key, row shape and dtype, the
variable that stores it, how it is stored (fixed rows, ragged rows, text or
bytes) and how a row comes back (tensor or numpy array). Named so as not to
be confused with the store's layout, which places rows on ranks.

A field's layout: "fixed" (every sample the same shape: a variable of fixed
rows), "ragged" (the size of one axis, `axis`, varies between samples: a
ragged variable whose units are the sample's slices along that axis, so
that axis is moved to the front in the store and back on read; shape holds
None there), "str" (UTF-8 text) and "bytes" (raw bytes), both ragged
variables of uint8 units.

How a field comes back, whatever its layout: a torch tensor, a numpy array,
a Python number (`scalar` "py": int, float, bool, stored as int64, float64,
bool) or a numpy scalar (`scalar` "np"), as the source gave it; a numpy
structured record (`record`, its dtype: an np.void or np.record, a
structured array or an np.recarray, `rkind` "void", "record", "array",
"recarray") is stored as its raw bytes, uint8 rows of shape (*shape,
itemsize), and comes back as the same kind of object with the same layout
(nested, aligned and padded records included)."""

import operator

import numpy as np
import torch

from .._errors import ArgumentError, ArgumentTypeError, BadDataset, IndexOutOfRange, UnknownField
from .._vars import below
from ..dtypes import as_array, numpy_dtype

# The reserved variables of a dataset (dataset.py) and the format tag of its
# metadata row.
_META, _FIELDS = "__meta__", "__fields__"
# A load's exchange between the ranks (dataset.py): freed once every rank
# has read it.
_CENSUS = "__census__"
_FORMAT = "ddstore.torch/1"
# Datasets with a field that is not fixed say so in their format, so that a
# reader that knows only fixed rows refuses them rather than misreads them.
_FORMAT_RAGGED = "ddstore.torch/2"
_FORMATS = (_FORMAT, _FORMAT_RAGGED)
LAYOUTS = ("fixed", "ragged", "str", "bytes")


class _Field:
    """One field of the samples: where it is stored, how, and what a row
    holds (see the module's docstring for layouts)."""

    __slots__ = ("key", "var", "shape", "dtype", "npdtype", "torch", "layout", "axis", "ragged", "scalar", "record",
                 "rkind")

    def __init__(self, key, var, shape, dtype, is_torch, layout="fixed", axis=None, scalar=None, record=None,
                 rkind=None):
        self.key, self.var, self.dtype, self.torch = key, var, dtype, is_torch
        self.shape = tuple(None if d is None else int(d) for d in shape)
        self.layout, self.axis = layout, axis
        # A number's kind ("py", "np"; None for arrays and tensors), a
        # record's dtype and kind (None for other fields).
        self.scalar, self.record, self.rkind = scalar, record, rkind
        # Stored as a ragged variable (ragged, str and bytes layouts).
        self.ragged = layout != "fixed"
        # bfloat16 rows are kept in int16 arrays: numpy has no bfloat16.
        self.npdtype = numpy_dtype(dtype)

    def like(self, shape=None, layout=None, axis=None):
        """This field with another shape, layout and axis (the rest kept)."""
        return _Field(self.key, self.var, self.shape if shape is None else shape, self.dtype, self.torch,
                      self.layout if layout is None else layout, self.axis if axis is None else axis, self.scalar,
                      self.record, self.rkind)

    def stacked(self):
        """This field as rows stacked along a new first axis hold it (a
        window's): numbers as 1-d arrays, records as arrays of records."""
        if self.scalar is None and self.rkind not in ("void", "record"):
            return self
        f = self.like()
        f.scalar = None
        f.rkind = {"void": "array", "record": "recarray"}.get(self.rkind, self.rkind)
        return f

    @property
    def user_shape(self):
        """The field's shape as a sample holds it (a record's without its
        bytes axis; None on a varying axis)."""
        return self.shape[:-1] if self.record is not None else self.shape

    @property
    def user_dtype(self):
        """The dtype as a sample holds it: a name, a record's structured
        dtype, or "str" / "bytes"."""
        if self.record is not None:
            return self.record
        return self.layout if self.layout in ("str", "bytes") else self.dtype

    @property
    def trailing(self):
        """The shape of one unit of a ragged field in the store: the sample's
        shape without its varying axis."""
        if self.layout != "ragged":
            return ()
        return tuple(d for k, d in enumerate(self.shape) if k != self.axis)

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
        """A field as the source gave it: a tensor, a numpy array, a number
        or a record (a of the stored shape; a view where it can be)."""
        if self.torch:
            return self.tensor(a, device)
        if self.record is not None:
            r = self.records(a)
            return r[()] if self.rkind in ("void", "record") else r
        if self.scalar == "py":
            return a.item()
        if self.scalar == "np":
            return a[()]
        return a

    def records(self, a):
        """Stored bytes (..., itemsize) as records (...): a structured array
        (an np.recarray for record and recarray fields), a view of a."""
        r = a.view(self.record)[..., 0]
        return r.view(np.recarray) if self.rkind in ("record", "recarray") else r

    def batch_value(self, a, device):
        """The rows of a batch array (n, *stored shape) as one value of shape
        (n, *shape): a tensor, a numpy array (numbers: 1-d), or records."""
        if self.torch:
            return self.tensor(a, device)
        if self.record is not None:
            return self.records(a)
        return a

    def unit_value(self, units, device):
        """One sample's field from its units in the store (units of shape
        (length, *trailing)): text, bytes, or the array with the varying
        axis moved back into place."""
        if self.layout == "str":
            return units.tobytes().decode("utf-8")
        if self.layout == "bytes":
            return units.tobytes()
        if self.axis:  # contiguous, as the source gave it
            units = np.ascontiguousarray(np.moveaxis(units, 0, self.axis))
        return self.value(units, device)

    def to_json(self):
        d = {"key": self.key, "shape": list(self.shape), "dtype": self.dtype, "torch": self.torch}
        if self.layout != "fixed":
            d["layout"] = self.layout
            d["axis"] = self.axis
        if self.scalar is not None:
            d["scalar"] = self.scalar
        if self.record is not None:
            d["record"], d["rkind"] = record_json(self.record), self.rkind
        return d

    def describe(self):
        """The field in words, for errors."""
        if self.layout in ("str", "bytes"):
            return self.layout
        if self.record is not None:
            return f"records {self.record} of shape {_shape_words(self.user_shape)}"
        return f"{self.dtype} of shape {_shape_words(self.shape)}"


class _Schema:
    """The schema of a sample: kind ("tensor", "tuple", "list", "dict", or
    "bare" for one field picked by WindowedDataset) and its fields in order."""

    def __init__(self, kind, fields):
        self.kind, self.fields = kind, list(fields)
        self.by_key = {f.key: f for f in self.fields}
        # Whether any field is stored ragged.
        self.ragged = any(f.ragged for f in self.fields)

    @classmethod
    def of_sample(cls, name, sample):
        kind, items = _items(sample)
        if not items:
            raise ArgumentError(f"ddstore: bad argument: dataset {name!r}: a sample with no fields")
        fields = []
        for key, v in items:
            if kind == "dict":
                if not isinstance(key, str):
                    raise ArgumentTypeError(f"ddstore: bad argument: dataset {name!r}: dict key {key!r}: want "
                                            f"str keys (they name variables and travel as JSON)")
                if key in (_META, _FIELDS, _CENSUS):
                    raise ArgumentError(f"ddstore: bad argument: dataset {name!r}: dict key {key!r} is reserved")
            a, dt, is_torch, layout = _field_array(v, key, 0)
            if layout is not None:
                fields.append(_Field(key, f"{name}/{key}", (None,), dt, False, layout, 0))
            else:
                # A field of no items is fine if it turns out ragged along
                # its empty axis (a graph without edges); the load checks.
                rec = _record_of(v)
                fields.append(_Field(key, f"{name}/{key}", a.shape, dt, is_torch, scalar=_scalar_of(v),
                                     record=rec, rkind=_rkind(v) if rec is not None else None))
        return cls(kind, fields)

    def to_json(self, length):
        return {"format": _FORMAT_RAGGED if self.ragged else _FORMAT, "kind": self.kind, "len": length,
                "fields": [f.to_json() for f in self.fields]}

    @classmethod
    def from_json(cls, name, meta):
        if meta.get("format") not in _FORMATS:
            raise BadDataset(f"ddstore: bad geometry: dataset {name!r}: metadata of format {meta.get('format')!r}: "
                             f"want one of {list(_FORMATS)}")
        return cls(meta["kind"], [_Field(f["key"], f"{name}/{f['key']}", f["shape"], f["dtype"], f["torch"],
                                         f.get("layout", "fixed"), f.get("axis"), f.get("scalar"),
                                         record_dtype(f["record"]) if "record" in f else None, f.get("rkind"))
                                  for f in meta["fields"]])

    def select(self, keys):
        """The schema of the fields `keys` (a list keeps the kind; a single
        key gives that field bare; None keeps everything)."""
        if keys is None:
            return self
        single = not isinstance(keys, (list, tuple))
        want = [keys] if single else list(keys)
        missing = [k for k in want if k not in self.by_key]
        if missing:
            raise UnknownField(f"ddstore: bad argument: unknown field {missing[0]!r}: fields are {list(self.by_key)}")
        fields = [self.by_key[k] for k in want]
        return _Schema("bare" if single or self.kind == "tensor" else self.kind, fields)

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
        against the schema: the same structure, and every field of the dtype
        and rank of sample 0's (fixed fields: of its shape too; a field whose
        sizes vary is the load's to find, see dataset.py)."""
        kind, items = _items(sample)
        if kind != self.kind or [k for k, _ in items] != [f.key for f in self.fields]:
            raise ArgumentError(f"ddstore: bad argument: sample at index {index}: its structure ({kind}, fields "
                                f"{[k for k, _ in items]}) differs from sample 0's ({self.kind}, fields "
                                f"{[f.key for f in self.fields]})")
        out = []
        for f, (_, v) in zip(self.fields, items):
            a, dt, _, layout = _field_array(v, f.key, index)
            if f.layout in ("str", "bytes") or layout is not None:
                if layout != f.layout:
                    got = layout or f"{dt} of shape {_shape_words(a.shape)}"
                    raise ArgumentError(f"ddstore: bad argument: sample at index {index}, field {f.key!r}: {got}, "
                                        f"sample 0 has {f.describe()}: every sample's field keeps one type")
            elif f.record is not None or _record_of(v) is not None:
                if _record_of(v) != f.record or a.ndim != len(f.shape):
                    got = (f"records {_record_of(v)}" if _record_of(v) is not None else f"{dt}") + \
                        f" of shape {_shape_words(a.shape[:-1] if _record_of(v) is not None else a.shape)}"
                    raise ArgumentError(f"ddstore: bad argument: sample at index {index}, field {f.key!r}: {got}, "
                                        f"sample 0 has {f.describe()}: every sample's field keeps one dtype and rank")
            elif dt != f.dtype or a.ndim != len(f.shape):
                raise ArgumentError(f"ddstore: bad argument: sample at index {index}, field {f.key!r}: {dt} of shape "
                                    f"{_shape_words(a.shape)} ({a.ndim} dimensions), sample 0 has {f.dtype} of shape "
                                    f"{_shape_words(f.shape)} ({len(f.shape)} dimensions): every sample's field "
                                    f"keeps one dtype and rank, only its sizes may vary")
            out.append(a)
        return out

    def sample(self, arrays, device):
        """One sample from per-field arrays: a fixed field's row, a ragged
        field's (units, lengths) of one row."""
        vals = []
        for f, a in zip(self.fields, arrays):
            vals.append(f.unit_value(a[0], device) if f.ragged else f.value(a, device))
        return self.pack(vals)

    def samples(self, arrays, n, device):
        """n samples as views into per-field batch arrays (a ragged field's
        values are cut at its rows' offsets)."""
        cols = [self.column(f, a, n, device) for f, a in zip(self.fields, arrays)]
        return [self.pack([c[j] for c in cols]) for j in range(n)]

    @staticmethod
    def column(f, a, n, device):
        """Field f of n samples, one value each, from its batch array a."""
        if f.ragged:
            values, lengths = a
            off = _offsets(lengths)
            if f.layout == "ragged" and f.torch:
                t = f.tensor(values, device)
                return [t[off[j]:off[j + 1]].movedim(0, f.axis).contiguous() if f.axis
                        else t[off[j]:off[j + 1]] for j in range(n)]
            return [f.unit_value(values[off[j]:off[j + 1]], device) for j in range(n)]
        if f.scalar == "py":
            return a.tolist()
        b = f.batch_value(a, device)
        if f.torch:
            return b.unbind(0)
        if f.scalar == "np" or f.rkind in ("void", "record"):
            return [b[j] for j in range(n)]  # numpy scalars, records
        # a[j, ...] keeps a 0-d row an array; a[j] would give a numpy scalar.
        return [b[j, ...] for j in range(n)]

    def collated(self, arrays, device, collate=None):
        """What default_collate makes of the samples: tensors (numpy fields
        too), a tuple's fields as a list. With ragged fields, or with a
        collate of ddstore.torch.collate, that collate's batch (default
        Packed)."""
        if collate is None:
            recs = [f.key for f in self.fields if f.record is not None]
            if recs:
                raise ArgumentTypeError(f"ddstore: bad argument: field {recs[0]!r} holds numpy structured records, "
                                        f"which default_collate cannot batch: pass a collate_fn")
        if collate is None and not self.ragged:
            vals = [f.tensor(a, device) for f, a in zip(self.fields, arrays)]
            return list(vals) if self.kind == "tuple" else self.pack(vals)
        if collate is None:
            from .collate import Packed
            collate = Packed()
        return collate._ddstore_batch(self, arrays, device)


def _offsets(lengths):
    off = np.zeros(len(lengths) + 1, np.int64)
    np.cumsum(lengths, out=off[1:])
    return off.tolist()


def _shape_words(shape):
    """A shape for errors, its varying axis as "*"."""
    return "(" + ", ".join("*" if d is None else str(d) for d in shape) + ("," if len(shape) == 1 else "") + ")"


class WindowValues(list):
    """A field's values over a window of rows (WindowedDataset over a dataset
    not of this package) where they cannot be stacked: of different shapes,
    or str and bytes. The collates of ddstore.torch.collate take a batch of
    windows holding such values as the batch of their rows, window after
    window."""

    __slots__ = ()


def _items(sample):
    """(kind, [(key, value)]) of a source sample."""
    if isinstance(sample, dict):
        return "dict", list(sample.items())
    if isinstance(sample, tuple):  # a namedtuple comes back as a plain tuple
        return "tuple", list(enumerate(sample))
    if isinstance(sample, list):
        return "list", list(enumerate(sample))
    return "tensor", [(0, sample)]


def _field_array(v, key=None, index=None):
    """(numpy array in storage dtype, ddstore dtype name, came from torch,
    layout "str"/"bytes" or None for an array)."""
    if isinstance(v, torch.Tensor):
        if v.device.type != "cpu":
            v = v.cpu()
        a, dt = as_array(v)
        return a, dt, True, None
    rec = _record_of(v)
    if rec is not None:
        if rec.hasobject:
            raise _unstorable(v, key, index, f"records of {rec} (with Python objects)")
        a = np.asarray(v)
        if not a.flags.c_contiguous:
            a = a.copy()
        return a.reshape(-1).view(np.uint8).reshape(*a.shape, rec.itemsize), "uint8", False, None
    if isinstance(v, (np.ndarray, np.generic, int, float, bool)) and not isinstance(v, (np.str_, np.bytes_)):
        a = np.asarray(v)
        if a.dtype.kind in "OUSV":
            raise _unstorable(v, key, index, f"a numpy array of {a.dtype}")
        a, dt = as_array(a)
        return a, dt, False, None
    if isinstance(v, str):
        return np.frombuffer(v.encode("utf-8"), np.uint8), "uint8", False, "str"
    if isinstance(v, (bytes, bytearray, memoryview)):
        return np.frombuffer(bytes(v), np.uint8), "uint8", False, "bytes"
    raise _unstorable(v, key, index, f"a {type(v).__name__}")


def _record_of(v):
    """The structured dtype of a record or an array of records, else None."""
    if isinstance(v, (np.ndarray, np.void)) and v.dtype.names is not None:
        return v.dtype
    return None


def _rkind(v):
    if isinstance(v, np.void):
        return "record" if isinstance(v, np.record) else "void"
    return "recarray" if isinstance(v, np.recarray) else "array"


def _scalar_of(v):
    """"py" for a Python number, "np" for a numpy scalar, else None."""
    if isinstance(v, np.generic):  # before float: np.float64 is a float too
        return None if isinstance(v, np.void) else "np"
    if isinstance(v, (bool, int, float)):
        return "py"
    return None


def record_json(dt):
    """A structured dtype as JSON that record_dtype makes it back from: every
    field's name, title, dtype and offset, the itemsize and alignment, so
    that nested, aligned and padded records keep their layout."""
    if dt.names is None:
        if dt.subdtype is not None:
            base, shape = dt.subdtype
            return {"sub": record_json(base), "shape": list(shape)}
        return dt.str
    fields = []
    for name in dt.names:
        f = dt.fields[name]
        fields.append({"name": name, "dtype": record_json(f[0]), "offset": f[1],
                       **({"title": f[2]} if len(f) > 2 and f[2] is not None else {})})
    return {"fields": fields, "itemsize": dt.itemsize, "aligned": bool(dt.isalignedstruct)}


def record_dtype(j):
    """The dtype record_json described."""
    if isinstance(j, str):
        return np.dtype(j)
    if "sub" in j:
        return np.dtype((record_dtype(j["sub"]), tuple(j["shape"])))
    spec = {"names": [f["name"] for f in j["fields"]], "formats": [record_dtype(f["dtype"]) for f in j["fields"]],
            "offsets": [f["offset"] for f in j["fields"]], "itemsize": j["itemsize"]}
    if any("title" in f for f in j["fields"]):
        spec["titles"] = [f.get("title") for f in j["fields"]]
    return np.dtype(spec, align=j["aligned"])


def _unstorable(v, key, index, what):
    r = repr(v)
    if len(r) > 60:
        r = r[:57] + "..."
    where = "" if index is None else f"sample at index {index}, "
    where += "" if key is None else f"field {key!r}: "
    return ArgumentTypeError(f"ddstore: bad argument: {where}{what} ({r}): want a tensor, a numpy array, a number, "
                             f"str or bytes, or a tuple, list or dict of them (pass encode= to store other objects, "
                             f"e.g. as pickle.dumps bytes)")


def _check_indices(indices, n, name):
    """indices as a 1-d int64 array, every one in [0, n) (negative ones are
    refused, as DDStore refuses them)."""
    idx = np.asarray(indices)
    if idx.ndim != 1:
        raise ArgumentTypeError(f"ddstore: bad argument: indices of shape {idx.shape}: want a 1-d sequence of integers")
    if idx.size == 0:
        return np.empty(0, np.int64)
    if idx.dtype.kind not in "iu":
        raise ArgumentTypeError(f"ddstore: bad argument: indices of type {idx.dtype}: want integers")
    idx = idx.astype(np.int64, copy=False)
    if not below(idx, n):
        k = int(np.flatnonzero((idx < 0) | (idx >= n))[0])
        raise IndexOutOfRange(f"ddstore: index out of range: dataset {name!r}: indices[{k}] = {int(idx[k])} "
                              f"not in [0, {n})")
    return idx


def _check_index(i, n, name):
    i = operator.index(i)
    if not 0 <= i < n:
        raise IndexOutOfRange(f"ddstore: index out of range: dataset {name!r}: index {i} not in [0, {n})")
    return i


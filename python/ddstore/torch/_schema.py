"""The schema of a dataset's samples: their kind (a bare tensor, a tuple,
list or dict of fields) and each field's key, row shape and dtype, the
variable that stores it, and how a row comes back (tensor or numpy array).
Named so as not to be confused with the store's layout, which places rows
on ranks."""

import operator

import numpy as np
import torch

from .._errors import ArgumentError, ArgumentTypeError, BadDataset, IndexOutOfRange, UnknownField
from ..dtypes import as_array, numpy_dtype

# The reserved variables of a dataset (dataset.py) and the format tag of its
# metadata row.
_META, _FIELDS = "__meta__", "__fields__"
_FORMAT = "ddstore.torch/1"


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


class _Schema:
    """The schema of a sample: kind ("tensor", "tuple", "list", "dict", or
    "bare" for one field picked by WindowedDataset) and its fields in order."""

    def __init__(self, kind, fields):
        self.kind, self.fields = kind, list(fields)
        self.by_key = {f.key: f for f in self.fields}

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
                if key in (_META, _FIELDS):
                    raise ArgumentError(f"ddstore: bad argument: dataset {name!r}: dict key {key!r} is reserved")
            a, dt, is_torch = _field_array(v)
            if a.size == 0:
                raise ArgumentError(f"ddstore: bad argument: dataset {name!r}: field {key!r} of shape {a.shape} "
                                    f"holds no items")
            fields.append(_Field(key, f"{name}/{key}", a.shape, dt, is_torch))
        return cls(kind, fields)

    def to_json(self, length):
        return {"format": _FORMAT, "kind": self.kind, "len": length,
                "fields": [{"key": f.key, "shape": list(f.shape), "dtype": f.dtype, "torch": f.torch}
                           for f in self.fields]}

    @classmethod
    def from_json(cls, name, meta):
        if meta.get("format") != _FORMAT:
            raise BadDataset(f"ddstore: bad geometry: dataset {name!r}: metadata of format {meta.get('format')!r}: "
                             f"want {_FORMAT!r}")
        return cls(meta["kind"], [_Field(f["key"], f"{name}/{f['key']}", f["shape"], f["dtype"], f["torch"])
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
        against the schema (every row of a variable has one shape)."""
        kind, items = _items(sample)
        if kind != self.kind or [k for k, _ in items] != [f.key for f in self.fields]:
            raise ArgumentError(f"ddstore: bad argument: sample at index {index}: its structure ({kind}, fields "
                                f"{[k for k, _ in items]}) differs from sample 0's ({self.kind}, fields "
                                f"{[f.key for f in self.fields]})")
        out = []
        for f, (_, v) in zip(self.fields, items):
            a, dt, _ = _field_array(v)
            if a.shape != f.shape or dt != f.dtype:
                raise ArgumentError(f"ddstore: bad argument: sample at index {index}, field {f.key!r}: {dt} of shape "
                                    f"{a.shape}, sample 0 has {f.dtype} of shape {f.shape}: samples must have fixed "
                                    f"shapes")
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
    raise ArgumentTypeError(f"ddstore: bad argument: a sample's field of type {type(v).__name__}: want a tensor, "
                            f"a numpy array, or a tuple, list or dict of them")


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


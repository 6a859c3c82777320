"""Ragged variables (Store.add_ragged, get_ragged, ragged_sizes,
get_ragged_row): rows of a length of their own, kept as the ranks' values
concatenated plus the node's index of where each row starts. Rows of this
node are copied out of shared memory; the others come from the agent in
one request, into a registered region or through staging."""

import time

import numpy as np

from . import _wire
from ._errors import ArgumentError, BadBuffer, GeometryError
from ._vars import MAX_ROWS_PER_READ, check_rows, row_indices
from .dtypes import as_array, as_destination


def add(store, name, values, lengths, offsets, backing=None, total=None):
    """Store.add_ragged: check the rows' geometry and the backing pair,
    then create the variable (a bad one fails the add on every rank)."""
    from .store import _check_ragged_backing
    try:
        a, dt = as_array(values)
        if a.ndim == 0:
            raise GeometryError(f"ddstore: bad geometry: variable {name!r}: 0-d values have no rows")
        shape = tuple(int(d) for d in a.shape[1:])
        if any(d < 1 for d in shape):
            raise GeometryError(f"ddstore: bad geometry: variable {name!r}: trailing shape {list(shape)}: "
                                f"want dimensions >= 1")
        lens = row_lengths(name, lengths, offsets)
        units = int(lens.sum()) if lens.size else 0
        if units != a.shape[0]:
            raise GeometryError(f"ddstore: bad geometry: variable {name!r}: lengths add up to {units} units, "
                                f"but the values have {a.shape[0]} (values of shape {a.shape})")
        spec, total = _check_ragged_backing(name, backing, total, int(lens.shape[0]))
    except Exception as e:  # whatever the type: the other ranks must hear of it (Store._create)
        return store._create(name, None, 0, 1, 1, "", bad=e, kind=_wire.KIND_RAGGED)
    disp = int(np.prod(shape, dtype=np.int64)) if shape else 1
    return store._create(name, (a, lens), int(lens.shape[0]), disp, a.dtype.itemsize, dt, kind=_wire.KIND_RAGGED,
                         items=units, shape=shape, backing=spec, total=total or 0)


def sizes(v, name, indices):
    """Store.ragged_sizes of v: lengths from the node's index, no request."""
    only(v, name)
    idx = check_rows(row_indices(indices), v.total, v.label)
    return v.index[idx + 1] - v.index[idx]


def get(store, v, name, indices, out):
    """Store.get_ragged of v: (values, lengths)."""
    only(v, name)
    idx = check_rows(row_indices(indices), v.total, v.label)
    index, ub = v.index, v.rb
    starts = index[idx]
    lengths = index[idx + 1] - starts
    units = int(lengths.sum())
    dt = v.npdtype if v.npdtype is not None else np.dtype(np.uint8)
    if out is None:
        out = np.empty((units,) + v.shape, dtype=dt)
        flat = out.reshape(-1).view(np.uint8)
    else:
        o, odt = as_destination(out)
        if v.dtype and odt != v.dtype:
            raise BadBuffer(f"ddstore: bad buffer: variable {name!r} holds {v.dtype}, destination is {odt}")
        if not o.flags.c_contiguous or not o.flags.writeable:
            raise BadBuffer(f"ddstore: bad buffer: variable {name!r}: destination must be C-contiguous and "
                            f"writable")
        if o.nbytes < units * ub:
            raise BadBuffer(f"ddstore: bad buffer: variable {name!r}: destination of {o.nbytes} bytes for "
                            f"{idx.shape[0]} ragged rows of {units * ub} bytes: want at least {units * ub} "
                            f"({units} units of shape {list(v.shape)})")
        flat = o.reshape(-1).view(np.uint8)
        out = o.reshape(-1)[:units * v.disp].reshape((units,) + v.shape)
    t0 = time.perf_counter()
    owner = np.searchsorted(v.prefix, idx, side="right") - 1
    if _all_local(v, owner):
        # Every row in this node's memory: the rows' bytes joined in one
        # call, in batch order, straight into the destination.
        first = v.first_unit[owner]
        s0, s1 = (starts - first) * ub, (starts + lengths - first) * ub
        np.concatenate([v.local[r][a:b] for r, a, b in zip(owner.tolist(), s0.tolist(), s1.tolist())] or
                       [flat[:0]], out=flat[:units * ub])
        _count(v, idx.shape[0], units * ub, 0, 0, t0)
        return out, lengths
    pos = np.zeros(idx.shape[0] + 1, dtype=np.int64)
    np.cumsum(lengths, out=pos[1:])
    remote = []
    for r in np.unique(owner).tolist():
        sel = np.flatnonzero(owner == r)
        src = v.local[r]
        if src is None:
            remote.append(sel)
            continue
        s0 = (starts[sel] - v.first_unit[r]) * ub
        d0, nb = pos[sel] * ub, lengths[sel] * ub
        for a, b, n in zip(d0.tolist(), s0.tolist(), nb.tolist()):
            flat[a:a + n] = src[b:b + n]
    nremote = nstored = 0
    if remote:
        sel = np.concatenate(remote) if len(remote) > 1 else remote[0]
        sel = sel[lengths[sel] > 0]
        nremote = sel.shape[0]
        nstored = int((idx[sel] >= v.held).sum())  # only in the backing file
        for lo in range(0, nremote, MAX_ROWS_PER_READ):
            part = sel[lo:lo + MAX_ROWS_PER_READ]
            _fetch(store, v, flat, idx[part], pos[part] * ub, lengths[part] * ub)
    _count(v, idx.shape[0], units * ub, nremote, nstored, t0)
    return out, lengths


def _all_local(v, owner):
    """Whether every row of owner's ranks lies in this node's memory."""
    lo, hi = int(owner.min(initial=0)), int(owner.max(initial=0))
    if lo == hi:
        return v.local[lo] is not None
    return all(v.local[r] is not None for r in range(lo, hi + 1)) or \
        all(v.local[r] is not None for r in np.unique(owner).tolist())


def _count(v, rows, nbytes, nremote, nstored, t0):
    p = v.profile
    p["calls"] += 1
    p["rows"] += rows
    p["bytes"] += nbytes
    p["local_rows"] += rows - nremote
    p["storage_rows"] += nstored
    if nremote:
        p["remote_rows"] += nremote - nstored
        p["remote_calls"] += 1
        p["wait_s"] += time.perf_counter() - t0


def _fetch(store, v, flat, globals_, at, size):
    """Rows globals_ of other nodes into flat[at[k]:at[k] + size[k]]:
    one request to the agent, rows written into a registered region
    (flat itself when it lies in a buffer from alloc_recv)."""
    region, base = store._recv.region_of(flat)

    def read(lane):
        if region is not None:
            offsets = base + at
            rid = region.id
        else:
            offsets = np.zeros(size.shape[0], dtype=np.int64)
            np.cumsum(size[:-1], out=offsets[1:])
            total = int(size.sum())
            stage = lane.staging(total, store._timeout)
            rid = stage.id
        enc = _wire.Encoder().string(v.name).u32(rid).i64(v.id).i64s(globals_).i64s(offsets)
        lane.call(_wire.OP_READ, enc)
        if region is None:
            buf = stage.array()
            for a, o, n in zip(at.tolist(), offsets.tolist(), size.tolist()):
                flat[a:a + n] = buf[o:o + n]

    store._pool.read(read, region)


def only(v, name):
    if not v.ragged:
        raise ArgumentError(f"ddstore: bad argument: variable {name!r} has rows of one size ({v.rb} bytes): "
                            f"read it with get or get_batch")


def row_lengths(name, lengths, offsets):
    """add_ragged's row lengths (int64), from lengths or offsets, checked."""
    if (lengths is None) == (offsets is None):
        raise ArgumentError(f"ddstore: bad argument: variable {name!r}: give lengths or offsets, one of them")
    if offsets is not None:
        off = np.asarray(offsets)
        if off.ndim != 1 or off.shape[0] < 1 or (off.dtype.kind not in "iu"):
            raise ArgumentError(f"ddstore: bad argument: variable {name!r}: offsets of shape {off.shape} and type "
                                f"{off.dtype}: want a 1-d sequence of rows + 1 integers")
        off = off.astype(np.int64)
        if off[0] != 0:
            raise GeometryError(f"ddstore: bad geometry: variable {name!r}: offsets[0] = {int(off[0])}: want 0")
        lens = np.diff(off)
        bad = np.flatnonzero(lens < 0)
        if bad.size:
            i = int(bad[0]) + 1
            raise GeometryError(f"ddstore: bad geometry: variable {name!r}: offsets[{i}] = {int(off[i])} after "
                                f"offsets[{i - 1}] = {int(off[i - 1])}: offsets must not decrease")
        return lens
    lens = np.asarray(lengths)
    if lens.ndim != 1 or (lens.size and lens.dtype.kind not in "iu"):
        raise ArgumentError(f"ddstore: bad argument: variable {name!r}: lengths of shape {lens.shape} and type "
                            f"{lens.dtype}: want a 1-d sequence of integers")
    lens = lens.astype(np.int64)
    bad = np.flatnonzero(lens < 0)
    if bad.size:
        i = int(bad[0])
        raise GeometryError(f"ddstore: bad geometry: variable {name!r}: lengths[{i}] = {int(lens[i])}: want >= 0")
    return lens

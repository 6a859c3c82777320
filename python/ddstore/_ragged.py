"""Ragged variables (Store.add_ragged, get_ragged, ragged_sizes,
get_ragged_row): rows of a length of their own, kept as the ranks' values
concatenated plus the node's index of where each row starts. Rows of this
node are copied out of shared memory; the others come from the agent in
one request, into a registered region or through staging."""

import time
from bisect import bisect_right
from itertools import accumulate

import numpy as np

from . import _direct, _wire
from ._errors import ArgumentError, BadBuffer, GeometryError
from ._vars import MAX_ROWS_PER_READ, check_rows, distinct, row_indices
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
    ext = v.extents[idx]
    return ext[:, 1] - ext[:, 0]


class Alloc:
    """A destination of get made once the rows' extents are known:
    make(units) returns an array of at least that many units (or None: a
    new one), checked as any destination."""

    __slots__ = ("make",)

    def __init__(self, make):
        self.make = make


class Plan:
    """Where the rows of one batch lie, worked out once for the reads of
    several variables of one sharding (the same rows per rank, the same
    shards mapped on this node, the same owners' addresses: a dataset's
    fields) with the same indices, and shared by them (Store._start_reads):
    each row's owner, the positions of this node's rows (here, of owners
    ho) and of the others' (remote, of owners rowner: rglob their global
    indices, rows those encoded for a Fetch, k of them, nstored of them
    only in the backing file), and the one address of the remote owners
    (None: several nodes, one without an address, or rows of the file).
    Made only for a batch with rows of other nodes (of()); a read of a
    variable it does not fit (fits()) plans for itself."""

    __slots__ = ("idx", "bounds", "addrs", "mapped", "owner", "here", "ho", "remote", "rowner", "rglob", "rows", "k",
                 "nstored", "addr", "groups", "here_l", "ho_l", "remote_l")

    @classmethod
    def of(cls, store, v, idx):
        """The plan of rows idx (checked int64) of v, or None when every
        row is of this node (each read's own path is then as short) or v
        is read by MPI."""
        if not idx.shape[0] or v.win is not None:
            return None
        mapped = [x is not None for x in v.local]
        owner = v.upper.searchsorted(idx, side="right")
        away = np.array(mapped)[owner] == False  # noqa: E712 - element-wise
        remote = away.nonzero()[0]
        if not remote.shape[0]:
            return None
        p = cls()
        p.idx, p.bounds, p.addrs, p.mapped, p.owner = idx, v.bounds, v.addrs, mapped, owner
        p.here = (~away).nonzero()[0]
        p.ho = owner[p.here]
        p.remote, p.rowner = remote, owner[remote]
        p.rglob = idx[remote]
        p.k = remote.shape[0]
        p.nstored = int(np.count_nonzero(p.rglob >= v.held)) if v.total > v.held else 0
        p.rows = p.rglob.astype("<i8", copy=False).tobytes()
        p.addr = None if p.nstored else store._direct.addr_of(v, distinct(p.rowner))
        p.groups = None
        # As lists too, for the rows' copies a row at a time (_planned).
        p.here_l, p.ho_l, p.remote_l = p.here.tolist(), p.ho.tolist(), remote.tolist()
        return p

    def fits(self, v):
        """Whether v is of the plan's sharding."""
        return (v.win is None and (v.bounds is self.bounds or v.bounds == self.bounds) and v.addrs == self.addrs
                and [x is not None for x in v.local] == self.mapped)

    def local_groups(self):
        """[(owner, positions)] of this node's rows, by owner (rows of
        fixed size are copied an owner at a time)."""
        g = self.groups
        if g is None:
            here, ho = self.here, self.ho
            if not here.shape[0]:
                g = []
            elif int(ho[0]) == int(ho[-1]) and (ho == ho[0]).all():
                g = [(int(ho[0]), here)]
            else:
                g = [(r, here[ho == r]) for r in distinct(ho)]
            self.groups = g
        return g


def get(store, v, name, indices, out, jobs=None, plan=None):
    """Store.get_ragged of v: (values, lengths). With jobs (a list), the
    rows of other nodes are not read here: the read of them is appended to
    jobs (_direct.Job), for the caller to run with other reads' (Store._read_many),
    and values holds them once it has. plan: the batch's Plan (indices
    then its checked rows, v of its sharding), which says where the rows
    lie."""
    only(v, name)
    if plan is not None:
        return _planned(store, v, plan, out, jobs)
    idx = row_indices(indices)
    n = idx.shape[0]
    lo, hi = (int(idx.min()), int(idx.max())) if n else (0, 0)
    if lo < 0 or hi >= v.total:
        check_rows(idx, v.total, v.label)  # names the first bad index
    ub = v.rb
    # Each row's extent, [start, end) in units: one lookup of the index's
    # (offsets[g], offsets[g + 1]) pairs.
    ext = v.extents[idx]
    starts = ext[:, 0]
    lengths = ext[:, 1] - starts
    units = int(lengths.sum())
    out, flat = _destination(v, name, n, units, out)
    t0 = time.perf_counter()
    if not n:
        _count(v, 0, 0, 0, 0, t0)
        return out, lengths
    views = v.views
    o0 = bisect_right(v.bounds, lo) - 1
    if hi < v.bounds[o0 + 1]:
        if views[o0] is not None:
            # The common case: every row in one shard of this node's memory,
            # copied row after row straight into the destination.
            _pack(flat, views[o0], (starts - int(v.first_unit[o0])) * ub, lengths * ub)
            _count(v, n, units * ub, 0, 0, t0)
            return out, lengths
        owner = None  # every row of one owner, of another node or the file
    else:
        owner = np.searchsorted(v.prefix, idx, side="right") - 1
        # Every row in memory and every shard this node's (one node: no
        # owner to look up), or every owner of the rows this node.
        if ((hi < v.held and None not in views[:-1])
                or all(views[r] is not None for r in distinct(owner))):
            _pack(flat, views, (starts - v.first_unit[owner]) * ub, lengths * ub, owner)
            _count(v, n, units * ub, 0, 0, t0)
            return out, lengths
    pos = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(lengths, out=pos[1:])
    if owner is None:
        sel = np.flatnonzero(lengths)
    else:
        remote = np.array([m is None for m in views])[owner]
        here = np.flatnonzero(~remote)
        if here.size:
            o = owner[here]
            _place(flat, views, o, (starts[here] - v.first_unit[o]) * ub, pos[here] * ub, lengths[here] * ub)
        sel = np.flatnonzero(remote & (lengths > 0))
    nremote = nstored = 0
    if sel.size:
        nremote = sel.shape[0]
        if v.total > v.held:
            nstored = int((idx[sel] >= v.held).sum())  # only in the backing file

        def through_agent():
            for lo in range(0, nremote, MAX_ROWS_PER_READ):
                part = sel[lo:lo + MAX_ROWS_PER_READ]
                _fetch(store, v, flat, idx[part], pos[part] * ub, lengths[part] * ub)
        direct = not nstored and nremote <= MAX_ROWS_PER_READ
        if jobs is not None:
            j = None
            if direct:
                j = store._direct.ragged_job(v, flat, idx[sel], (o0,) if owner is None else owner[sel],
                                             pos[sel] * ub, lengths[sel] * ub)
            if j is None:
                j = _direct.agent_job(None)
            j.t0 = t0
            j.done = lambda: _count(v, n, units * ub, nremote, nstored, j.t0)

            def fallback():
                through_agent()
                j.done()
            j.fallback = fallback
            jobs.append(j)
            return out, lengths
        if direct:
            # All on one other node, within the bound: straight to its
            # agent (_direct.py), else through the own agent.
            owners = (o0,) if owner is None else owner[sel]
            if store._direct.fetch_ragged(v, flat, idx[sel], owners, pos[sel] * ub, lengths[sel] * ub):
                _count(v, n, units * ub, nremote, nstored, t0)
                return out, lengths
        through_agent()
    _count(v, n, units * ub, nremote, nstored, t0)
    return out, lengths


def _destination(v, name, n, units, out):
    """get's destination of units units: (out as returned, its bytes)."""
    if type(out) is Alloc:
        out = out.make(units)
    if out is None:
        out = np.empty((units,) + v.shape, dtype=v.npdtype if v.npdtype is not None else np.dtype(np.uint8))
        return out, out.reshape(-1).view(np.uint8)
    if type(out) is np.ndarray and out.dtype == v.npdtype and v.dtype and v.dtype != "bfloat16":
        o = out  # a numpy array of the variable's own dtype: as_destination would say so, at more cost
        if not o.flags.writeable:
            as_destination(o)  # names the read-only destination as for any other
    else:
        o, odt = as_destination(out)
        if v.dtype and odt != v.dtype:
            raise BadBuffer(f"ddstore: bad buffer: variable {name!r} holds {v.dtype}, destination is {odt}")
    if not o.flags.c_contiguous or not o.flags.writeable:
        raise BadBuffer(f"ddstore: bad buffer: variable {name!r}: destination must be C-contiguous and writable")
    ub = v.rb
    if o.nbytes < units * ub:
        raise BadBuffer(f"ddstore: bad buffer: variable {name!r}: destination of {o.nbytes} bytes for {n} ragged "
                        f"rows of {units * ub} bytes: want at least {units * ub} ({units} units of shape "
                        f"{list(v.shape)})")
    o = o.reshape(-1)
    return o[:units * v.disp].reshape((units,) + v.shape), o.view(np.uint8)


def _planned(store, v, plan, out, jobs):
    """get with jobs of the rows plan says where they lie (some of them
    of other nodes): this node's copied, a job appended for the others.
    A batch's few rows are worked out as Python ints, a step a row, where
    each numpy operation over them would cost more than the whole loop."""
    t0 = time.perf_counter()
    idx = plan.idx
    n = idx.shape[0]
    ub = v.rb
    ext = v.extents[idx]
    lengths = ext[:, 1] - ext[:, 0]
    sl, ll = ext[:, 0].tolist(), lengths.tolist()
    pos = list(accumulate(ll, initial=0))
    units = pos[n]
    out, flat = _destination(v, v.label, n, units, out)
    dm = memoryview(flat)
    if plan.here_l:
        views, fu = v.views, v.first_unit.tolist()
        for k, o in zip(plan.here_l, plan.ho_l):
            nb, a, d = ll[k] * ub, (sl[k] - fu[o]) * ub, pos[k] * ub
            dm[d:d + nb] = views[o][a:a + nb]
    rl = plan.remote_l
    shared = all(ll[k] for k in rl)
    if not shared:  # empty rows of other nodes are not asked for
        rl = [k for k in rl if ll[k]]
        if not rl:
            _count(v, n, units * ub, 0, 0, t0)
            return out, lengths
    nremote = len(rl)
    at, size = [pos[k] * ub for k in rl], [ll[k] * ub for k in rl]
    total = sum(size)
    if shared:
        nstored, addr, rows = plan.nstored, plan.addr, plan.rows
    else:
        g = idx[rl]
        nstored = int(np.count_nonzero(g >= v.held)) if v.total > v.held else 0
        addr = None if nstored else store._direct.addr_of(v, distinct(plan.owner[rl]))
        rows = g.astype("<i8", copy=False).tobytes()
    j = None
    if addr is not None and nremote <= MAX_ROWS_PER_READ:
        a0 = at[0]
        tmp = None
        if at[-1] - a0 + size[-1] == total:  # neighbouring places: straight into flat
            dst = flat[a0:a0 + total]
        else:
            dst = tmp = np.empty(total, dtype=np.uint8)
        j = store._direct.planned_job(v, dst, nremote, rows, addr, total)
        if j is not None and tmp is not None:
            def place():
                sm, o = memoryview(tmp), 0
                for a, b in zip(at, size):
                    dm[a:a + b] = sm[o:o + b]
                    o += b
            j.place = place
    if j is None:
        j = _direct.agent_job(None)
    j.t0 = t0
    j.done = lambda: _count(v, n, units * ub, nremote, nstored, j.t0)

    def fallback():
        g, a, b = idx[rl], np.array(at, dtype=np.int64), np.array(size, dtype=np.int64)
        for lo in range(0, nremote, MAX_ROWS_PER_READ):
            part = slice(lo, lo + MAX_ROWS_PER_READ)
            _fetch(store, v, flat, g[part], a[part], b[part])
        j.done()
    j.fallback = fallback
    jobs.append(j)
    return out, lengths


def _pack(flat, src, s0, nb, owner=None):
    """Rows packed into flat, row k being nb[k] bytes from s0[k] of src
    (a memoryview; with owner, src[owner[k]] of a list of them): one
    memoryview slice assignment a row, the cheapest row copy Python has
    (numpy's slicing and np.concatenate cost three times as much a row)."""
    dm = memoryview(flat)
    p = 0
    if owner is None:
        for a, k in zip(s0.tolist(), nb.tolist()):
            q = p + k
            dm[p:q] = src[a:a + k]
            p = q
        return
    for m, a, k in zip(map(src.__getitem__, owner.tolist()), s0.tolist(), nb.tolist()):
        q = p + k
        dm[p:q] = m[a:a + k]
        p = q


def _place(flat, views, owner, s0, d0, nb):
    """Rows k of shards views[owner[k]] (bytes [s0[k], s0[k] + nb[k])) to
    flat[d0[k]:]."""
    dm = memoryview(flat)
    for m, a, d, k in zip(map(views.__getitem__, owner.tolist()), s0.tolist(), d0.tolist(), nb.tolist()):
        dm[d:d + k] = m[a:a + k]


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
            if at[-1] - at[0] == offsets[-1]:  # rows of neighbouring places: one copy
                flat[at[0]:at[0] + total] = buf[:total]
                return
            dm, sm = memoryview(flat), memoryview(buf)
            for a, o, n in zip(at.tolist(), offsets.tolist(), size.tolist()):
                dm[a:a + n] = sm[o:o + n]

    store._pool.read(read, region)
    if store._direct.moved:
        store._readdress(v)


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

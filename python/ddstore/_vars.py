"""A variable as one rank sees it (its table, the shards mapped on this
node, its MPI window), and the copying of its rows out of mapped shards."""

import math
import threading
import time

import numpy as np

from . import _wire
from ._errors import ArgumentError, FreedVariable, IndexOutOfRange, ProtocolError
from ._shm import KIND_INDEX, Segment
from .dtypes import numpy_dtype

# The most rows one read request to the agent names: a larger read goes in
# several.
MAX_ROWS_PER_READ = 1 << 20


class StaleTable(FreedVariable):
    """A table whose segments were dropped between the agent's answer and
    their mapping: the store looks the variable up again."""


class Var:
    """A variable as this rank sees it."""

    __slots__ = ("name", "label", "id", "disp", "itemsize", "rb", "dtype", "npdtype", "total", "held", "backing", "prefix",
                 "upper", "bounds", "shard_rows", "nodes", "addrs", "local", "typed", "own", "segs", "single",
                 "single_first", "stats", "quick_calls", "quick_rows", "win", "ragged", "shape", "index", "first_unit",
                 "extents", "views",
                 "marks", "mark", "void", "items", "fast", "fast_rank", "fast_all", "span", "addrs_at",
                 "quick")

    def __init__(self, t, own_rank):
        self.name, self.id, self.disp, self.itemsize, self.dtype = t.name, t.id, t.disp, t.itemsize, t.dtype
        # The name the store's user gave (name is the agents' name, with the
        # store's scope and replica group): the one errors show.
        self.label = t.name
        self.rb = t.disp * t.itemsize
        self.shard_rows = t.shard_rows
        self.prefix = np.concatenate(([0], np.cumsum(t.shard_rows))).astype(np.int64)
        # Each rank's end: a row's owner is one searchsorted (side "right").
        self.upper = self.prefix[1:]
        # Rows [held, total) are only in the backing file: the agent reads
        # them (owner index P below, like a rank on no node).
        self.held = int(self.prefix[-1])
        self.total = int(t.total) or self.held
        self.backing = t.backing
        self.nodes = [t.nodes[i] for i in t.rank_node]
        # Per rank: its node's peer address, for direct reads (_direct.py).
        self.addrs = [t.addrs[i] for i in t.rank_node]
        # When addrs were last taken from a table (Store._readdress).
        self.addrs_at = time.monotonic()
        self.local, self.segs, self.own = [None] * len(t.shard_rows), [], None
        # marks: the dropped word of each mapped segment (stale()); mark[r]
        # rank r's, for get()'s one-shard path.
        self.marks, self.mark = [], [None] * (len(t.shard_rows) + 1)
        # A ragged variable (_wire.KIND_RAGGED): rows of a length of their
        # own. index is the node's index of every row (N+1 job-wide offsets,
        # in units of shape's items), mapped read-only from the agent's
        # segment; first_unit[r] is rank r's first unit; local[r] is then a
        # local shard's values (uint8), never written after publication.
        self.ragged = t.kind == _wire.KIND_RAGGED
        self.shape = tuple(int(x) for x in t.shape)
        self.index = self.first_unit = self.extents = None
        try:
            if self.ragged:
                if not t.index:
                    raise ProtocolError(f"ddstore: protocol error: the agent's table of ragged variable {t.name!r} "
                                        f"names no index")
                seg = Segment(t.index, writable=False)
                self.segs.append(seg)
                self.marks.append(seg.mark)
                if seg.dropped():
                    raise StaleTable(f"ddstore: variable freed: index {t.index} of {t.name!r} was dropped since the "
                                     f"agent answered")
                self.index = seg.offsets
                self.first_unit = np.concatenate(([0], np.cumsum(t.shard_items))).astype(np.int64)
                # With a backing file the index holds every row, the file's
                # too: more units than the shards.
                held_units = int(self.first_unit[-1])
                units_ok = int(self.index[-1]) == held_units or (self.backing and int(self.index[-1]) >= held_units)
                if seg.kind != KIND_INDEX or seg.nrows != self.total or not units_ok:
                    raise ProtocolError(f"ddstore: protocol error: index {t.index} does not match the table of "
                                        f"{t.name!r}")
                # Row g's extent, (offsets[g], offsets[g + 1]), as one row of
                # two: a batch's extents are one fancy lookup.
                self.extents = np.lib.stride_tricks.as_strided(self.index, (self.total, 2), (8, 8), writeable=False)
            for r, path in enumerate(t.paths):
                if not path:
                    continue
                seg = Segment(path, writable=(r == own_rank and not self.ragged))
                self.segs.append(seg)
                self.marks.append(seg.mark)
                self.mark[r] = seg.mark
                if seg.dropped() or (seg.rank, seg.nrows, seg.disp, seg.itemsize) != (r, t.shard_rows[r], t.disp,
                                                                                       t.itemsize):
                    # Freed since the agent answered: the path may be a
                    # newer variable's segment by now.
                    raise StaleTable(f"ddstore: variable freed: segment {path} is not of the table of {t.name!r} "
                                     f"looked up (freed since)")
                self.local[r] = seg.values if self.ragged else seg.rows
                if r == own_rank and not self.ragged:
                    self.own = seg.rows
        except BaseException:
            self.unmap()
            raise
        # The one local rank holding every row, when there is one: a batch
        # then needs no owner lookup at all.
        nonempty = [r for r, n in enumerate(t.shard_rows) if n > 0]
        self.single = self.local[nonempty[0]] if len(nonempty) == 1 and self.local[nonempty[0]] is not None \
            and self.total == self.held else None
        self.single_first = int(self.prefix[nonempty[0]]) if self.single is not None else 0
        # The fast path of get(): prefix sums as a list (bisect), and each
        # local shard as items of the variable's own type.
        self.bounds = [int(x) for x in self.prefix] + [self.total]
        self.npdtype = numpy_dtype(self.dtype) if self.dtype else None
        self.typed = [None] * len(self.local)
        if self.npdtype is not None and not self.ragged:
            for r, rows in enumerate(self.local):
                if rows is not None:
                    self.typed[r] = rows.view(self.npdtype).reshape(rows.shape[0], self.disp)
        # Rows under 1 KiB: each local shard as one item per row of a
        # row-sized void dtype, for get_batch's fast path (copy_rows).
        self.void = np.dtype((np.void, self.rb)) if 0 < self.rb < 1024 and not self.ragged else None
        self.items = [None if rows is None or self.void is None else rows.view(self.void).reshape(-1)
                      for rows in self.local]
        # get_batch's fast path, per local shard r (None elsewhere): its
        # first row, its rows, its void items (rows under 1 KiB) or None,
        # its rows as uint8, its dropped word; made once, not per call.
        # fast_rank: the one shard holding every row, when there is one
        # (no lookup of the owner at all).
        self.fast = [None if rows is None or self.ragged or self.npdtype is None else
                     (int(self.prefix[r]), int(t.shard_rows[r]), self.items[r], rows, self.mark[r])
                     for r, rows in enumerate(self.local)]
        self.fast_rank = nonempty[0] if self.single is not None else None
        self.quick = quick_shard(self.fast, self.typed, self.npdtype, self.itemsize)
        # Whether every row is in a shard of this node (none only in a
        # backing file): a batch of several owners then needs no request.
        self.fast_all = self.total == self.held and all(f is not None or k == 0
                                                        for f, k in zip(self.fast, t.shard_rows))
        self.span = node_span(self.fast, t.shard_rows, self.rb, self.void) if self.fast_all else None
        # Past the last rank: the backing file's rows, never local.
        self.fast.append(None)
        self.local.append(None)
        self.typed.append(None)
        self.items.append(None)
        # A ragged variable's local shards as memoryviews: a row is then
        # copied by one slice assignment, a third of what numpy's slicing
        # costs a row of a batch.
        self.views = [memoryview(x) if x is not None and self.ragged else None for x in self.local]
        self.stats = {"calls": 0, "rows": 0, "bytes": 0, "local_rows": 0, "remote_rows": 0, "storage_rows": 0,
                      "remote_calls": 0, "wait_s": 0.0, "onesided_rows": 0,
                      "direct_rows": 0}
        # get_batch's shortest path counts its calls and rows here, two
        # increments where the profile's four keys cost it a tenth of a
        # 64-byte batch; profile adds them in when read.
        self.quick_calls = self.quick_rows = 0
        # The MPI window over the job's shards (Store(method="mpi")), or None.
        self.win = None

    @property
    def profile(self):
        """The variable's counters (get_profile), the shortest path's
        added in."""
        p = self.stats
        c = self.quick_calls
        if c:
            n = self.quick_rows
            self.quick_calls = self.quick_rows = 0
            p["calls"] += c
            p["rows"] += n
            p["bytes"] += n * self.rb
            p["local_rows"] += n
        return p

    def stale(self):
        """Whether the agent has dropped a segment this variable maps: rows
        copied out of it before this says so may be a freed variable's. Only
        loads of mapped words: no syscall, no request."""
        for m in self.marks:
            if m[0]:
                return True
        return False

    def unmap(self):
        self.marks, self.mark = [], [None] * len(self.mark)
        self.local = [None] * len(self.local)
        self.typed = [None] * len(self.local)
        self.items = [None] * len(self.local)
        self.fast = [None] * len(self.local)
        self.fast_rank = None
        self.fast_all = False
        self.quick = None
        self.span = None
        self.views = [None] * len(self.local)
        self.own = self.single = self.index = self.extents = None
        for s in self.segs:
            s.close()
        self.segs = []


# Rows a gather of several owners places at positions of a batch (1 KiB to
# 32 KiB) are gathered into a staging buffer of this thread, _STAGE_BYTES
# at a time (hot in cache), and placed from there: numpy's take into a
# buffer and one fancy assignment, where a loop over the rows costs a
# Python step each.
_PAGE = 4096
_STAGE_BYTES = 256 << 10
_STAGE_OFFSET = 2048
_stage = threading.local()


def _staging(nbytes):
    """This thread's staging buffer: nbytes (or more), _STAGE_OFFSET bytes
    into a page; allocated once and reused."""
    buf = getattr(_stage, "buf", None)
    if buf is None or buf.nbytes < nbytes:
        raw = np.empty(nbytes + _PAGE, np.uint8)
        off = (_STAGE_OFFSET - raw.ctypes.data) % _PAGE
        buf = _stage.buf = raw[off:off + nbytes]
    return buf[:nbytes]


def _copy_staged(dst, src, loc, pos):
    """copy_rows through this thread's staging buffer, a piece at a time."""
    rb = src.shape[1]
    step = max(1, _STAGE_BYTES // rb)
    stage = _staging(step * rb).reshape(step, rb)
    for a in range(0, loc.shape[0], step):
        lo = loc[a:a + step]
        m = lo.shape[0]
        src.take(lo, axis=0, out=stage[:m], mode="clip")
        if pos is None:
            dst[a:a + m] = stage[:m]
        else:
            dst[pos[a:a + m]] = stage[:m]


def quick_shard(fast, typed, npdtype, itemsize):
    """get_batch's shortest path, for a variable of which this node maps
    one shard with rows (DDStore's one rank per node, or a job of one
    rank): (dtype, strides of a C-contiguous (n, disp) destination, the
    shard as (rows, disp) of the dtype, strides of a 1-d destination and
    the shard as (rows,) for rows of one item (else None, None), the
    shard's first row, its rows, its dropped word); None for any other
    variable. A batch of that shard's rows is then one take straight
    from the shard into the destination itself, which take checks for
    shape and writability (a ValueError before any row moves): no view
    of the destination, no owner lookup."""
    held = [r for r, f in enumerate(fast) if f is not None and f[1] > 0]
    if len(held) != 1 or npdtype is None:
        return None
    r = held[0]
    first, rows, _, _, mark = fast[r]
    src2 = typed[r]
    disp = src2.shape[1]
    s2 = (disp * itemsize, itemsize)
    s1, src1 = ((itemsize,), src2.reshape(-1)) if disp == 1 else (None, None)
    return npdtype, s2, src2, s1, src1, first, rows, mark


def node_span(fast, shard_rows, rb, void):
    """The node's shards (fast's rows, two or more with rows) as one array
    for get_batch: a batch over several of them is then one gather straight
    into the destination, each row in its place, where a gather per shard
    must place its rows at their positions (a second pass through the
    staging buffer, or a Python step per row: 0.6-0.8× numpy's gather of as
    many rows into one place, docs/benchmarks.md). The array starts at the
    lowest shard's first row and spans the others' mappings in chunks of g
    bytes, g the greatest common divisor of the row size and the shards'
    distances (the row itself, or a page: each mapping starts on one): a
    row of global index i of shard o is the m = rb / g chunks from
    i * m + c[o] on. The space between the mappings is never read (every
    index is checked first); the shards' arrays are kept with it, so that
    no mapping it spans closes while it lives. Returns (span, c, m, chunks,
    items, lo, hi, shards), or None where fewer than two shards have rows
    or a chunk would be under 1 KiB (a gather per shard then): span is
    (chunks, g) uint8; chunks np.arange(m) (None when m is 1); items the
    span's rows as void items (rows under 1 KiB, m == 1) or None; [lo, hi)
    the addresses it spans (numpy's take into a destination within them
    goes through a temporary of the whole batch: get_batch then gathers
    per shard)."""
    held = [(r, f[0], f[3]) for r, (f, k) in enumerate(zip(fast, shard_rows)) if f is not None and k > 0]
    if len(held) < 2 or rb <= 0:
        return None
    addr = {r: rows.__array_interface__["data"][0] for r, _, rows in held}
    base_r = min(addr, key=addr.get)
    base = addr[base_r]
    g = rb
    for a in addr.values():
        g = math.gcd(g, a - base)
    m = rb // g
    if m > 1 and g < 1024:
        return None
    end = max((addr[r] - base) // g + rows.shape[0] * m for r, _, rows in held)
    base_rows = next(rows for r, _, rows in held if r == base_r)
    span = np.lib.stride_tricks.as_strided(base_rows, shape=(end, g), strides=(g, 1), writeable=False)
    c = np.zeros(len(fast) + 1, np.int64)
    for r, first, _ in held:
        c[r] = (addr[r] - base) // g - first * m
    items = span.view(void).reshape(-1) if void is not None and m == 1 else None
    return (span, c, m, np.arange(m) if m > 1 else None, items, base, base + end * g,
            tuple(rows for _, _, rows in held))


def copy_rows(dst, src, loc, pos=None):
    """dst[i] = src[loc[i]] (dst[pos[i]] = src[loc[i]] when pos is given),
    as fast as numpy goes. Every loc[i] must be a row of src: the caller has
    checked them (take's mode="clip" then never clips, and it writes
    straight into dst, where take's default mode="raise" gathers into a
    fresh temporary of the whole output and copies that: a second pass
    over the batch and, past a few MiB, fresh pages to fault in on every
    call). Rows under 1 KiB are taken as single items of a row-sized void
    dtype (numpy copies an item with one memcpy, not byte by byte). With
    pos (rows of several owners), rows of 32 KiB and more are copied by a
    loop, each row once, straight into its place; smaller rows through the
    staging buffer, a piece at a time.

    Rows go straight into dst whatever its alignment: a destination a few
    bytes past its source within a page (a numpy array of 128 KiB or more,
    16 bytes past a page, from a shard's rows, on pages) makes glibc's
    `rep movsb` up to a quarter slower for rows of 4 KiB to 1 MiB on this
    machine's EPYC, where a copy through a staging buffer costs a second
    pass: 9.9 against 11.6 GB/s straight at 4 KiB rows, 11.9 against 17.4
    at 64 KiB (docs/benchmarks.md)."""
    rb = src.shape[1]
    if rb < 1024:
        row = np.dtype((np.void, rb))
        s, d = src.view(row).reshape(-1), dst.view(row).reshape(-1)
        if pos is None:
            s.take(loc, out=d[:loc.shape[0]], mode="clip")
        else:
            d[pos] = s.take(loc, mode="clip")
        return
    if pos is None:
        src.take(loc, axis=0, out=dst[:loc.shape[0]], mode="clip")
    elif rb >= (32 << 10):
        for i, j in zip(pos.tolist(), loc.tolist()):
            dst[i] = src[j]
    else:
        _copy_staged(dst, src, loc, pos)


def count(v, rows, remote, wait):
    """Count one read of rows rows (remote of them through the agent or MPI,
    waited for wait seconds) in v's profile."""
    p = v.profile
    p["calls"] += 1
    p["rows"] += rows
    p["bytes"] += rows * v.rb
    p["local_rows"] += rows - remote
    if remote:
        p["remote_rows"] += remote
        p["remote_calls"] += 1
        p["wait_s"] += wait


def row_indices(indices):
    """indices as a 1-d int64 array; ArgumentError when they are not a 1-d
    sequence of integers."""
    idx = np.asarray(indices)
    if idx.ndim != 1 or (idx.size and idx.dtype.kind not in "iu"):
        raise ArgumentError(f"ddstore: bad argument: indices of shape {idx.shape} and type {idx.dtype}: "
                            f"want a 1-d sequence of integers")
    if idx.dtype == np.uint64 and idx.size and int(idx.max()) >= 2**63:
        # Named as given: as int64 it would read as a negative index.
        i = int(np.flatnonzero(idx >= np.uint64(2**63))[0])
        raise IndexOutOfRange(f"ddstore: index out of range: indices[{i}] = {int(idx[i])}: want a row index below "
                              f"2^63")
    return idx.astype(np.int64, copy=False)


U64 = np.dtype(np.uint64)


def below(idx, n):
    """Whether every one of idx (1-d int64) is in [0, n): one pass, an
    argmax of the indices as uint64 (where a negative one is above any n),
    a fifth of what min() and max() cost a batch of 256."""
    u = idx.view(U64)
    return not u.shape[0] or u.item(u.argmax()) < n


def check_rows(idx, total, name):
    """idx, after checking every index is a row of variable name (total
    rows): IndexOutOfRange names the first that is not."""
    if idx.size and not below(idx, total):
        i = int(np.flatnonzero((idx < 0) | (idx >= total))[0])
        raise IndexOutOfRange(f"ddstore: index out of range: variable {name!r}: indices[{i}] = {int(idx[i])} "
                              f"not in [0, {total})")
    return idx


def distinct(a):
    """The distinct values of a 1-d array of ranks >= 0 (a batch's owners;
    or a tuple of them), in order: a set of a few hundred costs a tenth of
    np.unique's sort (6.5 us for 16 values); a bincount for more."""
    if type(a) is tuple:
        return sorted(set(a))
    if a.shape[0] <= 512:
        return sorted(set(a.tolist()))
    return np.bincount(a).nonzero()[0].tolist()

"""Re-sharding: a job restarted on another number of ranks or nodes takes
its variables from the memory that still holds them instead of loading them
again from their source.

    import ddstore
    from ddstore.reshard import reshard, reshard_dataset

    old = ddstore.Store(reader=True, namespace="train-v1")   # the persisted (split mode) namespace
    new = ddstore.Store(namespace="train-v2")                 # this job, any number of ranks
    reshard(old, new, ["x", "y"])            # collective over new's ranks
    reshard_dataset(old, new, "qm9")         # a DistDataset's variables, its metadata last
    ds = ddstore.torch.DistDatasetReader("qm9", store=new)

Rank r of `dst` (of P) holds rows [r N / P, (r+1) N / P) of each variable,
DistDataset's layout. A variable with a backing file keeps it: the new
ranks share the rows its shards held (its first H), and the rest stay in
the file, read through the agents as before. A fixed variable is created zero-filled (Store.init)
and its shard read straight into the shard's shared memory, one read per
piece of an old shard (rows of this node are copied from shared memory,
others come through the agent); a ragged one is read (get_ragged) and added.
The source may be any
store that reads the variables: a reader of a persisted namespace (split
mode: agents started with --persist, or a job that keeps serving), or the
old job's own store. docs/benchmarks.md has the figure per GiB.
"""

import json
import time

import numpy as np

from ._errors import ArgumentError, UnknownVariable
from .dtypes import numpy_dtype

__all__ = ["reshard", "reshard_dataset"]


def _share(total, rank, size):
    return total * rank // size, total * (rank + 1) // size


def reshard(src, dst, names):
    """Collective over dst's ranks: copy the variables `names` that `src`
    reads into `dst`, each rank its share of rows; when it returns, every
    rank reads every rank's new rows (it ends with dst.fence()). Returns {name: (rows this
    rank holds, bytes, seconds)}. A name src does not know raises its
    UnknownVariable on every rank before anything is created (every rank
    checks the same names)."""
    if isinstance(names, str):
        names = [names]
    descs = [src.describe(n) for n in names]
    out = {}
    for name, d in zip(names, descs):
        t0 = time.perf_counter()
        backed = bool(d["backing"])
        # Backed: the new shards hold what the old ones held, the file the rest.
        lo, hi = _share(d["held_rows"] if backed else d["total_rows"], dst.rank, dst.size)
        file = {"backing": d["backing"], "total": d["total_rows"]} if backed else {}
        if d["kind"] == "ragged":
            values, lengths = src.get_ragged(name, np.arange(lo, hi, dtype=np.int64))
            if backed:
                file["backing"] = (d["backing"], d["backing_offsets"])
            dst.add_ragged(name, values, lengths, **file)
            nbytes = int(values.nbytes)
        else:
            dt = d["dtype"] or None
            if dt is None:
                raise ArgumentError(f"ddstore: bad argument: reshard: variable {name!r} has no dtype (added as raw "
                                    f"bytes): want a variable of a dtype")
            dst.init(name, hi - lo, d["disp"], dtype=dt, **file)
            v = dst._var(name)
            nbytes = (hi - lo) * d["disp"] * d["itemsize"]
            if hi > lo:
                own = v.own.reshape(-1).view(numpy_dtype(dt)).reshape(hi - lo, d["disp"])
                # One read per old shard the range covers: a node-local one
                # is a copy from shared memory.
                bounds = np.concatenate(([0], np.cumsum(d["shard_rows"]))).tolist()
                cuts = sorted({lo, hi, *(b for b in bounds if lo < b < hi)})
                for a, b in zip(cuts[:-1], cuts[1:]):
                    src.get(name, own[a - lo:b - lo], a)
        out[name] = (hi - lo, nbytes, time.perf_counter() - t0)
    # Each rank filled its own shards after the collective init: a fence,
    # so that no rank reads another's rows before that rank has written them.
    dst.fence()
    return out


def reshard_dataset(src, dst, name):
    """Collective over dst's ranks: copy DistDataset `name` (its fields'
    variables, then `{name}/__fields__` if any, then `{name}/__meta__`, the
    mark that the dataset is complete) from src into dst. Returns what
    reshard returns."""
    from .torch._schema import _FIELDS, _META, _Schema
    meta_var = f"{name}/{_META}"
    total, disp, _ = src.info(meta_var)
    buf = np.empty((total, disp), np.uint8)
    src.get(meta_var, buf, 0)
    meta = json.loads(buf[:1].tobytes().decode())
    names = [f.var for f in _Schema.from_json(name, meta).fields]
    try:
        src.info(f"{name}/{_FIELDS}")
        names.append(f"{name}/{_FIELDS}")
    except UnknownVariable:  # a tuple dataset has none
        pass
    return reshard(src, dst, names + [meta_var])

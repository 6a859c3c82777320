"""Re-sharding's cost per GiB, one node: a variable of --mib MiB held by a
job of one namespace is taken by a job of another (ddstore.reshard: a
reader of the first, each rank its share read straight into its new shard).

    python -m ddstore_bench.reshard [--mib 512] [--row-kib 4] [--reps 3] [--json]

Side by side, in one run, medians of --reps:

* memcpy: numpy copying the same bytes between two arrays (the limit of a
  copy between two regions of memory);
* reload_npy: what a restart without the store does: np.load of the
  variable's .npy file (in the page cache) and Store.add;
* create: Store.init of the new shard alone (the segment's pages reserved
  and zeroed: what every new variable pays, add or reshard);
* reshard: reshard(old, new, [name]) of the variable into the new store,
  which is create, then one read of the rows into the shard.

Figures in seconds and in s/GiB.
"""

import argparse
import json
import os
import tempfile
import time
import uuid

import numpy as np


def _median(f, reps):
    ts = []
    for _ in range(reps):
        ts.append(f())
    return sorted(ts)[len(ts) // 2]


def main(argv=None):
    p = argparse.ArgumentParser(prog="python -m ddstore_bench.reshard", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--mib", type=int, default=512)
    p.add_argument("--row-kib", type=int, default=4)
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--json", action="store_true")
    a = p.parse_args(argv)
    import ddstore
    from ddstore.reshard import reshard

    rowf = a.row_kib * 256  # float32 items per row
    rows = a.mib * 1024 // a.row_kib
    data = np.random.default_rng(0).random((rows, rowf), dtype=np.float32)
    gib = data.nbytes / 2**30
    tag = uuid.uuid4().hex[:8]
    old = ddstore.Store(namespace=f"bench-reshard-a-{tag}", rank=0, size=1)
    new = ddstore.Store(namespace=f"bench-reshard-b-{tag}", rank=0, size=1)
    try:
        old.add("x", data)
        reader = ddstore.Store(reader=True, namespace=old.namespace, rank=0, size=1, spawn=False)
        dst = np.empty_like(data)

        def memcpy():
            t = time.perf_counter()
            np.copyto(dst, data)
            return time.perf_counter() - t

        with tempfile.TemporaryDirectory() as d:
            f = os.path.join(d, "x.npy")
            np.save(f, data)

            def reload_npy():
                t = time.perf_counter()
                new.add("y", np.load(f))
                s = time.perf_counter() - t
                new.free("y")
                return s

            np.load(f)  # into the page cache
            t_reload = _median(reload_npy, a.reps)

        def one():
            t = time.perf_counter()
            got = reshard(reader, new, ["x"])
            s = time.perf_counter() - t
            assert got["x"][0] == rows
            new.free("x")
            return s

        def create():
            t = time.perf_counter()
            new.init("z", rows, rowf, dtype="float32")
            s = time.perf_counter() - t
            new.free("z")
            return s

        t_copy, t_create, t_reshard = _median(memcpy, a.reps), _median(create, a.reps), _median(one, a.reps)
        reader.close()
    finally:
        new.close()
        old.close()
    out = {"bytes": int(data.nbytes), "row_bytes": rowf * 4, "reps": a.reps,
           "memcpy_s": t_copy, "reload_npy_s": t_reload, "reshard_s": t_reshard, "create_s": t_create,
           "memcpy_s_per_gib": t_copy / gib, "reload_npy_s_per_gib": t_reload / gib,
           "create_s_per_gib": t_create / gib,
           "reshard_s_per_gib": t_reshard / gib, "reshard_over_memcpy": t_reshard / t_copy,
           "reshard_over_reload": t_reshard / t_reload}
    if a.json:
        print(json.dumps(out))
        return 0
    print(f"{data.nbytes / 2**20:.0f} MiB in rows of {rowf * 4} bytes, median of {a.reps}")
    for k in ("memcpy", "reload_npy", "create", "reshard"):
        print(f"  {k:11s} {out[k + '_s']:.3f} s  {out[k + '_s_per_gib']:.3f} s/GiB")
    print(f"  reshard / memcpy {out['reshard_over_memcpy']:.2f}, reshard / reload {out['reshard_over_reload']:.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

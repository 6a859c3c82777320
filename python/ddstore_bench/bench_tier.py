"""The storage tier's read cost, one rank: an epoch of N samples in random
order, batches of B, from a chunked HDF5 file (one sample per chunk, as
CosmoFlow's), the job's memory holding the first C = N/4 samples.

    python -m ddstore_bench.bench_tier [--samples 2048] [--batch 16] [--cube 16] [--reps 5] [--cold] [--json]

Side by side, in one run, medians of --reps epochs:

* h5py_per_sample: `ds[i]` for each sample (SOLAR's baseline reads);
* h5py_per_batch: `ds[sorted(batch)]`, one fancy-indexed read per batch;
* ddstore: Store.get_batch of a variable whose rows past C are in the file
  (the agent reads them, coalesced by chunk);
* ddstore_prefetch: the same, announcing each batch two steps ahead
  (Store.prefetch), as ScheduledSampler(prefetch=2) does;
* ddstore_recv, ddstore_prefetch_recv: the same two into a receive buffer
  (alloc_recv, as ThreadDataLoader's reused buffers are), which the agent
  writes the rows into directly: no copy through the lane's staging region.

--cold drops the file from the page cache (posix_fadvise DONTNEED) before
every epoch of every reader. Needs h5py and a ddstore binary with HDF5.
"""

import argparse
import json
import os
import sys
import tempfile
import time

import numpy as np

from .cosmoflow.loaders import drop_page_cache


def main(argv=None):
    p = argparse.ArgumentParser(prog="python -m ddstore_bench.bench_tier", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--samples", type=int, default=2048)
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--cube", type=int, default=16, help="cube side S: samples of 4 x S^3 int16")
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--cold", action="store_true", help="drop the file from the page cache before each epoch")
    p.add_argument("--dir", default=None, help="where the HDF5 file goes (default: a temporary directory)")
    p.add_argument("--json", action="store_true")
    a = p.parse_args(argv)
    import h5py

    import ddstore

    n, b, shape = a.samples, a.batch, (4, a.cube, a.cube, a.cube)
    tmp = None
    if a.dir is None:
        tmp = tempfile.TemporaryDirectory(prefix="ddstore-bench-tier-", dir="/var/tmp")
        a.dir = tmp.name
    f = os.path.join(a.dir, f"tier-{n}-{a.cube}.h5")
    if not os.path.exists(f):
        x = np.random.default_rng(0).integers(0, 1000, (n,) + shape, dtype=np.int16)
        with h5py.File(f + ".tmp", "w") as h:
            h.create_dataset("x", data=x, chunks=(1,) + shape)
        os.replace(f + ".tmp", f)
    c = n // 4
    perm = np.random.default_rng(1).permutation(n)
    out = np.empty((b,) + shape, np.int16)
    h = h5py.File(f, "r")
    ds = h["x"]

    def h5_each():
        for k in range(0, n - b + 1, b):
            for j, i in enumerate(perm[k:k + b]):
                out[j] = ds[i]

    def h5_batch():
        for k in range(0, n - b + 1, b):
            out[:] = ds[np.sort(perm[k:k + b])]

    s = ddstore.Store(rank=0, size=1)
    name = f"bench-tier-{os.getpid()}"
    s.add(name, ds[:c], backing=f + ":/x", total=n)

    # Batches into a receive buffer (alloc_recv, as ThreadDataLoader's
    # reused buffers are): the agent writes the file's rows straight in.
    recv = s.alloc_recv((b,) + shape, np.int16)

    def dd(prefetch, dst=out):
        def run():
            if prefetch:
                s.prefetch(name, perm[:2 * b])
            for k in range(0, n - b + 1, b):
                if prefetch and k + 3 * b <= n:
                    s.prefetch(name, perm[k + 2 * b:k + 3 * b])
                s.get_batch(name, dst, perm[k:k + b])
        return run

    readers = {"h5py_per_sample": h5_each, "h5py_per_batch": h5_batch, "ddstore": dd(False),
               "ddstore_prefetch": dd(True), "ddstore_recv": dd(False, recv),
               "ddstore_prefetch_recv": dd(True, recv)}
    times = {k: [] for k in readers}
    for _ in range(a.reps):  # interleaved: every reader sees the same machine
        for k, fn in readers.items():
            if a.cold:
                drop_page_cache([f])
            t = time.perf_counter()
            fn()
            times[k].append(time.perf_counter() - t)
    mb = (n // b) * b * out[0].nbytes / 1e6
    base = float(np.median(times["h5py_per_sample"]))
    res = {"samples": n, "batch": b, "sample_bytes": int(out[0].nbytes), "capacity": c, "cold": a.cold,
           "readers": {k: {"epoch_s": round(float(np.median(v)), 4), "MB_per_s": round(mb / float(np.median(v)), 1),
                           "speedup_vs_h5py_per_sample": round(base / float(np.median(v)), 2)}
                       for k, v in times.items()}}
    s.free(name)
    s.close()
    h.close()
    if a.json:
        print(json.dumps(res))
    else:
        print(f"{n} samples of {out[0].nbytes} B, batch {b}, C = {c} in memory, "
              f"{'cold' if a.cold else 'warm'} page cache; median of {a.reps} epochs")
        print(f"{'reader':<22} {'epoch s':>9} {'MB/s':>9} {'vs h5py per sample':>19}")
        for k, v in res["readers"].items():
            print(f"{k:<22} {v['epoch_s']:>9.4f} {v['MB_per_s']:>9.1f} {v['speedup_vs_h5py_per_sample']:>18.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())

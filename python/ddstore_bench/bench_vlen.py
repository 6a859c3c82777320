"""How fast libhdf5 (through h5py) reads ragged rows stored as an HDF5
variable-length dataset against the same rows stored as a flat pair (values
of shape (units, 3) and N+1 offsets), the layout a ragged variable's
backing file takes — to decide whether ddstore should read vlen datasets.

    python -m ddstore_bench.bench_vlen [--rows 20000] [--mean 50] [--batch 64] [--reps 7] [--json]

Rows of 1 to 2 x mean units of 3 float32 (positions [n, 3]), one file
holding both layouts, contiguous, in the page cache. Side by side, in one
run, medians of --reps repetitions:

* scan: every row. vlen: `ds[lo:hi]` in slices of 1024 rows (an object
  array of per-row arrays); pair: `values[off[lo]:off[hi]]` for the same
  slices (one hyperslab each), and the same split into per-row arrays, so
  that both end with what vlen returns.
* batch: 64 uniformly random rows. vlen: `ds[i]` per row; pair:
  `values[off[i]:off[i+1]]` per row (the same number of h5py calls; the
  agent coalesces neighbours on top of that).

Reports rows/s, MB/s of the rows' values and the ratio pair/vlen.
"""

import argparse
import json
import os
import statistics
import tempfile
import time

import numpy as np


def main(argv=None):
    p = argparse.ArgumentParser(prog="python -m ddstore_bench.bench_vlen", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rows", type=int, default=20000)
    p.add_argument("--mean", type=int, default=50, help="mean units (of 3 float32) a row")
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--batches", type=int, default=200, help="random batches per repetition")
    p.add_argument("--reps", type=int, default=7)
    p.add_argument("--json", action="store_true")
    a = p.parse_args(argv)
    import h5py

    rng = np.random.default_rng(0)
    lengths = rng.integers(1, 2 * a.mean + 1, a.rows)
    off = np.concatenate(([0], np.cumsum(lengths))).astype(np.int64)
    values = rng.standard_normal((int(off[-1]), 3)).astype(np.float32)
    with tempfile.TemporaryDirectory(prefix="ddstore-bench-vlen-", dir="/var/tmp") as d:
        f = os.path.join(d, "ragged.h5")
        with h5py.File(f, "w") as h:
            h.create_dataset("pair/values", data=values)
            h.create_dataset("pair/offsets", data=off)
            vl = h.create_dataset("vlen", (a.rows,), dtype=h5py.vlen_dtype(np.float32))
            for lo in range(0, a.rows, 4096):
                hi = min(lo + 4096, a.rows)
                vl[lo:hi] = [values[off[g]:off[g + 1]].reshape(-1) for g in range(lo, hi)]
        with h5py.File(f, "r") as h:
            res = measure(h, off, a)
    nbytes = int(off[-1]) * 12
    out = {"rows": a.rows, "mean_units": a.mean, "bytes": nbytes, "batch": a.batch, "reps": a.reps, **res}
    if a.json:
        print(json.dumps(out))
        return
    print(f"{a.rows} rows, mean {a.mean} units of 12 B ({nbytes / 1e6:.1f} MB), medians of {a.reps}")
    for case in ("scan", "scan_split", "batch"):
        v, pr = res[f"{case}_vlen_s"], res[f"{case}_pair_s"]
        rows = a.rows if case != "batch" else a.batch * a.batches
        byts = nbytes if case != "batch" else res["batch_bytes"]
        print(f"{case:10s} vlen {rows / v:12.0f} rows/s {byts / v / 1e6:9.1f} MB/s | "
              f"pair {rows / pr:12.0f} rows/s {byts / pr / 1e6:9.1f} MB/s | pair/vlen {v / pr:6.2f}x")


def measure(h, off, a):
    vl, values = h["vlen"], h["pair/values"]
    n = a.rows
    rng = np.random.default_rng(1)
    batches = [rng.integers(0, n, a.batch) for _ in range(a.batches)]
    batch_bytes = int(sum(int((off[b + 1] - off[b]).sum()) for b in batches)) * 12

    def scan_vlen():
        for lo in range(0, n, 1024):
            vl[lo:min(lo + 1024, n)]

    def scan_pair():
        for lo in range(0, n, 1024):
            hi = min(lo + 1024, n)
            values[off[lo]:off[hi]]

    def scan_pair_split():
        for lo in range(0, n, 1024):
            hi = min(lo + 1024, n)
            v = values[off[lo]:off[hi]]
            np.split(v, (off[lo + 1:hi] - off[lo]).tolist())

    def batch_vlen():
        for b in batches:
            for g in b.tolist():
                vl[g]

    def batch_pair():
        for b in batches:
            for g in b.tolist():
                values[off[g]:off[g + 1]]

    cases = {"scan_vlen": scan_vlen, "scan_pair": scan_pair, "scan_split_vlen": scan_vlen,
             "scan_split_pair": scan_pair_split, "batch_vlen": batch_vlen, "batch_pair": batch_pair}
    times = {k: [] for k in cases}
    for f in cases.values():  # warm the page cache and h5py
        f()
    for _ in range(a.reps):
        for k, f in cases.items():  # interleaved: the same conditions
            t0 = time.perf_counter()
            f()
            times[k].append(time.perf_counter() - t0)
    out = {f"{k.rsplit('_', 1)[0]}_{k.rsplit('_', 1)[1]}_s": statistics.median(v) for k, v in times.items()}
    out["batch_bytes"] = batch_bytes
    return out


if __name__ == "__main__":
    main()

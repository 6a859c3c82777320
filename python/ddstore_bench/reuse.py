"""ThreadDataLoader's reuse_buffers, side by side in one run: an epoch of
fixed-size rows read in shuffled batches with reuse_buffers=False (fresh
arrays per batch), True (DDStore's: a pool of one buffer set per worker, each
batch copied out) and "lend" (the batch is the buffers, valid until the next),
next to torch's DataLoader over the same DistDataset and to the limits: numpy's
own gather of the same rows into a reused array, and into a fresh one.

    python -m ddstore_bench.reuse [--rows 2048] [--row-kib 32] [--batch 64] [--epochs 5] [--workers 0]

Rows of this node only (one process): what the loader itself costs. Prints
one JSON object: median seconds per epoch of each, and the ratios to the
gather into a fresh array."""

import argparse
import json
import statistics
import time

import numpy as np


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=2048)
    ap.add_argument("--row-kib", type=int, default=32)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--epochs", type=int, default=5)
    ap.add_argument("--workers", type=int, default=0)
    a = ap.parse_args(argv)

    import torch
    from torch.utils.data import DataLoader

    import ddstore
    from ddstore.torch import DistDataset, ThreadDataLoader

    width = a.row_kib * 1024 // 4
    src = np.random.default_rng(0).standard_normal((a.rows, width)).astype(np.float32)
    out = {"rows": a.rows, "row_bytes": width * 4, "batch": a.batch, "workers": a.workers, "epochs": a.epochs}
    with ddstore.Store() as s:
        ds = DistDataset(src, "reuse-bench", store=s)
        g = torch.Generator()

        def order():
            return torch.randperm(a.rows, generator=g.manual_seed(1)).numpy()

        def gather(fresh):
            def epoch():
                o = order()
                buf = np.empty((a.batch, width), np.float32)
                for lo in range(0, a.rows, a.batch):
                    idx = o[lo:lo + a.batch]
                    if fresh:
                        torch.from_numpy(src[idx]).sum()
                    else:
                        np.take(src, idx, axis=0, out=buf[:len(idx)])
                        torch.from_numpy(buf[:len(idx)]).sum()
            return epoch

        def loader(make):
            lo = make()

            def epoch():
                g.manual_seed(1)
                for b in lo:
                    b.sum()  # touch the batch, as a step would
            return epoch

        kw = dict(batch_size=a.batch, shuffle=True, generator=g)
        cases = {
            "numpy gather, reused array": gather(False),
            "numpy gather, fresh array": gather(True),
            "torch DataLoader": loader(lambda: DataLoader(ds, **kw)),
            "reuse_buffers=False": loader(lambda: ThreadDataLoader(ds, num_workers=a.workers, **kw)),
            "reuse_buffers=True": loader(lambda: ThreadDataLoader(ds, num_workers=a.workers, reuse_buffers=True,
                                                                  **kw)),
            'reuse_buffers="lend"': loader(lambda: ThreadDataLoader(ds, num_workers=a.workers, reuse_buffers="lend",
                                                                    **kw)),
        }
        times = {k: [] for k in cases}
        for _ in range(a.epochs):  # the cases take turns, epoch by epoch
            for k, f in cases.items():
                t = time.perf_counter()
                f()
                times[k].append(time.perf_counter() - t)
        med = {k: statistics.median(v) for k, v in times.items()}
        base = med["numpy gather, fresh array"]
        out["median_epoch_s"] = med
        out["ratio_to_fresh_gather"] = {k: v / base for k, v in med.items()}
        ds.free()
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()

"""`python -m ddstore_bench.node_ranks`: DDStore's usage on one node, two
ranks of mpirun through pyddstore (PyDDStore(comm)): each rank adds its
shard and reads batches of 256 random rows of the whole variable (half of
them the other rank's shard, node-local too) with get_batch into a buffer
from np.zeros, as DDStore's scripts do, both ranks at once. Per rank and row
size: get_batch GB/s and, in turns with it in the same process, numpy's
gather of as many rows (np.take(rows, idx, axis=0, out=buf, mode="clip"))
from the node's shards themselves (the mappings get_batch reads: the same
pages, half of the rows from each rank's shard), into the same buffer and
into one starting on a page (no memmove slow case, see _vars), and of the
rank's own rows held in a numpy array (heap, huge pages); with each, the
page faults and context switches of this process per batch.

    python -m ddstore_bench.node_ranks [--quick] [--json] [--batch N] [--sizes B,B] [--probe]
"""

import argparse
import json
import os
import secrets
import sys

import numpy as np

from .bench import _interleaved, _mpirun_json, page_aligned

ROW_SIZES = (4096, 65536)
BATCH = 256


def _rank(shard_bytes, dur, batch=BATCH, sizes=ROW_SIZES, probe=False):
    from mpi4py import MPI

    import pyddstore
    comm = MPI.COMM_WORLD
    rank, size = comm.Get_rank(), comm.Get_size()
    dds = pyddstore.PyDDStore(comm)
    out = []
    try:
        for rb in sizes:
            n = shard_bytes // rb
            name = f"nr{rb}"
            rows = np.full((n, rb), 1, np.uint8)  # every page written: none reads as the zero page
            rows[:, :8] = (np.arange(n, dtype=np.int64) + rank * n).view(np.uint8).reshape(n, 8)
            dds.add(name, rows)
            rng = np.random.default_rng(rank)
            idxs = [rng.integers(0, size * n, batch) for _ in range(64)]
            buf = np.zeros((batch, rb), np.uint8)
            k = [0]

            def ours():
                k[0] = (k[0] + 1) % len(idxs)
                dds.get_batch(name, buf, idxs[k[0]])

            def gather():
                k[0] = (k[0] + 1) % len(idxs)
                rows.take(idxs[k[0]] % n, axis=0, out=buf, mode="clip")

            # The node's shards as get_batch maps them: rows of rank 0's
            # shard from it, the others from rank 1's.
            shards = dds.store._var(name).local[:size]
            aligned = page_aligned(buf.shape, buf.dtype)

            def gather_shm(into):
                def op():
                    k[0] = (k[0] + 1) % len(idxs)
                    idx = idxs[k[0]]
                    half = batch // 2
                    shards[0].take(idx[:half] % n, axis=0, out=into[:half], mode="clip")
                    shards[1].take(idx[half:] % n, axis=0, out=into[half:], mode="clip")
                return op
            store = dds.store

            def store_batch():  # the same call without pyddstore's layer
                k[0] = (k[0] + 1) % len(idxs)
                store.get_batch(name, buf, idxs[k[0]])

            def ours_aligned():
                k[0] = (k[0] + 1) % len(idxs)
                dds.get_batch(name, aligned, idxs[k[0]])

            def fresh(op):  # a fresh destination per call, as a script allocating one per batch
                def run():
                    k[0] = (k[0] + 1) % len(idxs)
                    op(np.zeros((batch, rb), np.uint8), idxs[k[0]])
                return run

            def shm_into(into, idx):
                half = batch // 2
                shards[0].take(idx[:half] % n, axis=0, out=into[:half], mode="clip")
                shards[1].take(idx[half:] % n, axis=0, out=into[half:], mode="clip")
            comm.Barrier()
            ops = {"get_batch": ours, "numpy_shm": gather_shm(buf), "numpy_shm_aligned": gather_shm(aligned),
                   "numpy": gather}
            if probe:
                ops.update({"store_get_batch": store_batch, "get_batch_aligned": ours_aligned,
                            "get_batch_fresh": fresh(lambda d, idx: dds.get_batch(name, d, idx)),
                            "numpy_shm_fresh": fresh(shm_into)})
            samples, usage = _interleaved(dur, buf.nbytes, ops, usage=True)
            dds.get_batch(name, buf, idxs[3])
            assert (buf[:, :8].copy().view(np.int64)[:, 0] == idxs[3]).all(), "wrong rows read"
            res = {"rank": rank, "row_bytes": rb}
            for key, v in samples.items():
                res[key + "_gbps"] = float(np.median(v))
                res[key + "_faults"], res[key + "_switches"] = usage[key]
            for key in [x for x in samples if x != "get_batch"]:
                ratio = np.asarray(samples["get_batch"]) / np.asarray(samples[key])
                res["vs_" + key] = float(np.median(ratio))
            out.append(res)
            comm.Barrier()
            dds.free(name)
    finally:
        dds.close()
    everyone = comm.gather(out, root=0)
    if rank == 0:
        print(json.dumps([r for rs in everyone for r in rs]), flush=True)


def main(argv=None):
    ap = argparse.ArgumentParser(prog="python -m ddstore_bench.node_ranks", description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="32 MiB per rank, 0.5 s per figure")
    ap.add_argument("--json", action="store_true", help="print one JSON object")
    ap.add_argument("--batch", type=int, default=BATCH, help=f"rows per batch (default {BATCH})")
    ap.add_argument("--sizes", default=",".join(str(x) for x in ROW_SIZES), help="row sizes in bytes, comma-separated")
    ap.add_argument("--probe", action="store_true",
                    help="also the store's get_batch without pyddstore's layer, get_batch into the buffer on a page, "
                         "and get_batch and numpy_shm each into a fresh np.zeros per call")
    ap.add_argument("--rank", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--shard", type=int, default=128 << 20, help=argparse.SUPPRESS)
    ap.add_argument("--duration", type=float, default=1.5, help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.rank:
        _rank(a.shard, a.duration, a.batch, tuple(int(x) for x in a.sizes.split(",")), a.probe)
        return
    shard, dur = (32 << 20, 0.5) if a.quick else (128 << 20, 1.5)
    if not os.environ.get("DDSTORE_SECRET"):
        os.environ["DDSTORE_SECRET"] = secrets.token_hex(32)
    ns = f"pynoderanks-{os.getpid()}"
    args = ["ddstore_bench.node_ranks", "--rank", "--shard", str(shard), "--duration", str(dur), "--batch",
            str(a.batch), "--sizes", a.sizes] + ["--probe"] * a.probe
    rows = _mpirun_json("mpirun", 2, ns, args, "node_ranks")
    if a.json:
        print(json.dumps({"rows": rows, "batch": a.batch, "shard_bytes": shard, "load": os.getloadavg()[0]}))
        return
    print(f"ddstore node_ranks: 2 ranks of mpirun on one node through pyddstore, batches of {a.batch} random rows, "
          f"{shard >> 20} MiB per rank, Python {sys.version.split()[0]}, numpy {np.__version__}\n")
    print("GB/s per rank; numpy_shm: from the shards get_batch maps, into the same buffer (_aligned: into one "
          "starting on a page); numpy: the rank's own rows from the heap; faults and switches per batch\n")
    cols = ("get_batch", "numpy_shm", "numpy_shm_aligned", "numpy")
    if a.probe:
        cols += ("store_get_batch", "get_batch_aligned", "get_batch_fresh", "numpy_shm_fresh")
    print(f"{'rank':>4} {'row':>7} " + " ".join(f"{c:>17}" for c in cols) + " " +
          " ".join(f"{'vs ' + c:>20}" for c in cols[1:]) + " " + " ".join(f"{c + ' flt/sw':>24}" for c in cols))
    for r in rows:
        print(f"{r['rank']:>4} {r['row_bytes']:>7} " + " ".join(f"{r[c + '_gbps']:>17.2f}" for c in cols) + " " +
              " ".join(f"{r['vs_' + c]:>20.2f}" for c in cols[1:]) + " " +
              " ".join(f"{r[c + '_faults']:>15.2f}/{r[c + '_switches']:<8.2f}" for c in cols))


if __name__ == "__main__":
    main()

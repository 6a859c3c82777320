"""`python -m ddstore_bench.node_ranks`: DDStore's usage on one node, two
ranks of mpirun through pyddstore (PyDDStore(comm)): each rank adds its
shard and reads batches of 256 random rows of the whole variable (half of
them the other rank's shard, node-local too) with get_batch into a buffer
from np.zeros, as DDStore's scripts do, both ranks at once. Per rank and row
size: get_batch GB/s and, in turns with it in the same process, numpy's
gather of as many rows of the rank's own rows held in a numpy array
(np.take(rows, idx, axis=0, out=buf, mode="clip")).

    python -m ddstore_bench.node_ranks [--quick] [--json]
"""

import argparse
import json
import os
import secrets
import sys

import numpy as np

from .bench import _interleaved, _mpirun_json

ROW_SIZES = (4096, 65536)
BATCH = 256


def _rank(shard_bytes, dur):
    from mpi4py import MPI

    import pyddstore
    comm = MPI.COMM_WORLD
    rank, size = comm.Get_rank(), comm.Get_size()
    dds = pyddstore.PyDDStore(comm)
    out = []
    try:
        for rb in ROW_SIZES:
            n = shard_bytes // rb
            name = f"nr{rb}"
            rows = np.zeros((n, rb), np.uint8)
            rows[:, :8] = (np.arange(n, dtype=np.int64) + rank * n).view(np.uint8).reshape(n, 8)
            dds.add(name, rows)
            rng = np.random.default_rng(rank)
            idxs = [rng.integers(0, size * n, BATCH) for _ in range(64)]
            buf = np.zeros((BATCH, rb), np.uint8)
            k = [0]

            def ours():
                k[0] = (k[0] + 1) % len(idxs)
                dds.get_batch(name, buf, idxs[k[0]])

            def gather():
                k[0] = (k[0] + 1) % len(idxs)
                rows.take(idxs[k[0]] % n, axis=0, out=buf, mode="clip")
            comm.Barrier()
            samples = _interleaved(dur, buf.nbytes, {"get_batch": ours, "numpy": gather})
            dds.get_batch(name, buf, idxs[3])
            assert (buf[:, :8].copy().view(np.int64)[:, 0] == idxs[3]).all(), "wrong rows read"
            ratio = np.asarray(samples["get_batch"]) / np.asarray(samples["numpy"])
            out.append({"rank": rank, "row_bytes": rb, "get_batch_gbps": float(np.median(samples["get_batch"])),
                        "numpy_gbps": float(np.median(samples["numpy"])), "vs_numpy": float(np.median(ratio))})
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
    ap.add_argument("--rank", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--shard", type=int, default=128 << 20, help=argparse.SUPPRESS)
    ap.add_argument("--duration", type=float, default=1.5, help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.rank:
        _rank(a.shard, a.duration)
        return
    shard, dur = (32 << 20, 0.5) if a.quick else (128 << 20, 1.5)
    if not os.environ.get("DDSTORE_SECRET"):
        os.environ["DDSTORE_SECRET"] = secrets.token_hex(32)
    ns = f"pynoderanks-{os.getpid()}"
    rows = _mpirun_json("mpirun", 2, ns, ["ddstore_bench.node_ranks", "--rank", "--shard", str(shard), "--duration",
                                          str(dur)], "node_ranks")
    if a.json:
        print(json.dumps({"rows": rows, "batch": BATCH, "shard_bytes": shard}))
        return
    print(f"ddstore node_ranks: 2 ranks of mpirun on one node through pyddstore, batches of {BATCH} random rows, "
          f"{shard >> 20} MiB per rank, Python {sys.version.split()[0]}, numpy {np.__version__}\n")
    print(f"{'rank':>4} {'row':>7} {'get_batch GB/s':>15} {'numpy GB/s':>11} {'vs numpy':>9}")
    for r in rows:
        print(f"{r['rank']:>4} {r['row_bytes']:>7} {r['get_batch_gbps']:>15.2f} {r['numpy_gbps']:>11.2f} "
              f"{r['vs_numpy']:>9.2f}")


if __name__ == "__main__":
    main()

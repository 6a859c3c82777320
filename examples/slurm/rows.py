"""Publish a variable into ddstore, and read every row of it back: from the
step that published it, or from a later step in reader mode (split mode).

    srun python3 rows.py publish --name rows     # every rank adds its rows, then reads all of them
    srun python3 rows.py read --name rows        # a later step: Store(reader=True) reads all of them

Row g of the variable holds g*disp + j in column j (int64), so any reader can
check what it gets without the data. Rank r adds `--rows` + r rows (shards of
different sizes, so the owner of a row is not a plain division). Each rank
reads every row once, in a random order of its own, in batches of `--batch`
rows: node-local rows come from shared memory, the others through the node's
agent. A wrong row exits 1; the last line of each rank says what it read.

The rank, size, local rank and node come from the launcher's environment
(srun: SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID, SLURMD_NODENAME; mpirun:
OMPI_COMM_WORLD_*), the namespace from the job (slurm-<SLURM_JOB_ID>), so
both steps of a job meet the same agents. Needs numpy and the ddstore
package (PYTHONPATH=<repository>/python, or installed).
"""

import argparse
import sys
import time

import numpy as np

import ddstore


def say(msg):
    """A whole line in one write: srun and mpirun interleave pieces."""
    sys.stdout.write(msg + "\n")
    sys.stdout.flush()


def expected(idx, disp):
    return idx.astype(np.int64)[:, None] * disp + np.arange(disp, dtype=np.int64)


def read_every_row(store, name, seed, batch):
    """Read all rows of `name` once, in a seeded random order, and check them;
    returns (rows, seconds). Raises SystemExit(1) on the first wrong row."""
    d = store.describe(name)
    total, disp = d["total_rows"], d["disp"]
    if np.dtype(d["dtype"]) != np.int64:
        say(f"{name}: dtype {d['dtype']}, want int64 (was it published by rows.py?)")
        raise SystemExit(1)
    order = np.random.default_rng(seed).permutation(total)
    out = np.empty((min(batch, total), disp), np.int64)
    t0 = time.perf_counter()
    for lo in range(0, total, batch):
        idx = order[lo:lo + batch]
        o = out[:len(idx)]
        store.get_batch(name, o, idx)
        bad = np.flatnonzero((o != expected(idx, disp)).any(axis=1))
        if bad.size:
            g = int(idx[bad[0]])
            say(f"{name}: row {g} reads {o[bad[0]][:4].tolist()}..., want {expected(np.array([g]), disp)[0][:4].tolist()}...")
            raise SystemExit(1)
    return total, time.perf_counter() - t0


def publish(args):
    s = ddstore.Store()
    n = args.rows + s.rank
    first = sum(args.rows + r for r in range(s.rank))
    s.add(args.name, expected(np.arange(first, first + n), args.disp))  # collective: every rank of the step
    total, secs = read_every_row(s, args.name, seed=s.rank, batch=args.batch)
    # No free: the rows stay with the agents for a later step to read. They
    # go when the agents stop (the end of the job's agent step).
    s.close()
    say(f"rank {s.rank}/{s.size} on {s.node}: published {n} rows of {args.name!r} "
        f"(namespace {s.namespace}), read all {total} back in {secs:.2f} s: ok")


def read(args):
    # reader=True: this step holds no shard; it reads what the publishing
    # step left with the agents of the same namespace.
    s = ddstore.Store(reader=True)
    total, secs = read_every_row(s, args.name, seed=1000 + s.rank, batch=args.batch)
    s.close()
    say(f"reader {s.rank}/{s.size} on {s.node}: read all {total} rows of {args.name!r} "
        f"(namespace {s.namespace}) in {secs:.2f} s: ok")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("mode", choices=["publish", "read"])
    ap.add_argument("--name", default="rows", help="the variable (default rows)")
    ap.add_argument("--rows", type=int, default=10000, help="rows rank 0 adds; rank r adds this + r (default 10000)")
    ap.add_argument("--disp", type=int, default=16, help="int64 items per row (default 16)")
    ap.add_argument("--batch", type=int, default=1024, help="rows per get_batch (default 1024)")
    args = ap.parse_args(argv)
    (publish if args.mode == "publish" else read)(args)


if __name__ == "__main__":
    main()

"""`python -m ddstore_bench.fence`: the cost of one fence (epoch_begin() or
epoch_end() of pyddstore, Store.fence()), which HydraGNN pays twice a
training step, at several job sizes, under mpirun with the ranks on two
simulated nodes (even ranks on one, odd on the other):

- mpi: PyDDStore(MPI.COMM_WORLD), an MPI barrier of the communicator;
- agents: PyDDStore() with DDSTORE_MPI=0 (ranks from the launcher's
  environment), a Barrier round on the coordinator agent;
- MPI_Barrier: mpi4py's comm.Barrier() alone, for scale.

Every rank times each of its calls; a launch's figure is the median of its
ranks' medians (p90 likewise), and a size's the median over the launches
(--rounds).

    python -m ddstore_bench.fence [--ranks 2,4,8] [--calls 2000] [--rounds 3] [--json]
"""

import argparse
import json
import os
import secrets
import statistics
import time

from .bench import _mpirun_json

PATHS = ("mpi", "agents", "MPI_Barrier")


def _rank(path, calls):
    """One rank of a launch: time `calls` fences after a warm-up; print
    (rank 0) every rank's median and p90 in microseconds as JSON."""
    rank = int(os.environ["OMPI_COMM_WORLD_RANK"])
    os.environ["DDSTORE_NODE_ID"] = f"fence-{'ab'[rank % 2]}"
    if path == "agents":
        os.environ["DDSTORE_MPI"] = "0"
    from mpi4py import MPI  # the results' gather, and the mpi and MPI_Barrier paths
    import numpy as np
    import pyddstore
    comm = MPI.COMM_WORLD
    s = None
    if path == "MPI_Barrier":
        fence = comm.Barrier
    else:
        s = pyddstore.PyDDStore(comm if path == "mpi" else None)
        assert s.store._fence_comm is not None if path == "mpi" else s.store._fence_comm is None
        s.init("v", 16, 64, 4, dtype="float32")   # a store with a variable, as a trainer's
        s.update("v", np.ones((16, 64), np.float32), 0)
        fence = s.epoch_begin
    for _ in range(50):
        fence()
    dts = np.empty(calls)
    clock = time.perf_counter
    for i in range(calls):
        t = clock()
        fence()
        dts[i] = clock() - t
    if s is not None:
        s.free()
        s.close()
    us = (float(np.median(dts)) * 1e6, float(np.percentile(dts, 90)) * 1e6)
    got = comm.gather(us, root=0)
    if rank == 0:
        print(json.dumps(got), flush=True)


def measure(sizes, calls, rounds, launcher="mpirun"):
    if not os.environ.get("DDSTORE_SECRET"):
        os.environ["DDSTORE_SECRET"] = secrets.token_hex(32)
    out = []
    for n in sizes:
        for path in PATHS:
            meds, p90s = [], []
            for k in range(rounds):
                ns = f"pyfence-{os.getpid()}-{n}-{path.lower()}-{k}"
                ranks = _mpirun_json(launcher, n, ns, ["ddstore_bench.fence", "--rank-of", path, "--calls", str(calls)],
                                     "fence bench")
                meds.append(statistics.median(m for m, _ in ranks))
                p90s.append(statistics.median(p for _, p in ranks))
            out.append({"ranks": n, "path": path, "median_us": statistics.median(meds),
                        "p90_us": statistics.median(p90s), "launch_medians_us": meds})
    return {"calls": calls, "rounds": rounds, "rows": out}


def table(res):
    by = {(r["ranks"], r["path"]): r for r in res["rows"]}
    sizes = sorted({r["ranks"] for r in res["rows"]})
    lines = ["| ranks | " + " | ".join(f"{p} µs (p90)" for p in PATHS) + " |", "|---|" + "---|" * len(PATHS)]
    for n in sizes:
        cells = [f"{by[(n, p)]['median_us']:.0f} ({by[(n, p)]['p90_us']:.0f})" for p in PATHS]
        lines.append(f"| {n} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv=None):
    ap = argparse.ArgumentParser(prog="python -m ddstore_bench.fence", description=__doc__.split("\n\n")[0])
    ap.add_argument("--ranks", default="2,4,8", help="job sizes, comma-separated (default 2,4,8)")
    ap.add_argument("--calls", type=int, default=2000, help="timed fences per rank and launch (default 2000)")
    ap.add_argument("--rounds", type=int, default=3, help="launches per size and path (default 3)")
    ap.add_argument("--json", action="store_true", help="print one JSON object")
    ap.add_argument("--rank-of", choices=PATHS, help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.rank_of:
        _rank(a.rank_of, a.calls)
        return
    res = measure([int(x) for x in a.ranks.split(",")], a.calls, a.rounds)
    print(json.dumps(res) if a.json else table(res))


if __name__ == "__main__":
    main()

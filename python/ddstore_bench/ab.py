"""`python -m ddstore_bench.ab --old DIR`: the Python client against an
older one in one run, side by side on the same agents, variable and rows.
DIR holds the older package (DIR/ddstore, e.g. from `git archive REV
python/ddstore | tar -x -C /tmp/old`, DIR=/tmp/old/python); it is loaded as
`ddstore_old`, and both clients read as readers of the job this process
makes with the current one (two simulated nodes on loopback).

get() of one row of the other node: one call of each per turn, each turn in
an order of its own (bench._latencies), new and old with a numpy and a
Python integer start, beside the raw direct request and Python's TCP round
trip; p50s and the medians of the turns' ratios. Node-local get_batch of
256 random rows: GB/s of each in turns (bench._interleaved) into the
caller's destination and into one starting on a page, beside numpy's
gathers: medians, the medians of the turns' ratios, and 90th percentiles
(a rate when the load leaves it alone) with their ratios.

    python -m ddstore_bench.ab --old DIR [--sizes 64,4096] [--local-sizes 64,4096,65536,1048576]
                               [--turns 5000] [--dur 0.5]
"""

import argparse
import importlib.util
import json
import os
import secrets
import socket
import subprocess
import sys

import numpy as np

from ddstore import Store
from ddstore_bench import bench


def load_old(path):
    """The package DIR/ddstore as module ddstore_old."""
    pkg = os.path.join(path, "ddstore")
    spec = importlib.util.spec_from_file_location("ddstore_old", os.path.join(pkg, "__init__.py"),
                                                  submodule_search_locations=[pkg])
    if spec is None or not os.path.isfile(os.path.join(pkg, "__init__.py")):
        raise SystemExit(f"ab: --old {path}: no package at {pkg}")
    mod = importlib.util.module_from_spec(spec)
    sys.modules["ddstore_old"] = mod
    spec.loader.exec_module(mod)
    return mod


def latency(stores, new, old, rb, turns):
    n = (8 << 20) // rb
    name = f"lat{rb}"
    bench._both(stores, lambda r, st: st.add(name, np.zeros((n, rb), np.uint8)))
    try:
        one = np.empty((1, rb), np.uint8)
        gr = np.random.default_rng(2).integers(n, 2 * n, turns)
        gl = gr.tolist()
        new.get(name, one, n)
        old.get(name, one, n)
        tcp = bench.Ping(socket.AF_INET, rb)
        raw, raw_close = bench.raw_direct(new, name, n)
        try:
            ts = bench._turn_times(turns, {"new_np": lambda i: new.get(name, one, gr[i]),
                                           "old_np": lambda i: old.get(name, one, gr[i]),
                                           "new_int": lambda i: new.get(name, one, gl[i]),
                                           "old_int": lambda i: old.get(name, one, gl[i]), "raw_direct": raw,
                                           "tcp": tcp})
        finally:
            raw_close()
            tcp.close()
        direct = {who: st.get_profile(name)["direct_rows"] for who, st in (("new", new), ("old", old))}
        out = {"what": "get_remote", "row_bytes": rb, "turns": turns, "direct_rows": direct}
        out.update({k + "_p50_us": float(np.percentile(t, 50) * 1e6) for k, t in ts.items()})
        for a, b in (("new_np", "old_np"), ("new_int", "old_int"), ("new_np", "raw_direct"), ("old_np", "raw_direct"),
                     ("new_np", "tcp"), ("old_np", "tcp")):
            out[f"{a}/{b}"] = float(np.median(ts[a] / ts[b]))
        return out
    finally:
        bench._both(stores, lambda r, st: st.free(name))


def local(stores, new, old, rb, dur):
    n = (32 << 20) // rb
    name = f"loc{rb}"

    def add(r, st):
        data = np.empty((n, rb), np.uint8)
        data[:, :8] = (np.arange(n, dtype=np.int64) + r * n).view(np.uint8).reshape(n, 8)
        st.add(name, data)
    bench._both(stores, add)
    try:
        idxs = [np.random.default_rng(1 + k).integers(0, n, 256) for k in range(64)]
        dst = np.empty((256, rb), np.uint8)
        al = bench.page_aligned(dst.shape, dst.dtype)
        shm = new._var(name).local[0]
        heap = np.array(shm)
        for st in (new, old):
            st.get_batch(name, dst, idxs[3])
            assert (dst[:, :8].copy().view(np.int64)[:, 0] == idxs[3]).all()
        k = [0]

        def turn(f):
            def op():
                k[0] = (k[0] + 1) & 63
                f(idxs[k[0]])
            return op
        ops = {"new": turn(lambda i: new.get_batch(name, dst, i)), "old": turn(lambda i: old.get_batch(name, dst, i)),
               "new_aligned": turn(lambda i: new.get_batch(name, al, i)),
               "old_aligned": turn(lambda i: old.get_batch(name, al, i)),
               "numpy_heap": turn(lambda i: heap.take(i, axis=0, out=dst, mode="clip")),
               "numpy_shm": turn(lambda i: shm.take(i, axis=0, out=dst, mode="clip")),
               "numpy_shm_aligned": turn(lambda i: shm.take(i, axis=0, out=al, mode="clip"))}
        S = {key: np.asarray(v) for key, v in bench._interleaved(dur, dst.nbytes, ops).items()}
        best = max(("numpy_heap", "numpy_shm", "numpy_shm_aligned"), key=lambda key: np.median(S[key]))
        sfx = "_aligned" if best == "numpy_shm_aligned" else ""
        out = {"what": "get_batch_local", "row_bytes": rb, "samples": len(S["new"]), "numpy_best": best}
        out.update({key + "_gbps": float(np.median(v)) for key, v in S.items()})
        # The 90th percentile of each: its rate when the load leaves it
        # alone (load adds time, never takes it away).
        out.update({key + "_p90_gbps": float(np.percentile(v, 90)) for key, v in S.items()})
        for a, b in (("new", "old"), ("new_aligned", "old_aligned"), ("new", "numpy_shm"), ("new", "numpy_heap"),
                     ("new_aligned", "numpy_shm_aligned")):
            out[f"p90 {a}/{b}"] = out[a + "_p90_gbps"] / out[b + "_p90_gbps"]
        out["new/old"] = float(np.median(S["new"] / S["old"]))
        out["new/old_aligned"] = float(np.median(S["new_aligned"] / S["old_aligned"]))
        out["new/numpy_best"] = float(np.median(S["new" + sfx] / S[best]))
        out["old/numpy_best"] = float(np.median(S["old" + sfx] / S[best]))
        out["new/numpy_shm"] = float(np.median(S["new"] / S["numpy_shm"]))
        return out
    finally:
        bench._both(stores, lambda r, st: st.free(name))


def main(argv=None):
    ap = argparse.ArgumentParser(prog="python -m ddstore_bench.ab", description=__doc__.split("\n\n")[0])
    ap.add_argument("--old", required=True, help="directory holding the older package (DIR/ddstore)")
    ap.add_argument("--sizes", default="64,4096", help="row bytes of the get() latencies")
    ap.add_argument("--local-sizes", default="64,4096,65536,1048576", help="row bytes of node-local get_batch")
    ap.add_argument("--turns", type=int, default=5000, help="turns of the get() latencies")
    ap.add_argument("--dur", type=float, default=0.5, help="seconds per op and row size of get_batch")
    a = ap.parse_args(argv)
    old_mod = load_old(a.old)
    sizes = [int(x) for x in a.sizes.split(",") if x]
    local_sizes = [int(x) for x in a.local_sizes.split(",") if x]
    ns = f"pyab-{os.getpid()}"
    if not os.environ.get("DDSTORE_SECRET"):
        os.environ["DDSTORE_SECRET"] = secrets.token_hex(32)
    args = ("--rendezvous", f"127.0.0.1:{bench._free_port()}")
    stores = [Store(namespace=ns, rank=r, size=2, local_rank=0, local_size=1, node=f"ab-{'ab'[r]}", agent_args=args)
              for r in range(2)]
    kw = dict(namespace=ns, reader=True, rank=0, size=2, local_rank=0, local_size=1, node="ab-a", spawn=False)
    new = old = None
    try:
        new, old = Store(**kw), old_mod.Store(**kw)
        print(json.dumps({"load_average": os.getloadavg()}), flush=True)
        for rb in sizes:
            print(json.dumps(latency(stores, new, old, rb, a.turns)), flush=True)
        for rb in local_sizes:
            print(json.dumps(local(stores, new, old, rb, a.dur)), flush=True)
        print(json.dumps({"load_average": os.getloadavg()}), flush=True)
    finally:
        for st in (new, old, *stores):
            if st is not None:
                st.close()
        subprocess.run(["pkill", "-f", "--", f"--namespace {ns} "], check=False)


if __name__ == "__main__":
    main()

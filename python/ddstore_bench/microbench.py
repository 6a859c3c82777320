"""`python -m ddstore_bench.microbench`: DDStore's microbenchmark from Python:
microseconds per row of a single get() and of a get_batch of 128 random
rows, for 3 KiB and 1 MiB rows, node-local and cross-node, next to DDStore's
published figures and the limits of this machine measured in the same run.

Two simulated nodes of this machine (two agents meeting on loopback, one
Store each, as in ddstore_bench.bench); rank 0 reads. Node-local rows come straight
from shared memory; cross-node rows through the node's agent and the other
agent over TCP, into a buffer from alloc_recv (DDStore's register_recv) and,
as `copy`, into a plain numpy array.

Limits, from this run: node-local, a single thread gathering the same random
rows from one in-memory buffer (`ddstore bench`'s gather) for a batch, and
for a single get() one ctypes.memmove of a random row into a reused buffer
(the cheapest copy a Python call makes); cross-node, raw
loopback TCP (`ddstore bench`'s tcp) for a batch, and for a single get() one
small Unix-socket and one small TCP round trip (a Python echo process) plus
the row at the TCP rate. The whole measurement runs three times (one with
--quick); figures are medians over the rounds, ratios medians of the ratios
within each round, because this machine's limits move from minute to minute.

    python -m ddstore_bench.microbench [--quick] [--rounds R] [--json]

With --mpi, the cross-node figures of two ranks launched by mpirun (each
its own simulated node), read through the agents and by MPI one-sided gets
from the rank itself (Store(comm, method="mpi"), DDStore's method 0), one
launch after the other.
"""

import argparse
import ctypes
import json
import os
import secrets
import signal
import socket
import subprocess
import sys
import time

import numpy as np

from ddstore import _agent
from .bench import _both, _free_port, _mpirun_json, _rate
from ddstore.launch import agent_pids
from ddstore import Store

ROW_SIZES = (3072, 1 << 20)
BATCH = 128

# DDStore's figures (REFERENCE.md §1), as microseconds per row, (low, high).
# Published: Frontier/Perlmutter, Slingshot RDMA between nodes, rows of
# 3-12.5 KB (get, get_batch of 128) and of 1 MB (14 GB/s per rank).
DDSTORE_PUBLISHED = {
    (3072, "get"): (8.6, 10.1),
    (3072, "batch"): (0.68, 1.82),
    ((1 << 20), "batch"): ((1 << 20) / 14e3, (1 << 20) / 14e3),
}
# Measured on this machine (its C++ build, Open MPI shared memory, 2 ranks,
# 4 KiB rows, batches of 256): the other rank's rows, which for ddstore are
# node-local. get() loop 0.5-0.66 GB/s, get_batch 2.9-3.6 GB/s.
DDSTORE_HERE_4K = {
    "get": (4096 / 660, 4096 / 500),
    "batch": (4096 / 3600, 4096 / 2900),
}


def _latency_for(dur, op, min_iters=200):
    """p50 and p99 microseconds of op(i), repeated for about dur seconds."""
    op(0)
    ts, t_end, i = [], time.perf_counter() + dur, 0
    while True:
        t0 = time.perf_counter()
        op(i)
        t1 = time.perf_counter()
        ts.append(t1 - t0)
        i += 1
        if t1 > t_end and i >= min_iters:
            break
    a = np.array(ts) * 1e6
    return float(np.percentile(a, 50)), float(np.percentile(a, 99))


_ECHO = r"""
import os, socket, sys, threading
def serve(ls):
    c, _ = ls.accept()
    if c.family == socket.AF_INET:
        c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    while True:
        b = c.recv(64)
        if not b:
            return
        c.sendall(b)
t = socket.socket(); t.bind(("127.0.0.1", 0)); t.listen(1)
u = socket.socket(socket.AF_UNIX); u.bind(sys.argv[1]); u.listen(1)
print(t.getsockname()[1], flush=True)
ths = [threading.Thread(target=serve, args=(s,)) for s in (t, u)]
[x.start() for x in ths]; [x.join() for x in ths]
"""


def round_trips(dur=0.5):
    """p50 microseconds of a 16-byte round trip to an echo process over a
    Unix socket and over loopback TCP: the wakeups a cross-node get() pays."""
    path = f"/tmp/ddstore-echo-{os.getpid()}.sock"
    p = subprocess.Popen([sys.executable, "-c", _ECHO, path], stdout=subprocess.PIPE, text=True)
    try:
        port = int(p.stdout.readline())
        t = socket.create_connection(("127.0.0.1", port))
        t.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        u = socket.socket(socket.AF_UNIX)
        u.connect(path)
        out = {}
        for key, s in (("unix_rtt_us", u), ("tcp_rtt_us", t)):
            msg, buf = b"x" * 16, bytearray(16)

            def rt(_, s=s, msg=msg, buf=buf):
                s.sendall(msg)
                got = 0
                while got < 16:
                    got += s.recv_into(memoryview(buf)[got:])
            out[key] = _latency_for(dur, rt)[0]
        t.close()
        u.close()
        p.wait(timeout=10)
        return out
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
        try:
            os.unlink(path)
        except OSError:
            pass


def copy_limits(row_sizes=ROW_SIZES, shard_bytes=256 << 20, dur=1.0):
    """p50 microseconds of the cheapest copy of one random row from a
    shard-sized buffer into a reused one-row buffer, from Python
    (ctypes.memmove): the limit of a node-local get()."""
    out = {}
    for rb in row_sizes:
        n = max(shard_bytes // rb, 1)
        src = np.ones((n, rb), np.uint8)
        dst = np.zeros(rb, np.uint8)
        base, d = src.ctypes.data, dst.ctypes.data
        offs = (np.random.default_rng(rb).integers(0, n, 4096) * rb + base).tolist()
        move = ctypes.memmove
        out[str(rb)] = _latency_for(dur, lambda i: move(d, offs[i % 4096], rb))[0]
        del src
    return out


def run(row_sizes=ROW_SIZES, batch=BATCH, shard_bytes=256 << 20, dur=1.0, binary=None):
    """ddstore's figures, one dict per (row size, node-local | cross-node)."""
    ns = f"pymicro-{os.getpid()}"
    args = ("--rendezvous", f"127.0.0.1:{_free_port()}")
    # Agents that meet through a rendezvous address prove a shared secret;
    # the agents the stores start inherit this one.
    if not os.environ.get("DDSTORE_SECRET"):
        os.environ["DDSTORE_SECRET"] = secrets.token_hex(32)
    stores = []
    out = []
    try:
        for r in range(2):
            stores.append(Store(namespace=ns, rank=r, size=2, local_rank=0, local_size=1,
                                node=f"micro-{'ab'[r]}", agent_args=args, binary=binary))
        s = stores[0]
        for rb in row_sizes:
            n = max(shard_bytes // rb, batch)
            name = f"m{rb}"
            _both(stores, lambda r, st: st.add(name, _rows(n, rb, r * n)))
            rng = np.random.default_rng(rb)
            recv = s.alloc_recv((batch, rb), np.uint8)
            dst = np.empty((batch, rb), np.uint8)
            dst[...] = 1  # touched before timing
            for where, lo in (("local", 0), ("remote", n)):
                idxs = [rng.integers(lo, lo + n, batch) for _ in range(64)]
                gl = rng.integers(lo, lo + n, 4096)
                one = (dst if where == "local" else recv)[:1]
                res = {"row_bytes": rb, "where": where, "batch": batch}
                res["get_us_p50"], res["get_us_p99"] = _latency_for(dur, lambda i: s.get(name, one, gl[i % 4096]))
                s.get(name, one, gl[7])
                assert _first(one)[0] == gl[7], "wrong row read"
                k = [0]

                def reader(buf):
                    def op():
                        k[0] = (k[0] + 1) % 64
                        s.get_batch(name, buf, idxs[k[0]])
                    return op
                target = dst if where == "local" else recv
                gbps = _rate(dur, batch * rb, reader(target))
                assert (_first(target) == idxs[k[0]]).all(), "wrong rows read"
                res["batch_us_per_row"] = rb / gbps / 1e3
                if where == "remote":
                    gbps = _rate(dur, batch * rb, reader(dst))
                    assert (_first(dst) == idxs[k[0]]).all(), "wrong rows read"
                    res["batch_copy_us_per_row"] = rb / gbps / 1e3
                out.append(res)
            s.free_recv(recv)
            _both(stores, lambda r, st: st.free(name))
    finally:
        for st in stores:
            st.close()
        for pid in agent_pids(ns):
            try:
                os.kill(pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
    return out


def _rows(n, rb, first):
    """n rows of rb bytes whose first 8 bytes hold their global index."""
    a = np.zeros((n, rb), np.uint8)
    a[:, :8] = (np.arange(n, dtype=np.int64) + first).view(np.uint8).reshape(n, 8)
    return a


def _first(buf):
    return buf[:, :8].copy().view(np.int64)[:, 0]


def go_limits(binary, row_sizes, batch, shard_bytes, dur):
    """`ddstore bench --json` at these sizes: the Go client's figures and the
    gather and loopback TCP limits, keyed by row size."""
    sizes = ",".join(str(x) for x in row_sizes)
    out = subprocess.run([binary, "bench", "--json", "--sizes", sizes, "--batch", str(batch), "--shard",
                          str(shard_bytes), "--duration", f"{int(dur * 1000)}ms"], check=True, capture_output=True,
                         text=True).stdout
    return {r["row_bytes"]: r for r in json.loads(out)["rows"]}


def compare(rows, go, rtt, copy):
    """Add to each row the limit, the Go client's figure, DDStore's figures
    and the ratios (speed ratios: > 1 means ddstore is faster)."""
    for r in rows:
        rb, g = r["row_bytes"], go[r["row_bytes"]]
        if r["where"] == "local":
            lim_b = rb / g["gather_limit_gbps"] / 1e3
            r["limit_batch_us_per_row"] = lim_b
            r["limit_get_us"] = copy[str(rb)]
            r["go_batch_us_per_row"] = rb / g["local_gbps"] / 1e3
            r["go_get_us_p50"] = g["get_local_p50_us"]
        else:
            lim_b = rb / g["tcp_limit_gbps"] / 1e3
            r["limit_batch_us_per_row"] = lim_b
            r["limit_get_us"] = rtt["unix_rtt_us"] + rtt["tcp_rtt_us"] + lim_b
            r["go_batch_us_per_row"] = rb / g["remote_gbps"] / 1e3
            r["go_get_us_p50"] = g["get_remote_p50_us"]
        r["batch_vs_limit"] = r["limit_batch_us_per_row"] / r["batch_us_per_row"]
        r["get_vs_limit"] = r["limit_get_us"] / r["get_us_p50"]
        for op, key in (("get", "get_us_p50"), ("batch", "batch_us_per_row")):
            pub = DDSTORE_PUBLISHED.get((rb, op))
            if pub:
                r[f"ddstore_published_{op}_us"] = list(pub)
                r[f"{op}_vs_ddstore_published"] = [pub[0] / r[key], pub[1] / r[key]]
            if r["where"] == "local" and rb == 3072:
                here = DDSTORE_HERE_4K[op]
                r[f"ddstore_here_4k_{op}_us"] = list(here)
    return rows


def _rng(a, fmt="{:.2f}"):
    if a is None:
        return "-"
    lo, hi = a
    return fmt.format(lo) if abs(hi - lo) < 1e-9 * max(abs(lo), 1) else f"{fmt.format(lo)}-{fmt.format(hi)}"


def table(rows):
    """The Markdown table docs/benchmarks.md shows."""
    out = ["| row | where | op | ddstore µs/row (p50) | Go client | limit µs/row | limit/ours | "
           "DDStore published µs/row | DDStore/ours | DDStore here, 4 KiB µs/row |",
           "|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        size = "3 KiB" if r["row_bytes"] == 3072 else ("1 MiB" if r["row_bytes"] == 1 << 20 else str(r["row_bytes"]))
        where = "node-local" if r["where"] == "local" else "cross-node"
        ops = (("get", "get()", "get_us_p50"), ("batch", f"get_batch({r['batch']})", "batch_us_per_row"))
        for op, label, key in ops:
            ours = f"{r[key]:.2f}"
            if op == "batch" and "batch_copy_us_per_row" in r:
                ours += f" (copy {r['batch_copy_us_per_row']:.2f})"
            go = r["go_get_us_p50"] if op == "get" else r["go_batch_us_per_row"]
            lim = r["limit_get_us"] if op == "get" else r["limit_batch_us_per_row"]
            vs = r["get_vs_limit"] if op == "get" else r["batch_vs_limit"]
            out.append(f"| {size} | {where} | {label} | {ours} | {go:.2f} | {lim:.2f} | {vs:.2f} | "
                       f"{_rng(r.get(f'ddstore_published_{op}_us'))} | {_rng(r.get(f'{op}_vs_ddstore_published'))}× | "
                       f"{_rng(r.get(f'ddstore_here_4k_{op}_us'))} |")
    return "\n".join(out).replace("| -× |", "| - |")


def measure(quick=False, binary=None, rounds=None):
    """The whole microbenchmark: `rounds` times ddstore's figures, then the
    limits and the Go client's figures; every figure is the median over the
    rounds, every ratio the median of the ratios taken within a round."""
    dur, shard = (0.3, 64 << 20) if quick else (1.0, 256 << 20)
    rounds = rounds or (1 if quick else 3)
    binary = binary or _agent.find_binary()
    per_round, limits, gos = [], [], []
    for _ in range(rounds):
        rows = run(ROW_SIZES, BATCH, shard, dur, binary)
        go = go_limits(binary, ROW_SIZES, BATCH, shard, dur)
        rtt = round_trips(dur)
        copy = copy_limits(ROW_SIZES, shard, dur)
        per_round.append(compare(rows, go, rtt, copy))
        gos.append(go)
        limits.append({"gather_gbps": {str(k): v["gather_limit_gbps"] for k, v in go.items()},
                       "tcp_gbps": {str(k): v["tcp_limit_gbps"] for k, v in go.items()}, "copy_row_us": copy,
                       **rtt})
    return {"rows": _median_rows(per_round), "rounds": rounds, "batch": BATCH, "shard_bytes": shard,
            "limits": _median_tree(limits), "limits_per_round": limits, "go": _median_tree(
                [{str(k): v for k, v in go.items()} for go in gos]),
            "python": sys.version.split()[0], "numpy": np.__version__, "cpus": os.cpu_count()}


def _median_tree(ds):
    """The median of every number over dicts of the same shape."""
    out = {}
    for k, v in ds[0].items():
        if isinstance(v, dict):
            out[k] = _median_tree([d[k] for d in ds])
        elif isinstance(v, (int, float)) and not isinstance(v, bool):
            vals = [d[k] for d in ds]
            out[k] = v if all(x == v for x in vals) else float(np.median(vals))
        else:
            out[k] = v
    return out


def _median_rows(per_round):
    """Per (row size, where): the median of each figure and of each ratio
    over the rounds; DDStore's ratios from the median figure."""
    out = []
    for i in range(len(per_round[0])):
        r = _median_tree([rows[i] for rows in per_round])
        for op, key in (("get", "get_us_p50"), ("batch", "batch_us_per_row")):
            pub = r.get(f"ddstore_published_{op}_us")
            if pub:
                r[f"{op}_vs_ddstore_published"] = [pub[0] / r[key], pub[1] / r[key]]
        out.append(r)
    return out


# -- --mpi: cross-node reads of ranks launched by mpirun, by each method -----

def _mpi_rank(method, row_sizes, batch, shard_bytes, dur):
    """One rank of `mpirun -np 2`, each rank a simulated node of its own:
    rank 0 reads rows of rank 1's shard with Store(comm, method=method) and
    prints its figures as JSON; rank 1 waits without spinning (the reads
    are one-sided: it takes no part)."""
    from mpi4py import MPI
    comm = MPI.COMM_WORLD
    rank = comm.Get_rank()
    os.environ["DDSTORE_NODE_ID"] = f"micro-{'ab'[rank]}"

    def idle_barrier():
        req = comm.Ibarrier()
        while not req.Test():
            time.sleep(0.001)

    s = Store(comm, method=method, agent_wait=60)
    out = []
    try:
        for rb in row_sizes:
            n = max(shard_bytes // rb, batch)
            name = f"m{rb}"
            s.add(name, _rows(n, rb, rank * n))
            if rank == 0:
                rng = np.random.default_rng(rb)
                dst = s.alloc_recv((batch, rb), np.uint8) if method == "agent" else np.empty((batch, rb), np.uint8)
                dst[...] = 1  # touched before timing
                idxs = [rng.integers(n, 2 * n, batch) for _ in range(64)]
                gl = rng.integers(n, 2 * n, 4096)
                one = dst[:1]
                res = {"method": method, "row_bytes": rb, "batch": batch}
                res["get_us_p50"], res["get_us_p99"] = _latency_for(dur, lambda i: s.get(name, one, gl[i % 4096]))
                s.get(name, one, gl[7])
                assert _first(one)[0] == gl[7], "wrong row read"
                k = [0]

                def op():
                    k[0] = (k[0] + 1) % 64
                    s.get_batch(name, dst, idxs[k[0]])
                gbps = _rate(dur, batch * rb, op)
                assert (_first(dst) == idxs[k[0]]).all(), "wrong rows read"
                res["batch_us_per_row"] = rb / gbps / 1e3
                p = s.get_profile(name)
                res["onesided_rows"], res["remote_rows"] = p["onesided_rows"], p["remote_rows"]
                out.append(res)
                if method == "agent":
                    s.free_recv(dst)
            idle_barrier()
            s.free(name)
            idle_barrier()
    finally:
        s.close()
    if rank == 0:
        print(json.dumps(out), flush=True)


def measure_mpi(quick=False, launcher="mpirun"):
    """Cross-node get() and get_batch by method "agent" and "mpi", each in
    an mpirun launch of two ranks of its own, one after the other."""
    row_sizes, batch = ROW_SIZES, BATCH
    shard, dur = (64 << 20, 0.3) if quick else (256 << 20, 1.0)
    if not os.environ.get("DDSTORE_SECRET"):
        os.environ["DDSTORE_SECRET"] = secrets.token_hex(32)
    rows = []
    for method in ("agent", "mpi"):
        ns = f"pymicro-mpi-{os.getpid()}-{method}"
        rows += _mpirun_json(launcher, 2, ns, ["ddstore_bench.microbench", "--mpi-rank", method, "--shard", str(shard),
                                               "--duration", str(dur)], "microbench --mpi")
    return {"shard_bytes": shard, "batch": batch, "rows": rows}


def table_mpi(res):
    by = {(r["method"], r["row_bytes"]): r for r in res["rows"]}
    lines = ["| row | op | agent µs/row | mpi µs/row | agent / mpi | DDStore published µs/row | DDStore / mpi |",
             "|---|---|---|---|---|---|---|"]
    for rb in sorted({r["row_bytes"] for r in res["rows"]}):
        a, m = by[("agent", rb)], by[("mpi", rb)]
        for op, key in (("get()", "get_us_p50"), (f"get_batch({res['batch']})", "batch_us_per_row")):
            pub = DDSTORE_PUBLISHED.get((rb, "get" if op == "get()" else "batch"))
            size = "3 KiB" if rb == 3072 else f"{rb >> 20} MiB" if rb >= 1 << 20 else f"{rb} B"
            lines.append(f"| {size} | {op} | {a[key]:.2f} | {m[key]:.2f} | {a[key] / m[key]:.2f}× | "
                         + (f"{_rng(pub)} | {_rng((pub[0] / m[key], pub[1] / m[key]))}× |" if pub else "– | – |"))
    return "\n".join(lines)


def main(argv=None):
    ap = argparse.ArgumentParser(prog="python -m ddstore_bench.microbench", description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="64 MiB per rank, 0.3 s per figure (about 20 s)")
    ap.add_argument("--rounds", type=int, help="repeat the whole measurement (default 3; 1 with --quick)")
    ap.add_argument("--json", action="store_true", help="print one JSON object")
    ap.add_argument("--mpi", action="store_true",
                    help="cross-node reads of two ranks launched by mpirun, through the agents and by MPI one-sided "
                         "gets from the rank itself (Store(comm, method='mpi')), side by side")
    ap.add_argument("--mpi-rank", choices=("agent", "mpi"), help=argparse.SUPPRESS)
    ap.add_argument("--shard", type=int, default=256 << 20, help=argparse.SUPPRESS)
    ap.add_argument("--duration", type=float, default=1.0, help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.mpi_rank:
        _mpi_rank(a.mpi_rank, ROW_SIZES, BATCH, a.shard, a.duration)
        return
    if a.mpi:
        res = measure_mpi(a.quick)
        if a.json:
            print(json.dumps(res))
            return
        print(f"ddstore microbenchmark, cross-node, 2 ranks of mpirun on 2 simulated nodes, "
              f"{res['shard_bytes'] >> 20} MiB per rank, Python {sys.version.split()[0]}\n")
        print(table_mpi(res))
        print("\n(ratios of µs: above 1, the second is faster)")
        return
    res = measure(a.quick, rounds=a.rounds)
    if a.json:
        print(json.dumps(res))
        return
    lim = res["limits"]
    print(f"ddstore microbenchmark: 2 nodes on loopback, {res['shard_bytes'] >> 20} MiB per rank, "
          f"medians of {res['rounds']} round{'s' if res['rounds'] > 1 else ''}, "
          f"Python {res['python']}, numpy {res['numpy']}; limits in this run: gather "
          + ", ".join(f"{float(v):.1f}" for v in lim["gather_gbps"].values()) + " GB/s, tcp "
          + ", ".join(f"{float(v):.1f}" for v in lim["tcp_gbps"].values())
          + f" GB/s (3 KiB, 1 MiB), one-row copy " + ", ".join(f"{float(v):.2f}" for v in lim["copy_row_us"].values())
          + f" µs, round trips unix {lim['unix_rtt_us']:.0f} µs, tcp {lim['tcp_rtt_us']:.0f} µs\n")
    print(table(res["rows"]))


if __name__ == "__main__":
    main()

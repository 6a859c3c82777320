"""`python -m ddstore_bench.bench`: the Python client's read figures next to the
Go client's, measured in the same run on two nodes of this machine (two
agents on loopback): get_batch GB/s of node-local and other-node rows, and
get() latency of single rows. Node-local get_batch is set beside numpy's own
gather of the same rows (np.take(shard, idx, axis=0, out=...)) in the same
run: from the mapped shard itself (the same pages as ours; into the same
destination and into one starting on a page) and from a copy of it in the
heap (huge pages; take's default mode and mode "clip"), each ratio apart.

    python -m ddstore_bench.bench [--quick] [--json]
"""

import argparse
import json
import os
import resource
import secrets
import signal
import socket
import subprocess
import sys
import threading
import time

import numpy as np

from ddstore import _agent
from ddstore import Store
from ddstore.launch import agent_pids


def _both(stores, f):
    """f(rank, store) on both stores at once (add and free are collective)."""
    errs = [None] * len(stores)

    def go(r):
        try:
            f(r, stores[r])
        except BaseException as e:  # noqa: BLE001 - re-raised below
            errs[r] = e
    ts = [threading.Thread(target=go, args=(r,)) for r in range(len(stores))]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    for e in errs:
        if e is not None:
            raise e


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _mpirun_json(launcher, n, ns, argv, what):
    """Run argv (python -m of a bench's rank part) as n ranks under
    launcher (Open MPI's mpirun), in namespace ns on a rendezvous of their
    own, with the ddstore settings of this environment passed on; the
    agents the job started are stopped after it. Returns what its last line
    of output holds (JSON); a failed job raises, what naming the bench."""
    env = {**os.environ, "DDSTORE_NAMESPACE": ns, "DDSTORE_RENDEZVOUS": f"127.0.0.1:{_free_port()}",
           "DDSTORE_PEER_LISTEN": "127.0.0.1:0"}
    cmd = [launcher, "--oversubscribe", "-np", str(n)]
    if os.geteuid() == 0:
        cmd.insert(1, "--allow-run-as-root")
    for key in ("DDSTORE_NAMESPACE", "DDSTORE_RENDEZVOUS", "DDSTORE_PEER_LISTEN", "DDSTORE_SECRET",
                "DDSTORE_BIN", "DDSTORE_RUN_DIR", "PYTHONPATH"):
        if key in env:
            cmd += ["-x", key]
    cmd += [sys.executable, "-m", *argv]
    try:
        r = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    finally:
        for pid in agent_pids(ns):
            try:
                os.kill(pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
    if r.returncode != 0:
        raise RuntimeError(f"{what}: {' '.join(cmd)} failed ({r.returncode}):\n{r.stdout}{r.stderr}")
    return json.loads(r.stdout.strip().splitlines()[-1])


def _rate(dur, nbytes, op):
    """Median GB/s over samples of at least ~2 ms of repeated op()."""
    op()
    group, samples, t_end = 1, [], time.perf_counter() + dur
    while True:
        t0 = time.perf_counter()
        for _ in range(group):
            op()
        el = time.perf_counter() - t0
        if el < 0.002:
            group *= 2
            continue
        samples.append(group * nbytes / el / 1e9)
        if time.perf_counter() > t_end and len(samples) >= 3:
            return float(np.median(samples))


# numpy's own gathers of the rows a node-local get_batch reads, the limit of
# a Python client: np.take(out=) in its default mode (which gathers into a
# temporary and copies that into out) and the take method in mode "clip"
# (straight into out, without the function's dispatch) from a copy of the
# shard in the process's heap (which numpy backs with huge pages), and in
# mode "clip" from the mapped shard itself (the same 4 KiB pages as ours)
# into the same destination and into one starting on a page (glibc's
# memmove copies rows of 4 KiB to 1 MiB slowly into a destination a few
# bytes past its source within a page, as a numpy array of 128 KiB or more
# is past a shard's rows: see _vars).
NUMPY_HEAP = ("numpy_take_gbps", "numpy_take_clip_gbps")
NUMPY_SHM = ("numpy_take_shm_gbps", "numpy_take_shm_aligned_gbps")
NUMPY_GATHERS = NUMPY_HEAP + NUMPY_SHM


def local_vs_numpy(dur, s, name, dst, idxs):
    """Node-local get_batch of the batches idxs into dst, and into a
    destination starting on a page, and numpy's gathers (NUMPY_GATHERS) of
    the same rows, their samples taken in turn (the machine's load moves
    from second to second): the median GB/s of each (local_gbps into dst,
    local_aligned_gbps into the page-aligned one); numpy_gbps, the fastest
    of numpy's (by median); local_vs_numpy, the median over the turns of
    get_batch's rate over that one's in the same turn, get_batch into the
    same destination as that numpy gather (a destination's alignment moves
    both alike: 64-byte rows into one 16 bytes past a cache line straddle
    two lines each); local_vs_numpy_shm and local_vs_numpy_heap, the same
    against the fastest from the shard's own mapping and from the heap
    copy."""
    shm = s._var(name).local[0]
    heap = np.array(shm)  # every page written: none reads as the zero page
    aligned = page_aligned(dst.shape, dst.dtype)
    k = [0]

    def ours(into):
        def op():
            k[0] = (k[0] + 1) % len(idxs)
            s.get_batch(name, into, idxs[k[0]])
        return op

    def gather(src, into, method=False, **kw):
        take = src.take if method else lambda i, **kw2: np.take(src, i, axis=0, **kw2)

        def op():
            k[0] = (k[0] + 1) % len(idxs)
            take(idxs[k[0]], axis=0, out=into, **kw) if method else take(idxs[k[0]], out=into, **kw)
        return op
    ops = {"local_gbps": ours(dst), "local_aligned_gbps": ours(aligned), "numpy_take_gbps": gather(heap, dst),
           "numpy_take_clip_gbps": gather(heap, dst, True, mode="clip"),
           "numpy_take_shm_gbps": gather(shm, dst, True, mode="clip"),
           "numpy_take_shm_aligned_gbps": gather(shm, aligned, True, mode="clip")}
    samples = _interleaved(dur, dst.nbytes, ops)
    out = {key: float(np.median(v)) for key, v in samples.items()}
    for suffix, keys in (("", NUMPY_GATHERS), ("_shm", NUMPY_SHM), ("_heap", NUMPY_HEAP)):
        best = max(keys, key=lambda key: out[key])
        mine = "local_aligned_gbps" if best == "numpy_take_shm_aligned_gbps" else "local_gbps"
        out["numpy" + suffix + "_gbps"] = out[best]
        out["local_vs_numpy" + suffix] = float(np.median(np.asarray(samples[mine]) / np.asarray(samples[best])))
    return out


def page_aligned(shape, dtype):
    """A zeroed array starting on a page (numpy's large arrays start 16
    bytes past one), its pages faulted in."""
    dt = np.dtype(dtype)
    nbytes = int(np.prod(shape)) * dt.itemsize
    raw = np.zeros(nbytes + 4096, np.uint8)
    off = -raw.ctypes.data % 4096
    a = raw[off:off + nbytes].view(dt).reshape(shape)
    a[...] = 0
    return a


def _usage():
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_minflt + r.ru_majflt, r.ru_nvcsw + r.ru_nivcsw


def _interleaved(dur, nbytes, ops, usage=False):
    """GB/s samples of each op (a dict of them), at least ~2 ms of repeated
    calls each, taken in turn (each round in a drawn order) for about dur
    seconds per op. With usage, also
    each op's page faults and context switches (voluntary or not) of this
    process per call: (samples, {op: (faults, switches)})."""
    groups = {}
    for key, op in ops.items():
        op()
        g = 1
        while True:
            t0 = time.perf_counter()
            for _ in range(g):
                op()
            if time.perf_counter() - t0 >= 0.002:
                break
            g *= 2
        groups[key] = g
    samples = {key: [] for key in ops}
    used = {key: [0, 0, 0] for key in ops}  # faults, switches, calls
    t_end = time.perf_counter() + dur * len(ops)
    # Each round in an order of its own, drawn: an op that always followed
    # another writing the same destination would find it in cache.
    items, rng = list(ops.items()), np.random.default_rng(11)
    while time.perf_counter() < t_end or len(samples[next(iter(ops))]) < 5:
        for key, op in (items[j] for j in rng.permutation(len(items)).tolist()):
            g = groups[key]
            u0 = _usage()
            t0 = time.perf_counter()
            for _ in range(g):
                op()
            samples[key].append(g * nbytes / (time.perf_counter() - t0) / 1e9)
            u1, u = _usage(), used[key]
            u[0] += u1[0] - u0[0]
            u[1] += u1[1] - u0[1]
            u[2] += g
    if usage:
        return samples, {key: (f / c, w / c) for key, (f, w, c) in used.items()}
    return samples


def _latency(iters, op):
    ts = np.empty(iters)
    for i in range(iters):
        t0 = time.perf_counter()
        op(i)
        ts[i] = time.perf_counter() - t0
    return float(np.percentile(ts, 50) * 1e6), float(np.percentile(ts, 99) * 1e6)


def _latencies(iters, ops):
    """Each op (a dict of op(i)) timed iters times in turns (_turn_times):
    {op: (p50, p99) in µs}."""
    return {key: (float(np.percentile(t, 50) * 1e6), float(np.percentile(t, 99) * 1e6))
            for key, t in _turn_times(iters, ops).items()}


def _turn_times(iters, ops):
    """Each op (a dict of op(i)) timed iters times, the ops taken in turn
    (one call of each per turn, so that a moment of load falls on all of
    them alike; each turn in an order of its own, drawn, so that none
    always follows the same other one: a round trip to another process
    leaves the next op a woken process to share the cores with):
    {op: seconds of each call}."""
    ts = {key: np.empty(iters) for key in ops}
    items = list(ops.items())
    orders = np.random.default_rng(7).permuted(np.tile(np.arange(len(items)), (iters, 1)), axis=1)
    for i in range(iters):
        for key, op in (items[j] for j in orders[i].tolist()):
            t0 = time.perf_counter()
            op(i)
            ts[key][i] = time.perf_counter() - t0
    return ts


def _recv_exact(sock, buf):
    view, n = memoryview(buf), 0
    while n < len(buf):
        k = sock.recv_into(view[n:])
        if k == 0:
            raise EOFError("ping peer closed")
        n += k


class Ping:
    """A raw connection of family (AF_INET on loopback, or AF_UNIX) to a
    forked child that answers each 64-byte request with 32 + reply bytes (a
    frame header and a row), as a direct get of one row of reply bytes
    moves: one call of the instance is one round trip. close() ends the
    child."""

    def __init__(self, family, reply):
        import tempfile
        self.dir = tempfile.mkdtemp(prefix="ddstore-ping-") if family == socket.AF_UNIX else None
        ln = socket.socket(family, socket.SOCK_STREAM)
        addr = os.path.join(self.dir, "s") if self.dir else ("127.0.0.1", 0)
        ln.bind(addr)
        ln.listen(1)
        addr = ln.getsockname()
        self.pid = os.fork()
        if self.pid == 0:
            code = 1
            try:
                c, _ = ln.accept()
                if family == socket.AF_INET:
                    c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                req, out = bytearray(64), bytes(32 + reply)
                while True:
                    try:
                        _recv_exact(c, req)
                    except EOFError:
                        break
                    c.sendall(out)
                code = 0
            finally:
                os._exit(code)
        ln.close()
        self.sock = socket.socket(family, socket.SOCK_STREAM)
        self.sock.connect(addr)
        if family == socket.AF_INET:
            self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.req, self.buf = bytes(64), bytearray(32 + reply)

    def __call__(self, i=0):
        self.sock.sendall(self.req)
        _recv_exact(self.sock, self.buf)

    def close(self):
        # Shut down, not only closed: a child forked since holds a copy of
        # the socket, which would keep this child waiting for a request.
        try:
            self.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self.sock.close()
        os.waitpid(self.pid, 0)
        if self.dir:
            os.unlink(os.path.join(self.dir, "s"))
            os.rmdir(self.dir)


def pingpong(family, reply, iters):
    """Round trips (µs: p50, p99) on one raw connection of family (Ping)."""
    p = Ping(family, reply)
    try:
        return _latency(iters, p)
    finally:
        p.close()


def raw_direct(s, name, first):
    """One round trip of the Python client's own direct read at its least:
    a FetchRange of row `first` of variable name (of another node), made
    once, sent on a direct connection to the owner's agent and its reply
    received into a buffer, nothing checked: what the agent and Python's
    sockets cost a get(), without the client's work. Returns (op, close)."""
    from ddstore import _direct, _wire
    v = s._var(name)
    r = int(np.searchsorted(v.prefix, first, side="right")) - 1
    c = _direct.Conn(v.addrs[r], s._direct_key(), 10.0)
    body = s._direct._name(v) + _direct._RANGE.pack(v.id, first, 1)
    frame = _wire.HEADER.pack(_wire.MAGIC, _wire.VERSION, _direct.OP_FETCH_RANGE, 0, 0, len(body), 0, 1, 0) + body
    buf = bytearray(_wire.HEADER.size + v.rb)
    sk = c.sock

    def op(i=0):
        sk.sendall(frame)
        _recv_exact(sk, buf)
    return op, c.close


def run(row_sizes=(4096, 65536), batch=256, shard_bytes=64 << 20, dur=0.5, lat_iters=20000, binary=None):
    ns = f"pybench-{os.getpid()}"
    port = _free_port()
    args = ("--rendezvous", f"127.0.0.1:{port}")
    # Agents that meet through a rendezvous address prove a shared secret;
    # the agents the stores start inherit this one.
    if not os.environ.get("DDSTORE_SECRET"):
        os.environ["DDSTORE_SECRET"] = secrets.token_hex(32)
    stores = [Store(namespace=ns, rank=r, size=2, local_rank=0, local_size=1, node=f"bench-{'ab'[r]}",
                    agent_args=args, binary=binary) for r in range(2)]
    s = stores[0]
    # A reader on rank 0's node whose reads of the other node all go
    # through its agent (direct=False): the path before direct reads.
    via = Store(namespace=ns, reader=True, rank=0, size=2, local_rank=0, local_size=1, node="bench-a", spawn=False,
                direct=False)

    def both(f):
        _both(stores, f)

    rows_out = []
    try:
        for rb in (64, *row_sizes):
            n = shard_bytes // rb
            name = f"b{rb}"

            def add(r, st):
                data = np.empty((n, rb), np.uint8)
                data[:, :8] = (np.arange(n, dtype=np.int64) + r * n).view(np.uint8).reshape(n, 8)
                st.add(name, data)
            both(add)
            rng = np.random.default_rng(1)
            idx_local = [rng.integers(0, n, batch) for _ in range(64)]
            idx_remote = [rng.integers(n, 2 * n, batch) for _ in range(64)]
            dst = np.empty((batch, rb), np.uint8)
            recv = s.alloc_recv((batch, rb), np.uint8)
            k = [0]

            def reader(out, idxs):
                def op():
                    k[0] = (k[0] + 1) % 64
                    s.get_batch(name, out, idxs[k[0]])
                return op
            res = {"row_bytes": rb}
            res.update(local_vs_numpy(dur, s, name, dst, idx_local))
            s.get_batch(name, dst, idx_local[5])
            assert (dst[:, :8].copy().view(np.int64)[:, 0] == idx_local[5]).all()
            if rb != 64:
                res["remote_gbps"] = _rate(dur, batch * rb, reader(recv, idx_remote))
                assert (recv[:, :8].copy().view(np.int64)[:, 0] == idx_remote[k[0]]).all()
                res["remote_copy_gbps"] = _rate(dur, batch * rb, reader(dst, idx_remote))
            one = np.empty((1, rb), np.uint8)
            gl = rng.integers(0, n, lat_iters)
            gr = rng.integers(n, 2 * n, max(lat_iters // 2, 100))
            res["get_local_p50_us"], res["get_local_p99_us"] = _latency(lat_iters, lambda i: s.get(name, one, gl[i]))
            # get() of the other node's rows, direct and through the own
            # agent, beside the limits, one of each in every turn: the raw
            # round trips of the same bytes (a Python client and server)
            # and the client's own direct read at its least (raw_direct).
            tcp, unix = Ping(socket.AF_INET, rb), Ping(socket.AF_UNIX, rb)
            raw, raw_close = raw_direct(s, name, n)
            try:
                lat = _latencies(len(gr), {"get": lambda i: s.get(name, one, gr[i]),
                                           "via": lambda i: via.get(name, one, gr[i]), "raw": raw, "tcp": tcp,
                                           "unix": unix})
            finally:
                raw_close()
                tcp.close()
                unix.close()
            res["get_remote_p50_us"], res["get_remote_p99_us"] = lat["get"]
            res["get_remote_via_agent_p50_us"] = lat["via"][0]
            res["raw_direct_p50_us"] = lat["raw"][0]
            res["tcp_round_trip_p50_us"], res["unix_round_trip_p50_us"] = lat["tcp"][0], lat["unix"][0]
            res["get_remote_vs_tcp_round_trip"] = res["get_remote_p50_us"] / res["tcp_round_trip_p50_us"]
            res["get_remote_vs_raw_direct"] = res["get_remote_p50_us"] / res["raw_direct_p50_us"]
            s.free_recv(recv)
            both(lambda r, st: st.free(name))
            rows_out.append(res)
    finally:
        via.close()
        for st in stores:
            st.close()
        subprocess.run(["pkill", "-f", "--", f"--namespace {ns} "], check=False)
    return rows_out


def go_figures(binary, row_sizes, batch, shard_bytes, dur):
    sizes = ",".join(str(x) for x in (64, *row_sizes))
    out = subprocess.run([binary, "bench", "--json", "--sizes", sizes, "--batch", str(batch), "--shard",
                          str(shard_bytes), "--duration", f"{int(dur * 1000)}ms"], check=True, capture_output=True,
                         text=True).stdout
    return {r["row_bytes"]: r for r in json.loads(out)["rows"]}


def main(argv=None):
    ap = argparse.ArgumentParser(prog="python -m ddstore_bench.bench", description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="short figures (about 30 s)")
    ap.add_argument("--json", action="store_true", help="print one JSON object")
    a = ap.parse_args(argv)
    dur, shard, lat = (0.3, 32 << 20, 4000) if a.quick else (1.5, 128 << 20, 20000)
    binary = _agent.find_binary()
    sizes = (4096, 65536, 1 << 20)
    py = run(sizes, 256, shard, dur, lat, binary)
    go = go_figures(binary, sizes, 256, shard, dur)
    for r in py:
        g = go[r["row_bytes"]]
        for key in ("local_gbps", "remote_gbps", "get_local_p50_us", "get_remote_p50_us", "tcp_round_trip_p50_us",
                    "get_remote_via_agent_p50_us"):
            if key in r:
                r["go_" + key] = g[key]
        r["local_vs_go"] = r["local_gbps"] / g["local_gbps"]
        if "remote_gbps" in r:
            r["remote_vs_go"] = r["remote_gbps"] / g["remote_gbps"]
    if a.json:
        print(json.dumps({"rows": py, "batch": 256, "shard_bytes": shard, "python": sys.version.split()[0],
                          "numpy": np.__version__}))
        return
    print(f"ddstore Python bench: 2 nodes on loopback, batches of 256 random rows, {shard >> 20} MiB per rank, "
          f"Python {sys.version.split()[0]}, numpy {np.__version__}\n")
    hdr = ("row", "local GB/s", "aligned", "numpy", "py/numpy", "numpy shm", "py/shm", "numpy heap", "py/heap", "go",
           "py/go",
           "remote GB/s", "go", "py/go", "remote copy GB/s",
           "get local p50 µs", "p99", "go p50", "get remote p50 µs", "p99", "go p50")
    print("  ".join(f"{h:>{max(len(h), 6)}}" for h in hdr))
    for r in py:
        f = lambda k, fmt="{:.2f}": fmt.format(r[k]) if k in r else "-"  # noqa: E731
        cells = (str(r["row_bytes"]), f("local_gbps"), f("local_aligned_gbps"), f("numpy_gbps"), f("local_vs_numpy"),
                 f("numpy_shm_gbps"),
                 f("local_vs_numpy_shm"), f("numpy_heap_gbps"), f("local_vs_numpy_heap"), f("go_local_gbps"),
                 f("local_vs_go"), f("remote_gbps"), f("go_remote_gbps"), f("remote_vs_go"), f("remote_copy_gbps"),
                 f("get_local_p50_us"), f("get_local_p99_us"), f("go_get_local_p50_us"), f("get_remote_p50_us"),
                 f("get_remote_p99_us"), f("go_get_remote_p50_us"))
        print("  ".join(f"{c:>{max(len(h), 6)}}" for c, h in zip(cells, hdr)))
    print("\nget() of one row of the other node: direct (one round trip to its agent), through this node's agent "
          "(direct=False), the client's own direct request at its least (raw direct: made once, sent, its reply "
          "received, nothing checked), and raw round trips of the same bytes between two Python processes (a 64-byte "
          "request, 32 + row bytes back); one call of each in every turn")
    hdr = ("row", "get remote p50 µs", "via agent", "raw direct", "get/raw", "tcp rtt", "unix rtt", "get/tcp rtt",
           "go get p50", "go via agent", "go tcp rtt")
    print("  ".join(f"{h:>{max(len(h), 6)}}" for h in hdr))
    for r in py:
        f = lambda k, fmt="{:.2f}": fmt.format(r[k]) if k in r else "-"  # noqa: E731
        cells = (str(r["row_bytes"]), f("get_remote_p50_us"), f("get_remote_via_agent_p50_us"), f("raw_direct_p50_us"),
                 f("get_remote_vs_raw_direct"), f("tcp_round_trip_p50_us"),
                 f("unix_round_trip_p50_us"), f("get_remote_vs_tcp_round_trip"), f("go_get_remote_p50_us"),
                 f("go_get_remote_via_agent_p50_us"), f("go_tcp_round_trip_p50_us"))
        print("  ".join(f"{c:>{max(len(h), 6)}}" for c, h in zip(cells, hdr)))


if __name__ == "__main__":
    main()

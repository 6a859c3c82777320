"""`python -m ddstore_bench.bytes`: DDStore users' byte-record pattern through
pyddstore, on two nodes of this machine (two agents on loopback): each rank
adds its records concatenated into one uint8 variable (a row is a byte),
and a record of R bytes is read with get(name, buf[:R], offset), one get per
sample, from this node's shard and from the other node's; beside it, in the
same run, get_batch of the record's R rows (an index per byte: how get read
another node's bytes before range reads). Prints the median and p99 latency
(µs) and the median rate (MB/s) per record size.

    python -m ddstore_bench.bytes [--sizes 1024,4096,10240] [--iters 2000] [--json]
"""

import argparse
import json
import os
import secrets

import numpy as np

import pyddstore
from ddstore_bench.bench import _both, _free_port, _latency


def run(sizes=(1024, 4096, 10240), records=512, iters=2000, binary=None):
    ns = f"pybytes-{os.getpid()}"
    args = ("--rendezvous", f"127.0.0.1:{_free_port()}")
    if not os.environ.get("DDSTORE_SECRET"):
        os.environ["DDSTORE_SECRET"] = secrets.token_hex(32)
    stores = [pyddstore.PyDDStore(None, rank=r, size=2, namespace=ns, node=f"bytes-{'ab'[r]}", agent_args=args,
                                  local_rank=0, local_size=1, binary=binary) for r in range(2)]
    out = []
    try:
        for rb in sizes:
            name = f"rec{rb}"
            n = records * rb

            def add(r, st):
                data = np.frombuffer(np.random.default_rng(r).bytes(n), np.uint8).copy()
                st.add(name, data)
            _both(stores, add)
            s = stores[0]
            buf = np.zeros(rb, np.uint8)
            rng = np.random.default_rng(2)
            starts = {"same node": rng.integers(0, records, iters) * rb,
                      "other node": n + rng.integers(0, records, iters) * rb}
            ar = np.arange(rb, dtype=np.int64)
            for where, offs in starts.items():
                s.get(name, buf, int(offs[0]))  # the first read maps the variable
                # get: a range read; get_batch of the record's rows: an
                # index per byte, as get sent before range reads.
                for how, op in (("get", lambda i: s.get(name, buf, int(offs[i]))),
                                ("get_batch", lambda i: s.get_batch(name, buf, ar + offs[i]))):
                    p50, p99 = _latency(iters, op)
                    out.append({"record_bytes": rb, "where": where, "how": how, "p50_us": p50, "p99_us": p99,
                                "mb_s": rb / p50 if p50 else 0.0})
            # The bytes read are the other rank's bytes.
            want = np.frombuffer(np.random.default_rng(1).bytes(n), np.uint8)
            s.get(name, buf, n + 3 * rb)
            assert np.array_equal(buf, want[3 * rb:4 * rb]), "wrong bytes"
            _both(stores, lambda r, st: st.free(name))
    finally:
        for st in stores:
            st.close()
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", default="1024,4096,10240", help="record sizes in bytes, comma-separated")
    ap.add_argument("--iters", type=int, default=2000, help="gets per record size and node")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args(argv)
    res = run(tuple(int(x) for x in a.sizes.split(",")), iters=a.iters)
    if a.json:
        print(json.dumps(res))
        return
    print(f"{'record':>8} {'where':>11} {'how':>10} {'p50 us':>9} {'p99 us':>9} {'MB/s':>8}")
    for r in res:
        print(f"{r['record_bytes']:>8} {r['where']:>11} {r.get('how', 'get'):>10} {r['p50_us']:>9.1f} "
              f"{r['p99_us']:>9.1f} {r['mb_s']:>8.1f}")


if __name__ == "__main__":
    main()

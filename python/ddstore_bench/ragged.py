"""`python -m ddstore_bench.ragged`: batches of 64 ragged rows (atomistic
structures' positions, [n_i, 3] float32, n_i from 8 to 256 atoms) read
four ways side by side in one run, from this node's memory and from the
other node's:

* ragged: Store.get_ragged of the batch into a receive buffer (one request
  per batch for the other node's rows, none for this node's);
* fixed: Store.get_batch of 64 rows of a fixed-shape variable whose rows
  hold the same bytes on average (the workaround: pad to one size);
* per-sample: DDStore users' pattern through pyddstore, each structure's
  bytes one range of a uint8 variable, read by get(name, buf, offset) one
  structure at a time;
* DataLoader + h5py: PyTorch's DataLoader (batch 64, no workers) over a
  Dataset that reads each structure's rows from one HDF5 file of the flat
  values and their offsets (the page cache holds the file);
* row copy (this node's rows only): the limit of a row-by-row copy in
  Python, the batch's rows copied from the same values (this process's
  memory) into the same buffer by one memoryview slice assignment each and
  nothing else, no index checked, no extent looked up, no allocation.

Two simulated nodes of this machine (two agents on loopback, one Store
each; rank 0 reads). Rates are GB/s of the rows' bytes, the median over
rounds; each round reads the same batches every way, in turn. Ratios are
the medians of the per-round ratios.

    python -m ddstore_bench.ragged [--structures N] [--rounds R] [--batches K] [--json] [--before FILE]

--before FILE: also times get_ragged as another version of the client's
ragged module (FILE, e.g. `git show REV:python/ddstore/_ragged.py`) reads
the same batches, in the same rounds ("before" and after/before columns).
"""

import argparse
import json
import os
import secrets
import subprocess
import sys
import tempfile
import time

import numpy as np

import pyddstore
from ddstore import Store, _agent

from .bench import _both, _free_port

BATCH = 64


def _sizes(n, seed=0):
    """Atoms per structure, as in the GNN job's data: 8 to 256, more small
    ones than large."""
    rng = np.random.default_rng(seed)
    return np.clip(np.round(np.exp(rng.uniform(np.log(8), np.log(257), n))), 8, 256).astype(np.int64)


def _row_copies(dst, src, starts, lengths):
    """The batch's rows packed into dst, one slice assignment a row: what a
    pure-Python gather of rows of their own sizes cannot go below."""
    p = 0
    for a, k in zip(starts.tolist(), lengths.tolist()):
        q = p + k
        dst[p:q] = src[a:a + k]
        p = q


def _module(path):
    """The ragged module of another version of the client, from its file."""
    import importlib.util
    spec = importlib.util.spec_from_file_location("ddstore._ragged_before", path)
    m = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(m)
    return m


def run(structures=8192, rounds=7, batches=20, binary=None, before=None):
    import h5py
    import torch
    ns = f"pybench-ragged-{os.getpid()}"
    args = ("--rendezvous", f"127.0.0.1:{_free_port()}")
    if not os.environ.get("DDSTORE_SECRET"):
        os.environ["DDSTORE_SECRET"] = secrets.token_hex(32)
    dds = [pyddstore.PyDDStore(None, rank=r, size=2, namespace=ns, node=f"ragged-{'ab'[r]}", agent_args=args,
                               local_rank=0, local_size=1, binary=binary) for r in range(2)]
    stores = [d.store for d in dds]
    atoms = _sizes(structures)
    off = np.concatenate(([0], np.cumsum(atoms)))
    values = np.random.default_rng(1).standard_normal((int(off[-1]), 3)).astype(np.float32)
    half = structures // 2
    row_bytes = 12
    mean_bytes = int(round(atoms.mean() * row_bytes))
    tmp = tempfile.mkdtemp(prefix="ddstore-bench-ragged-")
    h5 = os.path.join(tmp, "pos.h5")
    with h5py.File(h5, "w") as f:
        f["values"], f["offsets"] = values, off

    def shard(r):
        lo, hi = (0, half) if r == 0 else (half, structures)
        return lo, hi, values[off[lo]:off[hi]]

    def add(r, st):
        lo, hi, v = shard(r)
        st.add_ragged("pos", v, atoms[lo:hi])
        st.add("fixed", np.random.default_rng(r).integers(0, 255, (hi - lo, mean_bytes), dtype=np.uint8))
        dds[r].add("bytes", np.ascontiguousarray(v).view(np.uint8).reshape(-1))

    class H5Rows(torch.utils.data.Dataset):
        def __init__(self):
            self.f = None

        def __len__(self):
            return structures

        def __getitem__(self, i):
            if self.f is None:
                self.f = h5py.File(h5, "r")
            return torch.from_numpy(self.f["values"][off[i]:off[i + 1]])

    def cat(rows):
        return torch.cat(rows), torch.tensor([r.shape[0] for r in rows])

    out = {}
    try:
        _both(stores, add)
        s, d = stores[0], dds[0]
        rng = np.random.default_rng(2)
        where = {"local": [rng.integers(0, half, BATCH) for _ in range(batches)],
                 "remote": [rng.integers(half, structures, BATCH) for _ in range(batches)]}
        most = max(int(atoms[b].sum()) for bs in where.values() for b in bs)
        recv = s.alloc_recv((most, 3), np.float32)
        fixed = s.alloc_recv((BATCH, mean_bytes), np.uint8)
        byte_off = off * row_bytes
        buf = np.empty(int(atoms.max()) * row_bytes, np.uint8)
        for w, bs in where.items():
            # Checked once: each way reads the structures' rows.
            for b in bs[:2]:
                got, lengths = s.get_ragged("pos", b, out=recv)
                want = np.concatenate([values[off[i]:off[i + 1]] for i in b])
                assert np.array_equal(got, want) and np.array_equal(lengths, atoms[b]), w
                i = int(b[0])
                n = int(byte_off[i + 1] - byte_off[i])
                d.get("bytes", buf[:n], int(byte_off[i]))
                assert np.array_equal(buf[:n].view(np.float32).reshape(-1, 3), values[off[i]:off[i + 1]]), w
            loader = torch.utils.data.DataLoader(H5Rows(), batch_sampler=[b.tolist() for b in bs], collate_fn=cat)
            nbytes = [int(atoms[b].sum()) * row_bytes for b in bs]
            rates = {k: [] for k in ("ragged", "fixed", "per_sample", "dataloader_h5py")}
            if w == "local":
                rates["row_copy"] = []
                src_mv, dst_mv = memoryview(values.reshape(-1).view(np.uint8)), memoryview(recv.reshape(-1).view(np.uint8))
                spans = [(byte_off[b], byte_off[b + 1] - byte_off[b]) for b in bs]
            if before is not None:
                rates["before"] = []
            for _ in range(rounds):
                if before is not None:
                    t0 = time.perf_counter()
                    for b in bs:
                        s._reading("pos", lambda v: before.get(s, v, "pos", b, recv))
                    rates["before"].append(sum(nbytes) / (time.perf_counter() - t0) / 1e9)
                t0 = time.perf_counter()
                for b in bs:
                    s.get_ragged("pos", b, out=recv)
                t1 = time.perf_counter()
                for b in bs:
                    s.get_batch("fixed", fixed, b)
                t2 = time.perf_counter()
                for b in bs:
                    for i in b:
                        lo, hi = int(byte_off[i]), int(byte_off[i + 1])
                        d.get("bytes", buf[:hi - lo], lo)
                t3 = time.perf_counter()
                for _g in loader:
                    pass
                t4 = time.perf_counter()
                if w == "local":
                    for a, k in spans:
                        _row_copies(dst_mv, src_mv, a, k)
                    rates["row_copy"].append(sum(nbytes) / (time.perf_counter() - t4) / 1e9)
                total = sum(nbytes)
                rates["ragged"].append(total / (t1 - t0) / 1e9)
                rates["fixed"].append(len(bs) * BATCH * mean_bytes / (t2 - t1) / 1e9)
                rates["per_sample"].append(total / (t3 - t2) / 1e9)
                rates["dataloader_h5py"].append(total / (t4 - t3) / 1e9)
            r = {f"{k}_gbs": float(np.median(v)) for k, v in rates.items()}
            for k in [k for k in rates if k != "ragged"]:
                r[f"ragged_over_{k}"] = float(np.median(np.array(rates["ragged"]) / np.array(rates[k])))
            r["bytes_per_batch"] = float(np.mean(nbytes))
            out[w] = r
        s.free_recv(recv)
        s.free_recv(fixed)
    finally:
        for st in stores:
            st.close()
        subprocess.run(["pkill", "-f", "--", f"--namespace {ns} "], check=False)
        for name in os.listdir(tmp):
            os.unlink(os.path.join(tmp, name))
        os.rmdir(tmp)
    return {"mean_row_bytes": mean_bytes, "structures": structures, "results": out}


def main(argv=None):
    ap = argparse.ArgumentParser(prog="python -m ddstore_bench.ragged", description=__doc__.split("\n\n")[0])
    ap.add_argument("--structures", type=int, default=8192)
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--batches", type=int, default=20)
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--before", metavar="FILE", help="another version's python/ddstore/_ragged.py, timed beside")
    a = ap.parse_args(argv)
    res = run(a.structures, a.rounds, a.batches, binary=_agent.find_binary(),
              before=_module(a.before) if a.before else None)
    if a.json:
        print(json.dumps(dict(res, batch=BATCH, rounds=a.rounds)))
        return
    print(f"batches of {BATCH} structures ([n, 3] float32, mean row {res['mean_row_bytes']} B), "
          f"{a.structures} on 2 nodes, medians of {a.rounds} rounds (Python {sys.version.split()[0]})\n")
    print("| rows | KB/batch | ragged GB/s | fixed GB/s | per-sample get GB/s | DataLoader+h5py GB/s "
          "| row copy GB/s | ragged/fixed | ragged/per-sample | ragged/DataLoader | ragged/row copy |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for w, r in res["results"].items():
        copy = f"{r['row_copy_gbs']:.3f}" if "row_copy_gbs" in r else "-"
        over = f"{r['ragged_over_row_copy']:.2f}" if "row_copy_gbs" in r else "-"
        print(f"| {w} | {r['bytes_per_batch'] / 1e3:.0f} | {r['ragged_gbs']:.3f} | {r['fixed_gbs']:.3f} | "
              f"{r['per_sample_gbs']:.3f} | {r['dataloader_h5py_gbs']:.3f} | {copy} | {r['ragged_over_fixed']:.2f} | "
              f"{r['ragged_over_per_sample']:.1f} | {r['ragged_over_dataloader_h5py']:.1f} | {over} |")
    if a.before:
        print(f"\nbefore ({a.before}):\n\n| rows | before GB/s | ragged GB/s | ragged/before | before/fixed |\n|---|---|---|---|---|")
        for w, r in res["results"].items():
            print(f"| {w} | {r['before_gbs']:.3f} | {r['ragged_gbs']:.3f} | {r['ragged_over_before']:.2f} | "
                  f"{r['ragged_over_fixed'] / r['ragged_over_before']:.2f} |")


if __name__ == "__main__":
    main()

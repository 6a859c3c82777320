"""`python -m ddstore_bench.graphs`: batches of 64 graphs through DistDataset
and ThreadDataLoader (one get_ragged per ragged field, one get_batch for the
label, collated by Graphs), next to a plain per-sample loop that reads each
graph's fields with get_ragged_row (and the label with get) and builds the
same batch with torch.cat, side by side in one run.

Two simulated nodes of this machine (two agents meeting on loopback, one
Store each, as in ddstore_bench.bench); rank 0 reads. Graphs of 8 to 40
atoms (x [n, 16] float32, pos [n, 3] float32), 2 to 4 edges per atom
(edge_index [2, e] int64) and a label; batches of 64 random graphs, all of
rank 0's node ("local") or all of the other's ("remote"). Each figure is
the median over rounds of the time per batch; the ratio is the median of
the per-round ratios. Every batch of both ways is checked equal once.

    python -m ddstore_bench.graphs [--graphs N] [--rounds R] [--json]
"""

import argparse
import json
import os
import secrets
import subprocess
import sys
import time

import numpy as np
import torch

from ddstore import Store, _agent
from ddstore.torch import DistDataset, Graphs, ThreadDataLoader

from .bench import _both, _free_port

BATCH = 64
EDGES = {"edge_index": "x"}


class _Molecules(torch.utils.data.Dataset):
    def __init__(self, n, seed=0):
        rng = np.random.default_rng(seed)
        self.atoms = rng.integers(8, 41, n)
        self.bonds = self.atoms * rng.integers(2, 5, n)
        self.seed = seed

    def __len__(self):
        return len(self.atoms)

    def __getitem__(self, i):
        rng = np.random.default_rng([self.seed, i])
        n, e = int(self.atoms[i]), int(self.bonds[i])
        return {"x": torch.from_numpy(rng.standard_normal((n, 16), np.float32)),
                "pos": torch.from_numpy(rng.standard_normal((n, 3), np.float32)),
                "edge_index": torch.from_numpy(rng.integers(0, n, (2, e))),
                "y": torch.tensor(float(i))}


def _per_sample(store, name, idx):
    """The batch by hand: one get_ragged_row per ragged field and one get
    per label for each graph, then concatenation, shifts and batch vector."""
    xs, pos, ei, ys, counts = [], [], [], [], []
    y = np.empty((1,), np.float32)
    shift = 0
    for i in idx:
        x = store.get_ragged_row(f"{name}/x", i)
        xs.append(torch.from_numpy(x))
        pos.append(torch.from_numpy(store.get_ragged_row(f"{name}/pos", i)))
        e = store.get_ragged_row(f"{name}/edge_index", i)  # stored [e, 2]
        ei.append(torch.from_numpy(e).t() + shift)
        store.get(f"{name}/y", y, i)
        ys.append(torch.tensor(y[0]))
        counts.append(x.shape[0])
        shift += x.shape[0]
    n = torch.tensor(counts)
    ptr = torch.zeros(len(counts) + 1, dtype=torch.int64)
    torch.cumsum(n, 0, out=ptr[1:])
    return {"x": torch.cat(xs), "pos": torch.cat(pos), "edge_index": torch.cat(ei, 1), "y": torch.stack(ys),
            "batch": torch.repeat_interleave(torch.arange(len(counts)), n), "ptr": ptr}


def _same(a, b):
    return list(a) == list(b) and all(torch.equal(a[k], b[k]) for k in a)


def run(graphs=20000, rounds=5, batches=40, binary=None):
    ns = f"pybench-graphs-{os.getpid()}"
    args = ("--rendezvous", f"127.0.0.1:{_free_port()}")
    if not os.environ.get("DDSTORE_SECRET"):
        os.environ["DDSTORE_SECRET"] = secrets.token_hex(32)
    stores = [Store(namespace=ns, rank=r, size=2, local_rank=0, local_size=1, node=f"bench-{'ab'[r]}",
                    agent_args=args, binary=binary) for r in range(2)]
    src = _Molecules(graphs)
    dss = [None, None]

    def load(r, st):
        dss[r] = DistDataset(src, "mol", store=st)
    try:
        _both(stores, load)
        ds, s = dss[0], stores[0]
        half = graphs // 2
        rng = np.random.default_rng(1)
        where = {"local": [rng.integers(0, half, BATCH).tolist() for _ in range(batches)],
                 "remote": [rng.integers(half, graphs, BATCH).tolist() for _ in range(batches)]}
        collate = Graphs(edges=EDGES, ds=ds)
        out = {}
        for w, bs in where.items():
            # Checked once: both ways give the same batches.
            loader = ThreadDataLoader(ds, batch_sampler=bs, collate_fn=collate)
            for b, g in zip(bs, loader):
                ref = _per_sample(s, "mol", b)
                assert _same({k: g[k] for k in ref}, ref), w
            loader2 = ThreadDataLoader(ds, batch_sampler=bs, collate_fn=collate, num_workers=2)
            t_loader, t_loader2, t_loop, ratios = [], [], [], []
            for _ in range(rounds):
                t0 = time.perf_counter()
                for _g in loader:
                    pass
                t1 = time.perf_counter()
                for _g in loader2:
                    pass
                t2 = time.perf_counter()
                for b in bs:
                    _per_sample(s, "mol", b)
                t3 = time.perf_counter()
                t_loader.append((t1 - t0) / len(bs))
                t_loader2.append((t2 - t1) / len(bs))
                t_loop.append((t3 - t2) / len(bs))
                ratios.append((t3 - t2) / (t1 - t0))
            atoms = float(np.mean([src.atoms[b].sum() for b in bs]))
            out[w] = {"loader_ms": 1e3 * float(np.median(t_loader)), "loader_2_workers_ms":
                      1e3 * float(np.median(t_loader2)), "per_sample_ms": 1e3 * float(np.median(t_loop)),
                      "per_sample_over_loader": float(np.median(ratios)), "atoms_per_batch": atoms}
    finally:
        for st in stores:
            st.close()
        subprocess.run(["pkill", "-f", "--", f"--namespace {ns} "], check=False)
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(prog="python -m ddstore_bench.graphs", description=__doc__.split("\n\n")[0])
    ap.add_argument("--graphs", type=int, default=20000)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args(argv)
    res = run(a.graphs, a.rounds, binary=_agent.find_binary())
    if a.json:
        print(json.dumps({"batch": BATCH, "graphs": a.graphs, "rounds": a.rounds, "results": res}))
        return
    print(f"batches of {BATCH} graphs, {a.graphs} graphs on 2 nodes, medians of {a.rounds} rounds "
          f"(Python {sys.version.split()[0]}, torch {torch.__version__})\n")
    print("| rows | atoms/batch | DistDataset+ThreadDataLoader ms | same, 2 workers ms | per-sample get_ragged_row ms "
          "| per-sample / loader |")
    print("|---|---|---|---|---|---|")
    for w, r in res.items():
        print(f"| {w} | {r['atoms_per_batch']:.0f} | {r['loader_ms']:.3f} | {r['loader_2_workers_ms']:.3f} | "
              f"{r['per_sample_ms']:.3f} | {r['per_sample_over_loader']:.1f} |")


if __name__ == "__main__":
    main()

"""The training benchmark: the same CosmoFlow-like training (or, in I/O mode, the same
reads without a model) run with each loader, and SOLAR's report for each
plus a comparison with the baseline. The loaders take turns epoch by epoch
(epoch 1 of each, then epoch 2 of each, ...), so that whatever else runs on
the machine meanwhile weighs on all of them alike; --sequential runs one
loader after another instead (one dataset in memory at a time).

    python -m ddstore_bench.cosmoflow train [--json] [--cold] [--loaders L ...] [--samples N]
        [--size S] [--epochs E] [--batch B] [--ranks P] [--capacity C] [--data DIR]
    python -m ddstore_bench.cosmoflow io ...      # no model: 4 ranks, batch 16, 3 epochs by default

The command generates the dataset under DIR when it is missing (see
ddstore_bench.cosmoflow.data), starts P ranks on this machine (ddstore.launch:
torchrun's variables, one ddstore agent started by the first rank) and
prints the report. Run under a launcher of your own (torchrun, srun,
mpirun: RANK and WORLD_SIZE set), it is one rank of that job instead and
rank 0 prints; --ranks is then the launcher's.

Every loader runs the same model from the same seed for the same epochs
(see loaders.py for what each reads and why their global batches are the
same sets). Per epoch, each rank measures the time its loop waited for
batches (data loading time, SOLAR's io time), the time of its training loop
(epoch time; validation is not in it), and what it read; the report gives the
largest over ranks, the losses as means over all samples, and the storage
reads per epoch as the samples the agents read from the file (their
storage_rows counter, all fields of a sample counting once) or, for the
baseline, the sample files opened. --cold drops the dataset's files from the
page cache (fdatasync + posix_fadvise DONTNEED, by the first rank of each
node) before every epoch and before loading, so that reads come from storage
rather than memory.
"""

import contextlib
import json
import os
import subprocess
import sys
import tempfile
import time

import numpy as np

from .._job import (BAR, NodeAgent, end_rank, fmt_list, launch_ranks, parse_loaders, print_result, say, start_rank,
                    table, under_launcher, write_result)
from . import data
from .loaders import LOADERS

__all__ = ["main", "run", "rank_main", "report", "DEFAULTS"]

# The job's sizes: train is the README's two-minute run on 2 cores; io is
# SOLAR's I/O evaluation (4 processes, batch 16, 3 epochs, 800 samples).
DEFAULTS = {
    "train": {"samples": 512, "size": 32, "epochs": 8, "batch": 16, "ranks": 2},
    "io": {"samples": 800, "size": 32, "epochs": 3, "batch": 16, "ranks": 4},
}


# -- arguments ---------------------------------------------------------------------

def add_arguments(p, mode):
    d = DEFAULTS[mode]
    p.add_argument("--json", action="store_true", help="print one JSON object instead of the report")
    p.add_argument("--cold", action="store_true",
                   help="drop the dataset files from the page cache before every epoch (posix_fadvise DONTNEED)")
    p.add_argument("--loaders", nargs="+", default=list(LOADERS), metavar="L",
                   help=f"loaders to run, in order (default: all: {' '.join(LOADERS)}; commas work too)")
    p.add_argument("--samples", type=int, default=d["samples"], help=f"N (default {d['samples']})")
    p.add_argument("--size", type=int, default=d["size"], help=f"cube side S (default {d['size']})")
    p.add_argument("--channels", type=int, default=4, help="channels (default 4)")
    p.add_argument("--epochs", type=int, default=d["epochs"], help=f"E (default {d['epochs']})")
    p.add_argument("--batch", type=int, default=d["batch"], help=f"samples per rank per step B (default {d['batch']})")
    p.add_argument("--ranks", type=int, default=d["ranks"],
                   help=f"processes P started here (default {d['ranks']}; under a launcher, its own)")
    p.add_argument("--nodes", type=int, default=1, help="simulated nodes for the ranks started here (default 1)")
    p.add_argument("--capacity", default="0.5",
                   help="memory of ddstore-solar and ddstore-locality: a fraction of N (0.5) or a count of "
                        "samples (400) (default 0.5)")
    p.add_argument("--data", default=None,
                   help="dataset directory (default: $TMPDIR/ddstore-cosmoflow-NxS; generated when missing)")
    p.add_argument("--seed", type=int, default=0, help="seed of the epochs' order and the model (default 0)")
    p.add_argument("--workers", type=int, default=0,
                   help="loader workers (DataLoader processes for baseline, threads for ddstore and "
                        "ddstore-locality; ddstore-solar reads in the loop) (default 0, as SOLAR's baseline)")
    p.add_argument("--prefetch", type=int, default=2,
                   help="steps whose storage reads the tiered loaders announce ahead (default 2)")
    p.add_argument("--sequential", action="store_true",
                   help="run the loaders one after another (one in memory at a time) instead of their epochs in "
                        "turn")
    p.add_argument("--verify", action="store_true",
                   help="check every sample's content and record what each rank saw (JSON: loaders.L.verify)")
    if mode == "train":
        p.add_argument("--lr", type=float, default=1e-3, help="Adam learning rate (default 0.001)")
        p.add_argument("--val-samples", type=int, default=64, help="validation samples (default 64)")


def parse_capacity(text, n):
    """A fraction of n ("0.5") or a count ("400") -> samples in [1, n]."""
    s = str(text).strip()
    try:
        if any(ch in s for ch in ".eE"):
            f = float(s)
            if not 0 < f <= 1:
                raise ValueError
            c = max(1, int(round(f * n)))
        else:
            c = int(s)
    except ValueError:
        raise ValueError(f"capacity {text!r}: want a fraction in (0, 1] or a count of samples") from None
    if not 1 <= c <= n:
        raise ValueError(f"capacity {text!r}: {c} samples, want 1 to {n}")
    return c


def _loaders(names):
    return parse_loaders(names, LOADERS)


def config(a, mode, ranks):
    """The job's parameters, from the parsed arguments."""
    for name in ("samples", "epochs", "batch", "ranks", "nodes"):
        if getattr(a, name) < 1:
            raise ValueError(f"--{name} {getattr(a, name)}: want >= 1")
    if a.workers < 0 or a.prefetch < 0:
        raise ValueError("--workers and --prefetch: want >= 0")
    if a.batch * ranks > a.samples:
        raise ValueError(f"--batch {a.batch} x {ranks} ranks above --samples {a.samples}: not one global batch")
    cap = parse_capacity(a.capacity, a.samples)
    d = a.data or os.path.join(tempfile.gettempdir(), f"ddstore-cosmoflow-{a.samples}x{a.size}")
    d = os.path.abspath(d)
    sample_bytes = a.channels * a.size ** 3 * 2
    cfg = {
        "mode": mode, "loaders": _loaders(a.loaders), "samples": a.samples, "size": a.size, "channels": a.channels,
        "epochs": a.epochs, "batch": a.batch, "ranks": ranks, "capacity": cap, "data": d, "seed": a.seed,
        "workers": a.workers, "prefetch": a.prefetch, "cold": a.cold, "verify": a.verify,
        "sequential": a.sequential,
        "chunked": os.path.join(d, data.CHUNKED_NAME),
        "files": [os.path.join(d, data.FILES_DIR, data.file_name(i)) for i in range(a.samples)],
        "load_chunk": max(1, (64 << 20) // sample_bytes), "sample_bytes": sample_bytes,
        "lr": getattr(a, "lr", 1e-3), "val_samples": getattr(a, "val_samples", 0) if mode == "train" else 0,
        "val": os.path.join(d, "val"), "data_seed": 0, "val_seed": 1,
    }
    return cfg


def ensure_data(cfg):
    """Generate the dataset (and the validation set) when missing; the
    generator's messages go to stderr."""
    with contextlib.redirect_stdout(sys.stderr):
        data.generate(cfg["data"], cfg["samples"], size=cfg["size"], channels=cfg["channels"], seed=cfg["data_seed"])
        if cfg["val_samples"]:
            data.generate(cfg["val"], cfg["val_samples"], size=cfg["size"], channels=cfg["channels"],
                          seed=cfg["val_seed"], fmt="chunked")


# -- the command --------------------------------------------------------------------

def check_binary(cfg):
    """ddstore-solar and ddstore-locality have the agents read the HDF5
    file: refuse early when the binary cannot."""
    tiered = [n for n in cfg["loaders"] if n in ("ddstore-solar", "ddstore-locality")]
    if not tiered:
        return
    from ddstore import _agent
    from ddstore import Error
    try:
        b = _agent.find_binary()
    except Error as e:
        raise ValueError(str(e)) from None
    try:
        v = subprocess.run([b, "version"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError) as e:
        raise ValueError(f"cannot run the ddstore binary {b}: {e}") from None
    if "with HDF5" not in v:
        raise ValueError(f"the ddstore binary {b} is built without HDF5, and {' and '.join(tiered)} read the "
                         f"dataset's HDF5 file through the agents: rebuild it with libhdf5-dev installed "
                         f"(make deps build), or run --loaders baseline ddstore")


def run(a, mode):
    """`python -m ddstore_bench.cosmoflow train|io`: returns the exit status."""
    if under_launcher():
        cfg = config(a, mode, int(os.environ["WORLD_SIZE"]))
        check_binary(cfg)
        result = rank_main(cfg, generate=True)
        if result is not None:
            _print(result, a.json)
        return 0
    cfg = config(a, mode, a.ranks)
    check_binary(cfg)
    ensure_data(cfg)
    say(f"cosmoflow {mode}: starting {cfg['ranks']} ranks ({', '.join(cfg['loaders'])})")
    rc, result = launch_ranks(cfg, "ddstore_bench.cosmoflow.train", a.nodes, "cosmoflow")
    if rc != 0:
        say(f"cosmoflow {mode}: the job failed (status {rc})")
        return rc
    _print(result, a.json)
    return 0


def _print(result, as_json):
    print_result(result, as_json, report)


# -- one rank -------------------------------------------------------------------------

def _val_share(cfg, rank, ranks):
    import h5py
    n = cfg["val_samples"]
    lo, hi = rank * n // ranks, (rank + 1) * n // ranks
    with h5py.File(os.path.join(cfg["val"], data.CHUNKED_NAME), "r") as f:
        return f["x"][lo:hi], f["y"][lo:hi]


class _Verifier:
    """Which sample each row of a batch is (by its targets, which the
    generator derives from the cube: equal targets recomputed from x also
    check the cube)."""

    def __init__(self, cfg):
        import h5py
        with h5py.File(cfg["chunked"], "r") as f:
            ys = f["y"][...]
        self.index = {ys[i].tobytes(): i for i in range(ys.shape[0])}
        self.errors = 0

    def batch(self, x, y):
        xs, ys = x.numpy(), y.numpy()
        out = []
        for j in range(ys.shape[0]):
            i = self.index.get(ys[j].tobytes(), -1)
            if i < 0 or not np.array_equal(data.targets(xs[j]), ys[j]):
                self.errors += 1
            out.append(int(i))
        return out


def rank_main(cfg, generate=False):
    """One rank of the job; returns the result on rank 0 (None elsewhere)
    and writes it to cfg["result"] when that is set."""
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    import ddstore
    from .loaders import drop_page_cache, make_loader, resident_fraction
    from .model import CosmoCNN, local_loss_sum, per_sample_loss

    rank, ranks, local_rank = start_rank()
    if generate and rank == 0:
        ensure_data(cfg)
    dist.barrier()
    train = cfg["mode"] == "train"
    E, B = cfg["epochs"], cfg["batch"]
    G = B * ranks
    store = ddstore.Store()
    agent = NodeAgent(store, local_rank)
    drop_paths = [cfg["chunked"]] + cfg["files"]
    verifier = _Verifier(cfg) if cfg["verify"] else None
    if train:
        vx, vy = _val_share(cfg, rank, ranks)
        vx, vy = torch.from_numpy(vx), torch.from_numpy(vy)

    def log(msg):
        if rank == 0:
            say(f"cosmoflow {cfg['mode']}: {msg}")

    def cold(name):
        """Drop the files (--cold), then say how much of what the loader
        reads the page cache holds: the chunked file, or a sample of the
        baseline's files."""
        res = None
        if cfg["cold"] and local_rank == 0:
            drop_page_cache(drop_paths)
        if local_rank == 0:
            files = cfg["files"][::max(1, len(cfg["files"]) // 64)] if name == "baseline" else [cfg["chunked"]]
            fr = [resident_fraction(f) for f in files]
            res = None if None in fr else float(np.mean(fr))
        dist.barrier()
        return res

    def validate(model):
        model.eval()
        total = torch.zeros(2, dtype=torch.float64)
        with torch.no_grad():
            for lo in range(0, vx.shape[0], B):
                out = model(vx[lo:lo + B])
                total[0] += per_sample_loss(out, vy[lo:lo + B]).sum().item()
                total[1] += out.shape[0]
        dist.all_reduce(total)
        model.train()
        return float(total[0] / max(total[1], 1))

    if train:
        # Torch's first steps (kernel choice, allocator) are slow: taken
        # here, they are charged to no loader.
        warm = CosmoCNN(cfg["size"], cfg["channels"])
        xw = torch.zeros((B, cfg["channels"]) + (cfg["size"],) * 3, dtype=torch.int16)
        for _ in range(2):
            per_sample_loss(warm(xw), torch.zeros((B, 4))).sum().backward()
        del warm, xw

    class Run:
        """One loader's run: its model, optimizer and records."""

        def __init__(self, name):
            self.name, self.epochs = name, []
            self.loader = make_loader(name, cfg, store, ranks, rank)

    def setup(run):
        run.resident = cold(run.name)
        a0 = agent.counters()
        dist.barrier()
        t = time.perf_counter()
        run.loader.setup()
        run.setup_s = time.perf_counter() - t
        run.loader.take_stats()
        dist.barrier()
        run.setup_agent = NodeAgent.delta(a0, agent.counters())
        run.model = run.opt = None
        if train:
            torch.manual_seed(cfg["seed"])
            run.model = DDP(CosmoCNN(cfg["size"], cfg["channels"]))
            run.opt = torch.optim.Adam(run.model.parameters(), lr=cfg["lr"])
        log(f"{run.name}: set up in {run.setup_s:.2f} s")

    def epoch(run, e):
        loader, model, opt = run.loader, run.model, run.opt
        res = cold(run.name)
        tp = time.perf_counter()
        loader.prepare(e)
        plan_s = time.perf_counter() - tp
        a1 = agent.counters()
        dist.barrier()  # no rank reads before the counters are taken
        seen, sizes, errors0 = [], [], verifier.errors if verifier else 0
        load_s, loss_sum, n, batch_load = 0.0, 0.0, 0, []
        it = loader.epoch(e)
        t0 = time.perf_counter()
        while True:
            tl = time.perf_counter()
            try:
                x, y = next(it)
            except StopIteration:
                load_s += time.perf_counter() - tl
                break
            batch_load.append(time.perf_counter() - tl)
            load_s += batch_load[-1]
            if verifier is not None:
                seen.extend(verifier.batch(x, y))
                sizes.append(int(x.shape[0]))
            n += x.shape[0]
            if train:
                out = model(x)
                losses = per_sample_loss(out, y)
                opt.zero_grad()
                local_loss_sum(losses, ranks, G).backward()
                opt.step()
                loss_sum += float(losses.detach().sum())
        epoch_s = time.perf_counter() - t0
        stats = loader.take_stats()
        dist.barrier()
        a2 = agent.counters()
        val = validate(model) if train else None
        rec = {"load_s": load_s, "batch_load_s": batch_load, "epoch_s": epoch_s, "plan_s": plan_s, "samples": n,
               "loss_sum": loss_sum, "val": val, "agent": NodeAgent.delta(a1, a2), "resident": res, **stats}
        if verifier is not None:
            rec["seen"], rec["sizes"] = seen, sizes
            rec["promised"] = loader.promised(e).tolist()
            rec["content_errors"] = verifier.errors - errors0
        run.epochs.append(rec)
        log(f"{run.name}: epoch {e + 1}/{E}: {epoch_s:.2f} s, waited {load_s:.3f} s for data"
            + (f", loss {loss_sum / max(n, 1):.5f} (rank 0), validation {val:.5f}" if train else ""))

    def finish(run):
        order = run.loader.epoch_order() if hasattr(run.loader, "epoch_order") else None
        run.loader.close()
        mine = {"setup_s": run.setup_s, "setup_agent": run.setup_agent, "resident_setup": run.resident,
                "epochs": run.epochs, "epoch_order": order}
        gathered = [None] * ranks
        dist.all_gather_object(gathered, mine)
        dist.barrier()
        return summarize(run.name, gathered, cfg) if rank == 0 else None

    # Interleaved (the default): epoch e of every loader, then epoch e + 1,
    # so that whatever else the machine runs meanwhile weighs on every
    # loader alike. Sequential: one loader after another (one in memory at
    # a time).
    runs = [Run(name) for name in cfg["loaders"]]
    if cfg["sequential"]:
        steps = [(r, e) for r in runs for e in range(E)]
    else:
        steps = [(r, e) for e in range(E) for r in runs]
    results = {}
    for r, e in steps:
        if e == 0:
            setup(r)
        epoch(r, e)
        if e == E - 1:
            results[r.name] = finish(r)
    store.close()
    out = None
    if rank == 0:
        out = {"mode": cfg["mode"], "cold": cfg["cold"], "ranks": ranks, "epochs": E, "batch": B,
               "samples": cfg["samples"], "size": cfg["size"], "channels": cfg["channels"],
               "capacity": cfg["capacity"], "seed": cfg["seed"], "workers": cfg["workers"],
               "prefetch": cfg["prefetch"], "data": cfg["data"], "sequential": cfg["sequential"],
               "loaders": results}
        write_result(cfg, out)
    dist.barrier()
    end_rank([r.model for r in runs])
    return out


def summarize(name, per_rank, cfg):
    """One loader's figures from every rank's records."""
    E = cfg["epochs"]
    eps = [[r["epochs"][e] for r in per_rank] for e in range(E)]
    samples = [sum(x["samples"] for x in ep) for ep in eps]
    load = [max(x["load_s"] for x in ep) for ep in eps]
    client = [sum(x["storage"] for x in ep) for ep in eps]
    fields = 2  # x and y: the agents count a row of each per sample

    def agent_rows(ep):
        d = [x["agent"] for x in ep if x["agent"] is not None]
        return sum(a["storage_rows"] for a in d) / fields if d else None

    agent = [agent_rows(ep) for ep in eps]
    if name == "baseline":
        storage = client
    else:
        storage = [a if a is not None else c for a, c in zip(agent, client)]
    s = {
        "loading_seconds": sum(load),
        "loading_seconds_per_epoch": load,
        "loading_seconds_per_rank": [sum(ep["load_s"] for ep in r["epochs"]) for r in per_rank],
        "loading_seconds_median_batch": float(np.median([b for r in per_rank for ep in r["epochs"]
                                                         for b in ep["batch_load_s"]] or [0.0])),
        "epoch_seconds_per_epoch": [max(x["epoch_s"] for x in ep) for ep in eps],
        "planning_seconds_per_epoch": [max(x["plan_s"] for x in ep) for ep in eps],
        "storage_reads_per_epoch": storage,
        "hit_rate_per_epoch": [sum(x["hits"] for x in ep) / max(n, 1) for ep, n in zip(eps, samples)],
        "train_loss_per_epoch": ([sum(x["loss_sum"] for x in ep) / max(n, 1) for ep, n in zip(eps, samples)]
                                 if cfg["mode"] == "train" else None),
        "val_loss_per_epoch": [ep[0]["val"] for ep in eps] if cfg["mode"] == "train" else None,
        "samples_per_epoch": samples,
        "planned_storage_reads_per_epoch": client,
        "agent_storage_reads_per_epoch": agent,
        "buffer_hits_missing": sum(x["missing"] for ep in eps for x in ep),
        "setup_seconds": max(r["setup_s"] for r in per_rank),
        "setup_storage_reads": _setup_reads(name, cfg),
        "resident_fraction_per_epoch": [max((x["resident"] for x in ep if x["resident"] is not None), default=None)
                                        for ep in eps],
    }
    orders = [r["epoch_order"] for r in per_rank if r["epoch_order"] is not None]
    if orders:
        s["epoch_order"] = orders[0]
    if cfg["verify"]:
        s["verify"] = {"ranks": [{"seen": [ep["seen"] for ep in r["epochs"]],
                                  "sizes": [ep["sizes"] for ep in r["epochs"]],
                                  "promised": [ep["promised"] for ep in r["epochs"]],
                                  "content_errors": sum(ep["content_errors"] for ep in r["epochs"])}
                                 for r in per_rank]}
    return s


def _setup_reads(name, cfg):
    """Samples read from storage before the first epoch: what the job
    loads into memory."""
    return {"baseline": 0, "ddstore": cfg["samples"], "ddstore-locality": cfg["capacity"],
            "ddstore-solar": 0}[name]


# -- the report -----------------------------------------------------------------------------

def bound(result):
    """(1 - C/N + 0.01) * N: the issue's bound on ddstore-locality's storage
    reads per epoch."""
    n, c = result["samples"], result["capacity"]
    return (1 - c / n + 0.01) * n


def report(r):
    """SOLAR's report per loader, then the comparison table."""
    mode = r["mode"]
    out = []
    sb = r["channels"] * r["size"] ** 3 * 2
    cache = ("cold: the dataset files were dropped from the page cache before every epoch (reads come from "
             "storage)" if r["cold"] else "warm: the page cache was left alone (files read before may come from "
                                          "memory)")
    out.append(f"cosmoflow {mode}: {r['ranks']} ranks, {r['samples']} samples of {r['channels']}x{r['size']}^3 int16 "
               f"({sb / 1024:.0f} KiB), batch {r['batch']} per rank, {r['epochs']} epochs, capacity "
               f"{r['capacity']} samples ({r['capacity'] / r['samples']:.2f} of N) for ddstore-solar and "
               f"ddstore-locality, seed {r['seed']}, loader workers {r['workers']}")
    out.append(f"page cache: {cache}")
    out.append("order: " + ("one loader after another" if r.get("sequential") else
                            "the loaders' epochs in turn (epoch 1 of each, then epoch 2 of each, ...)"))
    out.append(f"data: {r['data']}")
    out.append("")
    for name, s in r["loaders"].items():
        out.append(f"{'*' * 12} {name} {'*' * 12}")
        out.append(f"Number of Processes used: {r['ranks']}")
        out.append(f"Number of Epochs: {r['epochs']}")
        out.append(f"Batch Size: {r['batch']}")
        out.append(f"DataLoading time: {s['loading_seconds']:.3f} s; per epoch "
                   f"{fmt_list(s['loading_seconds_per_epoch'], '.3f')} s")
        out.append(f"Epoch time: {fmt_list(s['epoch_seconds_per_epoch'], '.3f')} s")
        if mode == "train":
            out.append(f"Training Loss: {fmt_list(s['train_loss_per_epoch'], '.5f')}")
            out.append(f"Validation Loss: {fmt_list(s['val_loss_per_epoch'], '.5f')}")
        out.append(f"Storage reads per epoch: {fmt_list(s['storage_reads_per_epoch'], '.0f')} of "
                   f"{fmt_list(s['samples_per_epoch'], 'd')} samples; hit rate {fmt_list(s['hit_rate_per_epoch'], '.3f')}")
        extra = f"Set-up: {s['setup_seconds']:.2f} s, {s['setup_storage_reads']} samples loaded into memory"
        if name != "baseline":
            extra += (f"; planning before each epoch (not in the loading time): "
                      f"{fmt_list(s['planning_seconds_per_epoch'], '.3f')} s")
        if name == "ddstore-solar":
            extra += (f"; epoch order {s.get('epoch_order')}; planned hits missing from the buffers: "
                      f"{s['buffer_hits_missing']}")
        out.append(extra)
        out.append(BAR)
        out.append("")
    out.append(comparison(r))
    return "\n".join(out) + "\n"


def comparison(r):
    """The table: each loader against the baseline."""
    base = r["loaders"].get("baseline")
    rows = [("loader", "loading s", "x shorter", "epoch s", "/ baseline", "storage reads/epoch", "hit rate",
             "train loss (last)", "max dloss")]
    for name, s in r["loaders"].items():
        ep = float(np.median(s["epoch_seconds_per_epoch"]))
        shorter = rel = dl = "-"
        if base is not None:
            if s["loading_seconds"] > 0:
                shorter = f"{base['loading_seconds'] / s['loading_seconds']:.1f}x"
            rel = f"{ep / float(np.median(base['epoch_seconds_per_epoch'])):.2f}"
            if r["mode"] == "train" and name != "baseline":
                d = [abs(a - b) / abs(b) for a, b in zip(s["train_loss_per_epoch"], base["train_loss_per_epoch"])
                     if b]
                dl = f"{max(d):.1e}" if d else "-"
        reads = float(np.mean(s["storage_reads_per_epoch"]))
        rd = f"{reads:.0f}"
        if name == "ddstore-locality":
            rd += f" (bound {bound(r):.0f})"
        loss = s["train_loss_per_epoch"][-1] if r["mode"] == "train" and s["train_loss_per_epoch"] else None
        rows.append((name, f"{s['loading_seconds']:.3f}", shorter, f"{ep:.3f}", rel, rd,
                     f"{float(np.mean(s['hit_rate_per_epoch'])):.3f}", "-" if loss is None else f"{loss:.5f}", dl))
    lines = ["Comparison (loading: time the loops waited for batches, summed over epochs, largest rank; epoch s: "
             "median epoch time; x shorter: baseline loading / loading; max dloss: largest relative difference of "
             "an epoch's training loss from the baseline's)"] + table(rows)
    return "\n".join(lines)


# -- the rank entry of a job started by run() -----------------------------------------------

def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    with open(argv[0]) as f:
        cfg = json.load(f)
    rank_main(cfg)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""`python -m ddstore_bench.report`: the figures of docs/benchmarks.md as PNG.

    python -m ddstore_bench.report --out docs/figures            # measure, then plot
    python -m ddstore_bench.report --out docs/figures --replot   # plot the saved JSON again

Three figures, each from a JSON file that the run writes next to it:

  loading.png     data loading time per epoch per loader
                  (io.json: `python -m ddstore_bench.cosmoflow io --json --cold
                  --epochs 5`; skipped, with a message, where that command
                  does not exist)
  hit_rate.png    hit rate per epoch per schedule policy against the bound C/N
                  (schedule.json: `ddstore schedule --json`, one object per
                  policy and capacity)
  throughput.png  get_batch GB/s against row size: ddstore's Go client
                  node-local and cross-node, the gather and loopback TCP
                  limits of the same run (bench.json: `ddstore bench --json`,
                  three runs, medians),
                  the Python client (micro.json: `python -m ddstore_bench.microbench
                  --json`), and DDStore's figures (REFERENCE.md §1)

--io FILE plots a loading-time JSON made elsewhere instead of running the
command. Plotting needs matplotlib (Debian: python3-matplotlib).
"""

import argparse
import json
import os
import subprocess
import sys

from ddstore import _agent

POLICIES = ("random", "solar", "locality")
# ddstore schedule: the docs' small job (N = 2048, P = 4 with 2 per node,
# B = 16), at three capacities.
SCHEDULE = {"n": 2048, "ranks": 4, "ranks_per_node": 2, "batch": 16, "epochs": 10, "seed": 0}
FRACTIONS = (0.25, 0.5, 0.75)
BENCH_SIZES = "64,1K,4K,16K,64K,256K,1M"
# cosmoflow io: SOLAR's I/O evaluation (800 samples of 4x32^3, 4 ranks,
# batch 16), the files dropped from the page cache before every epoch.
IO_ARGS = "--cold --epochs 5"

# DDStore's figures as GB/s, (low, high), by row bytes (REFERENCE.md §1).
# Measured on this machine: its C++ build over Open MPI shared memory, two
# ranks, batches of 256; "other rank" rows are node-local for ddstore.
DDSTORE_HERE_OTHER = {4096: (2.9, 3.6), 65536: (5.0, 5.0)}
DDSTORE_HERE_OWN = {4096: (3.2, 4.3), 65536: (4.7, 6.7)}
# Published (Frontier/Perlmutter, Slingshot RDMA between nodes): get_batch of
# 128 rows of 3-12.5 KB at 0.68-1.82 µs per row (taken at 3 KiB), 1 MB rows at
# about 14 GB/s per rank.
DDSTORE_PUBLISHED = {3072: (3072 / 1820, 3072 / 680), 1 << 20: (14.0, 14.0)}


def _plt():
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    return plt


def _save(fig, path):
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    _plt().close(fig)
    return path


def _size_label(b):
    for unit, shift in (("MiB", 20), ("KiB", 10)):
        if b >= 1 << shift and b % (1 << shift) == 0:
            return f"{b >> shift} {unit}"
    return f"{b} B"


# -- plots -----------------------------------------------------------------


def plot_loading(io, path):
    """Data loading time per epoch per loader (and storage reads per epoch
    where the JSON has them), from `python -m ddstore_bench.cosmoflow io --json`."""
    plt = _plt()
    loaders = io["loaders"]
    reads = any(v.get("storage_reads_per_epoch") for v in loaders.values())
    fig, axes = plt.subplots(1, 2 if reads else 1, figsize=(10 if reads else 6, 3.8), squeeze=False)
    ax = axes[0][0]
    for name, v in loaders.items():
        ys = v["loading_seconds_per_epoch"]
        ax.plot(range(1, len(ys) + 1), ys, marker="o", label=name)
    ax.set_xlabel("epoch")
    ax.set_ylabel("data loading time (s)")
    ax.set_ylim(bottom=0)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    what = "training" if io.get("mode") == "train" else "reading only"
    cold = ", cold page cache" if io.get("cold") else ""
    cap = f", C = {io['capacity']}" if io.get("capacity") else ""
    ax.set_title(f"{io.get('samples', '?')} samples, {io.get('ranks', '?')} ranks, batch {io.get('batch', '?')}{cap}: "
                 f"{what}{cold}", fontsize=9)
    if reads:
        ax = axes[0][1]
        for name, v in loaders.items():
            ys = v.get("storage_reads_per_epoch")
            if ys:
                setup = v.get("setup_storage_reads")
                ax.plot(range(1, len(ys) + 1), ys, marker="o",
                        label=f"{name} (+{setup:g} before epoch 1)" if setup else name)
        ax.set_xlabel("epoch")
        ax.set_ylabel("samples read from storage")
        ax.set_ylim(bottom=0)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    from matplotlib.ticker import MaxNLocator
    for ax in axes[0]:
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    return _save(fig, path)


def plot_hit_rate(schedules, path):
    """Hit rate per epoch per policy against the bound C/N, one panel per
    capacity, from `ddstore schedule --json` objects."""
    plt = _plt()
    caps = sorted({s["capacity"] for s in schedules})
    fig, axes = plt.subplots(1, len(caps), figsize=(3.6 * len(caps), 4.4), squeeze=False, sharey=True)
    for ax, c in zip(axes[0], caps):
        group = [s for s in schedules if s["capacity"] == c]
        for s in sorted(group, key=lambda s: POLICIES.index(s["policy"]) if s["policy"] in POLICIES else 9):
            ys = s["hit_rate_per_epoch"]
            ax.plot(range(1, len(ys) + 1), ys, marker="o", ms=3, label=f"{s['policy']} ({s['hit_rate']:.3f})")
        n = group[0]["n"]
        bound = group[0].get("bound", c / n)
        ax.axhline(bound, color="0.4", ls="--", lw=2.5, zorder=0, label=f"bound C/N = {bound:.2f}")
        ax.set_title(f"N = {n}, C = {c}, P = {group[0].get('ranks', '?')}, B = {group[0].get('batch', '?')}",
                     fontsize=9)
        ax.set_xlabel("epoch")
        ax.set_ylim(0, 1)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.17), ncol=2)
    axes[0][0].set_ylabel("hit rate (reads served from memory)")
    return _save(fig, path)


def _band(ax, xs, ranges, **kw):
    """Points at the middle of each (low, high) range with the range as an
    error bar."""
    los = [r[0] for r in ranges]
    his = [r[1] for r in ranges]
    mid = [(a + b) / 2 for a, b in zip(los, his)]
    ax.errorbar(xs, mid, yerr=[[m - a for m, a in zip(mid, los)], [b - m for m, b in zip(mid, his)]],
                ls="none", capsize=3, **kw)


def plot_throughput(bench, path, micro=None):
    """get_batch GB/s against row size: ddstore (Go client from `ddstore bench
    --json`, Python client from the microbenchmark), the limits measured in
    the same run, and DDStore's figures."""
    plt = _plt()
    rows = sorted(bench["rows"], key=lambda r: r["row_bytes"])
    xs = [r["row_bytes"] for r in rows]
    fig, ax = plt.subplots(figsize=(10, 4.6))
    ax.plot(xs, [r["local_gbps"] for r in rows], "o-", color="C0", label="ddstore node-local (Go)")
    ax.plot(xs, [r["remote_gbps"] for r in rows], "s-", color="C1", label="ddstore cross-node, loopback TCP (Go)")
    ax.plot(xs, [r["gather_limit_gbps"] for r in rows], ":", color="C0", label="limit: 1-thread gather (same run)")
    ax.plot(xs, [r["tcp_limit_gbps"] for r in rows], ":", color="C1", label="limit: loopback TCP (same run)")
    if micro:
        for where, color, marker in (("local", "C0", "^"), ("remote", "C1", "v")):
            pts = sorted((r["row_bytes"], r["row_bytes"] / r["batch_us_per_row"] / 1e3)
                         for r in micro["rows"] if r["where"] == where)
            if pts:
                ax.plot(*zip(*pts), marker, color=color, mfc="none", ms=8,
                        label=f"ddstore {'node-local' if where == 'local' else 'cross-node'} (Python, batch "
                              f"{micro.get('batch', 128)})")
    own = sorted(DDSTORE_HERE_OWN.items())
    other = sorted(DDSTORE_HERE_OTHER.items())
    _band(ax, [x * 0.93 for x, _ in own], [r for _, r in own], color="C2", marker="D",
          label="DDStore, own rank (MPI shm, this machine)")
    _band(ax, [x * 1.07 for x, _ in other], [r for _, r in other], color="C3", marker="D",
          label="DDStore, other rank (MPI shm, this machine)")
    pub = sorted(DDSTORE_PUBLISHED.items())
    _band(ax, [x for x, _ in pub], [r for _, r in pub], color="C4", marker="*", ms=10,
          label="DDStore published (Slingshot RDMA, other nodes)")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xticks(xs)
    ax.set_xticklabels([_size_label(x) for x in xs], fontsize=8)
    ax.set_xlabel("row size")
    ax.set_ylabel("get_batch GB/s (one reader)")
    ax.set_title(f"batches of {bench.get('batch', '?')} random rows, {bench.get('cpus', '?')} CPUs, "
                 f"medians of {bench.get('rounds', 1)} runs", fontsize=9)
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1))
    return _save(fig, path)


# -- measuring -------------------------------------------------------------


def measure_schedules(binary, fractions=FRACTIONS, cfg=SCHEDULE):
    out = []
    for f in fractions:
        cap = int(cfg["n"] * f)
        for p in POLICIES:
            cmd = [binary, "schedule", "--n", str(cfg["n"]), "--ranks", str(cfg["ranks"]), "--ranks-per-node",
                   str(cfg["ranks_per_node"]), "--batch", str(cfg["batch"]), "--epochs", str(cfg["epochs"]),
                   "--capacity", str(cap), "--policy", p, "--seed", str(cfg["seed"]), "--json"]
            out.append(json.loads(subprocess.run(cmd, check=True, capture_output=True, text=True).stdout))
    return out


def measure_bench(binary, quick=False, rounds=None):
    """`ddstore bench --json`, run `rounds` times (3; 1 with quick): every
    figure and ratio the median over the runs."""
    from .microbench import _median_tree
    cmd = [binary, "bench", "--json", "--sizes", BENCH_SIZES, "--batch", "128",
           "--shard", "64M" if quick else "128M", "--duration", "300ms" if quick else "1s"]
    runs = [json.loads(subprocess.run(cmd, check=True, capture_output=True, text=True).stdout)
            for _ in range(rounds or (1 if quick else 3))]
    out = dict(runs[0], rounds=len(runs))
    out["rows"] = [_median_tree([r["rows"][i] for r in runs]) for i in range(len(runs[0]["rows"]))]
    return out


def io_command():
    """`python -m ddstore_bench.cosmoflow io --json` if this tree has it, else None."""
    cmd = [sys.executable, "-m", "ddstore_bench.cosmoflow", "io", "--help"]
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        return None
    return [sys.executable, "-m", "ddstore_bench.cosmoflow", "io", "--json"]


def _write(path, obj):
    with open(path + ".tmp", "w") as f:
        json.dump(obj, f, indent=1)
        f.write("\n")
    os.replace(path + ".tmp", path)


def _read(path):
    with open(path) as f:
        return json.load(f)


def main(argv=None):
    ap = argparse.ArgumentParser(prog="python -m ddstore_bench.report", description=__doc__.split("\n\n")[0],
                                 epilog=__doc__.split("\n\n", 2)[2],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="docs/figures", help="directory of the PNG and JSON files (default docs/figures)")
    ap.add_argument("--replot", action="store_true", help="plot the JSON files already in --out; measure nothing")
    ap.add_argument("--quick", action="store_true", help="short measurements (a first look, not for the docs)")
    ap.add_argument("--io", help="loading-time JSON to plot instead of running `ddstore_bench.cosmoflow io`")
    ap.add_argument("--io-args", default=IO_ARGS,
                    help=f"arguments for `python -m ddstore_bench.cosmoflow io --json` (default {IO_ARGS!r})")
    ap.add_argument("--skip", default="", help="comma-separated figures not to measure: loading,hit_rate,throughput")
    a = ap.parse_args(argv)
    os.makedirs(a.out, exist_ok=True)
    skip = set(filter(None, a.skip.split(",")))
    j = lambda name: os.path.join(a.out, name)  # noqa: E731
    binary = None if a.replot else _agent.find_binary()

    if not a.replot and "hit_rate" not in skip:
        print("measuring: ddstore schedule --json (3 policies x 3 capacities)", flush=True)
        _write(j("schedule.json"), measure_schedules(binary))
    if not a.replot and "throughput" not in skip:
        print(f"measuring: ddstore bench --json --sizes {BENCH_SIZES} --batch 128", flush=True)
        _write(j("bench.json"), measure_bench(binary, a.quick))
        print("measuring: python -m ddstore_bench.microbench --json", flush=True)
        from . import microbench
        _write(j("micro.json"), microbench.measure(a.quick, binary))
    if a.io:
        if os.path.abspath(a.io) != os.path.abspath(j("io.json")):
            _write(j("io.json"), _read(a.io))
    elif not a.replot and "loading" not in skip:
        cmd = io_command()
        if cmd is None:
            print("loading.png: `python -m ddstore_bench.cosmoflow io` does not exist yet; kept what was there", flush=True)
        else:
            cmd += a.io_args.split()
            print("measuring: python", " ".join(cmd[1:]), flush=True)
            out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
            _write(j("io.json"), json.loads(out.strip().splitlines()[-1]))

    made = []
    if os.path.exists(j("io.json")):
        made.append(plot_loading(_read(j("io.json")), j("loading.png")))
    if os.path.exists(j("schedule.json")):
        made.append(plot_hit_rate(_read(j("schedule.json")), j("hit_rate.png")))
    if os.path.exists(j("bench.json")):
        micro = _read(j("micro.json")) if os.path.exists(j("micro.json")) else None
        made.append(plot_throughput(_read(j("bench.json")), j("throughput.png"), micro))
    for p in made:
        print(f"wrote {p} ({os.path.getsize(p)} bytes)")
    if os.path.exists(j("micro.json")):
        from . import microbench
        print("\nmicrobenchmark (micro.json):\n" + microbench.table(_read(j("micro.json"))["rows"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())

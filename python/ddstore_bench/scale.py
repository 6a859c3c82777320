"""`python -m ddstore_bench.scale`: the scale model of docs/scale.md.

    python -m ddstore_bench.scale --out docs/scale            # measure, fit, plot
    python -m ddstore_bench.scale --out docs/scale --replot   # fit and plot the saved JSON again
    python -m ddstore_bench.scale --estimate A.json B.json     # the coordinator's figures and the cluster estimate of saved runs

Runs `ddstore bench scale --json` (DDSTORE_BIN, else bin/ddstore, else
ddstore on PATH; --args passes it flags), saves its JSON as OUT/scale.json,
fits each cost to a model in K (nodes) with R = K x ranks-per-node, plots
the measured points and the model out to 1,024 nodes (OUT/COST.png, one per
cost) and writes the table of docs/scale.md (OUT/model.md): the fitted
model, its prediction at K = 1,024 (R = 8,192 at 8 ranks per node), the
measured K = 8 -> 128 ratio and the target.

Models: a cost is fitted as c·K^a by least squares on log-log over the
points with K >= 8 (below, a round has fewer nodes than the relay
fanout and a batch fewer owners than rows: other regimes), and the
exponent a read as the order of growth. Reads are modelled from their
mechanism: a batch of B random rows of K - 1 other nodes touches
f(K) = (K-1)(1 - (1 - 1/(K-1))^B) owners, one Fetch each, so its time is
a + b f(K) and the rows per second B / (a + b f(K)). On one machine every
node's work shares its cores; the cluster estimates (OUT/cluster.md) take
the measured CPU apart: a collective Add on a cluster is the work of one
node (the ranks' and agents' CPU per round over K) plus the coordinator's
own part (serial: its agent's CPU less an ordinary agent's, which is its
node's share and runs beside the other nodes') plus log_8 K relay steps of
a round trip; a batch is the reading
agent's and client's CPU (the owners work in parallel on their own nodes)
plus a round trip.
"""

import argparse
import json
import os
import shutil
import subprocess
import sys

KMAX = 1024

# cost key -> (title, unit scale, unit, target ratio K=8 -> 128 or None,
# what the target is)
COSTS = [
    ("add_s", "collective Add (this machine)", 1, "s", 2.0, "at most 2x"),
    ("first_add_s", "first Add (joins included)", 1, "s", None, ""),
    ("add_coord_cpu_ms", "coordinator CPU per Add", 1, "ms", 16.0, "at most linear in K (16x)"),
    ("add_ranks_cpu_ms", "all ranks' CPU per Add", 1, "ms", None, ""),
    ("add_agents_cpu_ms", "other agents' CPU per Add", 1, "ms", None, ""),
    ("first_add_coord_cpu_ms", "coordinator CPU in the first Add", 1, "ms", None, ""),
    ("free_coord_cpu_ms", "coordinator CPU per Free", 1, "ms", None, ""),
    ("free_s", "collective Free", 1, "s", None, ""),
    ("open_s", "start to every rank's Open", 1, "s", None, ""),
    ("coord_add_bytes_out", "coordinator bytes out per Add round", 1e-6, "MB", 16.0, "at most linear in K (16x)"),
    ("coord_add_bytes_in", "coordinator bytes in per Add round", 1e-6, "MB", 16.0, "at most linear in K (16x)"),
    ("coord_add_msgs_out", "coordinator messages out per Add round", 1, "", 16.0, "at most linear in K (16x)"),
    ("coord_rss_bytes", "coordinator RSS", 1 / 2**20, "MiB", None, ""),
    ("agent_rss_bytes", "ordinary agent RSS", 1 / 2**20, "MiB", 18.1, "at most linear in nodes read from"),
    ("coord_goroutines", "coordinator goroutines", 1, "", None, ""),
    ("agent_goroutines", "ordinary agent goroutines", 1, "", 18.1, "at most linear in nodes read from"),
    ("coord_conns", "coordinator TCP connections", 1, "", None, ""),
    ("reader_conns", "reading agent TCP connections", 1, "", 18.1, "at most linear in nodes read from (7 → 127: 18.1x)"),
    ("read_agent_cpu_us", "reading agent CPU per batch", 1, "µs", None, ""),
    ("table_bytes", "a variable's table per node", 1e-3, "KB", None, ""),
]


def fanout(k, batch):
    others = k - 1
    return others * (1 - (1 - 1 / others) ** batch)


def power_fit(ks, ys, kmin=8):
    """c·K^a fitted by least squares on log-log over the points with K >= kmin."""
    import numpy as np
    pts = [(k, y) for k, y in zip(ks, ys) if k >= kmin and y > 0]
    if len(pts) < 2:
        pts = [(k, y) for k, y in zip(ks, ys) if y > 0]
    lk = np.log([k for k, _ in pts])
    ly = np.log([y for _, y in pts])
    a, lc = np.polyfit(lk, ly, 1)
    c = float(np.exp(lc))

    def model(k):
        return c * np.asarray(k, float) ** a
    resid = ly - (lc + a * lk)
    return float(a), c, model, float(np.sqrt(np.mean(resid ** 2)))


def order(a):
    """The exponent, read as an order of growth."""
    for name, e in (("1", 0), ("K^0.5", 0.5), ("K", 1), ("K^1.5", 1.5), ("K²", 2)):
        if abs(a - e) <= 0.12:
            return name
    return f"K^{a:.1f}"


def at(points, key, k):
    for p in points:
        if p["nodes"] == k:
            return p.get(key)
    return None


def fit_reads(points, batch, key="read_rows_per_s"):
    import numpy as np
    ks = [p["nodes"] for p in points if p.get(key)]
    t = [batch / p[key] for p in points if p.get(key)]
    f = [fanout(k, batch) for k in ks]
    a = np.stack([np.ones(len(f)), np.asarray(f)], axis=1)
    w = 1 / np.asarray(t)
    coef, *_ = np.linalg.lstsq(a * w[:, None], np.asarray(t) * w, rcond=None)
    coef = np.maximum(coef, 0)

    def model(k):
        k = np.asarray(k, float)
        return batch / (coef[0] + coef[1] * fanout(k, batch))
    return coef, model


def plot(out, name, title, ks, ys, model, unit, scale, rpn, label, before=None):
    import numpy as np
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(5.5, 3.8))
    grid = np.unique(np.geomspace(2, KMAX, 200).round())
    ax.plot(grid, model(grid) * scale, "-", color="tab:blue", label=f"model: {label}")
    ax.plot(ks, np.asarray(ys) * scale, "o", color="tab:red", label="measured (this machine)")
    if before:
        bk = [p["nodes"] for p in before if p.get(name)]
        if bk:
            ax.plot(bk, np.asarray([p[name] for p in before if p.get(name)]) * scale, "x", color="grey",
                    label="measured before the fixes (same run)")
    ax.axvline(max(ks), color="grey", lw=0.6, ls=":")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel(f"nodes K (ranks R = {rpn}·K)")
    ax.set_ylabel(f"{title} ({unit})" if unit else title)
    ax.set_title(title, fontsize=10)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(os.path.join(out, name + ".png"), dpi=90)
    plt.close(fig)


def analyse(rep, out, before=None):
    points = [p for p in rep["points"]]
    rpn = rep["ranks_per_node"]
    batch = rep["batch"]
    ks = [p["nodes"] for p in points]
    rows = []
    lines = ["| cost | model (K nodes, R = %d·K ranks) | order | K=1,024 | measured K=8→128 | target |" % rpn,
             "|---|---|---|---|---|---|"]
    for key, title, scale, unit, target, what in COSTS:
        ys = [p.get(key, 0) for p in points]
        if not any(ys):
            continue
        a_exp, c, model, err = power_fit(ks, ys)
        pred = float(model(KMAX)) * scale
        a, b = at(points, key, 8), at(points, key, 128)
        ratio = f"{b / a:.1f}×" if a and b else "—"
        ok = ""
        if target and a and b:
            ok = " ✓" if b / a <= target * 1.15 else " ✗"  # 15%: the noise of one run on a loaded machine
        label = f"{c * scale:.3g}·K^{a_exp:.2f}"
        plot(out, key, title, ks, ys, model, unit, scale, rpn, label, before)
        u = f" {unit}" if unit else ""
        lines.append(f"| {title} | {label}{u} | {order(a_exp)} | {pred:.3g}{u} | {ratio} | {what}{ok} |")
        rows.append({"cost": key, "c": c, "exponent": a_exp, "log_rms": err, "at_1024": pred / scale,
                     "ratio_8_128": (b / a) if a and b else None})
    for key, title in (("read_rows_per_s", "GetBatch rows/s, one rank"),
                       ("restart_rows_per_s", "GetBatch rows/s across an agent restart")):
        if not any(p.get(key) for p in points):
            continue
        coef, model = fit_reads(points, batch, key)
        kk = [p["nodes"] for p in points if p.get(key)]
        ys = [p[key] for p in points if p.get(key)]
        label = f"{batch}/({coef[0] * 1e6:.0f} µs + {coef[1] * 1e6:.1f} µs·f(K))"
        plot(out, key, title, kk, ys, model, "Mrows/s", 1e-6, rpn, label, before)
        a2, b = at(points, key, 2), at(points, key, 128)
        ratio = f"{b / a2:.2f}× of K=2" if a2 and b else "—"
        ok = ""
        if key == "read_rows_per_s" and a2 and b:
            ok = " ✓" if b / a2 >= 0.7 else " ✗"
        what = "within 0.7× of K=2" if key == "read_rows_per_s" else ""
        lines.append(f"| {title} | {label} | f(K) owners per batch | {float(model(KMAX)) / 1e6:.3f} Mrows/s | {ratio} | {what}{ok} |")
        rows.append({"cost": key, "a_s": float(coef[0]), "b_s_per_owner": float(coef[1]),
                     "at_1024": float(model(KMAX))})
    lines += ["", cluster(points, batch)]
    with open(os.path.join(out, "model.md"), "w") as f:
        f.write("\n".join(lines) + "\n")
    with open(os.path.join(out, "model.json"), "w") as f:
        json.dump(rows, f, indent=1)
    print("\n".join(lines))


RTT_S = 50e-6  # assumed round trip between nodes (a cluster network, not loopback)


def cluster(points, batch):
    """Estimates for a cluster: each node's work on its own cores."""
    import math
    import numpy as np
    ks = [p["nodes"] for p in points]
    need = ("add_ranks_cpu_ms", "add_agents_cpu_ms", "add_coord_cpu_ms", "read_agent_cpu_us", "read_client_cpu_us")
    if not all(all(p.get(k) for p in points if p["nodes"] >= 8) for k in need):
        return ""
    node = [(p["add_ranks_cpu_ms"] + p["add_agents_cpu_ms"]) / p["nodes"] for p in points]
    _, cn, node_m, _ = power_fit(ks, node)
    # The coordinator's agent also does its own node's work (its ranks'
    # shards, frees, manifest), in parallel with the other nodes': only what
    # it does beyond an ordinary agent is serial.
    own = [max(p["add_coord_cpu_ms"] - p["add_agents_cpu_ms"] / max(p["nodes"] - 1, 1), 1e-3) for p in points]
    _, cc, coord_m, _ = power_fit(ks, own)
    depth = lambda k: max(1, math.ceil(math.log(max(k - 1, 1), 8)))

    def add(k):
        return float(node_m(k)) / 1e3 + float(coord_m(k)) / 1e3 + depth(k) * RTT_S

    t = [(p["read_agent_cpu_us"] + p["read_client_cpu_us"]) * 1e-6 for p in points]
    f = [fanout(k, batch) for k in ks]
    a = np.stack([np.ones(len(f)), np.asarray(f)], axis=1)
    coef, *_ = np.linalg.lstsq(a, np.asarray(t), rcond=None)
    coef = np.maximum(coef, 0)

    def read(k):
        return batch / (coef[0] + coef[1] * fanout(k, batch) + RTT_S)
    out = ["Cluster estimates (one node's work on its own cores; %.0f µs round trip assumed):" % (RTT_S * 1e6), "",
           "| K | R | Add s | of which coordinator's own s | GetBatch rows/s per reading rank | vs K=2 |", "|---|---|---|---|---|---|"]
    r2 = read(2)
    for k in (2, 8, 128, KMAX):
        out.append(f"| {k} | {k * points[0]['ranks'] // points[0]['nodes']} | {add(k):.3f} | {float(coord_m(k)) / 1e3:.3f} | "
                   f"{read(k):,.0f} | {read(k) / r2:.2f}× |")
    out += ["", f"Add K=8→128: {add(128) / add(8):.2f}× (target ≤ 2×); reads at K=128: {read(128) / r2:.2f}× of K=2 "
            f"(target ≥ 0.7×); batch time {coef[0] * 1e6:.0f} µs + {coef[1] * 1e6:.1f} µs per owner node touched "
            f"(reading agent and client CPU)."]
    return "\n".join(out)


def find_bin():
    for b in (os.environ.get("DDSTORE_BIN"), os.path.join(os.path.dirname(__file__), "..", "..", "bin", "ddstore"),
              shutil.which("ddstore")):
        if b and os.path.exists(b):
            return b
    sys.exit("ddstore_bench.scale: no ddstore binary (set DDSTORE_BIN or run make build)")


def estimate(paths):
    """Per saved run (ddstore bench scale --json), the coordinator's CPU per
    Add (and Free) beyond an ordinary agent's, its messages and manifest
    writes, and the cluster estimate; with several runs, the medians over
    them: the figures to set side by side when two builds were run
    alternately."""
    import statistics
    out = []
    per_k = {}
    ratios = []
    for path in paths:
        with open(path) as f:
            rep = json.load(f)
        out.append(f"{path}:")
        for p in rep["points"]:
            k = p["nodes"]
            own = p["add_coord_cpu_ms"] - p["add_agents_cpu_ms"] / max(k - 1, 1)
            fig = {"add coord CPU ms": p["add_coord_cpu_ms"], "beyond an agent ms": own,
                   "msgs in per Add": p["coord_add_msgs_in"], "msgs out per Add": p["coord_add_msgs_out"],
                   "manifests per Add": p.get("coord_add_manifest_writes", float("nan")),
                   "free coord CPU ms": p.get("free_coord_cpu_ms", float("nan")),
                   "msgs per Free": p.get("coord_free_msgs", float("nan")),
                   "manifests per Free": p.get("coord_free_manifest_writes", float("nan")),
                   "Add s": p["add_s"], "Free s": p["free_s"]}
            per_k.setdefault(k, []).append(fig)
            out.append(f"  K={k}: coordinator CPU per Add {p['add_coord_cpu_ms']:.1f} ms ({own:.1f} beyond an ordinary agent), "
                       f"messages in {p['coord_add_msgs_in']:.0f}, KB in/out {p['coord_add_bytes_in'] / 1e3:.1f}/{p['coord_add_bytes_out'] / 1e3:.1f}, "
                       f"manifests {fig['manifests per Add']:.1f}, requests gathered/sent on "
                       f"{p.get('gathers_relayed_per_add', float('nan')):.0f}/{p.get('gathers_direct_per_add', float('nan')):.0f}; "
                       f"per Free {fig['free coord CPU ms']:.1f} ms, "
                       f"messages {fig['msgs per Free']:.0f}, manifests {fig['manifests per Free']:.1f}; "
                       f"Add {p['add_s']:.3f} s, Free {p['free_s']:.3f} s, load {p['load']}")
        est = cluster(rep["points"], rep["batch"])
        out += ["  " + line for line in est.splitlines() if line.startswith(("| 8 |", "| 128 |", "Add K"))]
        for line in est.splitlines():
            if line.startswith("Add K=8→128: "):
                ratios.append(float(line.split(": ")[1].split("×")[0]))
    if len(paths) > 1:
        out.append(f"medians of {len(paths)} runs:")
        for k in sorted(per_k):
            figs = per_k[k]
            out.append(f"  K={k}: " + ", ".join(f"{name} {statistics.median(f[name] for f in figs):.3g}" for name in figs[0]))
        if ratios:
            out.append(f"  the cluster's Add K=8→128: median {statistics.median(ratios):.2f}× ({min(ratios):.2f}–{max(ratios):.2f}×)")
    return "\n".join(out)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--estimate", nargs="+", metavar="JSON",
                    help="print the coordinator's figures and the cluster estimate of saved runs; measure nothing")
    ap.add_argument("--out", help="directory for scale.json, model.md and the PNGs")
    ap.add_argument("--replot", action="store_true", help="fit and plot OUT/scale.json again, measure nothing")
    ap.add_argument("--before", help="a scale.json of an earlier build, plotted beside (grey crosses)")
    ap.add_argument("--args", default="", help="flags for ddstore bench scale, e.g. '--nodes 2,4,8 --duration 1s'")
    a = ap.parse_args(argv)
    if a.estimate:
        print(estimate(a.estimate))
        return
    if not a.out:
        ap.error("--out is required (unless --estimate)")
    os.makedirs(a.out, exist_ok=True)
    path = os.path.join(a.out, "scale.json")
    if not a.replot:
        cmd = [find_bin(), "bench", "scale", "--json"] + a.args.split()
        print("$", " ".join(cmd), file=sys.stderr)
        res = subprocess.run(cmd, stdout=subprocess.PIPE, check=True)
        with open(path, "wb") as f:
            f.write(res.stdout)
    with open(path) as f:
        rep = json.load(f)
    before = None
    if a.before:
        with open(a.before) as f:
            before = json.load(f)["points"]
    analyse(rep, a.out, before)


if __name__ == "__main__":
    main()

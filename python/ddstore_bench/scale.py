"""`python -m ddstore_bench.scale`: the scale model of docs/scale.md.

    python -m ddstore_bench.scale --out docs/scale            # measure, fit, plot
    python -m ddstore_bench.scale --out docs/scale --replot   # fit and plot the saved JSON again

Runs `ddstore bench scale --json` (DDSTORE_BIN, else bin/ddstore, else
ddstore on PATH; --args passes it flags), saves its JSON as OUT/scale.json,
fits each cost to a model in K (nodes) with R = K x ranks-per-node, plots
the measured points and the model out to 1,024 nodes (OUT/COST.png, one per
cost) and writes the table of docs/scale.md (OUT/model.md): the fitted
model, its prediction at K = 1,024 (R = 8,192 at 8 ranks per node), the
measured K = 8 -> 128 ratio and the target.

Models: a cost c(K) is fitted by non-negative least squares on the basis
1, K, K^2 (every subset is tried; the one of least relative error wins,
fewer terms on ties), relative errors so that K = 2 weighs as much as
K = 128. Reads are modelled from their mechanism, not a polynomial: a
batch of B random rows of K - 1 other nodes touches
f(K) = (K-1)(1 - (1 - 1/(K-1))^B) owners, one Fetch each, so its time is
a + b f(K) and the rows per second B / (a + b f(K)).
"""

import argparse
import itertools
import json
import os
import shutil
import subprocess
import sys

KMAX = 1024

# cost key -> (title, unit scale, unit, target ratio K=8 -> 128 or None,
# what the target is)
COSTS = [
    ("add_s", "collective Add", 1, "s", 2.0, "at most 2x"),
    ("free_s", "collective Free", 1, "s", None, ""),
    ("open_s", "start to every rank's Open", 1, "s", None, ""),
    ("coord_add_bytes_out", "coordinator bytes out per Add round", 1e-6, "MB", 16.0, "at most linear in K (16x)"),
    ("coord_add_bytes_in", "coordinator bytes in per Add round", 1e-6, "MB", 16.0, "at most linear in K (16x)"),
    ("coord_add_msgs_out", "coordinator messages out per Add round", 1, "", 16.0, "at most linear in K (16x)"),
    ("coord_rss_bytes", "coordinator RSS", 1 / 2**20, "MiB", None, ""),
    ("agent_rss_bytes", "ordinary agent RSS", 1 / 2**20, "MiB", 16.0, "at most linear in nodes read from"),
    ("coord_goroutines", "coordinator goroutines", 1, "", None, ""),
    ("agent_goroutines", "ordinary agent goroutines", 1, "", 16.0, "at most linear in nodes read from"),
    ("coord_conns", "coordinator TCP connections", 1, "", None, ""),
    ("reader_conns", "reading agent TCP connections", 1, "", 16.0, "at most linear in nodes read from"),
    ("table_bytes", "a variable's table per node", 1e-3, "KB", None, ""),
]


def fanout(k, batch):
    others = k - 1
    return others * (1 - (1 - 1 / others) ** batch)


def nnls_fit(ks, ys):
    """Best non-negative fit of y on a subset of 1, K, K^2 (relative error)."""
    import numpy as np
    ks = np.asarray(ks, float)
    ys = np.asarray(ys, float)
    basis = [np.ones_like(ks), ks, ks ** 2]
    names = ["1", "K", "K^2"]
    best = None
    w = 1 / np.maximum(np.abs(ys), 1e-12)
    for n in (1, 2, 3):
        for sub in itertools.combinations(range(3), n):
            a = np.stack([basis[i] * w for i in sub], axis=1)
            coef, *_ = np.linalg.lstsq(a, ys * w, rcond=None)
            if (coef < 0).any():
                continue
            pred = sum(c * basis[i] for c, i in zip(coef, sub))
            err = float(np.sqrt(np.mean(((pred - ys) * w) ** 2)))
            if best is None or err < best[0] * 0.9:
                best = (err, sub, coef)
    err, sub, coef = best
    terms = {names[i]: float(c) for c, i in zip(coef, sub)}

    def model(k):
        k = np.asarray(k, float)
        return sum(c * [np.ones_like(k), k, k ** 2][i] for c, i in zip(coef, sub))
    return terms, model, err


def fmt_terms(terms, scale):
    parts = []
    for name, c in terms.items():
        c *= scale
        parts.append(f"{c:.3g}" if name == "1" else f"{c:.3g}·{name}")
    return " + ".join(parts) or "0"


def order(terms):
    if terms.get("K^2", 0) > 0:
        return "K²"
    if terms.get("K", 0) > 0:
        return "K"
    return "1"


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


def plot(out, name, title, ks, ys, model, unit, scale, rpn, label):
    import numpy as np
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(5.5, 3.8))
    grid = np.unique(np.geomspace(2, KMAX, 200).round())
    ax.plot(grid, model(grid) * scale, "-", color="tab:blue", label=f"model: {label}")
    ax.plot(ks, np.asarray(ys) * scale, "o", color="tab:red", label="measured (this machine)")
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


def analyse(rep, out):
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
        ys_fit = [max(y, 1e-9) for y in ys]
        terms, model, err = nnls_fit(ks, ys_fit)
        pred = float(model(KMAX)) * scale
        a, b = at(points, key, 8), at(points, key, 128)
        ratio = f"{b / a:.1f}×" if a and b else "—"
        ok = ""
        if target and a and b:
            ok = " ✓" if b / a <= target else " ✗"
        label = fmt_terms(terms, scale)
        plot(out, key, title, ks, ys, model, unit, scale, rpn, label)
        u = f" {unit}" if unit else ""
        lines.append(f"| {title} | {label}{u} | {order(terms)} | {pred:.3g}{u} | {ratio} | {what}{ok} |")
        rows.append({"cost": key, "terms": terms, "fit_rel_err": err, "at_1024": pred / scale,
                     "order": order(terms), "ratio_8_128": (b / a) if a and b else None})
    for key, title in (("read_rows_per_s", "GetBatch rows/s, one rank"),
                       ("restart_rows_per_s", "GetBatch rows/s across an agent restart")):
        if not any(p.get(key) for p in points):
            continue
        coef, model = fit_reads(points, batch, key)
        kk = [p["nodes"] for p in points if p.get(key)]
        ys = [p[key] for p in points if p.get(key)]
        label = f"{batch}/({coef[0] * 1e6:.0f} µs + {coef[1] * 1e6:.1f} µs·f(K))"
        plot(out, key, title, kk, ys, model, "Mrows/s", 1e-6, rpn, label)
        a2, b = at(points, key, 2), at(points, key, 128)
        ratio = f"{b / a2:.2f}× of K=2" if a2 and b else "—"
        ok = ""
        if key == "read_rows_per_s" and a2 and b:
            ok = " ✓" if b / a2 >= 0.7 else " ✗"
        what = "within 0.7× of K=2" if key == "read_rows_per_s" else ""
        lines.append(f"| {title} | {label} | f(K) owners per batch | {float(model(KMAX)) / 1e6:.3f} Mrows/s | {ratio} | {what}{ok} |")
        rows.append({"cost": key, "a_s": float(coef[0]), "b_s_per_owner": float(coef[1]),
                     "at_1024": float(model(KMAX))})
    with open(os.path.join(out, "model.md"), "w") as f:
        f.write("\n".join(lines) + "\n")
    with open(os.path.join(out, "model.json"), "w") as f:
        json.dump(rows, f, indent=1)
    print("\n".join(lines))


def find_bin():
    for b in (os.environ.get("DDSTORE_BIN"), os.path.join(os.path.dirname(__file__), "..", "..", "bin", "ddstore"),
              shutil.which("ddstore")):
        if b and os.path.exists(b):
            return b
    sys.exit("ddstore_bench.scale: no ddstore binary (set DDSTORE_BIN or run make build)")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True, help="directory for scale.json, model.md and the PNGs")
    ap.add_argument("--replot", action="store_true", help="fit and plot OUT/scale.json again, measure nothing")
    ap.add_argument("--args", default="", help="flags for ddstore bench scale, e.g. '--nodes 2,4,8 --duration 1s'")
    a = ap.parse_args(argv)
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
    analyse(rep, a.out)


if __name__ == "__main__":
    main()

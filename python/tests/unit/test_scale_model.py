"""The scale model (python -m ddstore_bench.scale) on synthetic reports: no
agent, no timing. Fits must recover the growth they were made from, the
table must say which target holds, and a PNG must come per cost."""

import json
import os

import pytest

pytest.importorskip("matplotlib")
pytest.importorskip("numpy")

from ddstore_bench import scale  # noqa: E402

KS = (2, 4, 8, 16, 32, 64, 128)


def report():
    pts = []
    for k in KS:
        pts.append({
            "nodes": k, "ranks": 8 * k, "open_s": 0.05 * k, "first_add_s": 0.02 * k, "add_s": 0.01 * k,
            "free_s": 0.004 * k, "coord_add_bytes_out": 1500.0 * k, "coord_add_bytes_in": 900.0 * k,
            "coord_add_msgs_out": 4.0 * k, "coord_rss_bytes": 30 << 20, "agent_rss_bytes": 28 << 20,
            "coord_goroutines": 10 * k, "agent_goroutines": 28, "coord_conns": 2 * k, "reader_conns": 4 * (k - 1),
            "table_bytes": 300 * k, "add_coord_cpu_ms": 0.02 * k * k, "add_ranks_cpu_ms": 8.0 * k,
            "add_agents_cpu_ms": 3.0 * k, "first_add_coord_cpu_ms": 0.05 * k, "free_coord_cpu_ms": 0.4 * k,
            "read_agent_cpu_us": 200 + 30 * scale.fanout(k, 256), "read_client_cpu_us": 80.0,
            "read_rows_per_s": 256 / (500e-6 + 60e-6 * scale.fanout(k, 256)),
        })
    return {"points": pts, "ranks_per_node": 8, "batch": 256}


def test_fanout():
    assert scale.fanout(2, 256) == pytest.approx(1)
    # 256 rows over 127 nodes touch most of them, never more than the rows.
    assert 110 < scale.fanout(128, 256) < 127
    assert scale.fanout(4096, 256) < 256


@pytest.mark.parametrize("exponent", [0, 0.5, 1, 2])
def test_power_fit_recovers_the_exponent(exponent):
    a, c, model, err = scale.power_fit(KS, [3.0 * k ** exponent for k in KS])
    assert a == pytest.approx(exponent, abs=1e-9)
    assert c == pytest.approx(3.0)
    assert float(model(1024)) == pytest.approx(3.0 * 1024 ** exponent)
    assert err == pytest.approx(0, abs=1e-9)


def test_order_names():
    assert [scale.order(a) for a in (0.04, 0.56, 0.71, 1.03, 1.9, 3.0)] == ["1", "K^0.5", "K^0.7", "K", "K²", "K^3.0"]


def test_analyse_writes_the_table_and_the_plots(tmp_path, capsys):
    rep = report()
    scale.analyse(rep, str(tmp_path), before=rep["points"])
    md = (tmp_path / "model.md").read_text()
    # A linear coordinator: the target holds; a quadratic one does not.
    line = next(ln for ln in md.splitlines() if ln.startswith("| coordinator bytes out per Add round"))
    assert "| K |" in line and "✓" in line
    line = next(ln for ln in md.splitlines() if ln.startswith("| coordinator CPU per Add "))
    assert "| K² |" in line and "✗" in line
    # Reads fall with the owners a batch touches: below 0.7x of K=2.
    line = next(ln for ln in md.splitlines() if ln.startswith("| GetBatch rows/s, one rank"))
    assert "✗" in line
    assert "Cluster estimates" in md
    rows = json.loads((tmp_path / "model.json").read_text())
    assert {r["cost"] for r in rows} >= {"add_s", "coord_add_bytes_out", "read_rows_per_s"}
    for key in ("add_s", "coord_add_bytes_out", "reader_conns", "read_rows_per_s"):
        assert os.path.getsize(tmp_path / f"{key}.png") > 1000


def test_estimate_gives_the_medians_of_the_runs(tmp_path):
    paths = []
    for i, writes in enumerate((1.0, 2.0, 4.0)):
        rep = report()
        for p in rep["points"]:
            p.update({"coord_add_msgs_in": p["nodes"] - 1.0, "coord_add_manifest_writes": writes,
                      "coord_free_msgs": 2.0 * p["nodes"], "coord_free_manifest_writes": 5.0, "load": "1 1 1"})
            p["add_coord_cpu_ms"] *= i + 1
        path = tmp_path / f"run-{i}.json"
        path.write_text(json.dumps(rep))
        paths.append(str(path))
    out = scale.estimate(paths)
    assert "medians of 3 runs:" in out
    line = next(ln for ln in out.splitlines() if ln.startswith("  K=128: add coord CPU ms"))
    # The middle run's: 0.02 K² ms twice over, and its two manifest writes.
    assert f"add coord CPU ms {2 * 0.02 * 128 * 128:.3g}," in line
    assert "manifests per Add 2," in line
    assert "the cluster's Add K=8→128: median" in out

"""The report's plots and the microbenchmark's table on synthetic inputs: no
agent, no timing; the PNGs must exist and be non-empty."""

import json

import pytest

from ddstore_bench import microbench, report

IO = {"mode": "io", "cold": True, "ranks": 2, "epochs": 3, "batch": 4, "samples": 64,
      "loaders": {name: {"loading_seconds": sum(ys), "loading_seconds_per_epoch": ys,
                         "epoch_seconds_per_epoch": [y + 0.1 for y in ys],
                         "storage_reads_per_epoch": [64, r, r], "hit_rate_per_epoch": [0, 1 - r / 64, 1 - r / 64],
                         "train_loss_per_epoch": []}
                  for name, ys, r in (("baseline", [3.0, 2.9, 3.1], 64), ("ddstore", [3.0, 0.4, 0.4], 0),
                                      ("ddstore-solar", [3.0, 1.2, 1.1], 40),
                                      ("ddstore-locality", [3.0, 1.0, 1.0], 32))}}


def schedules():
    out = []
    for cap in (512, 1024):
        for p, h in (("random", 0.03), ("solar", 0.28), ("locality", cap / 2048)):
            out.append({"policy": p, "n": 2048, "capacity": cap, "ranks": 4, "batch": 16, "bound": cap / 2048,
                        "hit_rate": h, "hit_rate_per_epoch": [0.0] + [h] * 9})
    return out


def bench():
    rows = []
    for rb in (64, 4096, 65536, 1 << 20):
        rows.append({"row_bytes": rb, "local_gbps": 10.0, "remote_gbps": 2.0, "gather_limit_gbps": 12.0,
                     "tcp_limit_gbps": 4.0, "get_local_p50_us": 0.5, "get_remote_p50_us": 100.0})
    return {"rows": rows, "batch": 128, "cpus": 2}


def micro():
    raw = [{"row_bytes": rb, "where": w, "batch": 128, "get_us_p50": 2.0, "get_us_p99": 5.0,
            "batch_us_per_row": 1.0, **({"batch_copy_us_per_row": 1.5} if w == "remote" else {})}
           for rb in microbench.ROW_SIZES for w in ("local", "remote")]
    go = {rb: r for rb, r in ((r["row_bytes"], r) for r in bench()["rows"])}
    go[3072] = go[4096]
    copy = {str(rb): 0.25 for rb in microbench.ROW_SIZES}
    return {"rows": microbench.compare(raw, go, {"unix_rtt_us": 10.0, "tcp_rtt_us": 12.0}, copy), "batch": 128}


@pytest.fixture(autouse=True)
def _matplotlib():
    pytest.importorskip("matplotlib")


def _png(path):
    with open(path, "rb") as f:
        head = f.read(8)
    assert head == b"\x89PNG\r\n\x1a\n", path
    assert path.stat().st_size > 1000


def test_plots(tmp_path):
    report.plot_loading(IO, tmp_path / "loading.png")
    report.plot_hit_rate(schedules(), tmp_path / "hit_rate.png")
    report.plot_throughput(bench(), tmp_path / "throughput.png", micro())
    report.plot_throughput(bench(), tmp_path / "throughput_go.png")
    for name in ("loading", "hit_rate", "throughput", "throughput_go"):
        _png(tmp_path / f"{name}.png")


def test_loading_without_storage_reads(tmp_path):
    io = json.loads(json.dumps(IO))
    for v in io["loaders"].values():
        del v["storage_reads_per_epoch"]
    report.plot_loading(io, tmp_path / "loading.png")
    _png(tmp_path / "loading.png")


def test_replot_from_json(tmp_path, capsys):
    out = tmp_path / "figures"
    out.mkdir()
    for name, obj in (("schedule.json", schedules()), ("bench.json", bench()), ("micro.json", micro())):
        (out / name).write_text(json.dumps(obj))
    src = tmp_path / "elsewhere.json"
    src.write_text(json.dumps(IO))
    assert report.main(["--out", str(out), "--replot", "--io", str(src)]) == 0
    for name in ("loading", "hit_rate", "throughput"):
        _png(out / f"{name}.png")
    assert json.loads((out / "io.json").read_text()) == IO
    assert "| 3 KiB | node-local | get() |" in capsys.readouterr().out


def test_microbench_ratios():
    rows = {(r["row_bytes"], r["where"]): r for r in micro()["rows"]}
    local, remote = rows[(3072, "local")], rows[(3072, "remote")]
    assert local["limit_batch_us_per_row"] == pytest.approx(3072 / 12.0 / 1e3)
    assert local["limit_get_us"] == 0.25
    assert remote["limit_get_us"] == pytest.approx(22.0 + 3072 / 4.0 / 1e3)
    # DDStore's published get_batch of 128 at 0.68-1.82 µs per row against ours at 1.0.
    assert local["batch_vs_ddstore_published"] == pytest.approx([0.68, 1.82])
    assert "ddstore_here_4k_batch_us" in local and "ddstore_here_4k_batch_us" not in remote
    t = microbench.table(micro()["rows"])
    assert t.count("\n") == 2 + 8 - 1

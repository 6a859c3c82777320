"""`python -m ddstore_bench.ab` at a toy size, the current package as its
own "old" one: every figure there, both clients reading direct, the rows
checked."""

import json
import os
import shutil
import subprocess
import sys

from conftest import ROOT


def test_ab_of_a_package_against_itself(job, tmp_path):
    shutil.copytree(os.path.join(ROOT, "python", "ddstore"), tmp_path / "old" / "ddstore")
    r = subprocess.run([sys.executable, "-m", "ddstore_bench.ab", "--old", str(tmp_path / "old"), "--sizes", "64",
                        "--local-sizes", "4096", "--turns", "50", "--dur", "0.01"],
                       cwd=os.path.join(ROOT, "python"), capture_output=True, text=True, timeout=120,
                       env={**os.environ, "PYTHONPATH": os.path.join(ROOT, "python")})
    assert r.returncode == 0, r.stdout + r.stderr
    lines = [json.loads(x) for x in r.stdout.splitlines()]
    lat = [x for x in lines if x.get("what") == "get_remote"]
    loc = [x for x in lines if x.get("what") == "get_batch_local"]
    assert len(lat) == 1 and len(loc) == 1 and "load_average" in lines[0], lines
    assert lat[0]["direct_rows"] == {"new": 101, "old": 101}, lat[0]  # the first read and 2 per turn
    for k in ("new_np_p50_us", "old_np_p50_us", "raw_direct_p50_us", "tcp_p50_us", "new_np/old_np", "new_np/tcp"):
        assert lat[0][k] > 0, k
    for k in ("new_gbps", "old_gbps", "numpy_heap_gbps", "new/old", "new/numpy_best"):
        assert loc[0][k] > 0, k


def test_ab_without_an_old_package(tmp_path):
    r = subprocess.run([sys.executable, "-m", "ddstore_bench.ab", "--old", str(tmp_path)],
                       cwd=os.path.join(ROOT, "python"), capture_output=True, text=True, timeout=60)
    assert r.returncode != 0 and "no package at" in r.stderr, r.stderr

"""A variable larger than the free /dev/shm: add(), and init() then update(),
fail on every rank with an error naming the bytes wanted and free, leave
nothing in /dev/shm, and the store keeps working. Run in a private mount
namespace (unshare -m) over whose /dev/shm a 64 MiB tmpfs is mounted: root
only. Sized without its pages reserved, the segment was a SIGBUS (exit 135)
in the rank that wrote its rows."""

import os
import shutil
import subprocess
import sys

import pytest

from conftest import ROOT

SHM_MIB = 64

# Run in the private namespace: two ranks on one node (conftest.run_ranks),
# each asking for 40 MiB of the 64: one of the two shards cannot fit.
DRIVER = r"""
import sys
sys.path.insert(0, sys.argv[1])
from conftest import run_ranks
outs = run_ranks(sys.argv[2], ["a", "a"], {})
print("".join(outs))
"""

RANK = r"""
import os
import numpy as np
import ddstore

s = ddstore.Store()
r = s.rank
rows = 40 << 10                      # 40 MiB of 1 KiB rows
want = 4096 + rows * 1024             # the segment: header page and rows


def fails(what, f):
    try:
        f()
    except ddstore.Error as e:
        msg = str(e)
        assert f"{want} bytes" in msg and "free" in msg, (what, msg)
        print("rank", r, what, "failed:", msg)
        return
    raise AssertionError(f"rank {r}: {what} of {want} bytes on a {os.statvfs('/dev/shm').f_blocks} block /dev/shm did not fail")


fails("add", lambda: s.add("big", np.full((rows, 1024), r + 1, dtype=np.uint8)))


def init_update():
    s.init("big2", rows, 1024, 1, dtype="uint8")
    s.update("big2", np.full((rows, 1024), r + 1, dtype=np.uint8))


fails("init", init_update)
# Both Adds have returned past the fence, so both ranks' shards, had they
# made one, were taken back; the second fence keeps the next variable out
# of this look.
s.fence()
left = [f for f in os.listdir("/dev/shm") if f.startswith("ddstore.")]
assert not left, (r, left)
s.fence()
# Everything keeps working: a variable that fits, read across ranks.
s.add("small", np.full((1024, 1024), r + 1, dtype=np.uint8))
out = np.empty((1, 1024), dtype=np.uint8)
s.get("small", out, 1024 * (1 - r))
assert (out == 2 - r).all(), out[0, :4]
s.free("small")
print("ok", r)
s.close()
"""


def test_variable_larger_than_free_shm(job, tmp_path):
    if os.geteuid() != 0 or shutil.which("unshare") is None:
        pytest.skip("a private /dev/shm needs root and unshare(1)")
    cmd = ["unshare", "-m", "--propagation", "private", "sh", "-c",
           f'mount -t tmpfs -o size={SHM_MIB}m,mode=1777 ddstore-small-shm /dev/shm && exec "$0" "$@"',
           sys.executable, "-c", DRIVER, os.path.join(ROOT, "python", "tests"), RANK]
    p = subprocess.run(cmd, env={**os.environ, **job}, capture_output=True, text=True, timeout=300)
    if p.returncode != 0 and "unshare failed" in p.stderr:
        pytest.skip(f"no mount namespace here: {p.stderr.strip()}")
    assert p.returncode == 0, p.stdout + p.stderr
    for r in (0, 1):
        assert f"ok {r}" in p.stdout, p.stdout
        assert f"rank {r} add failed" in p.stdout and f"rank {r} init failed" in p.stdout, p.stdout

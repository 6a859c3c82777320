"""Re-sharding: a job of 4 ranks publishes a DistDataset and a ragged
variable and ends; its agents keep them (split mode). A job of 3 ranks, of
another namespace and without the source, takes them into its own store,
each rank its share, from that memory (ddstore.reshard); a variable with a
backing file keeps it, the new shards sharing the rows the old ones held."""

import json
import subprocess

import numpy as np

from conftest import run_ranks

N = 50

FIRST = r"""
import sys, numpy as np, torch, ddstore
from ddstore.torch import DistDataset
n = 50
src = torch.utils.data.TensorDataset(torch.arange(n * 3, dtype=torch.float32).reshape(n, 3), torch.arange(n) * 7)
ds = DistDataset(src, "rs")
s = ds.store
lo, hi = s.rank * n // s.size, (s.rank + 1) * n // s.size
lengths = np.array([i % 4 for i in range(lo, hi)], np.int64)
values = np.concatenate([np.full((i % 4, 2), i, np.int32) for i in range(lo, hi)] or [np.empty((0, 2), np.int32)])
s.add_ragged("seq", values.reshape(-1, 2), lengths)
big = np.load(sys.argv[1])  # 40 rows in the file, the first 20 in memory
a, b = s.rank * 20 // s.size, (s.rank + 1) * 20 // s.size
s.add("big", big[a:b], backing=sys.argv[1], total=40)
print("published", s.rank)
s.close()
"""

SECOND = r"""
import json, sys, numpy as np, torch, ddstore
from ddstore.reshard import reshard, reshard_dataset
from ddstore.torch import DistDatasetReader
old = ddstore.Store(reader=True, namespace=sys.argv[1], rank=0, size=1, spawn=False)
new = ddstore.Store()
got = reshard_dataset(old, new, "rs")
got.update(reshard(old, new, ["seq", "big"]))
n = 50
lo, hi = new.rank * n // new.size, (new.rank + 1) * n // new.size
assert got["rs/0"][:2] == (hi - lo, (hi - lo) * 12), got
d = new.describe("rs/0")
assert d["shard_rows"] == [n * r // 3 - n * (r - 1) // 3 for r in range(1, 4)] and d["dtype"] == "float32", d
rd = DistDatasetReader("rs", store=new)
assert len(rd) == n
for i in range(n):
    x, y = rd[i]
    assert torch.equal(x, torch.arange(3 * i, 3 * i + 3, dtype=torch.float32)) and int(y) == 7 * i, i
values, lengths = new.get_ragged("seq", np.arange(n))
assert lengths.tolist() == [i % 4 for i in range(n)]
assert values.tolist() == [[i, i] for i in range(n) for _ in range(i % 4)]
assert new.describe("seq")["shard_rows"] == d["shard_rows"]
b = new.describe("big")  # the shards share the 20 rows held, the file keeps the rest
assert b["held_rows"] == 20 and b["shard_rows"] == [6, 7, 7] and b["backing"] == old.describe("big")["backing"], b
out = np.empty((40, 3), np.int64)
new.get_batch("big", out, np.arange(40)[::-1].copy())
assert (out[::-1] == np.arange(120).reshape(40, 3)).all()
print(json.dumps({"rank": new.rank, "rows": hi - lo}))
new.close(); old.close()
"""


def test_reshard_4_to_3(job, tmp_path):
    big = str(tmp_path / "big.npy")
    np.save(big, np.arange(120, dtype=np.int64).reshape(40, 3))
    outs = run_ranks(FIRST, ["a"] * 4, job, timeout=120, args=(big,))
    assert sorted(o.strip().splitlines()[-1] for o in outs) == [f"published {r}" for r in range(4)]
    ns2 = job["DDSTORE_NAMESPACE"] + "-b"
    try:
        outs = run_ranks(SECOND, ["a"] * 3, {**job, "DDSTORE_NAMESPACE": ns2}, timeout=120,
                         args=(job["DDSTORE_NAMESPACE"],))
    finally:  # the second job's agents, as the job fixture stops the first's
        subprocess.run(["pkill", "-f", "--", f"--namespace {ns2} "], check=False)
    rows = [json.loads(o.strip().splitlines()[-1]) for o in outs]
    assert [r["rows"] for r in rows] == [16, 17, 17]

"""The storage tier from Python: a variable whose rows all lie in a backing
file (.npy here; HDF5 when the agent has -tags hdf5), its ranks holding only
the first quarter; every row read through the store must equal the file's."""

import numpy as np
import pytest

import ddstore
from conftest import run_ranks


def test_single_rank_backed_npy(job, tmp_path):
    data = (np.arange(400 * 6, dtype=np.int64).reshape(400, 6) * 3 - 7).astype(np.float32)
    f = tmp_path / "d.npy"
    np.save(f, data)
    with ddstore.Store() as s:
        s.add("x", data[:100], backing=str(f), total=400)
        d = s.describe("x")
        assert d["total_rows"] == 400 and d["held_rows"] == 100 and d["backing"] == str(f)
        assert s.info("x") == (400, 6, 4)
        out = np.empty((400, 6), np.float32)
        s.get("x", out, 0)
        np.testing.assert_array_equal(out, data)
        rng = np.random.default_rng(1)
        for _ in range(10):
            idx = rng.permutation(400)[:32]
            s.prefetch("x", idx)
            o = np.empty((32, 6), np.float32)
            s.get_batch("x", o, idx)
            np.testing.assert_array_equal(o, data[idx])
        one = np.empty((1, 6), np.float32)
        s.get("x", one, 399)
        np.testing.assert_array_equal(one[0], data[399])
        assert s.get_profile("x")["storage_rows"] >= 300
        # Bad input: each a clear error, and the store keeps working.
        with pytest.raises(ddstore.IndexOutOfRange, match="400"):
            s.prefetch("x", [400])
        with pytest.raises(ddstore.IndexOutOfRange):
            s.get_batch("x", np.empty((1, 6), np.float32), [400])
        s.add("plain", data[:4])
        with pytest.raises(ddstore.ArgumentError, match="no backing file"):
            s.prefetch("plain", [0])
        with pytest.raises(ddstore.GeometryError, match="total"):
            s.add("y", data[:4], backing=str(f))
        with pytest.raises(ddstore.Error, match="nope.npy"):
            s.add("z", data[:4], backing=str(tmp_path / "nope.npy"), total=4)
        with pytest.raises(ddstore.Error, match="401"):
            s.add("w", data[:4], backing=str(f), total=401)
        s.get_batch("x", o, idx)
        np.testing.assert_array_equal(o, data[idx])


SCRIPT = r"""
import sys, numpy as np, ddstore
f, n = sys.argv[1], int(sys.argv[2])
data = np.load(f, mmap_mode="r")
s = ddstore.Store()
r, p = s.rank, s.size
held = n // 4
lo, hi = r * held // p, (r + 1) * held // p
s.add("x", np.ascontiguousarray(data[lo:hi]), backing=f, total=n)
rng = np.random.default_rng(r)
perm = rng.permutation(n)
B = 16
out = np.empty((B,) + data.shape[1:], data.dtype)
for k in range(0, n - B + 1, B):
    if k + 2 * B <= n:
        s.prefetch("x", perm[k + B:k + 2 * B])
    s.get_batch("x", out, perm[k:k + B])
    assert np.array_equal(out, data[perm[k:k + B]]), (r, k)
print("rank", r, "storage", s.get_profile("x")["storage_rows"])
s.close()
"""


def test_four_ranks_two_nodes_dataset_4x_memory(job, tmp_path):
    n = 640
    data = np.random.default_rng(0).integers(0, 1 << 30, (n, 64), dtype=np.int32)
    f = tmp_path / "d.npy"
    np.save(f, data)
    outs = run_ranks(SCRIPT, ["a", "a", "b", "b"], job, args=(str(f), str(n)))
    storage = [int(o.split()[3]) for o in outs]
    assert all(x > 0 for x in storage), outs


def _agent_has_hdf5(binary):
    import subprocess
    out = subprocess.run([binary, "version"], capture_output=True, text=True).stdout
    return "with HDF5" in out


@pytest.mark.parametrize("layout", ["chunked-gzip", "contiguous"])
def test_backed_hdf5(job, tmp_path, layout):
    h5py = pytest.importorskip("h5py")
    if not _agent_has_hdf5(job["DDSTORE_BIN"]):
        pytest.skip("this ddstore binary is built without HDF5 (make build with libhdf5-dev installed)")
    data = np.random.default_rng(3).integers(-1000, 1000, (300, 2, 4, 4), dtype=np.int16)
    f = tmp_path / "cubes.h5"
    with h5py.File(f, "w") as h:
        if layout == "contiguous":
            h.create_dataset("x", data=data)
        else:
            h.create_dataset("x", data=data, chunks=(8, 2, 4, 4), compression="gzip")
    with ddstore.Store() as s:
        s.add("x", data[:75], backing=f"{f}:/x", total=300)
        rng = np.random.default_rng(0)
        perm = rng.permutation(300)
        out = np.empty((20, 2, 4, 4), np.int16)
        for k in range(0, 300, 20):
            if k + 40 <= 300:
                s.prefetch("x", perm[k + 20:k + 40])
            s.get_batch("x", out, perm[k:k + 20])
            np.testing.assert_array_equal(out, data[perm[k:k + 20]])
        with pytest.raises(ddstore.Error, match="nope"):
            s.add("y", data[:4], backing=f"{f}:/nope", total=4)


TORCH_SCRIPT = r"""
import sys, json, numpy as np, torch, ddstore
from ddstore.torch import DistDataset, ScheduledSampler, ThreadDataLoader
fx, fy, n, cap = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
X, Y = np.load(fx, mmap_mode="r"), np.load(fy, mmap_mode="r")

class Source(torch.utils.data.Dataset):
    def __len__(self):
        return n
    def __getitem__(self, i):
        return {"x": torch.from_numpy(np.array(X[i])), "y": torch.from_numpy(np.array(Y[i]))}

ds = DistDataset(Source(), "cubes", capacity=cap, backing={"x": fx, "y": fy})
sampler = ScheduledSampler(ds, batch_size=8, seed=5, capacity=cap, prefetch=3)
loader = ThreadDataLoader(ds, batch_sampler=sampler, num_workers=2)
seen = []
for epoch in range(2):
    sampler.set_epoch(epoch)
    plan = sampler.plan(epoch)
    got = []
    for batch in loader:
        idx = batch["y"][:, 0].long().numpy()  # y[i, 0] == i: the sample's own index
        np.testing.assert_array_equal(batch["x"].numpy(), X[idx])
        got.extend(idx.tolist())
    assert got == plan.samples.tolist(), (ds.rank, epoch)
    seen.append(int((~plan.hits).sum()))
print(json.dumps({"rank": ds.rank, "storage_reads": seen}))
ds.store.close()
"""


def test_dist_dataset_with_backing_and_scheduled_sampler(job, tmp_path):
    n, cap = 256, 64
    rng = np.random.default_rng(4)
    X = rng.standard_normal((n, 2, 3, 3)).astype(np.float32)
    Y = np.stack([np.arange(n), -np.arange(n)], axis=1).astype(np.float32)
    fx, fy = tmp_path / "x.npy", tmp_path / "y.npy"
    np.save(fx, X)
    np.save(fy, Y)
    import json
    outs = run_ranks(TORCH_SCRIPT, ["a", "b"], job, args=(str(fx), str(fy), str(n), str(cap)))
    for o in outs:
        r = json.loads(o.strip().splitlines()[-1])
        # locality: every step's storage reads are the samples outside [0, cap)
        assert all(s == (n - cap) // 2 for s in r["storage_reads"]), r
    info = subprocess_info(job, "a")
    assert info["counters"]["staged_rows"] > 0, info["counters"]
    assert info["counters"]["storage_errors"] == 0


def subprocess_info(job, node):
    import json
    import subprocess
    out = subprocess.run([job["DDSTORE_BIN"], "info", "--json", "--namespace", job["DDSTORE_NAMESPACE"], "--node",
                          node, "--run-dir", job["DDSTORE_RUN_DIR"]], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def test_loader_buffers_are_receive_buffers(job, tmp_path):
    """A ThreadDataLoader reusing its buffers over a dataset whose rows come
    partly from a backing file reads into receive buffers (the agent writes
    the file's rows straight into the batch), right rows every epoch; the
    buffers are released once the loader is gone."""
    import gc

    from ddstore.torch import DistDataset, ThreadDataLoader
    n = 96
    data = np.arange(n * 10, dtype=np.float32).reshape(n, 10)
    f = tmp_path / "x.npy"
    np.save(f, data)
    with ddstore.Store() as s:
        ds = DistDataset(data, "ld", store=s, capacity=n // 4, backing=str(f))
        loader = ThreadDataLoader(ds, batch_size=8, shuffle=True, num_workers=2, reuse_buffers=True)
        for _ in range(2):
            seen = []
            for batch in loader:
                rows = batch.numpy()
                assert (rows == data[rows[:, 0].astype(int) // 10]).all()
                seen += (rows[:, 0] // 10).astype(int).tolist()
            assert sorted(seen) == list(range(n))
        assert len(s._recv) == 2, "one receive buffer per worker's buffer set"
        assert s.get_profile("ld/0")["storage_rows"] > 0
        del loader, batch, rows
        gc.collect()
        keep = s.alloc_recv((4,), np.uint8)  # the next allocation releases the collected ones
        assert len(s._recv) == 1
        s.free_recv(keep)
        # Rows all in memory on this node: plain buffers.
        mem = DistDataset(data, "mem", store=s)
        for batch in ThreadDataLoader(mem, batch_size=8, reuse_buffers=True):
            pass
        assert not s._recv

"""DDStore's pyddstore.torch API as its documentation gives it (docs/pytorch.md,
docs/api-torch.md of ORNL/DDStore), against real agents: numpy structured
records and numbers come back as the source gave them, `shapes` and
`dtypes`, `read_rows`, `alloc`, `release` and `__getitems__(out=)`; and
DistDataset's keywords under mpirun at 2 and 4 ranks on two simulated nodes,
with ThreadDataLoader(reuse_buffers=True) giving DataLoader's batches."""

import shutil

import numpy as np
import pytest

torch = pytest.importorskip("torch")
from torch.utils.data import DataLoader  # noqa: E402

import ddstore  # noqa: E402
import pyddstore.torch as pt  # noqa: E402
from ddstore.torch import DistDataset, DistDatasetReader, ThreadDataLoader  # noqa: E402

# A nested, aligned record (padding inside and at the end), and a packed one
# whose fields sit at offsets of their own, with a gap.
NESTED = np.dtype([("a", np.int32), ("b", np.float64, (2,)), ("c", [("x", np.uint8), ("y", np.int16)]),
                   ("d", np.uint8)], align=True)
GAPPED = np.dtype({"names": ["u", "v"], "formats": [np.uint8, np.float32], "offsets": [0, 5], "itemsize": 12})


def record(i):
    r = np.zeros((), NESTED)
    r["a"], r["b"], r["c"]["x"], r["c"]["y"], r["d"] = i, [i / 2, -i], i % 7, -3 * i, 200 + i % 50
    return r[()]


def records(i, n=3):
    a = np.zeros(n, GAPPED)
    a["u"], a["v"] = np.arange(i, i + n) % 256, np.arange(n) * 0.5 + i
    return a


class Mixed(torch.utils.data.Dataset):
    """Every kind of field DDStore's DistDataset keeps as the source gave it."""

    def __init__(self, n=23):
        self.n = n

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        return {"i": i, "f": i / 4, "b": i % 3 == 0, "np": np.float32(i * 1.5), "n64": np.int64(-i),
                "zero_d": np.array(i * 2), "t0": torch.tensor(i, dtype=torch.int32), "t": torch.full((2, 2), float(i)),
                "rec": record(i), "recs": records(i), "recarr": records(i + 1).view(np.recarray),
                "nprec": records(i, 2).view(np.recarray)[1]}


def assert_same(a, b, where="sample"):
    """Same type, dtype (a record's layout too), shape and values."""
    assert type(a) is type(b), f"{where}: {type(a).__name__} != {type(b).__name__}"
    if isinstance(a, dict):
        assert list(a) == list(b), where
        for k in a:
            assert_same(a[k], b[k], f"{where}[{k!r}]")
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b), where
        for k, (x, y) in enumerate(zip(a, b)):
            assert_same(x, y, f"{where}[{k}]")
    elif isinstance(a, torch.Tensor):
        assert a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b), where
    elif isinstance(a, (np.ndarray, np.generic)):
        assert a.dtype == b.dtype and a.shape == b.shape, f"{where}: {a.dtype}{a.shape} != {b.dtype}{b.shape}"
        if a.dtype.names is not None:
            da, db = a.dtype, b.dtype
            assert da.itemsize == db.itemsize and da.isalignedstruct == db.isalignedstruct, where
            assert [da.fields[k][1] for k in da.names] == [db.fields[k][1] for k in db.names], where
            same_records(np.asarray(a), np.asarray(b), where)
        else:
            np.testing.assert_array_equal(a, b, err_msg=where)
    else:
        assert a == b, f"{where}: {a!r} != {b!r}"


def same_records(a, b, where):
    """Field by field (a copy of a record leaves its padding as it was)."""
    for k in a.dtype.names:
        if a.dtype.fields[k][0].names is not None:
            same_records(a[k], b[k], f"{where}.{k}")
        else:
            np.testing.assert_array_equal(a[k], b[k], err_msg=f"{where}.{k}")


@pytest.fixture
def store(job):
    s = ddstore.Store()
    yield s
    s.close()


@pytest.mark.parametrize("chunk_size", [None, 4])
def test_records_and_numbers_come_back_as_the_source_gave_them(store, chunk_size):
    src = Mixed()
    ds = DistDataset(src, "mixed", store=store, chunk_size=chunk_size)
    for i in range(len(src)):
        assert_same(ds[i], src[i], f"sample {i}")
    order = [5, 0, 22, 5, 13]
    for i, got in zip(order, ds.__getitems__(order)):
        assert_same(got, src[i], f"__getitems__ sample {i}")
    assert ds.shapes == {"i": (), "f": (), "b": (), "np": (), "n64": (), "zero_d": (), "t0": (), "t": (2, 2),
                         "rec": (), "recs": (3,), "recarr": (3,), "nprec": ()}
    dt = ds.dtypes
    assert (dt["i"], dt["f"], dt["b"], dt["np"], dt["t"]) == ("int64", "float64", "bool", "float32", "float32")
    assert dt["rec"] == NESTED and dt["rec"].isalignedstruct and dt["recs"] == GAPPED
    # A reader learns the records' layout from the published metadata.
    rd = DistDatasetReader("mixed", store=store)
    for i in (0, 7, 22):
        assert_same(rd[i], src[i], f"reader sample {i}")
    assert rd.dtypes["rec"] == NESTED and rd.dtypes["rec"].isalignedstruct
    # default_collate cannot batch records (DataLoader raises too); a collate_fn can.
    with pytest.raises(TypeError):
        next(iter(DataLoader(src, batch_size=2)))
    with pytest.raises(TypeError, match="'rec' holds numpy structured records"):
        next(iter(ThreadDataLoader(ds, batch_size=2)))
    got = list(ThreadDataLoader(ds, batch_size=5, num_workers=2, collate_fn=list))
    assert_same(got, list(DataLoader(src, batch_size=5, collate_fn=list)), "batches")
    ds.free()


def test_a_whole_sample_record_and_numbers(store):
    recs = [record(i) for i in range(9)]
    ds = DistDataset(recs, "whole", store=store)
    assert ds.shapes == () and ds.dtypes == NESTED
    for i in range(9):
        assert_same(ds[i], recs[i])
    nums = [np.float64(i) / 3 for i in range(9)]
    dn = DistDataset(nums, "nums", store=store)
    assert_same([dn[i] for i in range(9)], nums)
    # Batches of numbers as default_collate makes them.
    for a, b in zip(ThreadDataLoader(dn, batch_size=4), DataLoader(nums, batch_size=4)):
        assert_same(a, b)
    ints = list(range(7))
    di = DistDataset(ints, "ints", store=store)
    assert_same([di[i] for i in range(7)], ints)
    assert_same(list(ThreadDataLoader(di, batch_size=3)), list(DataLoader(ints, batch_size=3)))
    with pytest.raises(TypeError, match="Python objects"):
        DistDataset([np.zeros(2, [("o", object)])], "obj", store=store)


def test_read_rows_alloc_and_out(store):
    src = Mixed(17)
    ds = DistDataset(src, "rows", store=store)
    rows = [16, 0, 3, 3]
    got = ds.read_rows(rows)
    assert list(got) == ds.fields
    assert got["i"].dtype == np.int64 and got["i"].tolist() == rows          # numbers: 1-d arrays
    assert isinstance(got["t"], torch.Tensor) and got["t"].shape == (4, 2, 2)
    assert isinstance(got["zero_d"], np.ndarray) and got["zero_d"].shape == (4,)
    assert got["rec"].dtype == NESTED and got["rec"].shape == (4,)
    assert isinstance(got["recarr"], np.recarray) and got["recarr"].shape == (4, 3)
    for j, r in enumerate(rows):
        assert_same(got["rec"][j], src[r]["rec"])
        assert_same(got["recs"][j], src[r]["recs"])
        assert torch.equal(got["t"][j], src[r]["t"])
    sel = ds.read_rows(np.array(rows), fields=["t", "i"])
    assert list(sel) == ["t", "i"]
    out = ds.alloc(8, fields=["t", "rec"])
    assert set(out) == {"t", "rec"}
    got = ds.read_rows(rows, fields=["rec", "t"], out=out)
    assert np.shares_memory(got["rec"], out["rec"]) and np.shares_memory(got["t"].numpy(), out["t"])
    same_records(got["rec"], np.array([src[r]["rec"] for r in rows], NESTED), "read into out")
    whole = ds.alloc(5)
    samples = ds.__getitems__([4, 2], out=whole)
    for i, s in zip([4, 2], samples):
        assert_same(s, src[i])
    assert np.shares_memory(samples[0]["t"].numpy(), whole["t"])
    ds.release(whole)
    assert whole == {}
    with pytest.raises(KeyError, match="nope"):
        ds.read_rows([0], fields=["nope"])
    with pytest.raises(IndexError):
        ds.read_rows([0, 17])
    with pytest.raises(ValueError, match=r"out\['t'\]"):
        ds.read_rows(list(range(9)), fields=["t"], out=out)  # 9 rows into buffers of 8
    with pytest.raises(ValueError, match="no buffer for field 'i'"):
        ds.read_rows([0], fields=["i"], out=out)
    with pytest.raises(ValueError):
        ds.alloc(0)
    # Ragged and text fields: a list of the rows' values; their buffers grow.
    var = [{"x": torch.arange(i + 1), "s": "ab" * i} for i in range(6)]
    dv = DistDataset(var, "var", store=store)
    assert dv.shapes == {"x": (None,), "s": (None,)} and dv.dtypes == {"x": "int64", "s": "str"}
    got = dv.read_rows([5, 1])
    assert [t.tolist() for t in got["x"]] == [list(range(6)), [0, 1]] and got["s"] == ["ab" * 5, "ab"]
    small = dv.alloc(1)
    got = dv.read_rows([5, 4, 5], out=small)
    assert [len(t) for t in got["x"]] == [6, 5, 6] and got["s"] == ["ab" * 5, "ab" * 4, "ab" * 5]
    ds.free(), dv.free()


def test_thread_loader_refuses_what_it_cannot_honour_and_closes(store):
    src = torch.utils.data.TensorDataset(torch.arange(40.).reshape(20, 2), torch.arange(20))
    ds = DistDataset(src, "tl", store=store)
    with pytest.raises(ValueError, match="batch_size=None"):
        ThreadDataLoader(ds, batch_size=None, reuse_buffers=True)
    with pytest.raises(ValueError, match="collate_copies=True"):
        ThreadDataLoader(ds, batch_size=4, reuse_buffers=True, collate_fn=lambda b: b)
    with pytest.raises(TypeError, match="alloc"):
        ThreadDataLoader(src, batch_size=4, reuse_buffers=True)
    with pytest.raises(ValueError, match="reuse_buffers 'yes'"):
        ThreadDataLoader(ds, batch_size=4, reuse_buffers="yes")
    # The default collate given by name is the default.
    ThreadDataLoader(ds, batch_size=4, reuse_buffers=True, collate_fn=torch.utils.data.default_collate)
    loader = ThreadDataLoader(ds, batch_size=3, num_workers=2, reuse_buffers=True)
    it = iter(loader)
    first = next(it)
    loader.close()  # stops the iteration's threads and lets go of the pool
    assert list(it) == []
    assert torch.equal(first[1], torch.arange(3))  # a kept batch outlives the pool
    assert loader._pool is None
    again = list(loader)  # a later iteration makes a new pool
    assert torch.equal(torch.cat([b[1] for b in again]), torch.arange(20))
    loader.close()


def test_distdataset_keywords_one_process(job):
    src = Mixed(11)
    ds = pt.DistDataset(src, "kw", None, None, "cpu", "cpu", 1, None, 3)  # device, add_device, method, chunk_size
    try:
        assert ds.method == 1 and ds.add_device == "cpu" and ds.device == "cpu"
        for i in range(11):
            assert_same(ds[i], src[i])
    finally:
        ds.free()
        ds.close()
    with pytest.raises(ValueError, match="chunk_size 0"):
        pt.DistDataset(src, "kw2", chunk_size=0)
    with pytest.raises((ValueError, TypeError, RuntimeError), match="add_device"):
        pt.DistDataset(src, "kw3", add_device="no-such-device")


# -- several ranks, two simulated nodes ----------------------------------------------------

RANKS = r"""
import os, sys
import numpy as np
import torch
from mpi4py import MPI
comm = MPI.COMM_WORLD
rank, size = comm.Get_rank(), comm.Get_size()
os.environ["DDSTORE_NODE_ID"] = "n%d" % (rank * 2 // size)   # two simulated nodes
sys.path.insert(0, sys.argv[1])
from test_torch_dropin import Mixed, assert_same
import pyddstore.torch as pt
from torch.utils.data import DataLoader
method, chunk = int(sys.argv[2]), (None if sys.argv[3] == "none" else int(sys.argv[3]))
src = Mixed(29)
ds = pt.DistDataset(src, "mixed", comm, method=method, chunk_size=chunk, device="cpu", add_device="cpu")
assert len(ds) == 29 and ds.ddstore.method == method
for i in range(29):
    assert_same(ds[i], src[i], "sample %d" % i)
# Rows of the other node into buffers from alloc: views of them.
owner = lambda i: max(r for r in range(size) if r * 29 // size <= i)
other = [i for i in range(29) if owner(i) * 2 // size != rank * 2 // size]
out = ds.alloc(len(other))
got = ds.read_rows(other, out=out)
for j, i in enumerate(other):
    assert_same(got["rec"][j], src[i]["rec"], "read_rows rec %d" % i)
    assert torch.equal(got["t"][j], src[i]["t"])
assert np.shares_memory(got["recs"], out["recs"])
for i, s in zip(other[::-1], ds.__getitems__(other[::-1], out=out)):
    assert_same(s, src[i], "__getitems__(out=) %d" % i)
# reuse_buffers=True: DataLoader's batches, each valid after the next is taken.
tsrc = torch.utils.data.TensorDataset(torch.randn(41, 3, generator=torch.Generator().manual_seed(2)), torch.arange(41))
fixed = pt.DistDataset(tsrc, "fixed", comm, method=method)
for workers in (0, 2):
    mk = lambda: dict(batch_size=6, shuffle=True, generator=torch.Generator().manual_seed(workers))
    loader = pt.ThreadDataLoader(fixed, reuse_buffers=True, num_workers=workers, **mk())
    ref_loader = DataLoader(tsrc, **mk())
    for epoch in range(2):
        kept, ref = list(loader), list(ref_loader)
        assert len(kept) == len(ref)
        for a, b in zip(kept, ref):
            assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])
    loader.close()
    assert next(iter(pt.ThreadDataLoader(fixed, batch_size=2)))[1].tolist() == [0, 1]
recs = list(pt.ThreadDataLoader(ds, batch_size=4, num_workers=2, reuse_buffers=True, collate_fn=list,
                                collate_copies=True))
assert_same([s for b in recs for s in b], [src[i] for i in range(29)], "records through the pool")
ds.free(); fixed.free()
comm.Barrier()
sys.stdout.write("ok %d\n" % rank); sys.stdout.flush()
"""


@pytest.mark.skipif(shutil.which("mpirun") is None, reason="Open MPI (mpirun) is not installed")
@pytest.mark.parametrize("np_,method,chunk", [(2, 0, "none"), (4, 1, "5")])
def test_distdataset_under_mpirun_on_two_nodes(job, tmp_path, np_, method, chunk):
    import os

    from test_bootstrap import mpirun_plain
    mpirun_plain(job, tmp_path, RANKS, np_, os.path.dirname(os.path.abspath(__file__)), str(method), chunk,
                 timeout=240)

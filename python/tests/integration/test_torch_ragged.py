"""Samples whose fields vary in size, against real agents: graphs (x and pos
[n_i, ...], edge_index [2, e_i], a label, a name, bytes), sequences, and
pickled objects through encode/decode; every sample and batch compared
with one built naively from the source; ThreadDataLoader, forked DataLoader
workers, ScheduledSampler, BudgetSampler, a reader store, and ranks on two
simulated nodes; bad samples failing the load on every rank."""

import inspect
import pickle

import numpy as np
import pytest

torch = pytest.importorskip("torch")
from torch.utils.data import DataLoader, Dataset  # noqa: E402

import ddstore  # noqa: E402
from conftest import run_ranks  # noqa: E402
from test_torch import assert_same as same  # noqa: E402
from ddstore.torch import (BudgetSampler, DistDataset, DistDatasetReader, Graphs, Packed, Padded,  # noqa: E402
                           ScheduledSampler, ThreadDataLoader, WindowedDataset)
from ddstore.torch.collate import _Collate  # noqa: E402

EDGES = {"edge_index": "x"}


class Molecules(Dataset):
    """Graphs of 0 to 11 nodes (a node-less one too), 0 to 29 edges; each
    value tells its graph and place, so a misplaced one never passes."""

    def __init__(self, n=53, seed=5):
        rng = np.random.default_rng(seed)
        self.nodes = rng.integers(1, 12, n)
        self.nodes[3] = 0
        self.edges = rng.integers(0, 30, n)
        self.edges[3] = 0
        self.edges[7] = 0
        self.seed = seed

    def __len__(self):
        return len(self.nodes)

    def __getitem__(self, i):
        rng = np.random.default_rng(self.seed * 1000 + i)
        n, e = int(self.nodes[i]), int(self.edges[i]) if self.nodes[i] else 0
        x = torch.from_numpy(i * 100 + np.arange(n * 4, dtype=np.float32).reshape(n, 4) / 8)
        pos = rng.standard_normal((n, 3))  # numpy float64: comes back numpy
        edge_index = torch.from_numpy(rng.integers(0, max(n, 1), (2, e))) if n else torch.zeros(2, 0,
                                                                                               dtype=torch.int64)
        return {"x": x, "pos": pos, "edge_index": edge_index, "y": torch.tensor(float(i) / 3),
                "name": f"mol-{i}-é" * (i % 3), "raw": bytes(range(i % 7))}


class Sentences(Dataset):
    def __init__(self, n=41):
        self.lengths = np.random.default_rng(9).integers(0, 17, n)

    def __len__(self):
        return len(self.lengths)

    def __getitem__(self, i):
        return torch.arange(int(self.lengths[i]), dtype=torch.int32) + 1000 * i, i % 5


def naive_graphs(samples):
    """PyTorch Geometric's batch of dict graphs, written out the long way."""
    out, shift = {}, 0
    xs, pos, ei, ys, batch = [], [], [], [], []
    for j, s in enumerate(samples):
        n = s["x"].shape[0]
        xs.append(s["x"])
        pos.append(torch.as_tensor(s["pos"]))
        ei.append(s["edge_index"] + shift)
        ys.append(s["y"])
        batch += [j] * n
        shift += n
    out = {"x": torch.cat(xs), "pos": torch.cat(pos), "edge_index": torch.cat(ei, 1), "y": torch.stack(ys),
           "name": [s["name"] for s in samples], "raw": [s["raw"] for s in samples],
           "batch": torch.tensor(batch, dtype=torch.int64)}
    counts = [s["x"].shape[0] for s in samples]
    out["ptr"] = torch.tensor(np.concatenate(([0], np.cumsum(counts))), dtype=torch.int64)
    return out


def naive_padded(samples, value=0):
    toks = [s[0] for s in samples]
    longest = max(len(t) for t in toks)
    pad = torch.full((len(toks), longest), value, dtype=toks[0].dtype)
    for j, t in enumerate(toks):
        pad[j, :len(t)] = t
    return [(pad, torch.tensor([len(t) for t in toks])), torch.tensor([s[1] for s in samples])]


def naive_packed(samples):
    toks = [s[0] for s in samples]
    off = torch.tensor(np.concatenate(([0], np.cumsum([len(t) for t in toks]))), dtype=torch.int64)
    return [(torch.cat(toks), off), torch.tensor([s[1] for s in samples])]


@pytest.fixture
def store(job):
    s = ddstore.Store()
    yield s
    s.close()


def check_samples(ds, src):
    assert len(ds) == len(src)
    for i in range(len(src)):
        same(ds[i], src[i], f"sample {i}")
    order = np.random.default_rng(1).permutation(len(src)).tolist() + [3, 3]
    for lo in range(0, len(order), 9):
        b = order[lo:lo + 9]
        for i, got in zip(b, ds.__getitems__(b)):
            same(got, src[i], f"__getitems__ sample {i}")


@pytest.mark.parametrize("chunk", [None, 7])
def test_graph_dataset(store, chunk):
    src = Molecules()
    kw = {} if chunk is None else dict(chunk_size=chunk, ragged={"x": 0, "pos": 0, "edge_index": 1})
    ds = DistDataset(src, "g", store=store, **kw)
    assert ds.ragged_fields == ["x", "pos", "edge_index", "name", "raw"]
    # How it is stored: the varying axis first, edges as [e_i, 2] units.
    d = store.describe("g/edge_index")
    assert d["kind"] == "ragged" and d["shape"] == [2] and d["total_items"] == int(src.edges.sum() - src.edges[3])
    assert store.describe("g/x")["shape"] == [4] and store.describe("g/name")["dtype"] == "uint8"
    assert store.describe("g/y")["kind"] != "ragged"
    assert ds.sizes().tolist() == src.nodes.tolist()
    assert ds.sizes("edge_index", [7, 0]).tolist() == [0, src.edges[0]]
    check_samples(ds, src)
    assert ds[1]["edge_index"].is_contiguous() and ds.__getitems__([2])[0]["edge_index"].is_contiguous()
    check_samples(DistDatasetReader("g", store=store), src)


def naive_window(src, rows, fields):
    """A window of src's rows: y (fixed) stacked, the fields of varying
    size as lists of the rows' values; fields a list, or one key (bare)."""
    samples = [src[r] for r in rows]
    keys = [fields] if isinstance(fields, str) else fields
    out = {k: torch.stack([s[k] for s in samples]) if k == "y" else [s[k] for s in samples] for k in keys}
    return out[fields] if isinstance(fields, str) else out


def test_windowed_ragged(store):
    src = Molecules()
    ds = DistDataset(src, "g", store=store)
    every = ["x", "pos", "edge_index", "y", "name", "raw"]
    for w, fields in ((WindowedDataset(ds, 3, stride=2, dilation=2), every),
                      (WindowedDataset(DistDatasetReader("g", store=store), 2, fields=["edge_index", "y"]),
                       ["edge_index", "y"]),
                      (WindowedDataset(ds, 4, starts=[49, 0, 3, 3], fields="x"), "x")):
        rows = [w._rows(np.array([i]))[0:w.window].tolist() for i in range(len(w))]
        for i in range(len(w)):
            same(w[i], naive_window(src, rows[i], fields), f"window {i}")
        b = [len(w) - 1, 0, 2, 2]
        for i, got in zip(b, w.__getitems__(b)):
            same(got, naive_window(src, rows[i], fields), f"__getitems__ window {i}")
        # A batch of windows collates as the batch of their rows, whether
        # read as a batch (ThreadDataLoader) or cut into window samples.
        flat = [src[r] for i in b for r in rows[i]]
        if isinstance(fields, str):
            flat = [s[fields] for s in flat]
        else:
            flat = [{k: s[k] for k in fields} for s in flat]
        collates = [Packed()] if isinstance(fields, str) else [Packed(), Graphs(edges={"edge_index": "edge_index"},
                                                                               nodes="edge_index")]
        for c in collates:
            want = c(flat)
            same(next(iter(ThreadDataLoader(w, batch_sampler=[b], collate_fn=c))), want)
            kw = dict(ds=w) if not isinstance(c, Graphs) else dict(ds=w, edges={"edge_index": "edge_index"},
                                                                    nodes="edge_index")
            same(type(c)(**kw)(w.__getitems__(b)), want)
            same(next(iter(DataLoader(w, batch_sampler=[b], collate_fn=type(c)(**kw)))), want)
        same(next(iter(ThreadDataLoader(w, batch_sampler=[b]))), Packed()(flat))  # the default
    # Graphs over the windows of every field, read ahead in threads.
    w = WindowedDataset(ds, 2, stride=3)
    got = list(ThreadDataLoader(w, batch_size=5, num_workers=2, collate_fn=Graphs(edges=EDGES)))
    for k, g in enumerate(got):
        windows = range(5 * k, min(5 * k + 5, len(w)))
        same(g, naive_graphs([src[r] for i in windows for r in (3 * i, 3 * i + 1)]), f"batch {k}")
    assert WindowedDataset(ds, 2, fields=["y"])[0]["y"].shape == (2,)  # fixed fields window as before


def test_windowed_plain_ragged(store):
    """Windows over a dataset not of this package whose fields vary in size
    come and collate as over a DistDataset of the same samples."""
    src = Molecules()
    ds = DistDataset(src, "gw", store=store)
    x_edges = dict(edges={"edge_index": "x"})
    e_edges = dict(edges={"edge_index": "edge_index"}, nodes="edge_index")
    for args, kw, graphs in (((3,), dict(stride=2, dilation=2), x_edges),
                             ((2,), dict(fields=["edge_index", "y", "name"]), e_edges),
                             ((4,), dict(starts=[49, 0, 3, 3], fields="x"), None)):
        plain, stored = WindowedDataset(src, *args, **kw), WindowedDataset(ds, *args, **kw)
        assert len(plain) == len(stored)
        for i in range(len(plain)):
            p, q = plain[i], stored[i]
            if isinstance(q, dict):
                assert list(p) == list(q)
                for k in q:
                    same(list(p[k]), list(q[k]), f"window {i} field {k}")
            else:
                same(list(p), list(q), f"window {i}")
        b = [len(plain) - 1, 0, 2, 2]
        collates = [Packed] + ([Graphs] if graphs else [])
        for c in collates:
            ckw = graphs if c is Graphs else {}
            want = next(iter(ThreadDataLoader(stored, batch_sampler=[b], collate_fn=c(**ckw))))
            same(next(iter(ThreadDataLoader(plain, batch_sampler=[b], collate_fn=c(**ckw)))), want)
            same(next(iter(DataLoader(plain, batch_sampler=[b], collate_fn=c(ds=plain, **ckw)))), want)
            same(c(**ckw)(plain.__getitems__(b)), want)
        # ThreadDataLoader's default: Packed, as over the DistDataset.
        same(next(iter(ThreadDataLoader(plain, batch_sampler=[b]))), next(iter(ThreadDataLoader(stored,
                                                                                           batch_sampler=[b]))))
    # Fields that keep their shape stack as before; rows of another kind
    # than the window's first are refused.
    assert isinstance(WindowedDataset(src, 2, fields=["y"])[0]["y"], torch.Tensor)

    class Mixed(Dataset):
        def __len__(self):
            return 4

        def __getitem__(self, i):
            return {"a": torch.zeros(i)} if i % 2 else (torch.zeros(i),)

    with pytest.raises(ddstore.Error, match=r"row 1 of a window \(dict, fields \['a'\]\) differs from its first "
                                            r"\(tuple"):
        WindowedDataset(Mixed(), 2)[0]


class PlainGraphs(Dataset):
    """Molecules without their str and bytes fields: what a backing file of
    numeric datasets holds."""

    def __init__(self, n=53):
        self.src = Molecules(n)

    def __len__(self):
        return len(self.src)

    def __getitem__(self, i):
        s = self.src[i]
        return {"x": s["x"], "pos": s["pos"], "edge_index": s["edge_index"], "y": s["y"]}


def write_graph_file(path, src):
    """The flat layout of ragged data in one HDF5 file: each field's rows
    concatenated along the varying axis, first in the file (edges as
    [sum e, 2]), and the offsets of nodes and of edges."""
    import h5py
    samples = [src[i] for i in range(len(src))]
    nodes = np.concatenate(([0], np.cumsum([s["x"].shape[0] for s in samples])))
    edges = np.concatenate(([0], np.cumsum([s["edge_index"].shape[1] for s in samples])))
    with h5py.File(path, "w") as f:
        f["x"] = np.concatenate([s["x"].numpy() for s in samples])
        f["pos"] = np.concatenate([s["pos"] for s in samples])
        f["edge_index"] = np.concatenate([s["edge_index"].numpy().T for s in samples])
        f["y"] = np.array([s["y"].item() for s in samples], np.float32)
        f["node_offsets"], f["edge_offsets"] = nodes, edges
    return {"x": (f"{path}:/x", f"{path}:/node_offsets"), "pos": (f"{path}:/pos", f"{path}:/node_offsets"),
            "edge_index": (f"{path}:/edge_index", f"{path}:/edge_offsets"), "y": f"{path}:/y"}


@pytest.mark.parametrize("chunk", [None, 6])
def test_graphs_larger_than_memory(store, tmp_path, chunk):
    """capacity and backing with ragged fields: samples [0, C) in memory,
    the others read from the file's values and offsets, every sample and
    batch the source's; a pair for a fixed field, or one file for a ragged
    one, is refused naming the field."""
    pytest.importorskip("h5py")
    src = PlainGraphs()
    backing = write_graph_file(str(tmp_path / "g.h5"), src)
    kw = {} if chunk is None else dict(chunk_size=chunk, ragged={"x": 0, "pos": 0, "edge_index": 1})
    ds = DistDataset(src, "gb", store=store, capacity=20, backing=backing, **kw)
    assert store.describe("gb/x")["backing"] and store.describe("gb/edge_index")["shape"] == [2]
    check_samples(ds, src)
    assert store.get_profile("gb/x")["storage_rows"] > 0
    order = np.random.default_rng(2).permutation(len(src))
    for lo in range(0, len(src), 8):
        b = order[lo:lo + 8].tolist()
        g = next(iter(ThreadDataLoader(ds, batch_sampler=[b], collate_fn=Graphs(edges=EDGES))))
        same(g, {k: v for k, v in naive_graphs_plain([src[i] for i in b]).items()}, f"batch {b}")
    ds.free()
    for key, spec, what in (("y", ("a.h5:/y", "a.h5:/o"), "field 'y' is fixed, its backing"),
                            ("x", str(tmp_path / "g.h5") + ":/x", "field 'x' is ragged, its backing")):
        bad = dict(backing, **{key: spec})
        with pytest.raises(ddstore.ArgumentError, match=what):
            DistDataset(src, "gb", store=store, capacity=20, backing=bad, **kw)
    DistDataset(src, "gb", store=store, capacity=20, backing=backing, **kw).free()  # the name works again


def agent_counters(store):
    import json
    import subprocess
    from ddstore import _agent
    out = subprocess.run([_agent.find_binary(), "info", "--json", "--socket", store.socket_path],
                         capture_output=True, text=True, check=True, timeout=30).stdout
    return json.loads(out)["counters"]


def test_announced_batch_staged_for_every_field(store, tmp_path):
    """prefetch of samples only the file holds: one announcement for the
    dataset's fields, its requests sent together; the agent reads every
    field's rows ahead, and the read of the batch takes them all from
    staging. Bad indices raise, and announcements keep working."""
    pytest.importorskip("h5py")
    from conftest import wait_until
    src = PlainGraphs()
    ds = DistDataset(src, "ga", store=store, capacity=20, backing=write_graph_file(str(tmp_path / "g.h5"), src))
    fields = len(ds.fields)
    for k, b in enumerate(([30, 41, 33, 52], [21, 22])):
        c0 = agent_counters(store)
        ds.prefetch(b)
        want = fields * len(b)
        wait_until(lambda: agent_counters(store)["prefetch_rows"] - c0["prefetch_rows"] >= want, 10,
                   f"{want} rows read ahead")
        for i, got in zip(b, ds.__getitems__(b)):
            same(got, src[i], f"sample {i}")
        c1 = agent_counters(store)
        assert c1["staged_rows"] - c0["staged_rows"] == want, (c0, c1)
        assert c1["prefetch_late"] == c0["prefetch_late"], (c0, c1)
        if k == 0:
            with pytest.raises(ddstore.IndexOutOfRange, match=str(len(src))):
                ds.prefetch([len(src)])
    ds.free()


def naive_graphs_plain(samples):
    g = naive_graphs([dict(s, name="", raw=b"") for s in samples])
    del g["name"], g["raw"]
    return g


def test_graph_batches(store):
    src = Molecules()
    ds = DistDataset(src, "g", store=store)
    sampler = torch.utils.data.BatchSampler(torch.utils.data.SequentialSampler(range(len(src))), 8, False)
    batches = list(sampler)
    for workers in (0, 2):
        got = list(ThreadDataLoader(ds, batch_sampler=sampler, num_workers=workers, collate_fn=Graphs(edges=EDGES)))
        assert len(got) == len(batches)
        for b, g in zip(batches, got):
            same(g, naive_graphs([src[i] for i in b]), f"batch {b}")
    # The collate over samples (torch's DataLoader path) gives the same.
    same(Graphs(edges=EDGES)(ds.__getitems__(batches[1])), naive_graphs([src[i] for i in batches[1]]))
    # reuse_buffers: ragged buffers grow to the largest batch and are reused.
    loader = ThreadDataLoader(ds, batch_size=16, shuffle=True, generator=torch.Generator().manual_seed(3),
                              num_workers=2, reuse_buffers=True, collate_fn=Graphs(edges=EDGES))
    order = list(torch.utils.data.BatchSampler(torch.utils.data.RandomSampler(
        range(len(src)), generator=torch.Generator().manual_seed(3)), 16, False))
    torch.empty((), dtype=torch.int64).random_(generator=torch.Generator().manual_seed(3))
    for epoch in range(2):
        n = 0
        for g in loader:
            n += g["ptr"].shape[0] - 1
            assert g["batch"].shape[0] == g["x"].shape[0]
        assert n == len(src)
    assert len(order) == len(loader)


def test_graph_batches_from_arrays(store):
    """Graphs over a dataset's arrays as read (the loader's path) batches
    them in numpy straight from the arrays: what _collate makes of them,
    and PyTorch Geometric's batch, for batches with node-less and
    edge-less graphs, repeats, and str and bytes fields."""
    src = Molecules()
    ds = DistDataset(src, "g", store=store)
    g = Graphs(edges=EDGES)
    for b in ([0, 1, 2], [3, 7, 3, 9, 12], list(range(len(src))), [3]):
        schema, arrays = ds._ddstore_read(np.array(b, np.int64))
        got = g._ddstore_batch(schema, arrays, None)
        assert g._fast[0] is schema and g._fast[1] == "x", g._fast  # the numpy path, its node field
        same(got, _Collate._ddstore_batch(g, schema, arrays, None), f"batch {b}")
        same(got, naive_graphs([src[i] for i in b]), f"batch {b}")
    # A field named as the batch vector: _collate's error, on the numpy path's schemas too.
    with pytest.raises(ddstore.Error, match="batch vector"):
        Graphs(edges=EDGES, batch="y")._ddstore_batch(schema, arrays, None)
    # A fixed node field: _collate counts it.
    schema, arrays = ds._ddstore_read(np.array([1, 2], np.int64))
    h = Graphs(edges={"edge_index": "y"})
    with pytest.raises(ddstore.Error):
        h._ddstore_batch(schema, arrays, None)
    assert h._fast[1] is None


def test_forked_dataloader_workers(store):
    src = Molecules(40)
    ds = DistDataset(src, "g", store=store)
    ds[0]  # the parent holds live connections the children must not use
    kw = dict(batch_size=6, shuffle=True, collate_fn=Graphs(edges=EDGES, ds=ds))
    ref = list(DataLoader(src, generator=torch.Generator().manual_seed(4), **kw))
    got = list(DataLoader(ds, num_workers=2, multiprocessing_context="fork", timeout=30,
                          generator=torch.Generator().manual_seed(4), **kw))
    same(got, ref)
    threads = list(ThreadDataLoader(ds, num_workers=2, generator=torch.Generator().manual_seed(4), **kw))
    same(threads, ref)
    check_samples(ds, src)  # the parent still reads


def test_sequences_padded_packed(store):
    src = Sentences()
    ds = DistDataset(src, "s", store=store)
    assert ds.ragged_fields == [0]
    b = [4, 0, 17, 17, 40]
    same(ThreadDataLoader(ds, batch_sampler=[b], collate_fn=Padded(value=-1)).__iter__().__next__(),
         naive_padded([src[i] for i in b], -1))
    same(Padded(value=-1)([src[i] for i in b]), naive_padded([src[i] for i in b], -1))
    # ThreadDataLoader's default over ragged fields: Packed.
    same(next(iter(ThreadDataLoader(ds, batch_sampler=[b]))), naive_packed([src[i] for i in b]))
    same(next(iter(ThreadDataLoader(ds, batch_sampler=[b], collate_fn=Packed()))), naive_packed([src[i] for i in b]))
    # A collate_fn of one's own gets the samples.
    got = next(iter(ThreadDataLoader(ds, batch_sampler=[b], collate_fn=lambda s: [len(t) for t, _ in s])))
    assert got == [len(src[i][0]) for i in b]
    # bfloat16 and bool rows, ragged, with reused buffers.
    half = [(torch.randn(k % 4 + 1, 2).to(torch.bfloat16), torch.arange(k % 3) > 0) for k in range(9)]
    h = DistDataset(half, "h", store=store)
    assert h.ragged_fields == [0, 1]
    check_samples(h, half)
    for (v, off), (m, moff) in ThreadDataLoader(h, batch_size=4, reuse_buffers=True, num_workers=1):
        assert v.dtype == torch.bfloat16 and m.dtype == torch.bool and off.shape == moff.shape
    # Edges padded along their own (last) axis.
    g = DistDataset(Molecules(12), "g", store=store)
    pad, lens = Padded(ds=g)(g.__getitems__([1, 2]))["edge_index"]
    e = [g[1]["edge_index"], g[2]["edge_index"]]
    assert pad.shape == (2, 2, max(t.shape[1] for t in e)) and lens.tolist() == [t.shape[1] for t in e]
    assert torch.equal(pad[1, :, :lens[1]], e[1])


class Objects(Dataset):
    """Samples no tensor can hold: sets, a class instance, None."""

    def __len__(self):
        return 17

    def __getitem__(self, i):
        return {"tags": {f"t{i}", i}, "point": Point(i, -i), "none": None, "x": torch.full((i % 4,), float(i))}


class Point:
    def __init__(self, a, b):
        self.a, self.b = a, b

    def __eq__(self, o):
        return isinstance(o, Point) and (o.a, o.b) == (self.a, self.b)


def test_encode_decode_and_bad_objects(store):
    src = Objects()
    enc = lambda s: {"blob": pickle.dumps({k: v for k, v in s.items() if k != "x"}), "x": s["x"]}  # noqa: E731
    dec = lambda d, i: {**pickle.loads(d["blob"]), "x": d["x"], "index": i}  # noqa: E731
    ds = DistDataset(src, "o", store=store, encode=enc, decode=dec)
    assert ds.ragged_fields == ["blob", "x"]
    for i in range(len(src)):
        got, want = ds[i], src[i]
        assert got["tags"] == want["tags"] and got["point"] == want["point"] and got["none"] is None
        assert torch.equal(got["x"], want["x"]) and got["index"] == i
    got = ds.__getitems__([5, 2])
    assert [g["index"] for g in got] == [5, 2] and got[0]["point"] == Point(5, -5)
    # A loader collates the decoded samples with the collate given.
    batch = next(iter(ThreadDataLoader(ds, batch_sampler=[[1, 2, 3]], collate_fn=lambda s: [g["index"] for g in s])))
    assert batch == [1, 2, 3]
    rd = DistDatasetReader("o", store=store, decode=dec)
    assert rd[9]["point"] == Point(9, -9)

    # Without encode: the value and what is expected, named.
    with pytest.raises(TypeError, match=r"field 'tags': a set \(\{.*\}\): want a tensor.*encode="):
        DistDataset(src, "bad", store=store)

    # encode that cannot serialise a sample: the sample, the error.
    class Unpicklable(Objects):
        def __getitem__(self, i):
            s = super().__getitem__(i)
            if i == 11:
                s["tags"] = lambda: 0
            return s

    with pytest.raises(ValueError, match=r"encode failed on the sample at index 11 \(a dict\): .*(Pickl|pickle)"):
        DistDataset(Unpicklable(), "bad", store=store, encode=enc)
    # encode that returns what cannot be stored.
    with pytest.raises(TypeError, match=r"sample at index 0, field 'p': a Point"):
        DistDataset(src, "bad", store=store, encode=lambda s: {"p": s["point"]})
    with pytest.raises(TypeError, match="encode of type int"):
        DistDataset(src, "bad", store=store, encode=3)
    # After all that, the name and the store work.
    ok = DistDataset(src, "bad", store=store, encode=enc, decode=dec)
    assert ok[16]["point"] == Point(16, -16)


def test_shapes_that_cannot_be_ragged(store):
    class Images(Dataset):
        def __len__(self):
            return 4

        def __getitem__(self, i):
            return torch.zeros(2 + i, 3 + i)

    with pytest.raises(ValueError, match=r"field 0 varies in axes \[0, 1\].*want one varying axis"):
        DistDataset(Images(), "im", store=store)
    with pytest.raises(ValueError, match=r"field 0 .* varies in axes \[0, 1\], declared ragged along axis 0"):
        DistDataset(Images(), "im", store=store, ragged=[0])
    with pytest.raises(ValueError, match=r"ragged field 0 along axis 2"):
        DistDataset(Images(), "im", store=store, ragged={0: 2})
    with pytest.raises(ValueError, match=r"ragged field 'nope'"):
        DistDataset(Images(), "im", store=store, ragged=["nope"])


def test_budget_sampler_over_a_dataset(store):
    src = Molecules(60)
    ds = DistDataset(src, "g", store=store)
    calls = store.get_profile("g/x")["calls"]
    sampler = BudgetSampler(ds, budget=40, field="x", seed=3)
    assert store.get_profile("g/x")["calls"] == calls  # the sizes alone: no row read
    loader = ThreadDataLoader(ds, batch_sampler=sampler, num_workers=2, collate_fn=Graphs(edges=EDGES))
    seen = []
    for g in loader:
        assert g["x"].shape[0] <= 40
        seen += (g["ptr"][1:] - g["ptr"][:-1]).tolist()
    assert sorted(seen) == sorted(src.nodes.tolist())  # one rank: every graph once, no padding
    with pytest.raises(ValueError, match=r"sample \d+ has size 11, above the budget 10"):
        BudgetSampler(ds, budget=10)
    # Resumed mid-epoch behind a prefetching loader: the rest of the epoch
    # is what the uninterrupted run got.
    sampler.set_epoch(1)
    full = [g["y"].tolist() for g in loader]
    it = iter(loader)
    for _ in range(4):
        next(it)
        sampler.consumed()
    state = sampler.state_dict()
    del it
    again = BudgetSampler(ds, budget=40, field="x", seed=3)
    again.load_state_dict(state)
    rest = [g["y"].tolist() for g in ThreadDataLoader(ds, batch_sampler=again, num_workers=2,
                                                          collate_fn=Graphs(edges=EDGES))]
    assert state["step"] == 4 and rest == full[4:]


TWO_RANKS = r"""
import sys, threading, numpy as np, torch, ddstore
from torch.utils.data import Dataset
from ddstore.torch import (BudgetSampler, DistDataset, DistDatasetReader, Graphs, ScheduledSampler,
                           ThreadDataLoader)
EDGES = {"edge_index": "x"}
""" + inspect.getsource(Molecules) + inspect.getsource(same) + "same = assert_same\n" + inspect.getsource(naive_graphs) + r"""
chunk = int(sys.argv[1]) or None
src = Molecules(45)
kw = {} if chunk is None else dict(chunk_size=chunk, ragged={"x": 0, "pos": 0, "edge_index": 1})
ds = DistDataset(src, "g", **kw)
s = ds.store
r, P = s.rank, s.size
for i in np.random.default_rng(r).permutation(len(src)).tolist():
    same(ds[i], src[i], f"rank {r} sample {i}")
sampler = ScheduledSampler(ds, batch_size=5, seed=2)
n = 0
for b, g in zip(list(sampler), ThreadDataLoader(ds, batch_sampler=sampler, num_workers=2,
                                                 collate_fn=Graphs(edges=EDGES))):
    same(g, naive_graphs([src[i] for i in b]), f"rank {r} batch {b}")
    n += 1
assert n == len(sampler)
# The fields' reads of a batch (each needing rows of the other node) went
# straight to its agent, pipelined in the loader's thread: no reader thread
# of the dataset's was needed; close() stops any there are.
readers = lambda: [t for t in threading.enumerate() if t.name.startswith("ddstore-fields-")]  # noqa: E731
for k in ("x", "pos", "edge_index"):
    p = s.get_profile(f"g/{k}")
    assert p["remote_rows"] > 0 and p["direct_rows"] == p["remote_rows"], (k, p)
# The budget sampler: every rank the same number of steps, within budget,
# each graph once across the ranks but for the padding of the last round.
bs = BudgetSampler(ds, budget=30, seed=4)
mine = [i for b in bs for i in b]
steps = len(bs)
print("rank", r, "remote", s.get_profile("g/x")["remote_rows"], "steps", steps, "samples",
      ",".join(map(str, mine)))
# A reader store of this job (split mode): it holds no shard.
if r == 0:
    rd = ddstore.Store(rank=0, size=1, spawn=False, reader=True)
    rds = DistDatasetReader("g", store=rd)
    for i in range(len(src)):
        same(rds[i], src[i], f"reader sample {i}")
    g = next(iter(ThreadDataLoader(rds, batch_size=9, collate_fn=Graphs(edges=EDGES))))
    same(g, naive_graphs([src[i] for i in range(9)]), "reader batch")
    rds.close()  # its reader threads; the store it was given stays open
    rd.close()
s.add("done", np.zeros((1, 1), np.uint8))  # rank 1 serves its rows until the reader is done
ds.close()  # and its store
assert not readers() and s._closed
"""


@pytest.mark.parametrize("chunk", ["0", "4"])
def test_two_ranks_on_two_nodes(job, chunk):
    outs = run_ranks(TWO_RANKS, ["a", "b"], job, timeout=120, args=(chunk,))
    words = [o.split() for o in outs]
    assert all(int(w[3]) > 0 for w in words), outs  # every rank read graphs of the other node
    assert words[0][5] == words[1][5], outs
    every = [int(x) for w in words for x in w[7].split(",")]
    assert set(every) == set(range(45)), outs



AHEAD = r"""
import time
import numpy as np, torch, ddstore
from torch.utils.data import Dataset
from ddstore.torch import DistDataset, Graphs, ScheduledSampler, ThreadDataLoader
from ddstore.torch import dataset as dsmod
EDGES = {"edge_index": "x"}
""" + inspect.getsource(Molecules) + inspect.getsource(same) + "same = assert_same\n" + inspect.getsource(naive_graphs) + r"""
src = Molecules(40)
ds = DistDataset(src, "g")
s = ds.store
r = s.rank
queue = lambda: ds._ahead[2] if ds._ahead is not None else []  # noqa: E731
rows = lambda: s.get_profile("g/x")["rows"]  # noqa: E731
if r == 0:
    b1, b2, b3, b4 = [21, 3, 30, 22], [25, 1, 2, 39], [5, 33, 34], [36, 6, 20, 7, 27]
    # Announced batches: their requests sent; read, they are the source's.
    ds.prefetch(b1)
    ds.prefetch(b2)
    assert len(queue()) == 2
    before = rows()
    for g, i in zip(ds.__getitems__(b1), b1):
        same(g, src[i], f"sample {i} read ahead")
    assert len(queue()) == 1 and rows() == before + len(b1)
    # Into buffers from alloc(): copied there, views of them.
    out = ds.alloc(len(b2))
    got = ds.__getitems__(b2, out=out)
    for g, i in zip(got, b2):
        same(g, src[i], f"sample {i} read ahead into out")
    assert not queue()
    assert np.shares_memory(got[0]["y"].numpy(), out["y"]), "fixed field not in out"
    # A batch read that was not announced, and single samples, leave the
    # announced ones alone; so does a later one read before them (a
    # loader's threads take batches out of order).
    ds.prefetch(b3)
    ds.prefetch(b4)
    same(ds[33], src[33], "sample 33")
    for g, i in zip(ds.__getitems__([1, 38]), [1, 38]):
        same(g, src[i], f"sample {i}")
    assert len(queue()) == 2
    before = rows()
    for g, i in zip(ds.__getitems__(b4), b4):
        same(g, src[i], f"sample {i} read ahead")
    assert [a.idx.tolist() for a in queue()] == [b3] and rows() == before + len(b4), (rows(), before)
    direct = s.get_profile("g/x")["direct_rows"]
    for g, i in zip(ds.__getitems__(b3), b3):
        same(g, src[i], f"sample {i} read ahead, after a later one")
    assert not queue() and s.get_profile("g/x")["direct_rows"] > direct
    # What a batch read ahead waited counts from its read, not from its
    # announcement (time passes in between: a read of another node's row).
    ds.prefetch(b1)
    same(ds[33], src[33], "sample 33")
    w0 = s.get_profile("g/x")["wait_s"]
    t = time.perf_counter()
    got = ds.__getitems__(b1)
    took = time.perf_counter() - t
    assert not queue() and s.get_profile("g/x")["wait_s"] - w0 <= took, (s.get_profile("g/x")["wait_s"] - w0, took)
    for g, i in zip(got, b1):
        same(g, src[i], f"sample {i} read ahead")
    # No more than READ_AHEAD announcements kept, the oldest dropped.
    r0 = rows()
    for k in range(dsmod.READ_AHEAD + 2):
        ds.prefetch([20 + k, k])
    assert len(queue()) == dsmod.READ_AHEAD and np.array_equal(queue()[0].idx, [22, 2])
    # A process whose announced batches others read (a DataLoader's, with
    # worker processes) stops reading ahead after 2 READ_AHEAD unused.
    for k in range(3 * dsmod.READ_AHEAD):
        ds.prefetch([20 + k % 20, k % 20])
    kept = [a.idx.tolist() for a in queue()]
    ds.prefetch([39, 9])
    assert [a.idx.tolist() for a in queue()] == kept and len(kept) == dsmod.READ_AHEAD, kept
    for g, i in zip(ds.__getitems__(kept[-1]), kept[-1]):  # those kept are still read ahead
        same(g, src[i], f"sample {i} read ahead")
    # What the dropped ones counted at their start is taken back: the
    # profile counts the one batch read.
    ds._drop_ahead()
    assert rows() == r0 + len(kept[-1]), (rows(), r0, kept[-1])
    # Rows all of this node: nothing sent, nothing kept.
    ds.prefetch([1, 2, 3])
    assert not queue()
    # ScheduledSampler (announcing two steps ahead) and ThreadDataLoader:
    # the batches are the source's, every one read ahead.
    direct = s.get_profile("g/x")["direct_rows"]
    sampler = ScheduledSampler(ds, batch_size=5, seed=2, rank=0, ranks=1)
    n = 0
    want = [sampler.plan(hits=False).batch(k).tolist() for k in range(len(sampler))]
    for b, g in zip(want, ThreadDataLoader(ds, batch_sampler=sampler, collate_fn=Graphs(edges=EDGES))):
        same(g, naive_graphs([src[i] for i in b]), f"batch {b}")
        # Batch n taken from those sent; n + 1 and n + 2 sent.
        sent = [sampler.plan(hits=False).batch(k).tolist() for k in range(n + 1, min(n + 3, 8))]
        assert [a.idx.tolist() for a in queue()] == sent, (n, queue())
        n += 1
    assert n == len(sampler) == 8 and not queue()
    assert s.get_profile("g/x")["direct_rows"] - direct == sum(1 for i in range(40) if i >= 20 and src.nodes[i] > 0)
    # close() lets go of what was sent.
    ds.prefetch(b1)
    assert queue()
    ds._stop_readers()
    assert ds._ahead is None
s.add("done", np.zeros((1, 1), np.uint8))  # rank 1 serves its rows until rank 0 is done
ds.close()
print("ok", r)
"""


def test_read_ahead_of_announced_batches(job):
    outs = run_ranks(AHEAD, ["a", "b"], job, timeout=120)
    assert [o.strip().splitlines()[-1] for o in outs] == ["ok 0", "ok 1"], outs


FAILING = r"""
import sys, pickle, numpy as np, torch, ddstore
from ddstore.torch import DistDataset

class Src(torch.utils.data.Dataset):
    def __init__(self, bad):
        self.bad = bad
    def __len__(self):
        return 20
    def __getitem__(self, i):
        x = torch.arange(i % 5, dtype=torch.float32)
        if i == 15 and self.bad == "dtype":
            x = x.double()
        if i == 15 and self.bad == "object":
            return {"x": x, "o": lambda: i}
        return {"x": x, "o": [i]}

s = ddstore.Store()
enc = lambda d: {"x": d["x"], "o": pickle.dumps(d["o"])}
for chunk in (None, 3):
    try:
        DistDataset(Src(sys.argv[1]), "f", store=s, encode=enc, chunk_size=chunk, ragged=["x"] if chunk else None)
    except Exception as e:
        print("ERR", type(e).__name__, str(e).replace("\n", " "))
    else:
        print("OK")
ok = DistDataset(Src(None), "f", store=s, encode=enc)   # the store and the name still work
assert pickle.loads(ok[15]["o"]) == [15] and ok[14]["x"].shape == (4,)
print("DONE")
s.close()
"""


@pytest.mark.parametrize("bad,what", [
    ("dtype", r"sample at index 15, field 'x': float64 of shape \(0,\) \(1 dimensions\), sample 0 has float32"),
    ("object", r"encode failed on the sample at index 15 \(a dict\): .*ickl"),
])
def test_a_bad_sample_on_one_rank_fails_every_rank(job, bad, what):
    """Rank 1's share holds the bad sample: it raises its own error, rank 0
    one naming rank 1 and the same message, whole and chunked; then both
    load again."""
    import re
    outs = run_ranks(FAILING, ["a", "b"], job, timeout=90, args=(bad,))
    for r, o in enumerate(outs):
        lines = o.splitlines()
        assert len(lines) == 3 and lines[2] == "DONE", outs
        for line in lines[:2]:
            assert line.startswith("ERR"), outs
            assert re.search(what, line), (r, line)
            if r == 0:
                assert "rank 1 could not load its share" in line, line


def test_reader_of_ragged_variables_without_metadata(store):
    """A ragged variable published by add_ragged alone (DDStore's
    convention of name/0, name/1, ...): a field of arrays (length,
    *trailing)."""
    vals = np.arange(21, dtype=np.float32).reshape(7, 3)
    store.add_ragged("rr/0", vals, [4, 0, 3])
    store.add("rr/1", np.arange(3, dtype=np.int64) * 5)
    rd = DistDatasetReader("rr", store=store)
    assert rd.ragged_fields == [0] and len(rd) == 3
    same(rd[0], (torch.from_numpy(vals[:4]), torch.tensor([0])))
    same(rd[1], (torch.zeros(0, 3), torch.tensor([5])))
    (v, off), y = next(iter(ThreadDataLoader(rd, batch_sampler=[[2, 0]])))
    assert torch.equal(v, torch.from_numpy(np.concatenate([vals[4:], vals[:4]]))) and off.tolist() == [0, 3, 7]
    assert y.tolist() == [[10], [0]]

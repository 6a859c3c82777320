"""The torch layer against real agents: DistDataset, DistDatasetReader,
WindowedDataset, row_of and ThreadDataLoader, every sample compared with the
source (or with torch's own DataLoader over it); forked DataLoader workers;
and two ranks on two simulated nodes."""

import threading
import time

import numpy as np
import pytest

torch = pytest.importorskip("torch")
from torch.utils.data import (BatchSampler, ConcatDataset, DataLoader, Dataset, SequentialSampler,  # noqa: E402
                              SubsetRandomSampler, TensorDataset)

import ddstore  # noqa: E402
from conftest import run_ranks  # noqa: E402
from ddstore.torch import DistDataset, DistDatasetReader, ThreadDataLoader, WindowedDataset, row_of  # noqa: E402

N = 37  # not a multiple of any batch size below: short last batches happen


def wait_for(cond, timeout=5.0):
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.005)
    return True


def assert_same(a, b, where="batch"):
    """Same structure, types, dtypes, shapes and values."""
    assert type(a) is type(b), f"{where}: {type(a).__name__} != {type(b).__name__}"
    if isinstance(a, torch.Tensor):
        assert a.dtype == b.dtype and a.shape == b.shape, \
            f"{where}: {a.dtype}{tuple(a.shape)} != {b.dtype}{tuple(b.shape)}"
        assert torch.equal(a, b), f"{where}: values differ"
    elif isinstance(a, np.ndarray):
        assert a.dtype == b.dtype and a.shape == b.shape, f"{where}: {a.dtype}{a.shape} != {b.dtype}{b.shape}"
        np.testing.assert_array_equal(a, b, err_msg=where)
    elif isinstance(a, dict):
        assert list(a) == list(b), f"{where}: keys {list(a)} != {list(b)}"
        for k in a:
            assert_same(a[k], b[k], f"{where}[{k!r}]")
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b), f"{where}: length {len(a)} != {len(b)}"
        for k, (x, y) in enumerate(zip(a, b)):
            assert_same(x, y, f"{where}[{k}]")
    else:
        assert a == b, f"{where}: {a!r} != {b!r}"


def tensor_source(n=N):
    g = torch.Generator().manual_seed(1)
    return TensorDataset(torch.randn(n, 3, 4, generator=g), torch.randint(0, 10**9, (n,), generator=g))


class DictSource(Dataset):
    """Dict samples mixing numpy and torch fields, 0-d to 3-d."""

    def __init__(self, n=N):
        g = torch.Generator().manual_seed(2)
        self.x = np.random.default_rng(2).standard_normal((n, 2))
        self.y = torch.randint(-1000, 1000, (n,), generator=g, dtype=torch.int32)
        self.img = torch.randint(0, 256, (n, 2, 2, 3), generator=g).to(torch.uint8)
        self.mask = torch.rand(n, 4, generator=g) > 0.5

    def __len__(self):
        return len(self.y)

    def __getitem__(self, i):
        return {"x": self.x[i], "y": self.y[i], "img": self.img[i], "mask": self.mask[i]}


def bf16_source(n=N):
    return torch.randn(n, 5, generator=torch.Generator().manual_seed(3)).to(torch.bfloat16)


def check_every_sample(ds, src):
    n = len(src)
    assert len(ds) == n
    for i in range(n):
        assert_same(ds[i], src[i], f"sample {i}")
    order = np.random.default_rng(0).permutation(n).tolist() + [0, 0, n - 1]  # repeats too
    for lo in range(0, len(order), 8):
        batch = order[lo:lo + 8]
        for i, got in zip(batch, ds.__getitems__(batch)):
            assert_same(got, src[i], f"__getitems__ sample {i}")
    assert ds.__getitems__([]) == []


@pytest.fixture
def store(job):
    s = ddstore.Store()
    yield s
    s.close()


# -- DistDataset and DistDatasetReader --------------------------------------------

@pytest.mark.parametrize("chunk_size", [None, 5])
def test_tensor_dataset(store, chunk_size):
    src = tensor_source()
    ds = DistDataset(src, "td", store=store, chunk_size=chunk_size)
    assert store.info("td/0") == (N, 12, 4) and store.info("td/1") == (N, 1, 8)
    check_every_sample(ds, src)
    assert ds.fields == [0, 1]
    assert isinstance(ds[0], tuple) and ds[0][1].shape == ()
    assert ds.__getitems__(torch.tensor([3, 4]))[1][1] == src[4][1]  # a tensor of indices works too
    for bad in (-1, N, 10**6):
        with pytest.raises(IndexError):
            ds[bad]
    with pytest.raises(IndexError, match=rf"indices\[1\] = {N}"):
        ds.__getitems__([0, N, 1])
    with pytest.raises(IndexError):
        ds.__getitems__([2, -1])
    with pytest.raises(TypeError):
        ds[1.5]
    with pytest.raises(TypeError):
        ds.__getitems__([0.5, 1.0])
    ds.free()
    with pytest.raises(KeyError, match="freed"):
        ds[0]


def test_dict_and_bfloat16_datasets_and_readers(store):
    dsrc, bsrc, tsrc = DictSource(), bf16_source(), tensor_source()
    dd = DistDataset(dsrc, "dd", store=store)
    bf = DistDataset(bsrc, "bf", store=store, chunk_size=8)
    DistDataset(tsrc, "td", store=store)
    check_every_sample(dd, dsrc)
    assert isinstance(dd[0]["x"], np.ndarray) and isinstance(dd[0]["y"], torch.Tensor)  # as the source gave them
    check_every_sample(bf, bsrc)
    assert store.describe("bf/0")["dtype"] == "bfloat16" and bf[0].dtype == torch.bfloat16
    # The published structure: the dict's keys, and one JSON row saying everything.
    keys = np.empty(store.info("dd/__fields__")[:2], np.uint8)
    store.get("dd/__fields__", keys)
    assert keys.tobytes() == b'["x", "y", "img", "mask"]'
    # Readers hold no shard and learn the structure from the store alone.
    for name, src in (("dd", dsrc), ("bf", bsrc), ("td", tsrc)):
        check_every_sample(DistDatasetReader(name, store=store), src)
    with DistDatasetReader("td") as own:  # with a store of its own, closed on exit
        check_every_sample(own, tsrc)
    with pytest.raises(KeyError, match="nope"):
        DistDatasetReader("nope", store=store)


def test_reader_of_variables_without_metadata(store):
    """Data published by plain add (DDStore's convention): fields found as
    name/0, name/1, ..., samples a tuple of flat rows."""
    a = np.arange(20 * 6, dtype=np.int32).reshape(20, 2, 3)
    b = np.arange(20, dtype=np.float64) / 4
    store.add("raw/0", a)
    store.add("raw/1", b)
    rd = DistDatasetReader("raw", store=store)
    assert len(rd) == 20 and rd.fields == [0, 1]
    for i in range(20):
        x, y = rd[i]
        assert torch.equal(x, torch.from_numpy(a[i].reshape(6))) and y.tolist() == [b[i]]
    # Dict fields named by name/__fields__ alone.
    store.add("rawd/a", a)
    store.add("rawd/b", b)
    store.add("rawd/__fields__", np.frombuffer(b'["b", "a"]', np.uint8).reshape(1, -1))
    rd = DistDatasetReader("rawd", store=store)
    assert rd.fields == ["b", "a"]
    for i, got in enumerate(rd.__getitems__(range(20))):
        assert list(got) == ["b", "a"] and got["b"].tolist() == [b[i]] and got["a"].tolist() == a[i].ravel().tolist()


def test_dataset_arguments(store):
    src = tensor_source(4)
    # A width of at least the job's size is one group: the store given is it.
    check_every_sample(DistDataset(src, "w2", store=store, ddstore_width=2), src)
    # DDStore's other arguments are accepted.
    ds = DistDataset(src, "w", store=store, ddstore_width=1, method=0, handshake_dir="/nonexistent", device="cpu")
    check_every_sample(ds, src)
    with pytest.raises(ValueError, match="empty"):
        DistDataset(TensorDataset(torch.zeros(0, 3)), "e", store=store)

    class Ragged(Dataset):
        def __init__(self, bad=None):
            self.bad = bad

        def __len__(self):
            return 3

        def __getitem__(self, i):
            if i == 2 and self.bad == "rank":
                return torch.zeros(3, 1)
            if i == 2 and self.bad == "dtype":
                return torch.zeros(3, dtype=torch.float64)
            return torch.zeros(2 + (i == 2))

    # A field whose size varies is stored ragged (test_torch_ragged.py);
    # one that changes rank or dtype is refused, naming the sample.
    r = DistDataset(Ragged(), "r", store=store)
    assert r.ragged_fields == [0] and r[2].shape == (3,) and r[0].shape == (2,)
    with pytest.raises(ValueError, match=r"index 2, field 0: float32 of shape \(3, 1\) \(2 dimensions\), sample 0 "
                                         r"has float32 of shape \(2,\) \(1 dimensions\)"):
        DistDataset(Ragged("rank"), "r2", store=store)
    with pytest.raises(ValueError, match=r"index 2, field 0: float64 .* sample 0 has float32"):
        DistDataset(Ragged("dtype"), "r2", store=store)
    with pytest.raises(ValueError, match=r"index 2, field 0: shape \(3,\), sample 0 has \(2,\).*ragged=\[0\]"):
        DistDataset(Ragged(), "r2", store=store, chunk_size=2)
    r2 = DistDataset(Ragged(), "r2", store=store, chunk_size=2, ragged=[0])  # the name still works
    assert r2[2].shape == (3,) and r2.ragged_fields == [0]


# -- windows and ConcatDataset rows ------------------------------------------------

def naive_window(src, rows, fields):
    samples = [src[r] for r in rows]
    if isinstance(samples[0], dict):
        out = {k: torch.stack([s[k] for s in samples]) if isinstance(samples[0][k], torch.Tensor)
               else np.stack([s[k] for s in samples]) for k in samples[0]}
        if fields is None:
            return out
        return out[fields] if isinstance(fields, str) else {k: out[k] for k in fields}
    if isinstance(samples[0], tuple):
        out = tuple(torch.stack([s[k] for s in samples]) for k in range(len(samples[0])))
        if fields is None:
            return out
        return out[fields] if isinstance(fields, int) else {k: out[k] for k in fields}  # a list: a dict, as DDStore's
    return torch.stack(samples)


WINDOWS = [  # window, stride, dilation, starts, fields
    (4, 1, 1, None, None),
    (3, 2, 3, None, [1]),
    (5, 3, 2, None, 0),
    (2, 1, 1, [0, 35, 7, 7, 20], None),
    (1, 5, 1, None, [1, 0]),
]


@pytest.mark.parametrize("window,stride,dilation,starts,fields", WINDOWS)
def test_windowed_dataset(store, window, stride, dilation, starts, fields):
    src = tensor_source()
    ds = DistDataset(src, "td", store=store)
    span = (window - 1) * dilation
    want_starts = starts if starts is not None else list(range(0, N - span, stride))
    for w in (WindowedDataset(ds, window, stride, dilation, starts, fields),  # one get_batch per field
              WindowedDataset(src, window, stride, dilation, starts, fields)):  # any dataset
        assert len(w) == len(want_starts)
        for i, s in enumerate(want_starts):
            assert_same(w[i], naive_window(src, [s + k * dilation for k in range(window)], fields), f"window {i}")
        idx = list(range(len(w)))[::-1] + [0]
        for i, got in zip(idx, w.__getitems__(idx)):
            assert_same(got, w[i], f"__getitems__ window {i}")
        for k in range(1, len(w) + 1):  # negative windows count from the end
            assert_same(w[-k], w[len(w) - k], f"window {-k}")
        assert_same(w.__getitems__([-1, 0]), [w[len(w) - 1], w[0]])
        for bad in (len(w), -len(w) - 1):
            with pytest.raises(IndexError):
                w[bad]
        with pytest.raises(IndexError):
            w.__getitems__([0, -len(w) - 1])


def test_windowed_dict_dataset_and_edges(store):
    src = DictSource()
    ds = DistDataset(src, "dd", store=store)
    w = WindowedDataset(ds, 3, stride=4, dilation=2, fields=["img", "x"])
    assert len(w) == (N - 5) // 4 + 1
    for i in range(len(w)):
        assert_same(w[i], naive_window(src, [4 * i, 4 * i + 2, 4 * i + 4], ["img", "x"]))
    assert len(WindowedDataset(ds, N + 1)) == 0 and len(WindowedDataset(ds, N)) == 1
    with pytest.raises(IndexError, match=r"starts\[1\] = 35"):
        WindowedDataset(ds, 3, starts=[0, 35])
    with pytest.raises(IndexError, match=r"starts\[0\] = -1"):
        WindowedDataset(ds, 1, starts=[-1])
    with pytest.raises(ValueError):
        WindowedDataset(ds, 0)
    with pytest.raises(KeyError, match="nope"):
        WindowedDataset(ds, 2, fields=["nope"])


def test_row_of():
    a, b, c = tensor_source(5), tensor_source(7), tensor_source(3)
    inner = ConcatDataset([b, c])
    concat = ConcatDataset([a, inner])
    for src in (a, b, c):
        for i in range(len(src)):
            assert_same(concat[row_of(concat, src, i)], src[i])
    assert row_of(concat, b, 0) == 5 and row_of(concat, c, 2) == 14 and row_of(concat, inner, 7) == 12
    with pytest.raises(ValueError, match="not part"):
        row_of(concat, tensor_source(5), 0)
    with pytest.raises(IndexError):
        row_of(concat, a, 5)
    # DDStore's form: the source's position in concat.datasets.
    assert [row_of(concat, 0, i) for i in range(5)] == list(range(5))
    assert row_of(concat, 1, 0) == 5 and row_of(concat, 1, 9) == 14
    for k, i in ((2, 0), (-1, 0), (0, 5), (1, 10), (1, -1)):
        with pytest.raises(IndexError):
            row_of(concat, k, i)


# -- ThreadDataLoader ---------------------------------------------------------------

CONFIGS = {
    "sequential": lambda: dict(batch_size=5),
    "shuffle": lambda: dict(batch_size=4, shuffle=True, drop_last=True, generator=torch.Generator().manual_seed(11)),
    "global-rng": lambda: dict(batch_size=6, shuffle=True),
    "sampler": lambda: dict(batch_size=3, sampler=SubsetRandomSampler(list(range(0, N, 2)),
                                                                      generator=torch.Generator().manual_seed(5))),
    "batch-sampler": lambda: dict(batch_sampler=[[3, 1, 4], [1, 5], [9, 2, 6, 5, 3], [36]]),
    "unbatched": lambda: dict(batch_size=None),
}


def compare_loaders(got_loader, ref_loader, epochs=2, lend=False):
    """The same batches; kept batches stay valid (compared after the whole
    epoch), but with reuse_buffers="lend", whose batches are compared before
    the next is requested."""
    assert len(got_loader) == len(ref_loader)
    for epoch in range(epochs):
        torch.manual_seed(epoch)  # the global generator, for shuffles without one
        ref = list(ref_loader)
        torch.manual_seed(epoch)
        if not lend:
            got = list(got_loader)
            assert len(got) == len(ref)
            for k, (a, b) in enumerate(zip(got, ref)):
                assert_same(a, b, f"epoch {epoch} batch {k}")
            continue
        n = 0
        for k, batch in enumerate(got_loader):
            assert_same(batch, ref[k], f"epoch {epoch} batch {k}")
            n += 1
        assert n == len(ref)


@pytest.mark.parametrize("num_workers", [0, 3])
@pytest.mark.parametrize("kind", ["tuple", "dict", "bfloat16", "window"])
def test_thread_loader_matches_dataloader(store, kind, num_workers):
    if kind == "dict":
        src = DictSource()
    elif kind == "bfloat16":
        src = bf16_source()
    else:
        src = tensor_source()
    ds = DistDataset(src, "v", store=store)
    if kind == "window":
        # N - 3 windows: the configs' indices (up to 36) stay in range
        src, ds = WindowedDataset(src, 2, dilation=2, starts=list(range(N))[:-2] + [0, 1]), \
            WindowedDataset(ds, 2, dilation=2, starts=list(range(N))[:-2] + [0, 1])
    for name, config in CONFIGS.items():
        for reuse in (False, True, "lend"):
            if reuse is True and config().get("batch_size", 1) is None:
                continue  # refused: test_thread_loader_refuses
            got = ThreadDataLoader(ds, num_workers=num_workers, reuse_buffers=reuse, **config())
            compare_loaders(got, DataLoader(src, **config()), lend=reuse == "lend")
    # A plain dataset goes through __getitem__ and default_collate.
    compare_loaders(ThreadDataLoader(src, num_workers=num_workers, **CONFIGS["shuffle"]()),
                    DataLoader(src, **CONFIGS["shuffle"]()))


@pytest.mark.parametrize("num_workers", [0, 2])
def test_thread_loader_buffers_and_custom_collate(store, num_workers):
    src = tensor_source()
    ds = DistDataset(src, "td", store=store)
    # reuse_buffers="lend": at most num_workers * prefetch_factor + 1 distinct batch arrays.
    ptrs = set()
    for x, y in ThreadDataLoader(ds, batch_size=2, drop_last=True, num_workers=num_workers, reuse_buffers="lend"):
        ptrs.add(x.data_ptr())
    assert len(ptrs) <= num_workers * 2 + 1, ptrs
    # ... kept from one epoch to the next (no fresh pages per epoch), also
    # after an epoch left early; two iterations at once never share one.
    loader = ThreadDataLoader(ds, batch_size=2, drop_last=True, num_workers=num_workers, reuse_buffers="lend")
    first = {x.data_ptr() for x, _ in loader}
    for x, _ in loader:
        break
    again = {x.data_ptr() for x, _ in loader}
    assert again <= first, (first, again)
    a, b = iter(loader), iter(loader)
    xa, xb = next(a)[0], next(b)[0]
    assert xa.data_ptr() != xb.data_ptr()
    assert_same(xa, xb)
    a.close(), b.close()
    ptrs = {x.data_ptr() for x, _ in ThreadDataLoader(ds, batch_size=2, num_workers=num_workers,
                                                      collate_copies=True, reuse_buffers="lend")}
    assert len(ptrs) > num_workers * 2 + 1  # copies: every batch its own memory
    # A custom collate_fn sees samples in the source's structure; with
    # collate_copies they outlive the reused buffers.
    for reuse in (True, "lend"):
        kept = list(ThreadDataLoader(ds, batch_size=4, num_workers=num_workers, reuse_buffers=reuse,
                                     collate_copies=True, collate_fn=lambda samples: samples))
        assert_same([s for b in kept for s in b], [src[i] for i in range(N)])


class Probe(Dataset):
    """Counts reads; raises on one index; optionally slow."""

    def __init__(self, n=40, bad=None, delay=0.0):
        self.n, self.bad, self.delay, self.reads = n, bad, delay, 0
        self.lock = threading.Lock()

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        with self.lock:
            self.reads += 1
        if self.delay:  # a dataset slow to read, so batches are in flight when the loader is dropped
            time.sleep(self.delay)
        if i == self.bad:
            raise ValueError(f"boom at {i}")
        return torch.tensor([i])


@pytest.mark.parametrize("num_workers", [0, 3])
def test_thread_loader_worker_exception_surfaces(num_workers):
    base = threading.active_count()
    it = iter(ThreadDataLoader(Probe(bad=13), batch_size=4, num_workers=num_workers))
    for k in range(3):
        assert next(it).tolist() == [[4 * k + j] for j in range(4)]
    with pytest.raises(ValueError, match="boom at 13"):
        next(it)
    with pytest.raises(StopIteration):  # an error ends the iteration
        next(it)
    assert wait_for(lambda: threading.active_count() == base)

    def init(wid):
        raise RuntimeError(f"init of worker {wid} failed")

    with pytest.raises(RuntimeError, match="init of worker"):
        list(ThreadDataLoader(Probe(), num_workers=num_workers, worker_init_fn=init))
    assert wait_for(lambda: threading.active_count() == base)


def test_thread_loader_bounds_batches_in_flight():
    ds = Probe()
    it = iter(ThreadDataLoader(ds, batch_size=1, num_workers=2, prefetch_factor=2))
    assert next(it).tolist() == [[0]]
    assert wait_for(lambda: ds.reads == 1 + 2 * 2), ds.reads  # the one taken, and 4 in flight
    # Once every batch sent to the workers is done, nothing more is read
    # until the next one is taken: no more than 4 were sent.
    shared = it._shared
    assert wait_for(lambda: len(shared.results) == it._sent - it._received and shared.tasks.empty())
    assert it._sent - it._received == 2 * 2 and ds.reads == 5
    assert next(it).tolist() == [[1]]
    assert wait_for(lambda: ds.reads == 6), ds.reads
    it.close()


def test_thread_loader_joins_its_threads():
    base = threading.active_count()
    loader = ThreadDataLoader(Probe(delay=0.002), batch_size=2, num_workers=3)
    it = iter(loader)
    next(it)
    assert threading.active_count() == base + 3
    del it  # dropped early, with batches in flight
    assert wait_for(lambda: threading.active_count() == base), threading.enumerate()
    for _ in loader:
        break
    assert wait_for(lambda: threading.active_count() == base), threading.enumerate()
    with iter(loader) as it:
        next(it)
    assert threading.active_count() == base
    assert len(list(loader)) == len(loader) == 20  # to the end: joined too
    assert wait_for(lambda: threading.active_count() == base), threading.enumerate()
    with pytest.raises(RuntimeError, match="timed out"):
        list(ThreadDataLoader(Probe(delay=0.3), batch_size=1, num_workers=1, timeout=0.05))
    assert wait_for(lambda: threading.active_count() == base), threading.enumerate()
    with pytest.raises(TypeError, match="nonsense"):
        ThreadDataLoader(Probe(), nonsense=1)
    ThreadDataLoader(Probe(), pin_memory=True, persistent_workers=False)  # DataLoader's, ignored


# -- processes -------------------------------------------------------------------------

def test_torch_dataloader_forked_workers(store):
    src = tensor_source(101)
    ds = DistDataset(src, "td", store=store)
    ds.__getitems__([0, 1])  # the parent has live connections the children must not use

    def loader(d):
        return DataLoader(d, batch_size=7, shuffle=True, num_workers=2, multiprocessing_context="fork", timeout=30,
                          generator=torch.Generator().manual_seed(9))

    ref = list(DataLoader(src, batch_size=7, shuffle=True, generator=torch.Generator().manual_seed(9)))
    got = list(loader(ds))
    assert_same(got, ref)
    assert sum(len(b[1]) for b in got) == 101
    check_every_sample(ds, src)  # the parent still reads after its children are gone


TWO_RANKS = r"""
import sys, numpy as np, torch, ddstore
from ddstore.torch import DistDataset, DistDatasetReader, ThreadDataLoader, WindowedDataset

def same(a, b):
    if isinstance(a, (tuple, list)):
        return type(a) is type(b) and len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    if isinstance(a, dict):
        return list(a) == list(b) and all(same(a[k], b[k]) for k in a)
    if isinstance(a, np.ndarray):
        return isinstance(b, np.ndarray) and a.dtype == b.dtype and np.array_equal(a, b)
    return a.dtype == b.dtype and torch.equal(a, b)

chunk = int(sys.argv[1]) or None
N = 41
src = torch.utils.data.TensorDataset(torch.arange(N * 6, dtype=torch.float32).reshape(N, 2, 3),
                                     torch.arange(N, dtype=torch.int64) * 3)
ds = DistDataset(src, "d", chunk_size=chunk)
s = ds.store
r, P = s.rank, s.size
assert s.describe("d/0")["shard_rows"] == [(k + 1) * N // P - k * N // P for k in range(P)]

class Dicts(torch.utils.data.Dataset):
    def __len__(self):
        return 23
    def __getitem__(self, i):
        return {"a": np.arange(i, i + 4, dtype=np.int16), "b": torch.tensor(i * 0.5).to(torch.bfloat16)}

dsrc = Dicts()
dd = DistDataset(dsrc, "dd", store=s, chunk_size=chunk)

rng = np.random.default_rng(r)
for d, source in ((ds, src), (dd, dsrc), (DistDatasetReader("d", store=s), src), (DistDatasetReader("dd"), dsrc)):
    order = rng.permutation(len(source)).tolist()
    for lo in range(0, len(order), 6):
        b = order[lo:lo + 6]
        for i, got in zip(b, d.__getitems__(b)):
            assert same(got, source[i]), (r, i, got, source[i])
    for i in order:
        assert same(d[i], source[i]), (r, i)

w = WindowedDataset(ds, 5, stride=3, dilation=2)
for i in range(len(w)):
    rows = [3 * i + 2 * k for k in range(5)]
    assert same(w[i], tuple(torch.stack([src[j][f] for j in rows]) for f in range(2))), (r, i)

kw = dict(batch_size=6, shuffle=True, generator=torch.Generator().manual_seed(r))
ref = list(torch.utils.data.DataLoader(src, **kw))
kw["generator"] = torch.Generator().manual_seed(r)
got = list(ThreadDataLoader(ds, num_workers=2, **kw))
assert len(got) == len(ref) and all(same(a, b) for a, b in zip(got, ref))
print("rank", r, "remote", s.get_profile("d/0")["remote_rows"], s.get_profile("dd/a")["remote_rows"])
s.close()
"""


@pytest.mark.parametrize("chunk", ["0", "4"])
def test_two_ranks_on_two_nodes(job, chunk):
    outs = run_ranks(TWO_RANKS, ["a", "b"], job, timeout=60, args=(chunk,))
    for o in outs:
        words = o.split()
        assert int(words[3]) > 0 and int(words[4]) > 0, outs  # every rank read rows of the other node


FAILING = r"""
import sys, torch, ddstore
from ddstore.torch import DistDataset

class Src(torch.utils.data.Dataset):
    def __len__(self):
        return 20
    def __getitem__(self, i):
        if i == 15:
            raise RuntimeError("source broke at 15")
        return torch.full((3,), float(i))

try:
    DistDataset(Src(), "f", chunk_size=int(sys.argv[1]) or None)
except Exception as e:
    print("ERR", type(e).__name__, e)
else:
    print("OK")
"""


@pytest.mark.parametrize("chunk", ["0", "3"])
def test_a_failing_source_on_one_rank_fails_every_rank(job, chunk):
    """Rank 1's share holds the bad index: it raises the source's error, and
    rank 0 an error of the collective add instead of waiting forever."""
    outs = run_ranks(FAILING, ["a", "b"], job, timeout=60, args=(chunk,))
    assert outs[1].startswith("ERR RuntimeError source broke at 15"), outs
    assert outs[0].startswith("ERR") and "rank 1" in outs[0], outs

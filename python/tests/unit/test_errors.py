"""Every error the package raises is a ddstore.Error that is also the builtin
a user of PyTorch or DDStore would catch: checked on the errors raised
before any agent is needed (arguments, samples, the loader, the sampler)."""

import os
import sys
import threading
import time

import numpy as np
import pytest

PY = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, PY)

import ddstore  # noqa: E402
from ddstore.sampler import EpochPlan  # noqa: E402

torch = pytest.importorskip("torch")

from ddstore.torch import DistDataset, ScheduledSampler, ThreadDataLoader, WindowedDataset, row_of  # noqa: E402

# (class, the builtins it must also be)
CLASSES = [
    (ddstore.IndexOutOfRange, (IndexError,)),
    (ddstore.GeometryError, (ValueError,)),
    (ddstore.UnknownVariable, (KeyError,)),
    (ddstore.ArgumentError, (ValueError,)),
    (ddstore.ArgumentTypeError, (ValueError, TypeError)),
    (ddstore.UnknownField, (ValueError, KeyError)),
    (ddstore.Unsupported, (ValueError, NotImplementedError)),
    (ddstore.BadDataset, (ValueError,)),
    (ddstore.LoaderTimeout, (TimeoutError, RuntimeError)),
    (ddstore.InternalError, (RuntimeError,)),
]


@pytest.mark.parametrize("cls,builtins", CLASSES, ids=[c.__name__ for c, _ in CLASSES])
def test_classes(cls, builtins):
    e = cls("ddstore: m")
    assert isinstance(e, ddstore.Error)
    for b in builtins:
        assert isinstance(e, b)
    assert str(e) == "ddstore: m"  # not quoted, as KeyError's str would be


def _raises(cls, builtin, f, *args, **kw):
    """f(*args, **kw) raises cls, caught both as ddstore.Error and as
    builtin."""
    with pytest.raises(ddstore.Error) as e:
        f(*args, **kw)
    assert type(e.value) is cls, e.value
    assert isinstance(e.value, builtin)
    return e.value


class _Plain(torch.utils.data.Dataset):
    def __init__(self, items):
        self.items = items

    def __len__(self):
        return len(self.items)

    def __getitem__(self, i):
        return self.items[i]


def test_dataset_arguments():
    t = [torch.zeros(3)] * 4
    _raises(ddstore.ArgumentError, ValueError, DistDataset, [], "d")
    _raises(ddstore.ArgumentError, ValueError, DistDataset, t, "d", chunk_size=0)
    _raises(ddstore.ArgumentError, ValueError, DistDataset, t, "d", capacity=9)
    _raises(ddstore.ArgumentError, ValueError, DistDataset, t, "d", capacity=2)  # no backing files
    _raises(ddstore.ArgumentTypeError, TypeError, DistDataset, [{"text"}], "d")  # str is a field, a set is not
    _raises(ddstore.ArgumentTypeError, TypeError, DistDataset, [{"a": None}], "d")
    _raises(ddstore.ArgumentTypeError, TypeError, DistDataset, t, "d", encode="pickle")
    _raises(ddstore.ArgumentError, ValueError, DistDataset, t, "d", encode=lambda s: 1 / 0)  # on sample 0
    _raises(ddstore.ArgumentTypeError, TypeError, DistDataset, t, "d", ragged=0)
    _raises(ddstore.ArgumentError, ValueError, DistDataset, t, "d", ragged={0: 1})
    _raises(ddstore.ArgumentTypeError, TypeError, DistDataset, [{1: torch.zeros(2)}], "d")
    _raises(ddstore.ArgumentError, ValueError, DistDataset, [{"__meta__": torch.zeros(2)}], "d")
    _raises(ddstore.ArgumentTypeError, TypeError, DistDataset, t, "d", capacity=2, backing=3)
    _raises(ddstore.ArgumentError, ValueError, DistDataset, [(torch.zeros(2), torch.zeros(1))] * 2, "d",
            capacity=1, backing="one.npy")


def test_windows_and_rows():
    ds = _Plain([np.full(2, i) for i in range(10)])
    _raises(ddstore.ArgumentError, ValueError, WindowedDataset, ds, 0)
    e = _raises(ddstore.IndexOutOfRange, IndexError, WindowedDataset, ds, 3, starts=[0, 8])  # as DDStore
    assert "starts[1] = 8" in str(e)
    w = WindowedDataset(ds, 3)
    _raises(ddstore.IndexOutOfRange, IndexError, w.__getitem__, len(w))
    _raises(ddstore.ArgumentTypeError, TypeError, w.__getitems__, [[0, 1]])
    cat = torch.utils.data.ConcatDataset([ds, ds])
    _raises(ddstore.IndexOutOfRange, IndexError, row_of, cat, ds, 10)
    _raises(ddstore.ArgumentError, ValueError, row_of, cat, _Plain([1]), 0)


def test_loader_arguments():
    ds = _Plain(list(range(4)))
    _raises(ddstore.ArgumentTypeError, TypeError, ThreadDataLoader, ds, nonsense=1)
    _raises(ddstore.ArgumentError, ValueError, ThreadDataLoader, ds, num_workers=-1)
    _raises(ddstore.ArgumentError, ValueError, ThreadDataLoader, ds, prefetch_factor=0)
    _raises(ddstore.ArgumentError, ValueError, ThreadDataLoader, ds, shuffle=True, sampler=[0, 1])
    _raises(ddstore.ArgumentTypeError, TypeError, ThreadDataLoader, ds, batch_size=2, reuse_buffers=True)  # no alloc()
    _raises(ddstore.ArgumentError, ValueError, ThreadDataLoader, ds, reuse_buffers=2)


def test_loader_timeout():
    release = threading.Event()

    class Blocked(_Plain):
        def __getitem__(self, i):
            release.wait(60)
            return i

    loader = ThreadDataLoader(Blocked(list(range(4))), batch_size=2, num_workers=1, timeout=0.05)
    it = iter(loader)

    def unblock():
        # The timed-out iterator stops, then joins its worker: let the
        # worker's read return once the stop is on (a poll on a condition).
        deadline = time.monotonic() + 60
        while not it._shared.stopped and time.monotonic() < deadline:
            time.sleep(0.001)
        release.set()

    threading.Thread(target=unblock, daemon=True).start()
    try:
        e = _raises(ddstore.LoaderTimeout, RuntimeError, next, it)
        assert isinstance(e, TimeoutError) and "timed out" in str(e)
    finally:
        release.set()
        it.close()


def test_sampler_and_plan():
    _raises(ddstore.ArgumentError, ValueError, ScheduledSampler, 10, 2, policy="nope")
    _raises(ddstore.ArgumentError, ValueError, ScheduledSampler, 10, 0)
    _raises(ddstore.ArgumentError, ValueError, ScheduledSampler, 10, 2, policy="solar")  # solar needs epochs
    plan = EpochPlan(0, np.arange(4), np.array([2, 2]), None)
    _raises(ddstore.ArgumentError, ValueError, plan.storage_reads, 0)


def test_pyddstore_arguments():
    import pyddstore
    import pyddstore.torch as pt
    _raises(ddstore.ArgumentError, ValueError, pyddstore.PyDDStore, method=7)
    _raises(ddstore.ArgumentError, ValueError, pyddstore.PyDDStore, rank=3, size=2)
    _raises(ddstore.ArgumentTypeError, TypeError, pt._as_stores, object())


def test_wire_name_too_long():
    from ddstore import _wire
    _raises(ddstore.ArgumentError, ValueError, _wire.Encoder().string, "x" * 70000)


def test_records_where_rows_of_one_dtype_are_wanted():
    """A structured array given to add, init or a read is refused naming the
    records (numpy's own parser errors never leak out)."""
    from ddstore.dtypes import as_array, dtype_name
    rec = np.zeros(3, [("a", "i4"), ("b", "f8")])
    nested = np.zeros(3, np.dtype([("a", "i4"), ("c", [("x", "u1"), ("y", "i2")])], align=True))
    for a in (rec, rec.view(np.recarray), nested):
        e = _raises(ddstore.BadBuffer, ValueError, as_array, a)
        assert "structured records" in str(e) and "view(np.uint8)" in str(e)
    _raises(ddstore.BadBuffer, ValueError, dtype_name, "(int32")
    assert dtype_name(np.float32) == "float32" and dtype_name(np.dtype("int8")) == "int8"

"""DDStore's `pyddstore.torch` over ddstore.torch: DistDataset,
DistDatasetReader, WindowedDataset, row_of and ThreadDataLoader under
DDStore's names and arguments.

WindowedDataset, row_of and ThreadDataLoader are ddstore.torch's. DistDataset
and DistDatasetReader are ddstore.torch's with DDStore's signatures and
defaults on top:

- DistDataset(source, name, comm=None, ddstore_width=None, device=None,
  add_device=None, method=None, handshake_dir=None, chunk_size=None,
  encode=None, decode=None, fields=None): encode, decode as ddstore.torch's
  (DDStore's hooks; samples whose fields vary in size are stored ragged),
  fields= keeps those keys or positions (not with encode); comm
  None is MPI.COMM_WORLD under an MPI launcher (see pyddstore), else the
  launcher's environment; method defaults to DDSTORE_METHOD; method 2 meets
  through handshake_dir (default DDSTORE_HANDSHAKE_DIR, else ./ddstore_hs)
  so that readers of another job can join; ddstore_width splits an mpi4py
  communicator (or the launcher's ranks) into groups of that many ranks, each
  holding a full copy in a namespace of its own, reads staying in the group
  (not with method 2, as DDStore). add_device is checked as a torch device
  and the shard stays in the agents' host shared memory. `ds.ddstore` is
  the PyDDStore. shapes, dtypes, read_rows, alloc, release and
  __getitems__(indices, out=) are ddstore.torch's (DDStore's).
- DistDatasetReader(name, handshake_dir=None, n_core=None, device=None,
  decode=None): a
  reader store (split mode: it holds no shard) that waits up to
  DDSTORE_HANDSHAKE_TIMEOUT_S (300 s) for the dataset to be published; n_core
  defaults to DDSTORE_N_CORE and, when known, is checked against the
  publisher's rank count.

Both also take store= (an open PyDDStore or ddstore.Store, which stays the
caller's) and have DDStore's `len()`, `get(i)` and `total_ns`.
"""

import os
import time

import ddstore.torch as _dt
from ddstore import ArgumentError, ArgumentTypeError, Error, Store, UnknownVariable, Unsupported
from ddstore.torch import ThreadDataLoader, WindowedDataset, row_of

from . import PyDDStore, _is_mpi_comm, _world, default_method, handshake_timeout

__all__ = ["DistDataset", "DistDatasetReader", "WindowedDataset", "row_of", "ThreadDataLoader"]


def _handshake_dir(handshake_dir):
    return handshake_dir or os.environ.get("DDSTORE_HANDSHAKE_DIR") or "./ddstore_hs"


def _as_stores(store):
    """(PyDDStore or None, ddstore.Store) of a store the caller passed."""
    if isinstance(store, PyDDStore):
        return store, store.store
    if isinstance(store, Store):
        return None, store
    raise ArgumentTypeError(f"pyddstore: bad argument: store of type {type(store).__name__}: want a PyDDStore or a "
                            f"ddstore.Store")


class _Compat:
    """DDStore's extra dataset methods, and its Python counters: a read of
    the dataset counts in its PyDDStore's py_gets and py_get, as DDStore's
    reads through PyDDStore.get and get_batch do."""

    def __getitem__(self, index):
        t = time.perf_counter()
        try:
            return super().__getitem__(index)
        finally:
            self._count(len(self._schema.fields), t)

    def _ddstore_read(self, idx, keys=None, out=None):
        t = time.perf_counter()
        try:
            return super()._ddstore_read(idx, keys, out)
        finally:
            self._count(len(self._schema.select(keys).fields), t)

    def _count(self, calls, t):
        dds = getattr(self, "ddstore", None)
        if dds is not None:
            dds._count(calls, time.perf_counter() - t)

    @property
    def total_ns(self):
        return len(self)

    def len(self):
        return len(self)

    def get(self, idx):
        return self[idx]


def _group_store(comm, width, method, handshake_dir):
    """The PyDDStore of this rank's group of `width` ranks (DDStore's
    ddstore_width), or of the whole job when width is None or its size."""
    hs = _handshake_dir(handshake_dir) if method == 2 else ""
    if comm is None:
        comm = _world()
    if width is None:
        return PyDDStore(comm, method=method, handshake_dir=hs)
    width = int(width)
    if width < 1:
        raise ArgumentError(f"pyddstore: bad argument: ddstore_width {width}: want >= 1")
    if _is_mpi_comm(comm):
        rank, size = comm.Get_rank(), comm.Get_size()
        if width >= size:
            return PyDDStore(comm, method=method, handshake_dir=hs)
        group = rank // width
        sub = comm.Split(group, rank)
        return PyDDStore(sub, method=method, handshake_dir=hs, exchange_ns=f"w{width}g{group}")
    if comm is not None:
        if not hasattr(comm, "Get_size") or width >= comm.Get_size():
            return PyDDStore(comm, method=method, handshake_dir=hs)
        raise Unsupported(f"pyddstore: ddstore_width {width} needs an mpi4py communicator or the "
                          f"launcher's environment, not a {type(comm).__name__}")
    from ddstore import _env
    e = _env.from_env()
    if width >= e.size:
        return PyDDStore(None, method=method, handshake_dir=hs)
    if method == 2:
        raise Unsupported("pyddstore: method=2 does not support ddstore_width < the job's size")
    group = e.rank // width
    first = group * width
    return PyDDStore(None, method=method, rank=e.rank - first, size=min(width, e.size - first),
                     exchange_ns=f"w{width}g{group}")


class _select:
    """DDStore's fields=: keep those keys (dict samples) or positions
    (tuple and list samples) of every sample."""

    def __init__(self, keys):
        self.keys = keys

    def __call__(self, s):
        if isinstance(s, dict):
            return {k: s[k] for k in self.keys}
        if isinstance(s, (tuple, list)):
            return type(s)(s[k] for k in self.keys) if not hasattr(s, "_fields") else tuple(s[k] for k in self.keys)
        raise ArgumentTypeError(f"pyddstore: bad argument: fields= on a sample of type {type(s).__name__}: want "
                                f"dict, tuple or list samples")


class DistDataset(_Compat, _dt.DistDataset):
    """DDStore's DistDataset (see the module docstring); construction is
    collective over comm (or over the group of ddstore_width ranks)."""

    def __init__(self, source, name, comm=None, ddstore_width=None, device=None, add_device=None, method=None,
                 handshake_dir=None, chunk_size=None, encode=None, decode=None, fields=None, store=None):
        if fields is not None:
            if encode is not None:
                raise ArgumentError("pyddstore: bad argument: fields= cannot be combined with encode= (select the "
                                    "fields in encode)")
            encode = _select(list(fields))
        if add_device is not None:
            try:
                import torch
                torch.device(add_device)
            except (RuntimeError, TypeError) as e:
                raise ArgumentError(f"pyddstore: bad argument: add_device {add_device!r}: want a torch device "
                                    f"({e})") from None
        method = default_method() if method is None else int(method)
        if store is None:
            dds = _group_store(comm, ddstore_width, method, handshake_dir)
            owned = True
        else:
            dds, _ = _as_stores(store)
            owned = False
        st = dds.store if dds is not None else store
        try:
            super().__init__(source, name, store=st, device=device, chunk_size=chunk_size, encode=encode,
                             decode=decode)
        except BaseException:
            if owned:
                dds.store.close()
            raise
        self._owns_store = owned
        self.ddstore, self.method, self.add_device = dds, method, add_device
        self.comm = comm
        self.ddstore_width = ddstore_width if ddstore_width is not None else st.size


class DistDatasetReader(_Compat, _dt.DistDatasetReader):
    """DDStore's DistDatasetReader: reads a dataset published by a
    DistDataset of another job (or of this one) without holding any shard."""

    def __init__(self, name, handshake_dir=None, n_core=None, device=None, decode=None, store=None, comm=None,
                 timeout=None):
        if n_core is None:
            n_core = int(os.environ.get("DDSTORE_N_CORE", "0") or 0)
        hs = handshake_dir or os.environ.get("DDSTORE_HANDSHAKE_DIR") or ""
        if not hs and default_method() == 2:
            hs = _handshake_dir(None)
        owned = store is None
        if owned:
            dds = PyDDStore(comm, method=2 if hs else default_method(), handshake_dir=hs, n_core=n_core, reader=True)
        else:
            dds, _ = _as_stores(store)
        st = dds.store if dds is not None else store
        try:
            self._wait(st, name, n_core, handshake_timeout() if timeout is None else float(timeout))
            super().__init__(name, store=st, device=device, decode=decode)
        except BaseException:
            if owned:
                st.close()
            raise
        self._owns_store = owned
        self.ddstore, self.n_core, self.handshake_dir = dds, n_core, hs

    @staticmethod
    def _wait(st, name, n_core, timeout):
        """Until `{name}/__meta__` (published last by DistDataset) exists;
        data published otherwise (`{name}/0`, ...) is taken when the time is
        up."""
        meta = f"{name}/{_dt._META}"
        w = PyDDStore._wrap(st, 0, "", n_core)
        try:
            w.join(meta, timeout)
        except Error as e:
            if not isinstance(e, TimeoutError):
                raise
            try:
                st.info(f"{name}/0")
            except UnknownVariable:
                raise e from None

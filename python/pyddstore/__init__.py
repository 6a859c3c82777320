"""pyddstore: ORNL DDStore's Python API on top of ddstore, so that code written
for DDStore runs unchanged.

    from mpi4py import MPI                   # optional: see "Without MPI"
    import numpy as np, pyddstore
    dds = pyddstore.PyDDStore(MPI.COMM_WORLD)
    dds.add("x", np.arange(30, dtype=np.float32).reshape(10, 3))   # collective
    out = np.empty((2, 3), np.float32)
    dds.get_batch("x", out, [7, 2])
    dds.free()

A PyDDStore is a thin wrapper of a ddstore.Store (its `store` attribute): the
rows live in shared memory held by one ddstore agent per node; rows of this
node are copied straight from that memory, rows of other nodes are fetched by
the agents over TCP.

How DDStore's choices map onto ddstore
---------------------------------------

=============================  ================================================
DDStore                        here
=============================  ================================================
method 0 (MPI RMA windows)     the agents: rows of other nodes travel between
method 1 (libfabric fi_read)   agents (over TCP, or MPI or libfabric between
                               agents started with --transport); the method
                               is recorded (`.method`) and changes nothing
                               else. DDStore's method 0 itself, MPI windows
                               read by the trainer processes, is
                               ddstore.Store(comm, method="mpi").
method 2 + handshake_dir,      file handshake: agents meet through records
core member (a comm)           in handshake_dir, which also lets readers of
                               another job find them (split mode); the ranks
                               of the comm hold shards. The directory decides
                               the namespace (a name the first store to come
                               writes in it, ddstore.namespace), so that jobs
                               that share only the directory meet, whatever
                               DDSTORE_NAMESPACE, Slurm or torchrun say; an
                               agent already running in that namespace with
                               another directory is an error. A handshake_dir
                               given with methods 0 and 1 (or
                               DDSTORE_HANDSHAKE_DIR) is used the same way; it
                               takes precedence over DDSTORE_RENDEZVOUS.
method 2 + handshake_dir,      a reader store (ddstore.Store(reader=True)): it
comm_or_none=None, n_core > 0  holds no shard and reads what the core job
("extra member")               published; join(name) waits for a variable.
comm_or_none=None              MPI.COMM_WORLD, as DDStore, when mpi4py is
                               available (HAVE_MPI) and the process was
                               started by an MPI launcher (Open MPI, MPICH,
                               PMIx/Slurm) or MPI is already initialized;
                               otherwise rank and size come from the
                               arguments or the launcher's environment
                               (torchrun, `python -m ddstore.launch`, Slurm,
                               Open MPI, MPICH). DDStore refuses None for
                               methods 0 and 1.
comm_or_none=FileComm(...)     pyddstore.FileComm is ddstore.FileComm: rank
                               and size given, agents meet in its directory.
rank=, size=                   explicit rank and size (no communicator).
exchange_ns=                   the store lives in namespace `NS.exchange_ns`
                               (NS: the handshake directory's, else
                               DDSTORE_NAMESPACE, the Slurm job, the
                               torchrun run, or "default"; namespace= sets
                               it), so that several
                               stores (sub-groups) never collide. A
                               sub-communicator of MPI.COMM_WORLD without
                               exchange_ns gets `NS.g<world rank of its rank
                               0>` by itself. With DDSTORE_RENDEZVOUS=host:port
                               such a namespace's agents meet at host:<a port
                               derived from the namespace>.
n_core                         readers only: the core job's rank count,
                               checked by join() when given.
nic_map, DDSTORE_NIC_MAP,      accepted, not needed: no fabric interface to
FABRIC_IFACE, DDSTORE_FABRIC   pick (peers talk TCP; the agent binds its
                               address, see `ddstore agent -h`).
DDSTORE_MAX_READ_BYTES         accepted, not needed: reads are split by the
                               client (2^20 rows a request).
DDSTORE_METHOD                 the default method (also of pyddstore.torch).
DDSTORE_PROFILE                accepted: get_profile() always counts.
DDSTORE_HANDSHAKE_DIR          the default handshake_dir (the agents read it
                               too).
DDSTORE_HANDSHAKE_TIMEOUT_S    how long join() waits for a variable to be
                               published (default 300 s).
DDSTORE_BATCH_GET              accepted: batched reads are always one request
                               per node.
DDSTORE_N_CORE                 the default n_core of a reader (method 2,
                               comm_or_none=None, no rank given) and of
                               pyddstore.torch.DistDatasetReader.
DDSTORE_MPI=0                  never use mpi4py (HAVE_MPI is False).
=============================  ================================================

On several nodes with no handshake directory and no DDSTORE_RENDEZVOUS, a
store made from a communicator (mpi4py, torch.distributed) has rank 0 make a
rendezvous address and a secret, and the communicator carries them to every
rank's agent (ddstore/_bootstrap.py). A store's variables are its own, as in
DDStore: a store made from a communicator names them with a token rank 0
draws (scope="store"), so stores side by side may use the same names; they
go when the store is freed or collected, or its processes are gone.
scope="namespace" (the default for method 2, readers, and stores without a
communicator) makes them the namespace's, for split mode and restarts.

Differences a DDStore user may notice, all on the safe side: reading into a
buffer of another dtype of the same size raises ValueError (DDStore silently
reinterprets the bytes; a variable made by init() without dtype= has no dtype
and is read into any buffer of its item size); get() may cross shard
boundaries (DDStore raises "Invalid count on target"); update() checks its
bounds; get_batch() is never collective; epoch_begin/epoch_end are fences
with every method (DDStore's are with method 0 only), and each call is one,
so calling begin twice is not an error; errors are
ddstore exceptions that derive from IndexError (indices), ValueError (shapes,
dtypes), KeyError (unknown variables), TimeoutError and ConnectionError
(peers), and the store keeps working after one.
"""

import importlib.util
import os
import secrets
import sys
import threading
import time
import zlib

import numpy as np

import ddstore as _dd
from ddstore import _agent, _env
from ddstore.comm import FileComm
from ddstore.dtypes import as_array

__all__ = ["PyDDStore", "PyDDstoreVarinfo", "FileComm", "HAVE_MPI", "mpi_available"]

_PY_LOCK = threading.Lock()
_MPI_LAUNCHER_VARS = ("OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK", "MPI_LOCALNRANKS")


def mpi_available():
    """mpi4py is importable and DDSTORE_MPI is not "0" (read now; HAVE_MPI
    is its value at import)."""
    if os.environ.get("DDSTORE_MPI", "").strip() == "0":
        return False
    try:
        return importlib.util.find_spec("mpi4py") is not None
    except (ImportError, ValueError):
        return False


HAVE_MPI = mpi_available()


def _world():
    """MPI.COMM_WORLD when comm_or_none=None should mean it, else None: MPI
    is available, and this process was started by an MPI launcher or has
    initialized MPI already. (A process started otherwise would get a
    singleton COMM_WORLD of size 1, which is never what a job of several
    processes means.)"""
    if not mpi_available():
        return None
    mod = sys.modules.get("mpi4py.MPI")
    started = any(os.environ.get(k) for k in _MPI_LAUNCHER_VARS)
    if not started and mod is not None:
        try:
            started = mod.Is_initialized() and not mod.Is_finalized()
        except Exception:
            started = False
    if not started:
        return None
    from mpi4py import MPI
    return MPI.COMM_WORLD


def _is_mpi_comm(comm):
    return comm is not None and hasattr(comm, "Split_type") and hasattr(comm, "bcast")


def _env_float(name, default):
    v = os.environ.get(name, "").strip()
    if not v:
        return default
    try:
        return float(v)
    except ValueError:
        raise _dd.ArgumentError(f"pyddstore: bad environment: {name}={v!r}: want a number") from None


def _env_int(name, default):
    v = os.environ.get(name, "").strip()
    if not v:
        return default
    try:
        return int(v)
    except ValueError:
        raise _dd.ArgumentError(f"pyddstore: bad environment: {name}={v!r}: want an integer") from None


def default_method():
    """DDSTORE_METHOD, else 0."""
    return _env_int("DDSTORE_METHOD", 0)


def handshake_timeout():
    """DDSTORE_HANDSHAKE_TIMEOUT_S, else 300 s."""
    return _env_float("DDSTORE_HANDSHAKE_TIMEOUT_S", 300.0)


def _group_rendezvous(namespace):
    """For a namespace other than the job's: DDSTORE_RENDEZVOUS's host with a
    port derived from the namespace, so that each group's agents meet at
    their own address (agents at one address form one job, whatever their
    namespace); None without DDSTORE_RENDEZVOUS."""
    rv = os.environ.get("DDSTORE_RENDEZVOUS", "").strip()
    if not rv or ":" not in rv:
        return None
    host, _, port = rv.rpartition(":")
    try:
        base = int(port)
    except ValueError:
        return None
    p = 20000 + zlib.crc32(namespace.encode()) % 10000
    if p == base:
        p += 1
    return f"{host}:{p}"


# The handshake directory's namespace, written by the first store that meets
# there: "hs-" and 12 hex digits.
_NS_RECORD = "ddstore.namespace"


def dir_namespace(hs, timeout=10.0):
    """The namespace of the agents that meet in handshake directory hs: read
    from its record, which the first store to come writes (O_EXCL: one
    wins), so that every job given the directory, and only those, meets the
    same agents whatever DDSTORE_NAMESPACE, Slurm or torchrun say."""
    os.makedirs(hs, mode=0o700, exist_ok=True)
    path = os.path.join(hs, _NS_RECORD)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        fd = None
    if fd is not None:
        try:
            os.write(fd, ("hs-" + secrets.token_hex(6) + "\n").encode())
            os.fsync(fd)
        finally:
            os.close(fd)
    deadline, wait = time.monotonic() + timeout, 0.002
    while True:  # the winner may be writing it still
        with open(path) as f:
            name = f.read()
        if name.endswith("\n"):
            name = name.strip()
            _agent.check_name("namespace", name)
            return name
        if time.monotonic() > deadline:
            raise _dd.ArgumentError(f"pyddstore: bad argument: handshake directory {hs!r}: its namespace record "
                                    f"{path} holds {name!r}, want a namespace and a newline")
        time.sleep(wait)
        wait = min(2 * wait, 0.05)


class PyDDstoreVarinfo:
    """DDStore's variable info record: name, disp, itemsize."""

    def __init__(self, name="", disp=0, itemsize=0):
        self.name, self.disp, self.itemsize = name, disp, itemsize

    def __repr__(self):
        return f"PyDDstoreVarinfo(name={self.name!r}, disp={self.disp}, itemsize={self.itemsize})"


class PyDDStore:
    """DDStore's PyDDStore over a ddstore.Store (see the module docstring for
    how each argument maps).

    comm_or_none: an mpi4py communicator, a FileComm, a torch.distributed
    group, or None. method: 0, 1 or 2 (None: DDSTORE_METHOD, else 0).
    handshake_dir: where agents meet (method 2; default DDSTORE_HANDSHAKE_DIR).
    n_core: > 0 with comm_or_none=None makes a reader (split mode). rank,
    size: explicit, without a communicator. exchange_ns: a namespace of its
    own for this store (sub-groups). reader=True makes a reader whatever
    the other arguments say. Other keyword arguments go to ddstore.Store
    (e.g. namespace=, agent_wait=, timeout=).
    """

    def __init__(self, comm_or_none=None, method=None, handshake_dir="", n_core=0, nic_map=None, rank=None, size=0,
                 exchange_ns="", **store_kw):
        method = default_method() if method is None else int(method)
        if method not in (0, 1, 2):
            raise _dd.ArgumentError(f"pyddstore: bad argument: method {method}: want 0 (MPI), 1 (libfabric) or 2 (file "
                                    f"handshake)")
        hs = os.fspath(handshake_dir) if handshake_dir else os.environ.get("DDSTORE_HANDSHAKE_DIR", "")
        if method == 2 and not hs:
            raise _dd.ArgumentError(f"pyddstore: bad argument: method=2 requires handshake_dir (got handshake_dir="
                                    f"{handshake_dir!r}; DDSTORE_HANDSHAKE_DIR is not set)")
        n_core = int(n_core or 0)
        if n_core < 0:
            raise _dd.ArgumentError(f"pyddstore: bad argument: n_core {n_core}: want >= 0")
        explicit = rank is not None or (size or 0) > 0
        if explicit and (rank is None or not size or not 0 <= rank < size):
            raise _dd.ArgumentError(f"pyddstore: bad argument: rank {rank} of size {size}: want both, 0 <= rank < size")
        if comm_or_none is None and not explicit and method == 2 and n_core == 0:
            n_core = _env_int("DDSTORE_N_CORE", 0)
        reader = store_kw.pop("reader", None)
        if reader is None:
            reader = comm_or_none is None and not explicit and n_core > 0
        reader = bool(reader)
        self.method, self.handshake_dir, self.n_core, self.nic_map = method, hs, n_core, nic_map
        self.exchange_ns = exchange_ns or ""

        comm = comm_or_none
        if comm is None and not explicit and not reader:
            comm = _world()
        # With a handshake directory, the directory decides the namespace:
        # two jobs that share only the directory (DDStore's split mode)
        # meet there whatever their own namespaces.
        base = (store_kw.pop("namespace", None) or getattr(comm, "ns", None) or (dir_namespace(hs) if hs else None)
                or _agent.default_namespace())
        suffix = self.exchange_ns
        if not suffix and _is_mpi_comm(comm):
            suffix = _subgroup_tag(comm)
        namespace = f"{base}.{suffix}" if suffix else base

        agent_args = list(store_kw.pop("agent_args", ()))
        # Where agents meet. A directory decides alone, even where
        # DDSTORE_RENDEZVOUS is set: an agent given both may become a second
        # coordinator (the rendezvous one, and the one rank 0 says hello to).
        if hs:
            agent_args += ["--handshake-dir", os.path.abspath(hs), "--rendezvous="]
        elif getattr(comm, "dir", None) is not None:  # a FileComm: ddstore.Store passes its directory
            agent_args += ["--rendezvous="]
        elif namespace != _agent.default_namespace():
            rv = _group_rendezvous(namespace)
            if rv:
                agent_args += ["--rendezvous", rv]

        ident = {}
        if explicit:
            ident = {"rank": rank, "size": size}
            try:  # local rank and size from the launcher, when it tells the same story
                e = _env.from_env()
                if (e.rank, e.size) == (rank, size) and e.local_rank >= 0:
                    ident.update(local_rank=e.local_rank, local_size=e.local_size)
            except _dd.Error:
                pass
        self._recv = {}
        self._py = {"py_gets": 0, "py_get": 0.0}
        # A namespace of the store's own (a sub-group's): its ranks are that
        # namespace's whole job, and its rank 0's agent coordinates there.
        if suffix and not reader:
            store_kw.setdefault("own_namespace", True)
        # Method 2 is DDStore's split mode: what the core job adds, readers
        # of another job join by name, so its variables are the namespace's.
        if method == 2 and not reader:
            store_kw.setdefault("scope", "namespace")
        self.store = _dd.Store(comm, namespace=namespace, agent_args=tuple(agent_args), reader=reader,
                               **ident, **store_kw)
        self.comm = comm

    @classmethod
    def _wrap(cls, store, method, handshake_dir, n_core, exchange_ns=""):
        self = cls.__new__(cls)
        self.method, self.handshake_dir, self.n_core, self.nic_map = method, handshake_dir, n_core, None
        self.exchange_ns, self.comm = exchange_ns, None
        self._recv = {}
        self._py = {"py_gets": 0, "py_get": 0.0}
        self.store = store
        return self

    # -- who ------------------------------------------------------------------

    @property
    def rank(self):
        return self.store.rank

    @property
    def size(self):
        return self.store.size

    @property
    def namespace(self):
        return self.store.namespace

    @property
    def reader(self):
        return self.store.reader

    def fork_reader(self):
        """A reader store of the same namespace and node (no shard: it only
        reads), e.g. for a DataLoader worker or a thread of its own. Close it
        when done; the agents keep serving this store."""
        s = self.store
        args = s._agent_args
        rd = _dd.Store(namespace=s.namespace, rank=s.rank, size=s.size, local_rank=s.local_rank,
                       local_size=s.local_size, node=s.node, socket_path=s.socket_path, agent_args=args, reader=True,
                       scope=s.scope)
        return PyDDStore._wrap(rd, self.method, self.handshake_dir, self.n_core, self.exchange_ns)

    # -- creating --------------------------------------------------------------

    def add(self, name, arr):
        """Collective: this rank's rows (arr.shape[0] rows of arr[0].size
        items) as variable `name`."""
        self.store.add(name, arr)

    def init(self, name, nrows, disp, itemsize=1, dtype=None):
        """Collective: a zero-filled shard of nrows rows of disp items of
        itemsize bytes (dtype= gives the variable a type, checked on reads)."""
        self.store.init(name, int(nrows), int(disp), int(itemsize), dtype=dtype)

    def update(self, name, arr, offset=0):
        """Overwrite rows of this rank's shard from local row `offset` on."""
        self.store.update(name, arr, int(offset))

    # -- reading ----------------------------------------------------------------

    def get(self, name, arr, start=0):
        """arr.shape[0] consecutive rows from global row `start` into arr."""
        t = time.perf_counter()
        try:
            self.store.get(name, arr, start)
        finally:
            self._count(1, time.perf_counter() - t)

    def _count(self, calls, seconds):
        """DDStore's Python counters of the store (py_gets, py_get): its
        reads, and those of pyddstore.torch's datasets over it, from any
        thread."""
        with _PY_LOCK:
            p = self._py
            p["py_gets"] += calls
            p["py_get"] += seconds

    def get_batch(self, name, arr, indices):
        """Rows indices[i] into arr[i] (any order, repeats); len(indices)
        must equal arr.shape[0]. Not collective."""
        a, _ = as_array(arr)
        idx = np.asarray(indices)
        if idx.ndim == 1 and a.ndim and a.shape[0] != idx.shape[0]:
            raise _dd.BadBuffer(f"pyddstore: bad buffer: arr has {a.shape[0]} rows but {idx.shape[0]} indices were "
                                f"given")
        t = time.perf_counter()
        try:
            self.store.get_batch(name, arr, idx)
        finally:
            self._count(1, time.perf_counter() - t)

    def register_recv(self, name, arr):
        """Accepted for DDStore code: every buffer works as a destination
        (store.alloc_recv gives one the agent writes into directly)."""
        self.store.register_recv(name, arr)
        a, _ = as_array(arr)
        self._recv[(name, a.__array_interface__["data"][0])] = arr

    def unregister_recv(self, name, arr):
        """Undo register_recv(name, arr); for a buffer never registered, a
        no-op with method 0 and ValueError otherwise, as DDStore."""
        a, _ = as_array(arr)
        key = (name, a.__array_interface__["data"][0])
        if key not in self._recv:
            if self.method == 0:
                return
            raise _dd.ArgumentError(f"pyddstore: bad argument: buffer is not registered for {name!r}")
        del self._recv[key]

    def join(self, name, timeout=None):
        """Wait until variable `name` is published (by this job or, in split
        mode, by the core job) and attach to it: up to timeout seconds
        (default DDSTORE_HANDSHAKE_TIMEOUT_S, 300). Raises TimeoutError."""
        timeout = handshake_timeout() if timeout is None else float(timeout)
        deadline, wait = time.monotonic() + timeout, 0.005
        while True:
            try:
                d = self.store.describe(name)
                break
            except _dd.UnknownVariable:
                if time.monotonic() >= deadline:
                    raise _dd.Timeout(f"pyddstore: timed out: variable {name!r} was not published in namespace "
                                      f"{self.namespace!r} within {timeout:g}s (DDSTORE_HANDSHAKE_TIMEOUT_S)") from None
                time.sleep(min(wait, max(0.0, deadline - time.monotonic())))
                wait = min(2 * wait, 0.1)
        if self.n_core and len(d["shard_rows"]) != self.n_core:
            raise _dd.ArgumentError(f"pyddstore: bad argument: variable {name!r} has {len(d['shard_rows'])} shards "
                                    f"(core ranks), n_core is {self.n_core}")

    # -- describing ---------------------------------------------------------------

    def info(self, name):
        """(total rows, disp, itemsize)."""
        return self.store.info(name)

    def query(self, name):
        """DDStore's query(): a PyDDstoreVarinfo."""
        _, disp, itemsize = self.store.info(name)
        return PyDDstoreVarinfo(name, disp, itemsize)

    def describe(self, name):
        return self.store.describe(name)

    def get_profile(self, name):
        """DDStore's counters (calls, rows, lock_wait, mr, mr_miss, read, cq,
        py_gets, py_get, py_sync) and ddstore's (bytes, local_rows,
        remote_rows, remote_calls, wait_s). read is the time spent waiting
        for rows of other nodes; the MR, CQ and lock counters of libfabric
        and py_sync (no GPU destination) have no counterpart and stay 0.
        py_gets and py_get (seconds) are the store's, for its get and
        get_batch calls and the reads of pyddstore.torch's datasets over
        it (a field's read a call, as DDStore's get_batch per field).
        Always counted (DDSTORE_PROFILE is not needed)."""
        p = self.store.get_profile(name)
        with _PY_LOCK:
            py = dict(self._py)
        out = {"calls": p["calls"], "lock_wait": 0.0, "mr": 0.0, "mr_miss": 0, "read": p["wait_s"], "cq": 0.0,
               "rows": p["rows"], **py, "py_sync": 0.0}
        out.update({k: v for k, v in p.items() if k not in out})
        return out

    def epoch_begin(self):
        """Collective: a fence of the store's communicator (or group), as
        DDStore's MPI_Win_fence: every rank's update() before it is read by
        every rank after it. (ddstore.Store.fence; a reader takes part in
        none.)"""
        self.store.fence()

    def epoch_end(self):
        """Collective: the same fence, so that no rank updates rows before
        every rank has finished its reads."""
        self.store.fence()

    # -- ending ---------------------------------------------------------------------

    def free(self, name=None):
        """Release every variable (or one): idempotent, and the store stays
        usable (variables may be added again)."""
        self._recv.clear()
        self.store.free(name)

    def close(self):
        """free() and close the connection to the agent."""
        try:
            if not self.store._closed:
                self.free()
        finally:
            self.store.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __repr__(self):
        kind = "reader" if self.reader else f"rank {self.rank} of {self.size}"
        return f"PyDDStore({kind}, method={self.method}, namespace={self.namespace!r})"


def _subgroup_tag(comm):
    """"g<world rank of the comm's rank 0>" for a proper sub-communicator of
    MPI.COMM_WORLD, "" otherwise (collective over comm)."""
    from mpi4py import MPI
    world = MPI.COMM_WORLD
    if comm.Get_size() == world.Get_size():
        return ""
    return "g%d" % comm.bcast(world.Get_rank(), root=0)

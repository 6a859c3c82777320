"""The Python client of ddstore: one Store per rank, attached to its node's
agent. Rows of the node are gathered straight from the mapped shared memory;
rows of other nodes cost one request per batch to the agent, which writes them
into a shared-memory receive region. No Go runs inside Python, so the store
survives fork(): a forked child reconnects on first use.

The Store keeps the API; its parts live beside it: _lanes (the connections
to the agent, fork), _recv (receive buffers), _onesided (MPI windows and
gets), _prefetch (the background Prefetch sender), _vars (a variable as this
rank sees it, row copies)."""

import functools
import json
import os
import re
import secrets
from bisect import bisect_right
import stat
import time

import numpy as np

from . import _agent, _auth, _bootstrap, _direct, _fence, _lanes, _onesided, _prefetch, _ragged, _wire
from ._errors import (ArgumentError, BadBuffer, ClosedError, Error, FreedVariable, GeometryError, IndexOutOfRange, ProtocolError,
                      UnknownVariable, VariableExists)
from ._recv import RecvBuffers, close_regions
from ._shm import Segment
from ._vars import MAX_ROWS_PER_READ, StaleTable, Var, below, check_rows, copy_rows, count, distinct, row_indices
from .dtypes import as_array, as_destination, dtype_name, itemsize as dtype_itemsize

# Tries of one read whose variable turns out dropped (_reading): it would
# have to be freed and added again between each of them.
_STALE_TRIES = 3
_I64 = np.dtype(np.int64)
_U64 = np.dtype(np.uint64)
_getpid = os.getpid
_ndarray = np.ndarray


class Store:
    """One rank's handle on the job's variables (DDStore's PyDDStore API).

    comm: an mpi4py communicator, a torch.distributed process group, a
    FileComm, or None (rank and size from torchrun, Slurm, Open MPI or MPICH).
    A communicator split from the job's (mpi4py, torch) is a replica group,
    as in DDStore: its ranks share whole copies of the variables among
    themselves, apart from the other groups'. width=w does the same without
    a communicator: ranks [k*w, (k+1)*w) form group k (the last may be
    smaller); rank and size are then the group's.

    method: how rows of other nodes are read. "agent" (the default): through
    this node's agent, which fetches them from the owners' agents. "mpi"
    (DDStore's method 0), with an mpi4py communicator: every variable this
    store creates is also exposed as an MPI window of the ranks' shards, and
    this process reads other nodes' rows itself with passive-target
    one-sided gets (a get per row, one flush per batch), the owners taking
    no part. add, init, free and close are then collective over comm
    (MPI_Win_create, MPI_Win_free; with width, over all its groups at once),
    as in DDStore. Rows of a backing file, and reads from a
    forked child (a DataLoader worker), still go through the agent. Needs an
    MPI whose windows reach other processes' memory by themselves: Open MPI
    over shared memory with single-copy (CMA) or RDMA between nodes.

    scope: whose variables this store's are. "store" (the default with an
    mpi4py communicator or a torch.distributed group): the store's own, as
    a DDStore object's; rank 0 draws a token the communicator carries, so
    stores side by side may use the same names, and they go when the store
    is freed, closed or collected, or when its processes are gone.
    "namespace" (the default otherwise, and for readers): the namespace's,
    found by name by readers of other jobs and restarted jobs, until freed.
    Another string is a store's token (a reader of that store's variables).

    With ranks on several nodes and neither a handshake directory nor a
    rendezvous address, a communicator carries a rendezvous and a secret
    rank 0 makes (_bootstrap). own_namespace=True says the communicator is
    the whole job of the store's namespace (a sub-communicator given a
    namespace of its own): its rank 0's agent coordinates there.
    """

    def __init__(self, comm=None, namespace=None, *, rank=None, size=None, local_rank=None, local_size=None,
                 node=None, socket_path=None, run_dir=None, spawn=True, agent_args=(), binary=None,
                 timeout=120.0, publish_timeout=300.0, agent_wait=60.0, max_lanes=16, reader=False, width=None,
                 wait_published=None, method=None, own_namespace=False, scope=None, direct=True):
        from .comm import identity, world_of
        timeout, publish_timeout = _seconds("timeout", timeout), _seconds("publish_timeout", publish_timeout)
        ident = identity(comm, rank, size, local_rank, local_size, node)
        self.rank, self.size, self.local_rank, self.local_size, self.node = (
            ident.rank, ident.size, ident.local_rank, ident.local_size, ident.node)
        # The replica group: the first world rank of this rank's group, or
        # None when the job is one group. The agents know a group's copy of
        # a variable by the name plus "@r<first>".
        self.group = None
        self._world_rank, self._world_size = self.rank, self.size
        world = world_of(comm, self.rank, self.size)
        if world is not None:
            self._world_rank, self._world_size, self.group = world
        if width is not None:
            if isinstance(width, bool) or not isinstance(width, int) or width < 1:
                raise ArgumentError(f"ddstore: bad argument: width {width!r}: want an int >= 1 (ranks per replica group)")
            if self.group is not None:
                raise ArgumentError("ddstore: bad argument: width with a split communicator: the communicator is "
                                    "the group already")
            if width < self.size:
                first = self.rank // width * width
                self.group, self.rank, self.size = first, self.rank - first, min(width, self.size - first)
        # A reader (split mode: a job reading data another job published)
        # holds no shard: it says rank -1 to the agent and cannot add.
        self.reader = bool(reader)
        self.method, self._mpi = _onesided.check_method(method, comm, self.reader), None
        # The fence's communicator: the group's, with an mpi4py one (else
        # the fence is a round on the coordinator agent).
        self._fence_comm = None
        if hasattr(comm, "Split_type") and not self.reader:
            self._fence_comm = _fence.group_comm(comm, self.group if width is not None else None, self._world_rank)
        self._fence_own_comm = self._fence_comm is not None and self._fence_comm is not comm
        if self.method == "mpi":
            self._mpi = _onesided.Windows(comm, self.group if width is not None and self.group is not None else 0)
        # How long a first read of a variable not published yet waits for it
        # (split mode: the reading job may start first); by default, for a
        # reader, DDStore's DDSTORE_HANDSHAKE_TIMEOUT_S, else none.
        if wait_published is None:
            wait_published = float(os.environ.get("DDSTORE_HANDSHAKE_TIMEOUT_S", "0") or 0) if self.reader else 0.0
        self._wait_published = float(wait_published)
        self.namespace = namespace or getattr(comm, "ns", None) or _agent.default_namespace()
        _agent.check_name("namespace", self.namespace)
        _agent.check_name("node", self.node)
        run_dir = run_dir or _agent.default_run_dir()
        self.socket_path = socket_path or _agent.socket_path(run_dir, self.namespace, self.node)
        handshake = getattr(comm, "dir", None)
        if handshake:
            agent_args = ("--handshake-dir", os.path.abspath(handshake), *agent_args)
        agent_env = None
        if comm is not None and not self.reader:
            # Ranks on several nodes with nowhere for their agents to meet:
            # the communicator carries a rendezvous and a secret (_bootstrap).
            agent_args, agent_env = _bootstrap.agree(comm, self.node, agent_args)
        self._agent_args, self._agent_env = tuple(agent_args), agent_env
        self.scope = _scope(comm, scope, self.reader)
        self._scope_suffix = "" if self.scope == NAMESPACE else "@s" + self.scope
        self._timeout, self._publish_timeout = timeout, publish_timeout
        # Counts fences and updates: a read started (_start_reads) under an
        # older count is made again when finished (_finish_reads).
        self._reads_gen = 0
        self._vars, self._freed, self._attempts = {}, set(), {}
        self._closed = False
        self._pid = os.getpid()
        self._prefetcher = _prefetch.Prefetcher(f"ddstore-prefetch-{self.rank}")
        # The hello is made from values, not from the store: nothing the pool
        # holds refers back to the store, which so goes (and closes) when
        # its last reference does.
        # The rank the hello says is the namespace's: the world's, unless the
        # communicator is the whole job of a namespace of its own (a
        # sub-communicator given one): rank 0 of the namespace's job is the
        # one whose agent coordinates through a handshake directory.
        if own_namespace:
            self._hello_rank, self._hello_size = ident.rank, ident.size
        else:
            self._hello_rank, self._hello_size = self._world_rank, self._world_size
        hello = functools.partial(_hello, self.namespace, self.node, -1 if self.reader else self._hello_rank,
                                  self._hello_size, self.local_rank, self.local_size)
        agent = _lanes.Agent(self.namespace, self.node, self.socket_path, hello, timeout, agent_wait, spawn,
                             self.local_rank, self._agent_args, binary, agent_env)
        self._pool = _lanes.LanePool(agent, max_lanes, self.rank)
        self._recv = RecvBuffers(self._pool, timeout)
        self._direct = _direct.Pool(self._direct_key, timeout, direct)
        _lanes.track(self)
        hs = _handshake_arg(self._agent_args)
        if hs is not None:
            try:
                self._check_handshake(hs)
            except BaseException:
                self._close(collective=False)
                raise

    def _check_handshake(self, want):
        """The node's agent meets its job in directory `want`: one already
        running in the namespace with another directory (or none) would
        never meet the agents this store means to (they are told so)."""
        info = json.loads(_wire.Decoder(self._control(_wire.OP_INFO, _wire.Encoder())).string32())
        have = info.get("handshake_dir", "")
        if have and os.path.realpath(have) == os.path.realpath(want):
            return
        how = (f"with handshake directory {have!r}" if have else
               "without a handshake directory (it meets its job through a rendezvous address, or alone)")
        raise ArgumentError(f"ddstore: bad argument: handshake directory {want!r}: the agent of namespace "
                            f"{self.namespace!r} on node {self.node!r} (pid {info.get('pid')}) already runs {how}: "
                            f"it would not meet the agents of {want!r}; give this store a namespace of its own "
                            f"(namespace= or DDSTORE_NAMESPACE), or start it once that agent has stopped (it stops "
                            f"30 s after its last store closes)")

    @property
    def _lock(self):
        """The store's lock (the lane pool's): its variables, lanes and
        receive buffers."""
        return self._pool.lock

    # -- connections --------------------------------------------------------

    def _hello(self):
        return _hello(self.namespace, self.node, -1 if self.reader else self._hello_rank, self._hello_size,
                      self.local_rank, self.local_size)

    def _wire_name(self, name):
        """The agents' name of a variable: the name, the store's scope
        ("@s<token>", none in the namespace's scope), the replica group
        ("@r<first world rank>", none for the whole job)."""
        name += self._scope_suffix
        return name if self.group is None else f"{name}@r{self.group}"

    def _check_fork(self):
        """In a forked child, drop the parent's connections (never use them)
        and its receive regions; keep the segment mappings, which fork
        shares. Done at fork time (os.register_at_fork); this catches a
        child made without it."""
        if self._pid != os.getpid():
            self._forked()

    def _forked(self):
        """Reset a forked child's copy of the store, which only this thread
        uses yet (see LanePool.forked)."""
        if self._pid == os.getpid():
            return
        self._pool.forked()
        self._recv.forked()
        self._direct.forked()
        self._prefetcher.forked()
        self._pid = os.getpid()

    def _direct_key(self):
        """The job's direct key, from this node's agent (_direct.py)."""
        body = self._pool.with_lane(lambda lane: lane.call(_direct.OP_DIRECT_KEY, _wire.Encoder()))
        if len(body) != _auth.KEY:
            raise ProtocolError(f"ddstore: protocol error: direct-key reply of {len(body)} bytes: want {_auth.KEY}")
        return body

    def _control(self, op, enc, timeout=None):
        self._check_fork()
        return self._pool.control(op, enc, timeout or self._timeout)

    def _request(self, op, enc, timeout=None):
        """A request on a lane of the pool: a collective that waits minutes
        for other ranks holds one lane, not the store's lock."""
        self._check_fork()
        return self._pool.with_lane(lambda lane: lane.call(op, enc, timeout=timeout or self._timeout))

    # -- creating -------------------------------------------------------------

    def add(self, name, arr, *, backing=None, total=None):
        """Collective: every rank adds its rows (arr.shape[0] rows of
        arr[0].size items each; possibly none) as variable `name`.

        backing names a file holding every row of the variable, `total` of
        them, for data larger than the memory the job gives it: a .npy file,
        an HDF5 dataset as "FILE:DATASET" (agents built with -tags hdf5), or
        a raw file of rows. The ranks' rows are then the file's first rows,
        in rank order; reads of the others go to the file, through the
        node's agent (see prefetch). Every rank passes the same backing and
        total."""
        spec = ""
        try:
            a, dt = as_array(arr)
            # A strided view (a slice, a transpose) is copied once into C
            # order: the rows go into the shard as bytes, row after row.
            if not a.flags.c_contiguous:
                a = np.ascontiguousarray(a)
            if a.ndim == 0:
                raise GeometryError(f"ddstore: bad geometry: variable {name!r}: a 0-d array has no rows")
            nrows = a.shape[0]
            disp = int(np.prod(a.shape[1:], dtype=np.int64)) if a.ndim > 1 else 1
            if disp < 1:
                raise GeometryError(f"ddstore: bad geometry: variable {name!r}: rows of shape {a.shape[1:]} hold no items")
            spec, total = _check_backing(name, backing, total, nrows)
        except Exception as e:  # whatever the type: the other ranks must hear of it (_create)
            return self._create(name, None, 0, 0, 0, "", bad=e)
        return self._create(name, a, nrows, disp, a.dtype.itemsize, dt, backing=spec, total=total or 0)

    def init(self, name, nrows, disp, itemsize=1, dtype=None, *, backing=None, total=None):
        """Collective: a zero-filled shard of nrows rows of disp items
        (backing and total as for add: fill the shard with the file's rows
        from this rank's first global row, through update, before reading)."""
        dt = ""
        bad = None
        spec = ""
        try:
            if dtype is not None:
                dt = dtype_name(dtype)
                itemsize = dtype_itemsize(dt)
            nrows, disp, itemsize = int(nrows), int(disp), int(itemsize)
            if disp < 1 or not 1 <= itemsize <= 64:
                raise GeometryError(f"ddstore: bad geometry: variable {name!r}: disp {disp}, itemsize {itemsize}: "
                                    f"want disp >= 1 and itemsize 1..64")
            if nrows < 0:
                raise GeometryError(f"ddstore: bad geometry: variable {name!r}: {nrows} rows: want >= 0")
            spec, total = _check_backing(name, backing, total, nrows)
        except Exception as e:  # whatever the type: the other ranks must hear of it (_create)
            return self._create(name, None, 0, 0, 0, "", bad=e)
        return self._create(name, None, nrows, disp, itemsize, dt, backing=spec, total=total or 0)

    def add_ragged(self, name, values, lengths=None, *, offsets=None, backing=None, total=None):
        """Collective: every rank adds its rows of a ragged variable `name`,
        rows of a length of their own (a graph's n_i atoms, a sequence's
        tokens). values holds the rows concatenated along the first axis,
        shape (sum of lengths, *trailing): row i is lengths[i] units of the
        trailing shape (positions [n_i, 3]: values of shape (N, 3)). Give
        lengths (one per row) or offsets (rows + 1, from 0, never
        decreasing, ending at values.shape[0]). Every rank passes the same
        dtype and trailing shape; lengths that are negative or do not add up
        to the values fail the add on every rank, naming them.

        backing, as for add, is a file holding every row, `total` of them,
        for data larger than the memory the job gives it: here a pair
        (VALUES, OFFSETS), each a .npy file or an HDF5 dataset as
        "FILE:DATASET" — the flat values, of shape (units, *trailing), and
        the offsets, 1-D integers, at least total + 1 of them, from 0,
        never decreasing, the last one the values' length (h5py's and
        numpy's usual layout: two datasets of one file, or two .npy files).
        The ranks' rows are then the file's first rows, in rank order; the
        node's agent reads the offsets once into the node's index, the
        other rows from the values (see prefetch). Offsets that decrease or
        do not end at the values' length, values of another dtype or
        trailing shape, a missing dataset, or rows that are not the file's
        fail the add on every rank."""
        return _ragged.add(self, name, values, lengths, offsets, backing, total)

    def _create(self, name, a, nrows, disp, itemsize, dt, bad=None, backing="", total=0, kind=_wire.KIND_ROWS,
                items=0, shape=()):
        _check_name(name)
        if self.reader:
            raise ArgumentError(f"ddstore: bad argument: variable {name!r}: a reader store holds no shard "
                                f"(it reads what another job published)")
        self._check_fork()
        with self._lock:
            if self._closed:
                raise ClosedError(f"ddstore: closed: store of rank {self.rank} closed")
            exists = name in self._vars
            attempt = self._attempts[name] = self._attempts.get(name, 0) + 1
        tms = int(self._publish_timeout * 1000)

        def shard(failed=False):
            return _wire.shard(_wire.Encoder(), self._wire_name(name), "", self.rank, self.size, nrows, disp, itemsize,
                               tms, attempt,
                               failed, dt, backing, total, kind, items, shape, group=self._wire_name(""))

        def fail(err):
            # The failed Publish first, so that the round fails for every
            # rank at once; then this rank's own error, as raised.
            try:
                self._request(_wire.OP_PUBLISH, shard(failed=True), timeout=self._publish_timeout + self._timeout)
            except Error:
                pass
            raise err

        if exists:
            bad = VariableExists(f"ddstore: variable exists: variable {name!r} already exists")
        if bad is not None:
            fail(bad)
        # Any failure from here to the Publish (numpy's own errors, a
        # KeyboardInterrupt) fails the round for every rank, not only a
        # ddstore.Error: the others would wait their publish timeout.
        try:
            d = _wire.Decoder(self._request(_wire.OP_CREATE, shard()))
            path = d.string32()
            if kind == _wire.KIND_RAGGED and a is not None:
                values, lens = a
                seg = Segment(path, writable=True)
                try:
                    seg.offsets[0] = 0
                    np.cumsum(lens, out=seg.offsets[1:])
                    if values.size:
                        seg.values[...] = np.ascontiguousarray(values).reshape(-1).view(np.uint8)
                finally:
                    seg.close()
            elif a is not None and nrows:
                seg = Segment(path, writable=True)
                try:
                    seg.rows[...] = a.reshape(nrows, -1).view(np.uint8).reshape(nrows, disp * itemsize)
                finally:
                    seg.close()
        except BaseException as e:
            fail(e)
        body = self._request(_wire.OP_PUBLISH, shard(), timeout=self._publish_timeout + self._timeout)
        t = _wire.Table.decode(body)
        with self._lock:
            self._freed.discard(name)
        v = self._install(t, name)
        if self._mpi is not None:
            self._open_window(name, v)

    def _open_window(self, name, v):
        """Collective over the communicator: v's MPI window (none when no
        group has rows on more than one node). A window that some rank could
        not make is made by none: an error on every rank, the variable
        freed."""
        err = self._mpi.open(v)
        if err is None:
            return
        self.free(name)
        why = f" ({err})" if err != "" else " (on another rank)"
        raise ArgumentError(f"ddstore: bad argument: variable {name!r}: method 'mpi': MPI could not make a window of "
                            f"the shards{why}: it needs single-copy access between the processes of a node (Open "
                            f"MPI: CMA, so not OMPI_MCA_btl_vader_single_copy_mechanism=none) or RDMA between nodes; "
                            f"use method='agent'") from None

    def _close_window(self, v):
        """Collective: free v's window (before its shards are unmapped)."""
        if v.win is not None:
            self._mpi.close(v)

    def _install(self, t, name):
        v = Var(t, -1 if self.reader else self.rank)
        v.label = name
        with self._lock:
            if self._closed:
                v.unmap()
                raise ClosedError(f"ddstore: closed: store of rank {self.rank} closed")
            old = self._vars.get(name)
            if old is not None:
                v.unmap()
                return old
            self._vars[name] = v
            return v

    def _var(self, name):
        v = self._vars.get(name)
        if v is not None:
            return v
        _check_name(name)
        if self._closed:
            raise ClosedError(f"ddstore: closed: store of rank {self.rank} closed")
        if name in self._freed:
            raise FreedVariable(f"ddstore: variable freed: variable {name!r} was freed")
        enc = _wire.Encoder().string(self._wire_name(name)).string("").i64(-1)
        for attempt in range(1, _STALE_TRIES + 1):
            try:
                body = self._request(_wire.OP_LOOKUP, enc)
            except UnknownVariable:
                if self._wait_published <= 0:
                    raise
                body = self._wait_for(name, enc)
            try:
                return self._install(_wire.Table.decode(body), name)
            except StaleTable as e:
                if attempt == _STALE_TRIES:
                    raise FreedVariable(str(e)) from None

    def _reading(self, name, read):
        """read(v) of the variable name, run again on the variable looked up
        anew if the agent dropped the one it read: its segments marked
        dropped once read(v) had copied its node-local rows (a reader of
        another job keeps them mapped, old rows and all, after every rank
        freed the variable), or an agent refusing its table id with
        FreedVariable. The rows it copied are then discarded (read(v)
        writes every row it returns again)."""
        for attempt in range(1, _STALE_TRIES + 1):
            try:
                v = self._var(name)
            except UnknownVariable as e:
                if attempt == 1:
                    raise
                raise FreedVariable(f"ddstore: variable freed: variable {name!r} was freed, and there is no variable "
                                    f"of that name now ({e})") from None
            try:
                out = read(v)
            except FreedVariable:
                pass
            else:
                if not v.stale():
                    return out
            self._forget(name, v)
        raise FreedVariable(f"ddstore: variable freed: variable {name!r} was freed and added again while it was "
                            f"read, {_STALE_TRIES} times")

    def _forget(self, name, v):
        """Take a dropped variable out of the store and unmap it: the next
        use of its name looks it up again."""
        with self._lock:
            if self._vars.get(name) is not v:
                return  # forgotten, freed or closed already, and unmapped there
            del self._vars[name]
        if v.win is None:  # a window is collective: it goes with free() or close()
            v.unmap()

    def _wait_for(self, name, enc):
        """Look a variable up until it is published or wait_published has
        passed."""
        deadline = time.monotonic() + self._wait_published
        wait = 0.01
        while True:
            time.sleep(max(0.0, min(wait, deadline - time.monotonic())))
            try:
                return self._request(_wire.OP_LOOKUP, enc)
            except UnknownVariable as e:
                if time.monotonic() >= deadline:
                    raise UnknownVariable(f"{e} (after waiting {self._wait_published:g}s for it to be published)") \
                        from None
            wait = min(2 * wait, 0.2)

    # -- ragged rows --------------------------------------------------------------

    def ragged_sizes(self, name, indices):
        """The lengths (units of the trailing shape) of rows `indices` of a
        ragged variable, as int64: what get_ragged will read, from the
        node's index in shared memory, with no request to the agent. Their
        sum is the first dimension get_ragged's `out` needs."""
        self._check_fork()
        return self._reading(name, lambda v: _ragged.sizes(v, name, indices))

    def get_ragged(self, name, indices, out=None):
        """Rows `indices` of a ragged variable (any order, repeats, any
        owner), packed: (values, lengths), values of shape (sum of lengths,
        *trailing shape) with row i at values[offsets[i]:offsets[i+1]]
        (offsets = 0, then the cumulative sum of lengths). Rows of this node
        are copied from shared memory; the others come in one request to
        the agent, written straight into `out` when it is a buffer from
        alloc_recv. out: an array to fill (of the variable's dtype,
        C-contiguous, at least sum of lengths units); values is then its
        first rows. An out too small is an error naming both sizes, before
        any row is read."""
        self._check_fork()
        return self._reading(name, lambda v: _ragged.get(self, v, name, indices, out))

    def get_ragged_row(self, name, index):
        """One row of a ragged variable: an array of shape (n, *trailing)."""
        values, _ = self.get_ragged(name, [index])
        return values

    # -- reading ----------------------------------------------------------------

    def _dst(self, v, arr, nrows):
        """arr as a (nrows, row bytes) uint8 view, after checking its dtype,
        size and layout."""
        a, dt = as_destination(arr)
        if v.dtype and dt != v.dtype:
            raise BadBuffer(f"ddstore: bad buffer: variable {v.label!r} holds {v.dtype}, destination is {dt}")
        if a.dtype.itemsize != v.itemsize:
            raise BadBuffer(f"ddstore: bad buffer: variable {v.label!r} has items of {v.itemsize} bytes, "
                            f"destination {dt} of {a.dtype.itemsize}")
        if a.size != nrows * v.disp:
            raise BadBuffer(f"ddstore: bad buffer: variable {v.label!r}: destination of {a.size} items for {nrows} "
                            f"rows of {v.disp}: want {nrows * v.disp}")
        if not a.flags.c_contiguous or not a.flags.writeable:
            raise BadBuffer(f"ddstore: bad buffer: variable {v.label!r}: destination must be C-contiguous and writable")
        return a.reshape(-1).view(np.uint8).reshape(nrows, v.rb)

    def get(self, name, arr, start=0):
        """arr.shape[0] consecutive rows from global row `start` into arr
        (the range may span several ranks' shards)."""
        try:
            v = self._vars[name]
            q = v.quick
        except KeyError:
            v = q = None
        # The shortest path (Var.quick, as get_batch's): a C-contiguous
        # numpy destination of the variable's type, rows all in the one
        # shard of this node: one slice assignment, which checks the
        # destination's shape and that it is writable (a ValueError before
        # any row moves: the paths below then say what is wrong), and no
        # fork check (a forked child shares the mapping).
        if q is not None and type(arr) is _ndarray:
            npdt, s2, src, s1, src1, first, rows, mark = q
            st = arr.strides
            if st != s2:
                src = src1 if st == s1 else None
            dt = arr.dtype
            if src is not None and (dt is npdt or dt == npdt):
                lo = start if type(start) is int else int(start) if isinstance(start, np.integer) else -1
                if lo >= 0:
                    lo -= first
                    n = len(arr)
                    if 0 <= lo and lo + n <= rows and n:
                        try:
                            arr[...] = src[lo:lo + n]
                        except ValueError:
                            pass  # a destination the assignment refuses: the general path says why
                        else:
                            if not mark[0]:
                                v.quick_calls += 1
                                v.quick_rows += n
                                return arr
        if self._pid != _getpid():
            self._check_fork()
        # Fast path: a numpy destination of the variable's type, rows all in
        # one shard of this node (about a microsecond), or in one shard of
        # another node: one MPI get with method="mpi", else one round trip
        # to its agent (_direct). A numpy integer start is made an int once:
        # each comparison and sum of one costs a few hundred nanoseconds.
        if v is not None and type(arr) is np.ndarray and arr.dtype == v.npdtype:
            fl = arr.flags
            if type(start) is not int and isinstance(start, np.integer):
                start = int(start)
            n = arr.shape[0] if arr.ndim else 1
            b = v.bounds
            r = bisect_right(b, start) - 1
            if (fl.c_contiguous and fl.writeable and 0 <= r < len(v.typed) and start >= 0 and start + n <= b[r + 1]
                    and n > 0 and arr.size == n * v.disp):
                lo = start - b[r]
                p = v.profile
                if v.typed[r] is not None:
                    arr.reshape(n, v.disp)[...] = v.typed[r][lo:lo + n]
                    if v.mark[r][0]:  # dropped: those rows may be a freed variable's
                        self._forget(name, v)
                        return self._get(name, arr, start)
                    p["local_rows"] += n
                elif v.win is not None and r < len(v.shard_rows) and self._mpi.usable():
                    # Rows of one shard of another node: one MPI get.
                    self._mpi.get_shard(v, arr, r, lo, n)
                    p["remote_rows"] += n
                    p["onesided_rows"] += n
                    p["remote_calls"] += 1
                elif (v.win is None and r < len(v.shard_rows)
                      and self._direct.shard_range(v, arr.reshape(-1).view(np.uint8), start, n, r)):
                    # Rows of one shard of another node: one round trip to
                    # its agent, received into arr.
                    p["remote_rows"] += n
                    p["remote_calls"] += 1
                else:
                    return self._get(name, arr, start)
                p["calls"] += 1
                p["rows"] += n
                p["bytes"] += n * v.rb
                return arr
        return self._get(name, arr, start)

    def _get(self, name, arr, start):
        self._check_fork()
        return self._reading(name, lambda v: self._get_from(v, name, arr, start))

    def _get_from(self, v, name, arr, start):
        _not_ragged(v, "get")
        a, _ = as_destination(arr)
        n = a.shape[0] if a.ndim else 1
        dst = self._dst(v, arr, n)
        start = int(start)
        if n == 0:
            return arr
        if start < 0 or start + n > v.total:
            raise IndexOutOfRange(f"ddstore: index out of range: variable {name!r}: rows [{start}, {start + n}) "
                                  f"not in [0, {v.total})")
        src = v.single
        if src is not None:
            first = v.single_first
            dst[:] = src[start - first:start - first + n]
            count(v, n, 0, 0.0)
            return arr
        if start + n > v.held or (v.win is not None and self._mpi.usable()):
            # Rows of the backing file, or MPI gets: row by row.
            self._gather(v, dst, np.arange(start, start + n, dtype=np.int64))
        else:
            self._get_range(v, dst, start, n)
        return arr

    def _get_range(self, v, dst, start, n):
        """Rows [start, start+n) into dst: runs of this node's shards
        copied, each run of other nodes' rows one ReadRange (whatever the
        rows' size: a record of a uint8 variable is one request, not one
        index per byte)."""
        t0 = time.perf_counter()
        b, end, g = v.bounds, start + n, start
        remote = []
        while g < end:
            r = bisect_right(b, g) - 1
            hi = min(end, b[r + 1])
            src = v.local[r]
            if src is not None:
                lo = g - b[r]
                dst[g - start:hi - start] = src[lo:lo + hi - g]
            elif remote and remote[-1][1] == g:
                remote[-1][1] = hi
            else:
                remote.append([g, hi])
            g = hi
        nremote = 0
        for lo, hi in remote:
            nremote += hi - lo
            for c in range(lo, hi, MAX_ROWS_PER_READ):
                self._fetch_range(v, dst, c - start, c, min(hi, c + MAX_ROWS_PER_READ) - c)
        count(v, n, nremote, time.perf_counter() - t0 if nremote else 0.0)

    def _fetch_range(self, v, dst, pos, first, k):
        """Rows [first, first+k) of other nodes into dst[pos:pos+k]: one
        ReadRange, into the destination itself when it lies in a buffer
        from alloc_recv, else through the lane's staging region."""
        rb = v.rb
        b = v.bounds
        if self._direct.range(v, dst[pos:pos + k], first, k, bisect_right(b, first) - 1, bisect_right(b, first + k - 1) - 1):
            return
        region, base = self._recv.region_of(dst)

        def read(lane):
            if region is not None:
                rid, off = region.id, base + pos * rb
            else:
                stage = lane.staging(k * rb, self._timeout)
                rid, off = stage.id, 0
            lane.call(_wire.OP_READ_RANGE, _wire.read_range(_wire.Encoder(), v.name, rid, v.id, first, k, off))
            if region is None:
                dst[pos:pos + k] = stage.array()[:k * rb].reshape(k, rb)

        self._pool.read(read, region)
        if self._direct.moved:
            self._readdress(v)

    def get_batch(self, name, arr, indices):
        """Rows indices[i] into arr[i]: any order, repeats, any owners. Every
        index is checked before any row is read."""
        try:
            v = self._vars[name]
            q = v.quick
        except KeyError:
            v = q = None
        # The shortest path (Var.quick): numpy indices and a C-contiguous
        # numpy destination of the variable's type and shape, every row in
        # the one shard of this node. At 64-byte rows numpy gathers a batch
        # of 256 in about a microsecond, and each step here is counted
        # against it: the destination is taken as it is (take checks its
        # shape and that it is writable, with a ValueError before any row
        # moves, the general path then saying what is wrong), the indices
        # checked in one pass (an argmax of them as uint64, where a negative
        # one is above any bound: below()), and no fork check: the rows are
        # read from mappings a forked child shares, and anything else goes
        # through the paths below, which make it.
        if q is not None and type(arr) is _ndarray and type(indices) is _ndarray:
            npdt, s2, src, s1, src1, first, rows, mark = q
            st = arr.strides
            if st != s2:
                src = src1 if st == s1 else None
            dt = arr.dtype
            if src is not None and (dt is npdt or dt == npdt):
                dt = indices.dtype
                if dt is not _I64 and (dt.kind == "i" or dt.kind == "u" and dt.itemsize < 8):
                    indices = indices.astype(_I64)
                    dt = _I64
                if dt is _I64:
                    loc = indices - first if first else indices
                    u = loc.view(_U64)
                    try:
                        if u.item(u.argmax()) < rows:
                            src.take(loc, axis=0, out=arr, mode="clip")
                            if not mark[0]:
                                v.quick_calls += 1
                                v.quick_rows += len(loc)
                                return arr
                            # Dropped (those rows may be a freed variable's):
                            # the paths below find it so and read anew.
                    except ValueError:
                        pass  # no indices, or a destination take refuses: the general path says which
        # Fast path (node-local rows as well: the fork check waits for the
        # first request below): numpy indices and a numpy destination of the
        # variable's type, every row in one shard of this node (the shard of
        # the first index, or the only one): one pass to check the indices
        # (an argmax of them as uint64, where a negative one is above any
        # bound: below()), one gather, none of the general path's owner
        # lookup per row, and the shard's state made once per variable
        # (Var.fast). Its steps are written out here, not called: at 64-byte
        # rows a batch of 256 costs numpy a microsecond or so, and each call
        # and attribute looked up again is counted against it.
        if (v is not None and type(arr) is np.ndarray and type(indices) is np.ndarray and indices.ndim == 1
                and arr.dtype == v.npdtype):
            n = indices.shape[0]
            fl = arr.flags
            if (fl.c_contiguous and fl.writeable and n and arr.size == n * v.disp
                    and (arr.shape[0] if arr.ndim else 1) == n):
                dt = indices.dtype
                if dt is not _I64 and dt.kind == "i":
                    indices = indices.astype(_I64)
                    dt = _I64
                if dt is _I64:
                    r = v.fast_rank
                    if r is None:
                        r = bisect_right(v.bounds, indices.item(0)) - 1
                    f = v.fast[r] if 0 <= r < len(v.fast) else None
                    if f is not None:
                        first, rows, items, src, mark = f
                        loc = indices - first if first else indices
                        u = loc.view(_U64)
                        if u.item(u.argmax()) < rows:
                            if items is not None:  # rows under 1 KiB, as in copy_rows
                                items.take(loc, out=arr.reshape(-1).view(v.void), mode="clip")
                            else:
                                copy_rows(arr.reshape(n, -1).view(np.uint8), src, loc)
                            if not mark[0]:
                                p = v.profile
                                p["calls"] += 1
                                p["rows"] += n
                                p["bytes"] += n * v.rb
                                p["local_rows"] += n
                                return arr
                            # Dropped: those rows may be a freed variable's.
                            self._forget(name, v)
                            self._check_fork()
                            return self._reading(name, lambda v: self._get_batch(v, name, arr, indices))
                    if v.fast_all and below(indices, v.held):
                        # Rows of several shards, all of this node (DDStore's
                        # usage on one node): one gather over the node's
                        # shards, or each owner's rows in one gather.
                        dst = arr.reshape(n, -1).view(np.uint8)
                        owner = v.upper.searchsorted(indices, side="right")
                        sp = v.span
                        if sp is not None:
                            d = arr.ctypes.data
                            if d < sp[6] and d + arr.nbytes > sp[5]:
                                sp = None  # a destination among the shards' mappings
                        if sp is not None:  # one gather over the node's shards (_vars.node_span)
                            span, c, m, chunks, items = sp[:5]
                            if m == 1:
                                at = indices + c.take(owner)
                                if items is not None:
                                    items.take(at, out=arr.reshape(-1).view(v.void), mode="clip")
                                else:
                                    span.take(at, axis=0, out=dst, mode="clip")
                            else:
                                at = (indices * m + c.take(owner))[:, None] + chunks
                                span.take(at, axis=0, out=dst.reshape(n, m, -1), mode="clip")
                        else:
                            for o in np.bincount(owner).nonzero()[0].tolist():
                                pos = (owner == o).nonzero()[0]
                                first, _, _, src, _ = v.fast[o]
                                copy_rows(dst, src, indices[pos] - first if first else indices[pos], pos)
                        if not v.stale():
                            count(v, n, 0, 0.0)
                            return arr
                        self._forget(name, v)
        self._check_fork()
        return self._reading(name, lambda v: self._get_batch(v, name, arr, indices))

    def _get_batch(self, v, name, arr, indices, jobs=None, plan=None):
        _not_ragged(v, "get_batch")
        if plan is not None:
            self._planned_gather(v, self._dst(v, arr, plan.idx.shape[0]), plan, jobs)
            return arr
        idx = row_indices(indices)
        dst = self._dst(v, arr, idx.shape[0])
        check_rows(idx, v.total, name)
        self._gather(v, dst, idx, jobs)
        return arr

    def _planned_gather(self, v, dst, plan, jobs):
        """_gather with jobs of the rows plan (_ragged.Plan, of v's
        sharding) says where they lie, some of them of other nodes."""
        t0 = time.perf_counter()
        idx = plan.idx
        n = idx.shape[0]
        for r, pos in plan.local_groups():
            first = v.bounds[r]
            copy_rows(dst, v.local[r], idx[pos] - first if first else idx[pos], pos)
        pos = plan.remote
        nremote = pos.shape[0]
        if plan.nstored:
            v.profile["storage_rows"] += plan.nstored
        j = None
        if nremote <= MAX_ROWS_PER_READ and plan.addr is not None:
            rb = v.rb
            p0 = int(pos[0])
            if int(pos[-1]) - p0 == nremote - 1:  # positions in a row: straight into dst
                j = self._direct.planned_job(v, dst[p0:p0 + nremote], nremote, plan.rows, plan.addr, nremote * rb)
            else:
                tmp = np.empty((nremote, rb), dtype=np.uint8)
                j = self._direct.planned_job(v, tmp, nremote, plan.rows, plan.addr, nremote * rb)
                if j is not None:
                    def place():
                        dst[pos] = tmp
                    j.place = place
        if j is None:
            j = _direct.agent_job(None)
        j.t0 = t0
        j.done = lambda: count(v, n, nremote, time.perf_counter() - j.t0)

        def fallback():
            for lo in range(0, nremote, MAX_ROWS_PER_READ):
                self._fetch_agent(v, dst, idx, pos[lo:lo + MAX_ROWS_PER_READ])
            j.done()
        j.fallback = fallback
        jobs.append(j)

    def _read_many(self, reads, overlap=None):
        """Several reads made at once, their results in order: each read
        ("ragged", name, indices, out) as get_ragged(name, indices, out),
        ("batch", name, arr, indices) as get_batch(name, arr, indices). The
        rows they need from one other node go to its agent together, their
        requests pipelined on one direct connection (a batch of several
        fields waits about one round trip, in this thread); what must go
        through the own agent is read after, the requests of two or more
        reads overlapped on `overlap` (an executor) when given. A read whose
        variable turns out dropped is made again by itself."""
        return self._finish_reads(self._start_reads(reads), overlap)

    def _direct_worth(self, name, indices):
        """Whether a read of rows indices (checked int64) of variable name
        would send a request straight to another node's agent: some rows in
        memory on another node, none only in the backing file (a read ahead
        of use is started only then: the others gain nothing by it)."""
        v = self._var(name)
        if not indices.shape[0] or int(indices.max()) >= v.held:
            return False
        owner = v.upper.searchsorted(indices, side="right")
        return any(v.local[r] is None for r in distinct(owner))

    def _start_reads(self, reads, post=False):
        """The first half of _read_many: rows of this node copied, the reads
        of the others planned, and with post their direct requests sent now
        (their replies wait in the socket for _finish_reads, or are dropped
        by _drop_reads)."""
        self._check_fork()
        jobs, got, vs = [], [], []
        # Reads of one index array (a dataset's fields) share where its
        # rows lie (_ragged.Plan), worked out by the first of them: each
        # further variable of the same sharding looks up only its own
        # extents.
        src = plan = None
        for kind, name, a, b in reads:
            v = self._var(name)
            indices = a if kind == "ragged" else b
            p = None
            if indices is src:
                p = plan if plan is not None and plan.fits(v) else None
            elif type(indices) is np.ndarray:
                src, plan = indices, None
                if indices.ndim == 1 and indices.dtype == np.int64 and indices.shape[0]:
                    if kind == "batch" and v.ragged:
                        _not_ragged(v, "get_batch")
                    if kind == "ragged":
                        _ragged.only(v, name)
                    p = plan = _ragged.Plan.of(self, v, check_rows(indices, v.total, name))
            if kind == "ragged":
                got.append(_ragged.get(self, v, name, a, b, jobs, p))
            else:
                got.append(self._get_batch(v, name, a, b, jobs, p))
            vs.append(v)
        posted = self._direct.post(jobs) if post else None
        return reads, jobs, got, vs, posted, os.getpid(), self._reads_gen

    def _drop_reads(self, started):
        """Let go of _start_reads's reads unfinished (their results unread)."""
        posted, pid = started[4], started[5]
        if posted is not None and pid == os.getpid():
            self._direct.discard(posted)

    def _finish_reads(self, started, overlap=None):
        """The second half of _read_many: the results of _start_reads's reads."""
        reads, jobs, got, vs, posted, pid, gen = started
        if pid != os.getpid():
            raise ArgumentError("ddstore: bad argument: reads started in another process")
        if gen != self._reads_gen:
            # A fence or an update came between the start and now: rows the
            # start copied or the owners served may be older than it.
            self._drop_reads(started)
            return self._read_many(reads, overlap)
        if posted is not None:
            # Reads started ahead of use (their requests sent then) have
            # waited only from now: the time since their start was the
            # caller's, not the read's.
            now = time.perf_counter()
            for j in jobs:
                j.t0 = now
        err, stale = None, False
        try:
            left = self._direct.collect(posted) if posted is not None else self._direct.run_jobs(jobs)
        except BaseException as e:  # the agent path reads what the direct one did not finish
            left, err = [j for j in jobs if j.addr is None], e
        futures = []
        if overlap is not None and len(left) > 1:
            futures = [overlap.submit(j.fallback) for j in left[1:]]
            left = left[:1]
        for j in left:
            try:
                j.fallback()
            except FreedVariable:
                stale = True
            except BaseException as e:
                err = err or e
        for f in futures:
            try:
                f.result()
            except FreedVariable:
                stale = True
            except BaseException as e:
                err = err or e
        if err is not None:
            raise err
        for k, (kind, name, a, b) in enumerate(reads):
            if stale or vs[k].stale():
                got[k] = self.get_ragged(name, a, b) if kind == "ragged" else self.get_batch(name, a, b)
        return got

    def _gather(self, v, dst, idx, jobs=None):
        t0 = time.perf_counter()
        n = idx.shape[0]
        if n == 0:
            return
        src = v.single
        if src is not None:
            first = v.single_first
            copy_rows(dst, src, idx - first if first else idx)
            count(v, n, 0, 0.0)
            return
        # Each row's owner (the backing file's rows: len(shard_rows)), and
        # the owners of the batch from their counts: no sort of the batch.
        # (Methods, not np.* functions: no dispatch of __array_function__.)
        owner = v.upper.searchsorted(idx, side="right")
        per = np.bincount(owner)
        o0 = int(owner[0])
        if per[o0] == n:  # the common case: one owner for the batch
            src = v.local[o0]
            if src is not None:
                first = v.bounds[o0]
                copy_rows(dst, src, idx - first if first else idx)
                count(v, n, 0, 0.0)
                return
            remote = [np.arange(n)]
        else:
            remote = []
            for r in per.nonzero()[0].tolist():
                pos = (owner == r).nonzero()[0]
                src = v.local[r]
                if src is None:
                    remote.append(pos)
                else:
                    copy_rows(dst, src, idx[pos] - v.bounds[r], pos)
        nremote = 0
        if remote:
            pos = np.concatenate(remote) if len(remote) > 1 else remote[0]
            nremote = pos.shape[0]
            if v.total > v.held:
                v.profile["storage_rows"] += int(np.count_nonzero(idx[pos] >= v.held))
            if v.win is not None and self._mpi.usable():
                pos = self._mpi.get_rows(v, dst, idx, pos, owner)
            elif jobs is not None:
                j = self._fetch_job(v, dst, idx, pos) if pos.shape[0] <= MAX_ROWS_PER_READ else None
                if j is None:
                    j = _direct.agent_job(None)
                j.t0 = t0
                j.done = lambda: count(v, n, nremote, time.perf_counter() - j.t0)

                def fallback():
                    for lo in range(0, pos.shape[0], MAX_ROWS_PER_READ):
                        self._fetch_agent(v, dst, idx, pos[lo:lo + MAX_ROWS_PER_READ])
                    j.done()
                j.fallback = fallback
                jobs.append(j)
                return
            for lo in range(0, pos.shape[0], MAX_ROWS_PER_READ):
                self._fetch(v, dst, idx, pos[lo:lo + MAX_ROWS_PER_READ])
        count(v, n, nremote, time.perf_counter() - t0 if nremote else 0.0)

    def _fetch(self, v, dst, idx, pos):
        """Rows idx[pos] from other nodes into dst[pos]: straight from their
        node's agent when they may (_direct.py), else one request to the own
        agent."""
        j = self._fetch_job(v, dst, idx, pos)
        if j is None or not self._direct.run_one(j):
            self._fetch_agent(v, dst, idx, pos)

    def _fetch_job(self, v, dst, idx, pos):
        """The direct read of rows idx[pos] into dst[pos] (a _direct.Job,
        received into a buffer and placed when the places do not follow one
        another), or None when they cannot go direct."""
        rb = v.rb
        k = pos.shape[0]
        if k * rb > self._direct.max:
            return None
        g = idx[pos]
        owners = np.searchsorted(v.prefix, g, side="right") - 1
        p0 = int(pos[0])
        if int(pos[-1]) - p0 == k - 1 and (k == 1 or bool((np.diff(pos) == 1).all())):
            return self._direct.fetch_job(v, dst[p0:p0 + k], g, owners, k * rb)
        tmp = np.empty((k, rb), dtype=np.uint8)
        j = self._direct.fetch_job(v, tmp, g, owners, k * rb)
        if j is not None:
            def place():
                dst[pos] = tmp
            j.place = place
        return j

    def _fetch_agent(self, v, dst, idx, pos):
        """Rows idx[pos] from other nodes into dst[pos]: one request to the
        agent, rows written into a registered region (the destination itself
        when it lies in a buffer from alloc_recv)."""
        rb = v.rb
        k = pos.shape[0]
        region, base = self._recv.region_of(dst)

        def read(lane):
            if region is not None:
                offsets = base + pos * rb
                rid = region.id
            else:
                stage = lane.staging(k * rb, self._timeout)
                offsets = np.arange(k, dtype=np.int64) * rb
                rid = stage.id
            enc = _wire.Encoder().string(v.name).u32(rid).i64(v.id).i64s(idx[pos]).i64s(offsets)
            lane.call(_wire.OP_READ, enc)
            if region is None:
                dst[pos] = stage.array()[:k * rb].reshape(k, rb)

        self._pool.read(read, region)
        if self._direct.moved:
            self._readdress(v)

    def _readdress(self, v):
        """After a read through the agent worked: when a direct connection
        to one of v's owners failed since v's addresses were taken, the
        owner may have moved (its agent restarted on another port, which
        the own agent learnt on that read): v's addresses from the table
        looked up anew, so that direct reads go to the new one. Once per
        failure (the failed address is then left alone a while: _direct's
        RETRY), and only for the same table (a variable added again is
        _reading's to look up)."""
        if not self._direct.moved_since(v.addrs, v.addrs_at):
            return
        v.addrs_at = time.monotonic()
        try:
            t = _wire.Table.decode(self._request(_wire.OP_LOOKUP, _wire.Encoder().string(v.name).string("").i64(-1)))
        except Error:
            return  # the read stands; the next failure tries again
        if t.id == v.id and len(t.rank_node) == len(v.addrs):
            addrs = [t.addrs[i] for i in t.rank_node]
            if addrs != v.addrs:
                v.addrs = addrs

    # -- receive buffers ------------------------------------------------------

    def alloc_recv(self, shape, dtype=np.uint8):
        """A numpy array in shared memory that the agent writes rows of other
        nodes into directly: reads into it (or a slice) skip a copy."""
        self._check_fork()
        return self._recv.alloc(shape, dtype)

    def _recv_buffer(self, shape, dtype):
        """A receive buffer (alloc_recv) released by itself once its array
        and every view of it are gone: for buffers the library reuses (a
        data loader's batches)."""
        self._check_fork()
        return self._recv.reusable(shape, dtype)

    def _through_agent(self, name):
        """Whether reads of a variable may need the agent: rows of another
        node's shards, or of its backing file."""
        v = self._var(name)
        return v.total > v.held or any(n > 0 and v.local[r] is None for r, n in enumerate(v.shard_rows))

    def register_recv(self, name, arr):
        """DDStore's register_recv: here reads into any buffer work; a buffer
        from alloc_recv also skips the copy. Kept so DDStore code runs."""
        self._var(name)
        return arr

    def unregister_recv(self, name, arr=None):
        return None

    def free_recv(self, arr):
        """Release a buffer from alloc_recv."""
        self._check_fork()
        if not self._recv.drop(np.asarray(arr).__array_interface__["data"][0]):
            raise BadBuffer("ddstore: bad buffer: not a buffer returned by alloc_recv")

    # -- updating, describing, freeing -----------------------------------------

    def update(self, name, arr, offset=0):
        """Overwrite rows of this rank's own shard from row `offset` on."""
        self._check_fork()
        v = self._var(name)
        _not_ragged(v, "update")
        if v.own is None:
            raise ArgumentError(f"ddstore: bad argument: variable {name!r}: rank {self.rank} holds no shard to update")
        a, dt = as_array(arr)
        if v.dtype and dt != v.dtype:
            raise BadBuffer(f"ddstore: bad buffer: variable {name!r} holds {v.dtype}, rows are {dt}")
        nbytes = a.size * a.dtype.itemsize
        if nbytes % v.rb:
            raise BadBuffer(f"ddstore: bad buffer: variable {name!r}: {nbytes} bytes is not a whole number of "
                            f"{v.rb}-byte rows")
        n, have = nbytes // v.rb, v.own.shape[0]
        if offset < 0 or offset + n > have:
            raise IndexOutOfRange(f"ddstore: index out of range: variable {name!r}: update of rows [{offset}, "
                                  f"{offset + n}) is outside rank {self.rank}'s shard of {have} rows")
        v.own[offset:offset + n] = np.ascontiguousarray(a).reshape(-1).view(np.uint8).reshape(n, v.rb)
        self._reads_gen += 1  # a read started before (read ahead) is made again

    def info(self, name):
        """(total rows, disp, itemsize), as DDStore's info()."""
        return self._reading(name, lambda v: (v.total, v.disp, v.itemsize))

    def describe(self, name):
        """Everything known of a variable: geometry, dtype, shards, nodes,
        and its backing file ("" for none) with the rows the shards hold."""
        return self._reading(name, lambda v: self._describe(v, name))

    def _describe(self, v, name):
        d = {"name": name, "total_rows": v.total, "disp": v.disp, "itemsize": v.itemsize, "dtype": v.dtype,
             "shard_rows": [int(x) for x in v.shard_rows], "nodes": list(v.nodes), "backing": v.backing,
             "held_rows": v.held, "kind": "ragged" if v.ragged else "fixed", "bytes": v.total * v.rb}
        if v.ragged:
            d["shape"] = list(v.shape)
            d["shard_items"] = [int(b - a) for a, b in zip(v.first_unit[:-1], v.first_unit[1:])]
            # The index holds every row, the backing file's too.
            d["total_items"] = int(v.index[-1])
            d["bytes"] = d["total_items"] * v.rb
            if "\0" in v.backing:
                d["backing"], d["backing_offsets"] = v.backing.split("\0", 1)
        return d

    def prefetch(self, name, indices, wait=False):
        """Tell the node's agent which rows of a variable with a backing file
        this rank reads soon (its next steps' storage reads, from the
        schedule): it reads them from the file now, into staging memory, so
        that the get_batch that wants them finds them there. Rows in memory
        are skipped; rows beyond the staging room are read when asked for.

        Returns at once: the request goes to the agent from a background
        thread of the store (wait=True sends it on this thread and returns
        once the agent has queued the rows). Bad arguments raise here; an
        error the agent answers is raised by the next prefetch."""
        self._prefetch_many([name], indices, wait)

    def _prefetch_many(self, names, indices, wait=False):
        """prefetch of the same rows of several variables (a dataset's
        fields): one hand-over to the prefetch thread, which sends the
        requests pipelined on one lane (one wake-up of the thread and of
        the agent a step, not one per variable, where the thread competes
        with the caller for the interpreter)."""
        self._check_fork()
        encs = [e for e in (_prefetch.request(self._var(n), indices) for n in names) if e is not None]
        err = self._prefetcher.take_error()
        if err is not None:
            raise err
        if not encs:
            return
        if wait:
            self._send_prefetch(encs)
            return
        self._prefetcher.submit(encs, self._lock, self._send_prefetch)

    def _send_prefetch(self, encs):
        self._check_fork()
        self._pool.with_lane(lambda lane: lane.calls(_wire.OP_PREFETCH, encs))

    def get_profile(self, name):
        return dict(self._var(name).profile)

    def fence(self):
        """Collective over this store's ranks (its replica group): returns once
        every rank has called it, each rank's n-th call meeting the others'
        n-th. Rows a rank updated before its fence are then read by every
        rank after theirs, rows of this node and of others. A rank that does
        not come within publish_timeout fails the fence with TimeoutError
        (through the agents, on every rank, naming the missing ranks). An
        MPI barrier of the group with an mpi4py communicator, else a round
        on the coordinator agent; a reader takes part in none. Reads started
        before it and finished after (a dataset's read ahead of an announced
        batch) are made again."""
        try:
            self._fence()
        finally:
            self._reads_gen += 1

    def _fence(self):
        if self._closed:
            raise ClosedError(f"ddstore: closed: store of rank {self.rank} closed")
        if self.reader or self.size <= 1:
            return
        if self._fence_comm is not None and self._pid == os.getpid():
            if _onesided.finalized():
                raise ClosedError(f"ddstore: closed: rank {self.rank}: MPI has been finalised, and the store's fence "
                                  f"is a barrier of its communicator")
            mpi = self._mpi
            wins = [v.win for v in list(self._vars.values()) if v.win is not None] if mpi is not None else ()
            _fence.mpi_fence(self._fence_comm, wins, mpi.lock if mpi is not None else None, self._publish_timeout,
                             self.rank, self.size)
            return
        key = self._wire_name("")  # the group's suffix as variables carry it: "" for the whole job
        seq = _fence.next_seq((self.namespace, self.socket_path, key, self.rank, self.size))
        self._request(_wire.OP_BARRIER, _fence.barrier_request(key, self.rank, self.size, seq, self._publish_timeout),
                      timeout=self._publish_timeout + self._timeout)

    # DDStore's names of the fence (an MPI window fence there).
    epoch_begin = fence
    epoch_end = fence

    def free(self, name=None):
        """Release one variable, or every variable with no name (DDStore's
        free()). Freeing twice is not an error."""
        self._check_fork()
        names = [name] if name is not None else list(self._vars)
        for n in names:
            with self._lock:
                v = self._vars.pop(n, None)
                if v is not None:
                    self._freed.add(n)
            if v is None:
                continue
            self._close_window(v)
            v.unmap()
            if self.reader:
                continue  # a reader holds no share of the variable to give back
            self._request(_wire.OP_FREE, _wire.Encoder().string(self._wire_name(n)).string("").i64(self.rank),
                          timeout=3 * self._timeout)

    def close(self):
        """Release everything this store holds (collective with
        method="mpi": the windows are freed). The variables of a store's own
        scope go with it (this rank's share of each is freed, as by free());
        those of the namespace's scope stay with the agents."""
        if self._scope_suffix and not self.reader and not self._closed and self._pid == os.getpid():
            self.free()
        self._close(collective=True)

    def _close(self, collective):
        if self._pid == os.getpid():
            self._prefetcher.close(self._timeout)  # sends what was queued, then ends
        with self._lock:
            if self._closed:
                return
            self._closed = True
            vars_, self._vars = self._vars, {}
            lanes = self._pool.shut()
            recv = self._recv.take_all()
        self._direct.close()
        for v in vars_.values():
            if v.win is not None and not collective:
                # Not collective (a store collected as garbage): the window
                # and the mapping it exposes stay until the process ends, as
                # other ranks may still read them.
                _onesided.keep_open(v)
                continue
            self._close_window(v)
            v.unmap()
        _lanes.close_lanes(lanes, own=self._pid == os.getpid())
        close_regions(recv)
        if collective and self._fence_own_comm and self._pid == os.getpid() and not _onesided.finalized():
            self._fence_comm.Free()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __del__(self):
        # A store's own variables go with it (DDStore's free() at garbage
        # collection): this rank's share of each is given back; variables
        # of the namespace's scope stay, and so does a window (its free is
        # collective).
        try:
            if self._scope_suffix and not self.reader and not self._closed and self._pid == os.getpid():
                for n, v in list(self._vars.items()):
                    if v.win is None:
                        self._request(_wire.OP_FREE, _wire.Encoder().string(self._wire_name(n)).string("").i64(self.rank),
                                      timeout=self._timeout)
        except Exception:
            pass
        try:
            self._close(collective=False)
        except Exception:
            pass


NAMESPACE = "namespace"
_SCOPE_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-")


def _scope(comm, scope, reader):
    """The store's scope: NAMESPACE, or the token its variables' names
    carry. "store" (the default with an mpi4py communicator or a
    torch.distributed group): rank 0 draws a token and the communicator
    carries it (collective), so that each store's variables are its own.
    "namespace" (the default for a reader and without such a communicator):
    variables are the namespace's, as readers of another job and restarted
    jobs see them. Any other string is a token every rank passes the same
    (a forked reader of a store passes the store's)."""
    if scope is None:
        scope = NAMESPACE if reader or _bootstrap._collectives(comm) is None else "store"
    if not isinstance(scope, str) or not scope:
        raise ArgumentError(f"ddstore: bad argument: scope {scope!r}: want \"store\", \"namespace\" or a token of "
                            f"[A-Za-z0-9_-]")
    if scope == NAMESPACE:
        return NAMESPACE
    if scope == "store":
        if reader:
            raise ArgumentError("ddstore: bad argument: scope \"store\" for a reader: a reader reads variables of the "
                                "namespace (scope=\"namespace\") or of a store whose token it is given")
        coll = _bootstrap._collectives(comm)
        if coll is None:
            raise ArgumentError(f"ddstore: bad argument: scope \"store\" needs an mpi4py communicator or a "
                                f"torch.distributed group to agree on the store's token (comm is "
                                f"{type(comm).__name__}): use scope=\"namespace\" or pass a token")
        mine = secrets.token_hex(6) if _bootstrap.comm_rank(comm) == 0 else None
        return coll[1](mine)
    if len(scope) > 64 or not set(scope) <= _SCOPE_CHARS:
        raise ArgumentError(f"ddstore: bad argument: scope {scope!r}: want \"store\", \"namespace\" or a token of "
                            f"1 to 64 characters of [A-Za-z0-9_-]")
    return scope


def _handshake_arg(args):
    """The directory of the last --handshake-dir of agent arguments (None
    for none, or an empty one)."""
    hs = None
    for k, a in enumerate(args):
        if a == "--handshake-dir" and k + 1 < len(args):
            hs = args[k + 1]
        elif isinstance(a, str) and a.startswith("--handshake-dir="):
            hs = a.split("=", 1)[1]
    return hs or None


def _hello(namespace, node, rank, size, local_rank, local_size):
    """The Hello request every lane opens with (rank -1: a reader); the pid
    is taken at each connection, so a forked child says its own."""
    return _wire.Encoder().string(namespace).string(node).i64(rank, size, local_rank, local_size, os.getpid())


_HDF5_EXTS = (".h5", ".hdf5", ".hdf", ".he5")


def _check_backing(name, backing, total, nrows):
    """(absolute spec, total) of add's and init's backing arguments, or
    ("", None) without a backing file."""
    if backing is None:
        if total is not None:
            raise ArgumentError(f"ddstore: bad argument: variable {name!r}: total={total!r} without a backing file")
        return "", None
    spec = _absolute_spec(name, backing)
    if isinstance(total, bool) or not isinstance(total, (int, np.integer)) or int(total) < 1:
        raise GeometryError(f"ddstore: bad geometry: variable {name!r}: backing file {backing} needs total=ROWS, "
                            f"the rows the variable has in all (got {total!r})")
    if nrows > int(total):
        raise GeometryError(f"ddstore: bad geometry: variable {name!r}: {nrows} rows on this rank but {total} in all")
    return spec, int(total)


def _check_ragged_backing(name, backing, total, nrows):
    """(the pair as sent, total) of add_ragged's backing arguments, or
    ("", None) without a backing file (naming.CheckRaggedBacking): values
    and offsets each a .npy file or an HDF5 dataset, FILE made absolute,
    joined by a NUL byte."""
    if backing is None:
        if total is not None:
            raise ArgumentError(f"ddstore: bad argument: variable {name!r}: total={total!r} without a backing file")
        return "", None
    if isinstance(backing, (str, os.PathLike)) or not isinstance(backing, (tuple, list)) or len(backing) != 2:
        raise ArgumentError(f"ddstore: bad argument: variable {name!r}: ragged backing {backing!r}: want a pair "
                            f"(VALUES, OFFSETS) of .npy files or HDF5 datasets")
    values, offsets = (os.fspath(s) if isinstance(s, os.PathLike) else s for s in backing)
    if not isinstance(values, str) or not isinstance(offsets, str) or not values or not offsets:
        raise ArgumentError(f"ddstore: bad argument: variable {name!r}: ragged backing (values {values!r}, offsets "
                            f"{offsets!r}): want both files named")
    _, total = _check_backing(name, "/rows.npy", total, nrows)
    sent = []
    for what, spec in (("values", values), ("offsets", offsets)):
        if "\0" in spec:
            raise ArgumentError(f"ddstore: bad argument: variable {name!r}: backing file name {spec!r} holds a NUL byte")
        a = _absolute_spec(name, spec)
        kind, has_dataset = _spec_kind(a)
        if kind == "raw":
            raise ArgumentError(f"ddstore: bad argument: variable {name!r}: ragged backing {what} {spec}: want a .npy "
                                f"file or an HDF5 dataset as FILE:DATASET (FILE ending in .h5 or .hdf5)")
        if kind == "hdf5" and not has_dataset:
            raise ArgumentError(f"ddstore: bad argument: variable {name!r}: ragged backing {what} {spec}: an HDF5 "
                                f"file without a dataset: want FILE:DATASET, e.g. {spec}:/{what}")
        sent.append(a)
    if sent[0] == sent[1]:
        raise ArgumentError(f"ddstore: bad argument: variable {name!r}: ragged backing: values and offsets are both "
                            f"{values}: want two datasets")
    return sent[0] + "\0" + sent[1], total


def _spec_kind(spec):
    """("hdf5" | "npy" | "raw", whether a dataset is named) of a spec as
    _absolute_spec returns it (naming.ParseSpec)."""
    for i, ch in enumerate(spec):
        if ch == ":" and i > 0 and _is_hdf5(spec[:i]):
            return "hdf5", True
    if _is_hdf5(spec):
        return "hdf5", False
    if spec.lower().endswith(".npy"):
        return "npy", False
    return "raw", False


def _absolute_spec(name, spec):
    """A backing file spec (FILE, or FILE:DATASET for HDF5) with FILE made
    absolute: the agent, which opens it, has another working directory."""
    if not isinstance(spec, (str, os.PathLike)) or not str(spec):
        raise ArgumentError(f"ddstore: bad argument: variable {name!r}: backing file {spec!r}: want a file name")
    spec = os.fspath(spec)
    for i, ch in enumerate(spec):
        if ch == ":" and i > 0 and _is_hdf5(spec[:i]):
            if i + 1 == len(spec):
                raise ArgumentError(f"ddstore: bad argument: variable {name!r}: backing file {spec}: empty dataset "
                                    f"name after the colon: want FILE:DATASET, e.g. {spec}/data")
            return os.path.abspath(spec[:i]) + ":" + spec[i + 1:]
    return os.path.abspath(spec)


def _is_hdf5(file):
    """An HDF5 file by its extension or, for a regular file, its signature
    (internal/source's isHDF5)."""
    if file.lower().endswith(_HDF5_EXTS):
        return True
    try:
        if not stat.S_ISREG(os.stat(file).st_mode):
            return False
        with open(file, "rb") as f:
            return f.read(8) == b"\x89HDF\r\n\x1a\n"
    except OSError:
        return False


def _not_ragged(v, op):
    if v.ragged:
        raise ArgumentError(f"ddstore: bad argument: variable {v.label!r} has ragged rows: {op} takes rows of one "
                            f"size; read it with get_ragged")


_SCOPED = re.compile(r"@s[0-9a-f]{12}(@r[0-9]+)?$")


def _check_name(name):
    try:
        n = len(name.encode()) if isinstance(name, str) else 0
    except UnicodeEncodeError as e:  # a lone surrogate
        raise ArgumentError(f"ddstore: bad argument: variable name {name!r}: not encodable as UTF-8 ({e.reason} at "
                            f"position {e.start}): want a str of 1 to 1024 bytes of UTF-8") from None
    if not 1 <= n <= 1024:
        raise ArgumentError(f"ddstore: bad argument: variable name {name!r}: want a str of 1 to 1024 bytes")
    if _SCOPED.search(name):
        raise ArgumentError(f"ddstore: bad argument: variable name {name!r}: a name may not end in @s and 12 hex "
                            f"digits, the mark of a store's scope (naming.StoreScoped)")


def _seconds(name, v):
    """A time limit in seconds: a finite number above 0 (0 would be no
    limit at all to the sockets' SO_RCVTIMEO)."""
    try:
        f = float(v)
    except (TypeError, ValueError):
        raise ArgumentError(f"ddstore: bad argument: {name} {v!r}: want a number of seconds above 0") from None
    if isinstance(v, bool) or not 0 < f < float("inf"):
        raise ArgumentError(f"ddstore: bad argument: {name} {v!r}: want a number of seconds above 0")
    return f

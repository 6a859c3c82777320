"""The Python client of ddstore: one Store per rank, attached to its node's
agent. Rows of the node are gathered straight from the mapped shared memory;
rows of other nodes cost one request per batch to the agent, which writes them
into a shared-memory receive region. No Go runs inside Python, so the store
survives fork(): a forked child reconnects on first use."""

import array
import os
import queue
from bisect import bisect_right
import socket
import stat
import threading
import time
import weakref

import numpy as np

from . import _agent, _auth, _env, _wire
from ._errors import (ArgumentError, BadBuffer, ClosedError, Error, FreedVariable, GeometryError, IndexOutOfRange,
                      NoAgent, ProtocolError, Timeout, UnknownVariable, VariableExists)
from ._shm import Region, Segment
from .dtypes import as_array, dtype_name, numpy_dtype

_MAX_ROWS_PER_READ = 1 << 20


class _Lane:
    """One connection to the agent with its own staging region; a thread
    takes a lane for each request that needs the agent."""

    __slots__ = ("sock", "req", "hdr", "stage", "broken", "unsent", "timeout")

    def __init__(self, path, hello, timeout):
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(timeout)
        self.timeout = timeout
        self.req, self.hdr, self.stage, self.broken = 0, bytearray(_wire.HEADER.size), None, False
        # unsent: the lane broke sending a request, which so never reached
        # the agent (safe to send again on a new lane: the agent restarted).
        self.unsent = False
        try:
            self.sock.connect(path)
        except OSError as e:
            self.sock.close()
            raise NoAgent(f"ddstore: no agent: connect to {path}: {e}") from None
        try:
            _auth.handshake(self, path)
            self.call(_wire.OP_HELLO, hello)
        except BaseException:
            self.close()
            raise

    def call(self, op, enc, fds=None, timeout=None):
        self.req += 1
        frame = enc.frame(op, self.req)
        try:
            # A long wait (a collective) for this request only.
            self.sock.settimeout(self.timeout if timeout is None else timeout)
            try:
                if fds:
                    self.sock.sendmsg([frame], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", fds))])
                else:
                    self.sock.sendall(frame)
            except (BrokenPipeError, ConnectionResetError, ConnectionRefusedError, ConnectionAbortedError):
                self.unsent = True
                raise
            self._recv_into(self.hdr)
            rop, status, blen, rid, payload = _wire.parse_header(self.hdr)
            body = bytearray(blen)
            if blen:
                self._recv_into(body)
        except socket.timeout:
            self.broken = True
            raise Timeout(f"ddstore: timed out: the agent did not answer op {op} in time") from None
        except (OSError, EOFError) as e:
            self.broken = True
            raise NoAgent(f"ddstore: no agent: op {op}: {e}") from None
        except ProtocolError:
            self.broken = True
            raise
        if rid != self.req or rop != op or payload:
            self.broken = True
            raise ProtocolError(f"ddstore: protocol error: reply op {rop} #{rid} to request op {op} #{self.req}")
        if status:
            raise _wire.status_error(status, body)
        return body

    def _recv_into(self, buf):
        view, n = memoryview(buf), 0
        while n < len(buf):
            k = self.sock.recv_into(view[n:])
            if k == 0:
                raise EOFError("connection closed by the agent")
            n += k

    def staging(self, nbytes, timeout):
        """A registered region of at least nbytes (grown as needed)."""
        if self.stage is not None and self.stage.size >= nbytes:
            return self.stage
        size = max(nbytes, 1 << 20)
        if self.stage is not None:
            size = max(size, 2 * self.stage.size)
            self.call(_wire.OP_UNREGISTER, _wire.Encoder().u32(self.stage.id).i64(0))
            self.stage.close()
            self.stage = None
        r = Region(size)
        try:
            r.id = register(self, r, timeout)
        except BaseException:
            r.close()
            raise
        self.stage = r
        return r

    def close(self):
        try:
            self.sock.close()
        finally:
            if self.stage is not None:
                self.stage.close()
                self.stage = None


def register(lane, region, timeout):
    body = lane.call(_wire.OP_REGISTER, _wire.Encoder().u32(0).i64(region.size), fds=[region.fd], timeout=timeout)
    d = _wire.Decoder(body)
    rid = d.u32()
    d.i64()
    d.done()
    return rid


class _Var:
    """A variable as this rank sees it."""

    __slots__ = ("name", "id", "disp", "itemsize", "rb", "dtype", "npdtype", "total", "held", "backing", "prefix",
                 "bounds", "shard_rows", "nodes", "local", "typed", "own", "segs", "single", "single_first", "profile",
                 "win")

    def __init__(self, t, own_rank):
        self.name, self.id, self.disp, self.itemsize, self.dtype = t.name, t.id, t.disp, t.itemsize, t.dtype
        self.rb = t.disp * t.itemsize
        self.shard_rows = t.shard_rows
        self.prefix = np.concatenate(([0], np.cumsum(t.shard_rows))).astype(np.int64)
        # Rows [held, total) are only in the backing file: the agent reads
        # them (owner index P below, like a rank on no node).
        self.held = int(self.prefix[-1])
        self.total = int(t.total) or self.held
        self.backing = t.backing
        self.nodes = [t.nodes[i] for i in t.rank_node]
        self.local, self.segs, self.own = [None] * len(t.shard_rows), [], None
        try:
            for r, path in enumerate(t.paths):
                if not path:
                    continue
                seg = Segment(path, writable=(r == own_rank))
                self.segs.append(seg)
                self.local[r] = seg.rows
                if r == own_rank:
                    self.own = seg.rows
        except BaseException:
            self.unmap()
            raise
        # The one local rank holding every row, when there is one: a batch
        # then needs no owner lookup at all.
        nonempty = [r for r, n in enumerate(t.shard_rows) if n > 0]
        self.single = self.local[nonempty[0]] if len(nonempty) == 1 and self.local[nonempty[0]] is not None \
            and self.total == self.held else None
        self.single_first = int(self.prefix[nonempty[0]]) if self.single is not None else 0
        # The fast path of get(): prefix sums as a list (bisect), and each
        # local shard as items of the variable's own type.
        self.bounds = [int(x) for x in self.prefix] + [self.total]
        self.npdtype = numpy_dtype(self.dtype) if self.dtype else None
        self.typed = [None] * len(self.local)
        if self.npdtype is not None:
            for r, rows in enumerate(self.local):
                if rows is not None:
                    self.typed[r] = rows.view(self.npdtype).reshape(rows.shape[0], self.disp)
        # Past the last rank: the backing file's rows, never local.
        self.local.append(None)
        self.typed.append(None)
        self.profile = {"calls": 0, "rows": 0, "bytes": 0, "local_rows": 0, "remote_rows": 0, "storage_rows": 0,
                        "remote_calls": 0, "wait_s": 0.0, "onesided_rows": 0}
        # The MPI window over the job's shards (Store(method="mpi")), or None.
        self.win = None

    def unmap(self):
        self.local = [None] * len(self.local)
        self.typed = [None] * len(self.local)
        self.own = self.single = None
        for s in self.segs:
            s.close()
        self.segs = []


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
    """

    def __init__(self, comm=None, namespace=None, *, rank=None, size=None, local_rank=None, local_size=None,
                 node=None, socket_path=None, run_dir=None, spawn=True, agent_args=(), binary=None,
                 timeout=120.0, publish_timeout=300.0, agent_wait=60.0, max_lanes=16, reader=False, width=None,
                 wait_published=None, method=None):
        from .comm import identity, world_of
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
        self.method, self._mpi = _check_method(method, comm, self.reader), None
        self._mpi_lock = threading.Lock()
        self._mpi_pid = os.getpid()  # windows are this process's: not a forked child's
        # Windows span the communicator given, so rank r of the store is
        # rank _mpi_base + r there: the group's first rank when width splits
        # it into replica groups. (Not one communicator per group: Open MPI
        # 4.1 names a window's shared-memory state by its communicator's
        # context id, which sibling groups share, so two groups with ranks
        # on one host and windows at once collide.)
        self._mpi_base = 0
        if self.method == "mpi":
            self._mpi = comm
            if width is not None and self.group is not None:
                self._mpi_base = self.group
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
            agent_args = ("--handshake-dir", handshake, *agent_args)
        self._spawn, self._agent_args, self._binary = spawn, tuple(agent_args), binary
        self._timeout, self._publish_timeout, self._agent_wait = timeout, publish_timeout, agent_wait
        self._max_lanes = max_lanes
        self._lock = threading.Lock()
        self._vars, self._freed, self._attempts, self._recv = {}, set(), {}, []
        # Receive buffers made for the library's own reuse (_recv_buffer)
        # whose arrays were collected: released at the next allocation.
        self._recv_dead = []
        self._closed = False
        self._pid = os.getpid()
        self._lanes, self._nlanes, self._lane_free = [], 0, threading.Condition(self._lock)
        # The background sender of prefetch(), started on first use.
        self._pf_queue, self._pf_thread, self._pf_error = None, None, None
        _STORES.add(self)
        self._ctl = self._connect()

    # -- connections --------------------------------------------------------

    def _hello(self):
        rank = -1 if self.reader else self._world_rank
        return (_wire.Encoder().string(self.namespace).string(self.node)
                .i64(rank, self._world_size, self.local_rank, self.local_size, os.getpid()))

    def _wire_name(self, name):
        return name if self.group is None else f"{name}@r{self.group}"

    def _connect(self):
        try:
            return _Lane(self.socket_path, self._hello(), self._timeout)
        except NoAgent:
            pass
        spawned = False
        if self._spawn and self.local_rank <= 0:
            _agent.spawn(self.namespace, self.node, self.socket_path, self._agent_args, self._binary)
            spawned = True
        # The other ranks give local rank 0 a head start, then start the agent
        # themselves (its lock keeps it one per node), as the Go library does.
        now = time.monotonic()
        grace, deadline, wait = now + min(3.0, self._agent_wait / 2), now + self._agent_wait, 0.002
        while True:
            try:
                return _Lane(self.socket_path, self._hello(), self._timeout)
            except NoAgent as e:
                if not spawned and self._spawn and time.monotonic() > grace:
                    _agent.spawn(self.namespace, self.node, self.socket_path, self._agent_args, self._binary)
                    spawned = True
                    continue
                if time.monotonic() > deadline:
                    raise NoAgent(f"ddstore: no agent: none for namespace {self.namespace!r} on node {self.node!r} answered "
                                  f"at {self.socket_path} within {self._agent_wait}s: {e}") from None
            time.sleep(wait)
            wait = min(2 * wait, 0.1)

    def _check_fork(self):
        """In a forked child, drop the parent's connections (never use them)
        and its receive regions; keep the segment mappings, which fork
        shares. Done at fork time (os.register_at_fork); this catches a
        child made without it."""
        if self._pid != os.getpid():
            self._forked()

    def _forked(self):
        """Reset a forked child's copy of the store, which only this thread
        uses yet. The parent's lock is not taken: another parent thread may
        have held it when the process forked, and its copy here would stay
        locked forever."""
        if self._pid == os.getpid():
            return
        self._lock = threading.Lock()
        self._lane_free = threading.Condition(self._lock)
        for lane in self._lanes + [self._ctl]:
            if lane is not None:
                try:
                    lane.sock.close()
                except OSError:
                    pass
                lane.stage = None  # the parent owns its regions
        self._lanes, self._nlanes, self._recv, self._recv_dead = [], 0, [], []
        self._ctl = None
        self._pf_queue = self._pf_thread = None  # the parent's thread is not in the child
        self._pid = os.getpid()

    def _control(self, op, enc, timeout=None):
        self._check_fork()
        with self._lock:
            if self._closed:
                raise ClosedError(f"ddstore: closed: store of rank {self.rank} closed")
            self._ensure_ctl()
            try:
                return self._ctl.call(op, enc, timeout=timeout or self._timeout)
            except NoAgent:
                if not self._ctl.unsent:
                    raise
            # The agent was restarted: a new control session (receive
            # buffers registered again), and the request once more.
            self._ensure_ctl()
            return self._ctl.call(op, enc, timeout=timeout or self._timeout)

    def _request(self, op, enc, timeout=None):
        """A request on a lane of the pool: a collective that waits minutes
        for other ranks holds one lane, not the store's lock."""
        self._check_fork()
        return self._with_lane(lambda lane: lane.call(op, enc, timeout=timeout or self._timeout))

    def _with_lane(self, f):
        """f(lane) on a lane of the pool. A lane found dead before its
        request left (the agent was restarted: every pooled lane is then
        dead) makes the pool drop its idle lanes, and f runs once more on a
        new one."""
        for attempt in (0, 1):
            lane = self._take_lane()
            try:
                return f(lane)
            except NoAgent:
                if attempt or not lane.unsent:
                    raise
            finally:
                self._put_lane(lane)
            with self._lock:
                idle, self._lanes = self._lanes, []
                self._nlanes -= len(idle)
                self._lane_free.notify_all()
            for lane in idle:
                lane.close()

    def _ensure_ctl(self):
        """(Re)connect the control lane; receive buffers registered on a
        session the agent dropped are registered again. Holds self._lock."""
        if self._ctl is not None and not self._ctl.broken:
            return
        lost = self._ctl is not None
        self._ctl = self._connect()
        if lost:
            for r, _ in self._recv:
                r.id = register(self._ctl, r, self._timeout)

    def _take_lane(self):
        with self._lock:
            while True:
                if self._closed:
                    raise ClosedError(f"ddstore: closed: store of rank {self.rank} closed")
                if self._lanes:
                    return self._lanes.pop()
                if self._nlanes < self._max_lanes:
                    self._nlanes += 1
                    break
                self._lane_free.wait()
        try:
            return self._connect()
        except BaseException:
            with self._lock:
                self._nlanes -= 1
            raise

    def _put_lane(self, lane):
        with self._lock:
            if lane.broken or self._closed:
                lane.close()
                self._nlanes -= 1
            else:
                self._lanes.append(lane)
            self._lane_free.notify()

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
            if a.ndim == 0:
                raise GeometryError(f"ddstore: bad geometry: variable {name!r}: a 0-d array has no rows")
            nrows = a.shape[0]
            disp = int(np.prod(a.shape[1:], dtype=np.int64)) if a.ndim > 1 else 1
            if disp < 1:
                raise GeometryError(f"ddstore: bad geometry: variable {name!r}: rows of shape {a.shape[1:]} hold no items")
            spec, total = _check_backing(name, backing, total, nrows)
        except Error as e:
            return self._create(name, None, 0, 0, 0, "", bad=e)
        return self._create(name, a, nrows, disp, a.dtype.itemsize, dt, backing=spec, total=total or 0)

    def init(self, name, nrows, disp, itemsize=1, dtype=None, *, backing=None, total=None):
        """Collective: a zero-filled shard of nrows rows of disp items
        (backing and total as for add: fill the shard with the file's rows
        from this rank's first global row, through update, before reading)."""
        dt = ""
        bad = None
        spec = ""
        if dtype is not None:
            dt = dtype_name(dtype)
            itemsize = np.dtype("uint16" if dt == "bfloat16" else dt).itemsize if dt != "bool" else 1
        if disp < 1 or not 1 <= itemsize <= 64:
            bad = GeometryError(f"ddstore: bad geometry: variable {name!r}: disp {disp}, itemsize {itemsize}: "
                                f"want disp >= 1 and itemsize 1..64")
        elif nrows < 0:
            bad = GeometryError(f"ddstore: bad geometry: variable {name!r}: {nrows} rows: want >= 0")
        else:
            try:
                spec, total = _check_backing(name, backing, total, nrows)
            except Error as e:
                bad = e
        return self._create(name, None, int(nrows), int(disp), int(itemsize), dt, bad=bad, backing=spec,
                            total=total or 0)

    def _create(self, name, a, nrows, disp, itemsize, dt, bad=None, backing="", total=0):
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
        if exists:
            raise VariableExists(f"ddstore: variable exists: variable {name!r} already exists")
        tms = int(self._publish_timeout * 1000)

        def shard(failed=False):
            return _wire.shard(_wire.Encoder(), self._wire_name(name), "", self.rank, self.size, nrows, disp, itemsize,
                               tms, attempt,
                               failed, dt, backing, total)

        def fail(err):
            try:
                self._request(_wire.OP_PUBLISH, shard(failed=True), timeout=self._publish_timeout + self._timeout)
            except Error:
                pass
            raise err

        if bad is not None:
            fail(bad)
        try:
            d = _wire.Decoder(self._request(_wire.OP_CREATE, shard()))
            path = d.string32()
            if a is not None and nrows:
                seg = Segment(path, writable=True)
                try:
                    seg.rows[...] = a.reshape(nrows, -1).view(np.uint8).reshape(nrows, disp * itemsize)
                finally:
                    seg.close()
        except Error as e:
            fail(e)
        body = self._request(_wire.OP_PUBLISH, shard(), timeout=self._publish_timeout + self._timeout)
        t = _wire.Table.decode(body)
        with self._lock:
            self._freed.discard(name)
        v = self._install(t, name)
        if self._mpi is not None:
            self._open_window(name, v)

    def _open_window(self, name, v):
        """Collective over the communicator: expose this rank's shard of v in
        an MPI window, locked for every target at once. None when no group
        has rows on more than one node. A window that some rank could not
        make is made by none: an error on every rank, the variable freed."""
        from mpi4py import MPI
        comm = self._mpi
        if not comm.allreduce(int(len(set(v.nodes)) > 1), op=MPI.MAX):
            return
        mem = v.own if v.own is not None and v.own.nbytes else MPI.BOTTOM
        win, err = None, None
        try:
            win = MPI.Win.Create(mem, 1, comm=comm)
        except MPI.Exception as e:
            err = e
        if comm.allreduce(int(win is not None), op=MPI.MIN):
            win.Lock_all(MPI.MODE_NOCHECK)
            v.win = win
            return
        if win is not None:
            win.Free()
        self.free(name)
        why = f" ({err})" if err is not None else " (on another rank)"
        raise ArgumentError(f"ddstore: bad argument: variable {name!r}: method 'mpi': MPI could not make a window of "
                            f"the shards{why}: it needs single-copy access between the processes of a node (Open "
                            f"MPI: CMA, so not OMPI_MCA_btl_vader_single_copy_mechanism=none) or RDMA between nodes; "
                            f"use method='agent'") from None

    def _close_window(self, v):
        """Collective: free v's window (before its shards are unmapped)."""
        win, v.win = v.win, None
        if win is not None and self._mpi_pid == os.getpid():
            with self._mpi_lock:
                win.Unlock_all()
                win.Free()

    def _install(self, t, name):
        v = _Var(t, -1 if self.reader else self.rank)
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
        try:
            body = self._request(_wire.OP_LOOKUP, enc)
        except UnknownVariable:
            if self._wait_published <= 0:
                raise
            body = self._wait_for(name, enc)
        return self._install(_wire.Table.decode(body), name)

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

    # -- reading ----------------------------------------------------------------

    def _dst(self, v, arr, nrows):
        """arr as a (nrows, row bytes) uint8 view, after checking its dtype,
        size and layout."""
        a, dt = as_array(arr)
        if v.dtype and dt != v.dtype:
            raise BadBuffer(f"ddstore: bad buffer: variable {v.name!r} holds {v.dtype}, destination is {dt}")
        if a.dtype.itemsize != v.itemsize:
            raise BadBuffer(f"ddstore: bad buffer: variable {v.name!r} has items of {v.itemsize} bytes, "
                            f"destination {dt} of {a.dtype.itemsize}")
        if a.size != nrows * v.disp:
            raise BadBuffer(f"ddstore: bad buffer: variable {v.name!r}: destination of {a.size} items for {nrows} "
                            f"rows of {v.disp}: want {nrows * v.disp}")
        if not a.flags.c_contiguous or not a.flags.writeable:
            raise BadBuffer(f"ddstore: bad buffer: variable {v.name!r}: destination must be C-contiguous and writable")
        return a.reshape(-1).view(np.uint8).reshape(nrows, v.rb)

    def get(self, name, arr, start=0):
        """arr.shape[0] consecutive rows from global row `start` into arr
        (the range may span several ranks' shards)."""
        if self._pid != os.getpid():
            self._check_fork()
        v = self._vars.get(name)
        # Fast path: a numpy destination of the variable's type, rows all in
        # one shard of this node (about a microsecond), or, with
        # method="mpi", in one shard of another node.
        if (v is not None and type(arr) is np.ndarray and arr.dtype == v.npdtype and arr.flags.c_contiguous
                and arr.flags.writeable):
            n = arr.shape[0] if arr.ndim else 1
            b = v.bounds
            r = bisect_right(b, start) - 1
            if 0 <= r < len(v.typed) and start >= 0 and start + n <= b[r + 1] and n > 0 and arr.size == n * v.disp:
                lo = start - b[r]
                p = v.profile
                if v.typed[r] is not None:
                    arr.reshape(n, v.disp)[...] = v.typed[r][lo:lo + n]
                    p["local_rows"] += n
                elif v.win is not None and r < len(v.shard_rows) and self._mpi_pid == os.getpid():
                    # Rows of one shard of another node: one MPI get.
                    from mpi4py import MPI
                    with self._mpi_lock:
                        t = r + self._mpi_base
                        v.win.Get([arr, MPI.BYTE], t, (lo * v.rb, n * v.rb, MPI.BYTE))
                        v.win.Flush(t)
                    p["remote_rows"] += n
                    p["onesided_rows"] += n
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
        v = self._var(name)
        a, _ = as_array(arr)
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
            _count(v, n, 0, 0.0)
            return arr
        idx = np.arange(start, start + n, dtype=np.int64)
        self._gather(v, dst, idx)
        return arr

    def get_batch(self, name, arr, indices):
        """Rows indices[i] into arr[i]: any order, repeats, any owners. Every
        index is checked before any row is read."""
        self._check_fork()
        v = self._var(name)
        idx = np.asarray(indices)
        if idx.ndim != 1 or (idx.size and idx.dtype.kind not in "iu"):
            raise ArgumentError(f"ddstore: bad argument: indices of shape {idx.shape} and type {idx.dtype}: "
                                f"want a 1-d sequence of integers")
        idx = idx.astype(np.int64, copy=False)
        dst = self._dst(v, arr, idx.shape[0])
        if idx.size:
            lo, hi = idx.min(), idx.max()
            if lo < 0 or hi >= v.total:
                i = int(np.flatnonzero((idx < 0) | (idx >= v.total))[0])
                raise IndexOutOfRange(f"ddstore: index out of range: variable {name!r}: indices[{i}] = {int(idx[i])} "
                                      f"not in [0, {v.total})")
        self._gather(v, dst, idx)
        return arr

    def _gather(self, v, dst, idx):
        t0 = time.perf_counter()
        n = idx.shape[0]
        if n == 0:
            return
        src = v.single
        if src is not None:
            first = v.single_first
            _copy_rows(dst, src, idx - first if first else idx)
            _count(v, n, 0, 0.0)
            return
        owner = np.searchsorted(v.prefix, idx, side="right") - 1
        o0 = int(owner[0])
        if (owner == o0).all():  # the common case: one owner for the batch
            src = v.local[o0]
            if src is not None:
                first = v.bounds[o0]
                _copy_rows(dst, src, idx - first if first else idx)
                _count(v, n, 0, 0.0)
                return
            remote = [np.arange(n)]
        else:
            remote = []
            for r in np.unique(owner).tolist():
                pos = np.flatnonzero(owner == r)
                src = v.local[r]
                if src is None:
                    remote.append(pos)
                else:
                    _copy_rows(dst, src, idx[pos] - v.bounds[r], pos)
        nremote = 0
        if remote:
            pos = np.concatenate(remote) if len(remote) > 1 else remote[0]
            nremote = pos.shape[0]
            if v.total > v.held:
                v.profile["storage_rows"] += int(np.count_nonzero(idx[pos] >= v.held))
            if v.win is not None and self._mpi_pid == os.getpid():
                pos = self._get_onesided(v, dst, idx, pos, owner)
            for lo in range(0, pos.shape[0], _MAX_ROWS_PER_READ):
                self._fetch(v, dst, idx, pos[lo:lo + _MAX_ROWS_PER_READ])
        _count(v, n, nremote, time.perf_counter() - t0 if nremote else 0.0)

    def _get_onesided(self, v, dst, idx, pos, owner):
        """Rows idx[pos] of other nodes' shards into dst[pos] by MPI gets from
        this process: a get per row, or from _MPI_TYPED_ROWS rows one get
        per owner of indexed datatypes; then one flush. Returns the
        positions left for the agent (rows only the backing file holds)."""
        from mpi4py import MPI
        own = owner[pos]
        mem = own < len(v.shard_rows)
        p, o = pos[mem], own[mem]
        k = p.shape[0]
        if k:
            rb, win, byte = v.rb, v.win, MPI.BYTE
            offs = (idx[p] - v.prefix[o]) * rb
            o = o + self._mpi_base  # ranks in the window's communicator
            with self._mpi_lock:
                if k < _MPI_TYPED_ROWS:
                    get = win.Get
                    for i, r, off in zip(p.tolist(), o.tolist(), offs.tolist()):
                        get([dst[i], byte], r, (off, rb, byte))
                else:
                    # One get per owner: rows gathered at both ends by
                    # indexed datatypes (far fewer calls into MPI).
                    base = dst.reshape(-1)
                    for r in np.unique(o).tolist():
                        sel = o == r
                        here = MPI.BYTE.Create_hindexed_block(rb, (p[sel] * rb).tolist()).Commit()
                        there = MPI.BYTE.Create_hindexed_block(rb, offs[sel].tolist()).Commit()
                        try:
                            win.Get([base, 1, here], r, (0, 1, there))
                        finally:
                            here.Free()
                            there.Free()
                win.Flush_all()
            v.profile["onesided_rows"] += k
        return pos[~mem]

    def _fetch(self, v, dst, idx, pos):
        """Rows idx[pos] from other nodes into dst[pos]: one request to the
        agent, rows written into a registered region (the destination itself
        when it lies in a buffer from alloc_recv)."""
        rb = v.rb
        k = pos.shape[0]
        region, base = self._recv_of(dst)

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

        try:
            self._with_lane(read)
        except ArgumentError as e:
            if region is None or "receive region" not in str(e):
                raise
            # The agent no longer knows the buffer (it was restarted, or
            # dropped the control session): register the buffers again on
            # a new session, and read once more.
            with self._lock:
                if self._ctl is not None:
                    self._ctl.broken = True
                self._ensure_ctl()
            self._with_lane(read)

    def _recv_of(self, dst):
        if not self._recv:
            return None, 0
        p = dst.__array_interface__["data"][0]
        n = dst.nbytes
        for r, base_ptr in self._recv:
            if base_ptr <= p and p + n <= base_ptr + r.size:
                return r, p - base_ptr
        return None, 0

    # -- receive buffers ------------------------------------------------------

    def alloc_recv(self, shape, dtype=np.uint8):
        """A numpy array in shared memory that the agent writes rows of other
        nodes into directly: reads into it (or a slice) skip a copy."""
        dt = np.dtype(dtype)
        n = int(np.prod(shape, dtype=np.int64)) * dt.itemsize
        if n <= 0:
            raise ArgumentError(f"ddstore: bad argument: receive buffer of shape {shape}: want > 0 bytes")
        self._release_dead()
        r = Region(n)
        a = r.array()[:n].view(dt).reshape(shape)
        try:
            with self._lock:
                self._ensure_ctl()
                r.id = register(self._ctl, r, self._timeout)
                self._recv.append((r, a.__array_interface__["data"][0]))
        except BaseException:
            r.close()
            raise
        return a

    def _recv_buffer(self, shape, dtype):
        """A receive buffer (alloc_recv) released by itself once its array
        and every view of it are gone: for buffers the library reuses (a
        data loader's batches). The release waits for the next allocation,
        as a collector may run it while this thread holds the lock."""
        a = self.alloc_recv(shape, dtype)
        weakref.finalize(a, self._recv_dead.append, a.__array_interface__["data"][0])
        return a

    def _release_dead(self):
        while self._recv_dead:
            try:
                self._drop_recv(self._recv_dead.pop())  # False: freed already (close, fork)
            except Error:
                pass  # the agent is gone or restarting: nothing to unregister

    def _drop_recv(self, p):
        """Unregister and unmap the receive buffer at address p; False if
        there is none. Found and taken out under the lock: freed twice at
        once, freed once."""
        with self._lock:
            i = next((i for i, (_, base_ptr) in enumerate(self._recv) if base_ptr == p), None)
            r = self._recv.pop(i)[0] if i is not None else None
        if r is None:
            return False
        try:
            self._control(_wire.OP_UNREGISTER, _wire.Encoder().u32(r.id).i64(0))
        finally:
            r.close()
        return True

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
        if not self._drop_recv(np.asarray(arr).__array_interface__["data"][0]):
            raise BadBuffer("ddstore: bad buffer: not a buffer returned by alloc_recv")

    # -- updating, describing, freeing -----------------------------------------

    def update(self, name, arr, offset=0):
        """Overwrite rows of this rank's own shard from row `offset` on."""
        self._check_fork()
        v = self._var(name)
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

    def info(self, name):
        """(total rows, disp, itemsize), as DDStore's info()."""
        v = self._var(name)
        return v.total, v.disp, v.itemsize

    def describe(self, name):
        """Everything known of a variable: geometry, dtype, shards, nodes,
        and its backing file ("" for none) with the rows the shards hold."""
        v = self._var(name)
        return {"name": name, "total_rows": v.total, "disp": v.disp, "itemsize": v.itemsize, "dtype": v.dtype,
                "shard_rows": [int(x) for x in v.shard_rows], "nodes": list(v.nodes), "backing": v.backing,
                "held_rows": v.held}

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
        self._check_fork()
        v = self._var(name)
        if not v.backing:
            raise ArgumentError(f"ddstore: bad argument: variable {name!r} has no backing file: its rows are all in "
                                f"memory, there is nothing to prefetch")
        idx = np.asarray(indices)
        if idx.ndim != 1 or (idx.size and idx.dtype.kind not in "iu"):
            raise ArgumentError(f"ddstore: bad argument: indices of shape {idx.shape} and type {idx.dtype}: "
                                f"want a 1-d sequence of integers")
        idx = idx.astype(np.int64, copy=False)
        if idx.size and (idx.min() < 0 or idx.max() >= v.total):
            i = int(np.flatnonzero((idx < 0) | (idx >= v.total))[0])
            raise IndexOutOfRange(f"ddstore: index out of range: variable {name!r}: indices[{i}] = {int(idx[i])} "
                                  f"not in [0, {v.total})")
        idx = idx[idx >= v.held]
        err, self._pf_error = self._pf_error, None
        if err is not None:
            raise err
        if not idx.size:
            return
        enc = _wire.Encoder().string(v.name).i64(v.id).i64s(idx)
        if wait:
            self._request(_wire.OP_PREFETCH, enc)
            return
        with self._lock:
            if self._pf_queue is None:
                self._pf_queue = queue.SimpleQueue()
                self._pf_thread = threading.Thread(target=self._prefetcher, args=(self._pf_queue,), daemon=True,
                                                   name=f"ddstore-prefetch-{self.rank}")
                self._pf_thread.start()
            q = self._pf_queue
        q.put(enc)

    def _prefetcher(self, q):
        """Sends the Prefetch requests prefetch() queues, until close()."""
        while True:
            enc = q.get()
            if enc is None:
                return
            try:
                self._request(_wire.OP_PREFETCH, enc)
            except Error as e:
                self._pf_error = e

    def get_profile(self, name):
        return dict(self._var(name).profile)

    def epoch_begin(self):
        """Accepted for DDStore code; reads need no fence here."""
        if self._closed:
            raise ClosedError(f"ddstore: closed: store of rank {self.rank} closed")

    epoch_end = epoch_begin

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
        method="mpi": the windows are freed)."""
        self._close(collective=True)

    def _close(self, collective):
        q, t = self._pf_queue, self._pf_thread
        if q is not None and self._pid == os.getpid():
            q.put(None)  # the prefetcher sends what was queued, then ends
            t.join(self._timeout)
        with self._lock:
            if self._closed:
                return
            self._closed = True
            vars_, self._vars = self._vars, {}
            lanes, self._lanes = self._lanes, []
            ctl, self._ctl = self._ctl, None
            recv, self._recv = self._recv, []
            self._lane_free.notify_all()
        for v in vars_.values():
            if v.win is not None and not collective:
                # Not collective (a store collected as garbage): the window
                # and the mapping it exposes stay until the process ends, as
                # other ranks may still read them.
                _KEPT_WINDOWS.append(v)
                continue
            self._close_window(v)
            v.unmap()
        own = self._pid == os.getpid()
        for lane in lanes + ([ctl] if ctl else []):
            if own:
                lane.close()
            else:
                lane.sock.close()
        for r, _ in recv:
            r.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __del__(self):
        try:
            self._close(collective=False)
        except Exception:
            pass


def _copy_rows(dst, src, loc, pos=None):
    """dst[i] = src[loc[i]] (dst[pos[i]] = src[loc[i]] when pos is given),
    as fast as numpy goes: rows under 1 KiB are taken as single items of a
    row-sized void dtype (numpy copies an item with one memcpy, not byte by
    byte); fancy indexing through a temporary beats take(out=) while the
    temporary stays small (hot in cache and allocator); past 32 KiB a row is
    large enough for a loop of copies, each row copied once, straight into
    its place."""
    rb = src.shape[1]
    if rb < 1024:
        row = np.dtype((np.void, rb))
        s, d = src.view(row).reshape(-1), dst.view(row).reshape(-1)
        if pos is None:
            s.take(loc, out=d[:loc.shape[0]])
        else:
            d[pos] = s.take(loc)
        return
    if rb >= (32 << 10):
        if pos is None:
            for i, j in enumerate(loc.tolist()):
                dst[i] = src[j]
        else:
            for i, j in zip(pos.tolist(), loc.tolist()):
                dst[i] = src[j]
        return
    step = max(1, (1 << 20) // rb)
    for a in range(0, loc.shape[0], step):
        if pos is None:
            dst[a:a + step] = src[loc[a:a + step]]
        else:
            dst[pos[a:a + step]] = src[loc[a:a + step]]


def _count(v, rows, remote, wait):
    p = v.profile
    p["calls"] += 1
    p["rows"] += rows
    p["bytes"] += rows * v.rb
    p["local_rows"] += rows - remote
    if remote:
        p["remote_rows"] += remote
        p["remote_calls"] += 1
        p["wait_s"] += wait


# From this many rows a one-sided read moves each owner's rows with one get
# of indexed datatypes rather than a get per row (Store(method="mpi")).
_MPI_TYPED_ROWS = 8

# Every open Store, reset in a forked child before any thread of the child
# can touch it.
_STORES = weakref.WeakSet()

# Variables whose MPI window a store closed without its ranks together
# (garbage collection) left open: kept, mapped, until the process ends.
_KEPT_WINDOWS = []


def _check_method(method, comm, reader):
    """The read method Store(method=) names: "agent" or "mpi"."""
    if method is None or method == "agent":
        return "agent"
    if method != "mpi":
        raise ArgumentError(f"ddstore: bad argument: method {method!r}: want 'agent' or 'mpi'")
    if reader:
        raise ArgumentError("ddstore: bad argument: method 'mpi' with reader=True: a reader is not in the publishing "
                            "job's communicator; it reads through the agent")
    if not hasattr(comm, "Split_type"):
        raise ArgumentError(f"ddstore: bad argument: method 'mpi' needs an mpi4py communicator as comm, not "
                            f"{type(comm).__name__}")
    return "mpi"


def _after_fork_in_child():
    for s in list(_STORES):
        s._forked()


os.register_at_fork(after_in_child=_after_fork_in_child)

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


def _check_name(name):
    if not isinstance(name, str) or not 1 <= len(name.encode()) <= 1024:
        raise ArgumentError(f"ddstore: bad argument: variable name {name!r}: want a str of 1 to 1024 bytes")

"""A store's connections to its node's agent, and what becomes of them in a
forked child.

A lane is one connection with its own staging region. The pool keeps a
control lane (registrations, unregistrations: requests that must share one
agent session with the receive buffers they name) and up to max_lanes lanes
for everything else, taken by one thread per request, so that a collective
waiting minutes for other ranks holds one lane and not the store.

No Go runs inside Python, so a store survives fork(): the child drops the
parent's connections (never uses them) at fork time and connects again on
first use."""

import array
import os
import socket
import threading
import time
import weakref

from . import _agent, _auth, _wire
from ._errors import ClosedError, NoAgent, ProtocolError, RegionLost, Timeout
from ._shm import Region


class Lane:
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
            self._send(frame, fds)
            rop, status, rid, payload, body = self._reply()
        except BaseException as e:
            self._failed(op, e)
        if rid != self.req or rop != op or payload:
            self.broken = True
            raise ProtocolError(f"ddstore: protocol error: reply op {rop} #{rid} to request op {op} #{self.req}")
        if status:
            raise _wire.status_error(status, body)
        return body

    def calls(self, op, encs):
        """Requests op of each of encs, pipelined: sent at once, the
        replies read in turn (the agent serves a connection's requests in
        order). The first error answered is raised once every reply is
        read, so that the lane stays in step."""
        if len(encs) == 1:
            return self.call(op, encs[0])
        first = self.req + 1
        frames = b"".join(enc.frame(op, first + k) for k, enc in enumerate(encs))
        self.req += len(encs)
        err = None
        try:
            self.sock.settimeout(self.timeout)
            self._send(frames, None)
            for k in range(len(encs)):
                rop, status, rid, payload, body = self._reply()
                if rid != first + k or rop != op or payload:
                    self.broken = True
                    raise ProtocolError(f"ddstore: protocol error: reply op {rop} #{rid} to request op {op} "
                                        f"#{first + k}")
                if status and err is None:
                    err = _wire.status_error(status, body)
        except BaseException as e:
            self._failed(op, e)
        if err is not None:
            raise err

    def _send(self, frames, fds):
        try:
            if fds:
                self.sock.sendmsg([frames], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", fds))])
            else:
                self.sock.sendall(frames)
        except (BrokenPipeError, ConnectionResetError, ConnectionRefusedError, ConnectionAbortedError):
            # Never reached the agent: safe to send again on a new lane.
            self.unsent = True
            raise

    def _failed(self, op, e):
        """Raise what a request op that failed with e means: a timeout, a
        lost agent or a protocol error break the lane (out of step with the
        agent); anything else is raised as it is."""
        if isinstance(e, socket.timeout):
            self.broken = True
            raise Timeout(f"ddstore: timed out: the agent did not answer op {op} in time") from None
        if isinstance(e, (OSError, EOFError)):
            self.broken = True
            raise NoAgent(f"ddstore: no agent: op {op}: {e}") from None
        if isinstance(e, ProtocolError):
            self.broken = True
        raise e

    def _reply(self):
        """A reply's header and body: (op, status, id, payload bytes, body)."""
        self._recv_into(self.hdr)
        rop, status, blen, rid, payload = _wire.parse_header(self.hdr)
        body = bytearray(blen)
        if blen:
            self._recv_into(body)
        return rop, status, rid, payload, body

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

    def drop(self):
        """Close the connection only: a forked child's copy of a lane whose
        staging region is the parent's."""
        try:
            self.sock.close()
        except OSError:
            pass
        self.stage = None


def register(lane, region, timeout):
    """Register a shared-memory region with the agent on lane's session;
    returns its id."""
    body = lane.call(_wire.OP_REGISTER, _wire.Encoder().u32(0).i64(region.size), fds=[region.fd], timeout=timeout)
    d = _wire.Decoder(body)
    rid = d.u32()
    d.i64()
    d.done()
    return rid


class Agent:
    """Where a store's agent is and how to start one: the socket, the hello
    every lane opens with, and spawn's arguments."""

    __slots__ = ("namespace", "node", "socket_path", "hello", "timeout", "wait", "spawn", "local_rank", "args",
                 "binary", "env")

    def __init__(self, namespace, node, socket_path, hello, timeout, wait, spawn, local_rank, args, binary, env=None):
        self.namespace, self.node, self.socket_path, self.hello = namespace, node, socket_path, hello
        self.timeout, self.wait, self.spawn, self.local_rank = timeout, wait, spawn, local_rank
        self.args, self.binary, self.env = args, binary, env

    def connect(self):
        """A new lane, starting the node's agent when none answers."""
        try:
            return Lane(self.socket_path, self.hello(), self.timeout)
        except NoAgent:
            pass
        spawned = False
        if self.spawn and self.local_rank <= 0:
            _agent.spawn(self.namespace, self.node, self.socket_path, self.args, self.binary, self.env)
            spawned = True
        # The other ranks give local rank 0 a head start, then start the agent
        # themselves (its lock keeps it one per node), as the Go library does.
        now = time.monotonic()
        grace, deadline, wait = now + min(3.0, self.wait / 2), now + self.wait, 0.002
        while True:
            try:
                return Lane(self.socket_path, self.hello(), self.timeout)
            except NoAgent as e:
                if not spawned and self.spawn and time.monotonic() > grace:
                    _agent.spawn(self.namespace, self.node, self.socket_path, self.args, self.binary, self.env)
                    spawned = True
                    continue
                if time.monotonic() > deadline:
                    raise NoAgent(f"ddstore: no agent: none for namespace {self.namespace!r} on node {self.node!r} "
                                  f"answered at {self.socket_path} within {self.wait}s: {e}") from None
            time.sleep(wait)
            wait = min(2 * wait, 0.1)


class LanePool:
    """The control lane and the pool of lanes of one store.

    lock guards the pool and, shared with the store, the store's own state
    (its variables, its receive buffers, closed). on_reconnect(ctl) runs,
    under lock, when a new control session replaces one the agent dropped:
    the receive buffers (RecvBuffers, which sets it) are registered again
    there."""

    def __init__(self, agent, max_lanes, rank):
        self.agent, self.max_lanes, self.rank = agent, max_lanes, rank
        self.on_reconnect = None
        self.lock = threading.Lock()
        self.free = threading.Condition(self.lock)
        self.lanes, self.nlanes = [], 0
        self.closed = False
        self.ctl = agent.connect()

    def closed_error(self):
        return ClosedError(f"ddstore: closed: store of rank {self.rank} closed")

    def control(self, op, enc, timeout):
        """A request on the control lane."""
        with self.lock:
            if self.closed:
                raise self.closed_error()
            self.ensure_ctl()
            try:
                return self.ctl.call(op, enc, timeout=timeout)
            except NoAgent:
                if not self.ctl.unsent:
                    raise
            # The agent was restarted: a new control session (receive
            # buffers registered again), and the request once more.
            self.ensure_ctl()
            return self.ctl.call(op, enc, timeout=timeout)

    def ensure_ctl(self):
        """(Re)connect the control lane. Holds self.lock."""
        if self.ctl is not None and not self.ctl.broken:
            return
        lost = self.ctl is not None
        self.ctl = self.agent.connect()
        if lost and self.on_reconnect is not None:
            self.on_reconnect(self.ctl)

    def renew_ctl(self):
        """A new control session, though the old one answers: the agent no
        longer knows what was registered on it."""
        with self.lock:
            if self.ctl is not None:
                self.ctl.broken = True
            self.ensure_ctl()

    def with_lane(self, f):
        """f(lane) on a lane of the pool. A lane found dead before its
        request left (the agent was restarted: every pooled lane is then
        dead) makes the pool drop its idle lanes, and f runs once more on a
        new one."""
        for attempt in (0, 1):
            lane = self.take()
            try:
                return f(lane)
            except NoAgent:
                if attempt or not lane.unsent:
                    raise
            finally:
                self.put(lane)
            with self.lock:
                idle, self.lanes = self.lanes, []
                self.nlanes -= len(idle)
                self.free.notify_all()
            for lane in idle:
                lane.close()

    def read(self, read, region):
        """read(lane) on a lane, for a read into region (a registered
        receive region, or None for one through staging). When the agent no
        longer holds region (the session that registered it ended, or the
        agent was restarted), the buffers are registered again on a new
        session and read runs once more; an error of that read stands."""
        try:
            return self.with_lane(read)
        except RegionLost:
            if region is None:
                raise
            self.renew_ctl()
            return self.with_lane(read)

    def take(self):
        with self.lock:
            while True:
                if self.closed:
                    raise self.closed_error()
                if self.lanes:
                    return self.lanes.pop()
                if self.nlanes < self.max_lanes:
                    self.nlanes += 1
                    break
                self.free.wait()
        try:
            return self.agent.connect()
        except BaseException:
            with self.lock:
                self.nlanes -= 1
            raise

    def put(self, lane):
        with self.lock:
            if lane.broken or self.closed:
                lane.close()
                self.nlanes -= 1
            else:
                self.lanes.append(lane)
            self.free.notify()

    def shut(self):
        """Mark the pool closed and take its lanes out; returns them, to be
        closed (close_lanes) once the store has let go of the lock. Holds
        self.lock."""
        self.closed = True
        lanes, self.lanes = self.lanes, []
        ctl, self.ctl = self.ctl, None
        self.free.notify_all()
        return lanes + ([ctl] if ctl else [])

    def forked(self):
        """Reset a forked child's copy of the pool, which only this thread
        uses yet. The parent's lock is not taken: another parent thread may
        have held it when the process forked, and its copy here would stay
        locked forever."""
        self.lock = threading.Lock()
        self.free = threading.Condition(self.lock)
        for lane in self.lanes + [self.ctl]:
            if lane is not None:
                lane.drop()  # the parent owns its regions
        self.lanes, self.nlanes, self.ctl = [], 0, None


def close_lanes(lanes, own):
    """Close lanes a pool gave up (shut); a forked child's copies only
    drop their connections."""
    for lane in lanes:
        if own:
            lane.close()
        else:
            lane.sock.close()


# Every open Store, reset in a forked child before any thread of the child
# can touch it.
_STORES = weakref.WeakSet()


def track(store):
    """Reset store (store._forked()) in every child this process forks."""
    _STORES.add(store)


def _after_fork_in_child():
    for s in list(_STORES):
        s._forked()


os.register_at_fork(after_in_child=_after_fork_in_child)

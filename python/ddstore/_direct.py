"""Direct reads (docs/design.md, Reading): a small read whose rows are all on
one other node goes straight to that node's agent, on its peer port, over a
pooled TCP connection that proved the job's direct key (docs/protocol.md,
Authentication): one network round trip, the rows received into the
destination. The owner checks the variable's name and table id as for its
peers; on any failure (no key, no address, a refused or broken connection,
an error reply) the caller reads through its own agent instead, which gives
that path's answer. When a connection to an owner failed and the read
through the own agent then worked, the owner may have moved (its agent
restarted on another port): the store looks the variable up again for its
owners' addresses (Store._readdress, at most once per failure), so that
direct reads resume at the new one. A connection unused for `idle` seconds is closed; a
forked child opens its own (the parent's are closed in the child, never
used)."""

import hmac
import os
import socket
import struct
import threading
import time

import numpy as np

from . import _auth, _wire
from ._errors import ArgumentError
from ._vars import distinct

# The largest read sent direct (bytes of rows of other nodes), as the Go
# client's DirectMaxBytes; DDSTORE_DIRECT_MAX_BYTES overrides it (0: never).
MAX_BYTES = 1 << 20
MAX_ENV = "DDSTORE_DIRECT_MAX_BYTES"
IDLE = 10.0  # seconds an unused connection stays open
RETRY = 5.0  # seconds an address that failed (or a missing key) is left alone
MAX_IDLE = 4  # idle connections kept per owner node

OP_DIRECT_KEY = 15  # client protocol: the direct key, from the own agent
OP_DIRECT_AUTH, OP_DIRECT_AUTH_PROOF = 51, 52  # peer protocol: the direct handshake
OP_FETCH, OP_FETCH_RANGE = 35, 45  # peer protocol: rows


def max_bytes():
    v = os.environ.get(MAX_ENV, "")
    if not v:
        return MAX_BYTES
    try:
        n = int(v)
    except ValueError:
        n = -1
    if n < 0:
        from ._errors import ArgumentError
        raise ArgumentError(f"ddstore: bad argument: {MAX_ENV}={v!r}: want a number of bytes >= 0")
    return n


_TIMEVAL = struct.Struct("@ll")
_HEADER, _HLEN, _MAGIC, _VERSION = _wire.HEADER, _wire.HEADER.size, _wire.MAGIC, _wire.VERSION
_RANGE = struct.Struct("<qqq")  # FetchRange after its name: id, start, count
_FETCH = struct.Struct("<qI")  # Fetch after its name: id, count of globals


def _pieces(jobs):
    """jobs in runs of at most PIPELINE_BYTES of requests each."""
    part, size = [], 0
    for j in jobs:
        b = _wire.HEADER.size + len(j.body)
        if part and size + b > PIPELINE_BYTES:
            yield part
            part, size = [], 0
        part.append(j)
        size += b
    if part:
        yield part


class Failed(Exception):
    """A direct read did not happen; the caller reads through its agent."""


class Job:
    """One read of a batch of reads (Pool.run_jobs): a request to the agent
    at addr (None: one for the own agent only) and where its reply's rows go
    (want bytes into dst); place() (or None) then puts them where they
    belong, done() counts them (waited since t0), and fallback() reads them
    through the own agent instead when the direct read did not happen."""

    __slots__ = ("addr", "op", "body", "dst", "want", "rows", "v", "place", "done", "fallback", "t0")

    def __init__(self, addr, op, body, dst, want, v, rows, place=None):
        self.addr, self.op, self.body, self.dst, self.want = addr, op, body, dst, want
        self.v, self.rows, self.place = v, rows, place
        self.done = self.fallback = None
        self.t0 = 0.0  # when the read began to wait (its profile's wait_s counts from it)


def agent_job(fallback):
    """A Job for the own agent only: fallback() is the read."""
    j = Job(None, 0, b"", None, 0, None, 0)
    j.fallback = fallback
    return j


# Bytes of requests sent together on one connection before their replies
# are read: well under a socket's receive buffer, so that the owner, which
# answers each before it reads the next, never blocks the sender.
PIPELINE_BYTES = 32 << 10


class Conn:
    __slots__ = ("addr", "sock", "req", "hdr", "used")

    def __init__(self, addr, key, timeout):
        host, _, port = addr.rpartition(":")
        self.addr, self.req, self.hdr, self.used = addr, 0, bytearray(_wire.HEADER.size), 0.0
        self.sock = socket.create_connection((host.strip("[]") or "127.0.0.1", int(port)), timeout=min(timeout, 5.0))
        try:
            self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            self._handshake(key)
            # Blocking, bounded by the kernel (SO_RCVTIMEO, SO_SNDTIMEO):
            # no poll() before each send and receive, as a Python timeout
            # costs; a peer that stops answering fails the read.
            self.sock.settimeout(None)
            tv = _TIMEVAL.pack(int(timeout), int((timeout % 1) * 1e6))
            self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO, tv)
            self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDTIMEO, tv)
        except BaseException:
            self.sock.close()
            raise

    def _call(self, op, enc):
        """One request, its reply's (status, body, payload length)."""
        self.req += 1
        self.sock.sendall(enc.frame(op, self.req))
        self._recv_into(self.hdr)
        rop, status, blen, rid, payload = _wire.parse_header(self.hdr)
        body = bytearray(blen)
        if blen:
            self._recv_into(body)
        if rid != self.req or rop != op:
            raise Failed(f"reply op {rop} #{rid} to op {op} #{self.req} from {self.addr}")
        return status, body, payload

    def _handshake(self, key):
        ni = os.urandom(_auth.NONCE)
        e = _wire.Encoder()
        e.b += ni
        status, body, _ = self._call(OP_DIRECT_AUTH, e)
        if status or len(body) != _auth.NONCE + 32:
            raise Failed(f"direct handshake refused by {self.addr}")
        nr, theirs = bytes(body[:_auth.NONCE]), bytes(body[_auth.NONCE:])
        if not hmac.compare_digest(theirs, _auth.mac(key, "direct", "responder", ni, nr)):
            raise Failed(f"the agent at {self.addr} does not hold the direct key")
        e = _wire.Encoder()
        e.b += _auth.mac(key, "direct", "initiator", ni, nr)
        status, body, _ = self._call(OP_DIRECT_AUTH_PROOF, e)
        if status or body:
            raise Failed(f"direct proof refused by {self.addr}")

    def _recv_into(self, buf):
        view, n = memoryview(buf).cast("B"), 0
        while n < len(view):
            k = self.sock.recv_into(view[n:])
            if k == 0:
                raise EOFError(f"connection to {self.addr} closed")
            n += k

    def read(self, op, body, dst, want):
        """op (its body's bytes) and its reply's rows (want bytes) into dst
        (a writable contiguous buffer of bytes): the header and the rows in
        one receive when they come together."""
        self.req = rid = self.req + 1
        self.sock.sendall(_HEADER.pack(_MAGIC, _VERSION, op, 0, 0, len(body), 0, rid, 0) + body)
        self._reply(op, rid, dst, want)

    def send_many(self, jobs):
        """The jobs' requests sent together; returns the first one's id, for
        recv_many (the owner answers a connection's fetches one after the
        other, in order)."""
        frames, first = [], self.req + 1
        for j in jobs:
            self.req += 1
            frames.append(_HEADER.pack(_MAGIC, _VERSION, j.op, 0, 0, len(j.body), 0, self.req, 0))
            frames.append(j.body)
        self.sock.sendall(b"".join(frames))
        return first

    def recv_many(self, jobs, first):
        """The replies to send_many's requests, in order, each job's rows
        into its dst. Returns whether each was read (False: the owner
        answered an error; the connection stays sound); a broken connection
        raises."""
        ok = []
        for k, j in enumerate(jobs):
            try:
                self._reply(j.op, first + k, j.dst, j.want)
            except Failed:
                ok.append(False)
            else:
                ok.append(True)
        return ok

    def _reply(self, op, rid, dst, want):
        """The reply to request rid (op) and its want bytes of rows into dst."""
        hdr = self.hdr
        n = self.sock.recvmsg_into([hdr, dst])[0]
        if n < _HLEN:
            self._recv_into(memoryview(hdr)[n:])  # raises at EOF
            n = _HLEN
        magic, version, rop, status, r1, blen, r2, rrid, payload = _HEADER.unpack(hdr)
        if magic != _MAGIC or version != _VERSION or r1 or r2 or blen > _wire.MAX_BODY:
            _wire.parse_header(hdr)  # raises, naming what is wrong
        got = n - _HLEN  # bytes already in dst: rows, or an error's body
        if rrid != rid or rop != op:
            raise OSError(f"reply op {rop} #{rrid} to op {op} #{rid} from {self.addr}")
        if status:
            if payload:
                raise OSError(f"error reply from {self.addr} with {payload} payload bytes")
            b = bytearray(blen)
            b[:got] = memoryview(dst).cast("B")[:got]
            if blen > got:
                self._recv_into(memoryview(b)[got:])
            raise Failed(str(_wire.status_error(status, b)))  # the connection stays sound
        if blen or payload != want:
            raise OSError(f"{self.addr} sent a body of {blen} bytes and {payload} row bytes, want none and {want}")
        if got < want:
            self._recv_into(memoryview(dst).cast("B")[got:])

    def close(self):
        try:
            self.sock.close()
        except OSError:
            pass


class Pool:
    """A store's direct connections, by owner address. key() asks the own
    agent for the direct key (raises when it cannot)."""

    def __init__(self, key, timeout, enabled):
        self._key_of, self.timeout = key, timeout
        self.max = max_bytes() if enabled else 0
        self.idle_for = IDLE
        self._reset()

    def _reset(self):
        self.lock = threading.Lock()
        self.key, self.key_retry = None, 0.0
        self.idle, self.bad = {}, {}
        self.timer, self.closed = None, False
        self.names = {}
        # addr: when a connection to it last failed (dial or a broken
        # reply), for Store._readdress; dropped once one to it served a
        # request again.
        self.moved = {}

    def _take(self, addr):
        now = time.monotonic()
        with self.lock:
            if self.closed or self.bad.get(addr, 0.0) > now:
                return None
            cs = self.idle.get(addr)
            if cs:
                return cs.pop(), True
            key = self.key
            if key is None and self.key_retry > now:
                return None
        if key is None:
            try:
                key = bytes(self._key_of())
            except ArgumentError:  # no key in this job (rows move over another transport): never ask again
                with self.lock:
                    self.key_retry = float("inf")
                return None
            except Exception:
                with self.lock:
                    self.key_retry = time.monotonic() + RETRY
                return None
            with self.lock:
                self.key = key
        try:
            return Conn(addr, key, self.timeout), False
        except Exception:
            self._mark_bad(addr)
            self._note_moved(addr)
            return None

    def _put(self, c):
        c.used = time.monotonic()
        with self.lock:
            # A connection that served its request: an earlier failure of
            # its address no longer says the owner moved, nor that it is
            # down.
            if self.moved:
                self.moved.pop(c.addr, None)
            if self.bad:
                self.bad.pop(c.addr, None)
            cs = self.idle.setdefault(c.addr, [])
            if self.closed or len(cs) >= MAX_IDLE:
                c.close()
                return
            cs.append(c)
            if self.timer is None:
                self.timer = threading.Timer(self.idle_for, self._sweep)
                self.timer.daemon = True
                self.timer.start()

    def _sweep(self):
        with self.lock:
            self.timer = None
            if self.closed:
                return
            now, nxt = time.monotonic(), None
            for addr in list(self.idle):
                kept = []
                for c in self.idle[addr]:
                    left = self.idle_for - (now - c.used)
                    if left > 0:
                        kept.append(c)
                        nxt = left if nxt is None else min(nxt, left)
                    else:
                        c.close()
                if kept:
                    self.idle[addr] = kept
                else:
                    del self.idle[addr]
            if nxt is not None:
                self.timer = threading.Timer(nxt, self._sweep)
                self.timer.daemon = True
                self.timer.start()

    def _drop_idle(self, addr):
        with self.lock:
            cs = self.idle.pop(addr, [])
        for c in cs:
            c.close()

    def _mark_bad(self, addr):
        with self.lock:
            self.bad[addr] = time.monotonic() + RETRY
        self._drop_idle(addr)

    def _note_moved(self, addr):
        with self.lock:
            self.moved[addr] = time.monotonic()

    def moved_since(self, addrs, t):
        """Whether a connection to one of addrs failed after time t."""
        m = self.moved
        return any(m.get(a, 0.0) > t for a in set(addrs))

    def _run(self, addr, op, body, dst, want):
        with self.lock:
            cs = self.idle.get(addr)
            c = cs.pop() if cs and not self.closed else None
        if c is not None:
            reused = True
        else:
            got = self._take(addr)
            if got is None:
                return False
            c, reused = got
        try:
            c.read(op, body, dst, want)
        except Failed:
            self._put(c)  # the owner answered: the connection is sound
            return False
        except Exception:
            self._broken(c, addr, reused)
            return False
        self._put(c)
        return True

    def _name(self, v):
        """v's name as a wire String, kept for the next read."""
        b = self.names.get(v.name)
        if b is None:
            e = v.name.encode()
            b = self.names[v.name] = struct.pack("<H", len(e)) + e
        return b

    def addr_of(self, v, ranks):
        """The one address of ranks' node, or None (several nodes, or one
        without an address)."""
        addr = None
        for r in ranks:
            a = v.addrs[r] if r < len(v.addrs) else ""
            if not a or (addr is not None and a != addr):
                return None
            addr = a
        return addr

    def shard_range(self, v, dst, first, k, r):
        """Rows [first, first+k) of rank r's shard into dst (get()'s one
        shard): range() without its owners' walk."""
        if k * v.rb > self.max or v.ragged:
            return False
        addr = v.addrs[r] if r < len(v.addrs) else ""
        return bool(addr) and self._fetch_range(v, dst, first, k, addr)

    def range(self, v, dst, first, k, rank_lo, rank_hi):
        """Rows [first, first+k) of ranks rank_lo..rank_hi into dst (k rows
        of v.rb bytes, contiguous); False: not read (the caller reads them
        through its agent)."""
        if k * v.rb > self.max or v.ragged:
            return False
        addr = self.addr_of(v, range(rank_lo, rank_hi + 1))
        return addr is not None and self._fetch_range(v, dst, first, k, addr)

    def _fetch_range(self, v, dst, first, k, addr):
        """One FetchRange of rows [first, first+k) from the agent at addr."""
        body = self._name(v) + _RANGE.pack(v.id, first, k)
        if not self._run(addr, OP_FETCH_RANGE, body, dst, k * v.rb):
            return False
        v.profile["direct_rows"] += k
        return True

    def fetch_ragged(self, v, flat, globals_, owners, at, size):
        """Ragged rows globals_ (of ranks owners, none only in the backing
        file, none empty) into flat[at[k]:at[k] + size[k]]: one Fetch, the
        owner answering each row its own size (as to its peers), received
        straight into flat when the rows follow one another there, else
        into a buffer and placed; False: not read."""
        j = self.ragged_job(v, flat, globals_, owners, at, size)
        return j is not None and self.run_one(j)

    def _fetch(self, v, dst, globals_, owners, want):
        j = self.fetch_job(v, dst, globals_, owners, want)
        return j is not None and self.run_one(j)

    def run_one(self, j):
        """Run the direct job j by itself and place its rows (not done():
        the caller counts); False: not read."""
        if not self._run(j.addr, j.op, j.body, j.dst, j.want):
            return False
        j.v.profile["direct_rows"] += j.rows
        if j.place is not None:
            j.place()
        return True

    def fetch_job(self, v, dst, globals_, owners, want):
        """A Job of rows globals_ (of ranks owners) into dst (want bytes,
        contiguous), or None when they cannot go direct (above the bound,
        several nodes, an owner without an address)."""
        if want > self.max:
            return None
        addr = self.addr_of(v, distinct(owners))
        if addr is None:
            return None
        return self.planned_job(v, dst, globals_.shape[0], np.ascontiguousarray(globals_, dtype="<i8").tobytes(),
                                addr, want)

    def planned_job(self, v, dst, k, rows, addr, want):
        """A Job of k rows of v at addr, their global indices already
        encoded (rows: k little-endian int64s, as a batch plan shares them
        among the variables it reads), into dst (want bytes), or None above
        the bound."""
        if want > self.max:
            return None
        return Job(addr, OP_FETCH, self._name(v) + _FETCH.pack(v.id, k) + rows, dst, want, v, k)

    def ragged_job(self, v, flat, globals_, owners, at, size, plan=None):
        """A Job of ragged rows globals_ into flat[at[k]:at[k] + size[k]]
        (as fetch_ragged), or None. plan: the rows' batch plan
        (_ragged.Plan, its remote rows being these), whose owner address
        and encoded indices it takes instead of working them out."""
        total = int(size.sum())
        a0 = int(at[0])
        if int(at[-1]) - a0 + int(size[-1]) == total:  # neighbouring places
            dst, tmp = flat[a0:a0 + total], None
        else:
            dst = tmp = np.empty(total, dtype=np.uint8)
        if plan is not None:
            j = self.planned_job(v, dst, plan.k, plan.rows, plan.addr, total) if plan.addr is not None else None
        else:
            j = self.fetch_job(v, dst, globals_, owners, total)
        if j is None or tmp is None:
            return j

        def place():
            dm, sm, o = memoryview(flat), memoryview(tmp), 0
            for a, n in zip(at.tolist(), size.tolist()):
                dm[a:a + n] = sm[o:o + n]
                o += n
        j.place = place
        return j

    def run_jobs(self, jobs):
        """Run the jobs (post, then collect); returns the jobs left to read
        through the own agent (see collect)."""
        return self.collect(self.post(jobs))

    def post(self, jobs):
        """Send the direct jobs' requests now, those of one owner pipelined on
        one of its connections (Conn.send_many), which stays out of the pool
        until collect() or discard() of what this returns."""
        sent, left, by = [], [], {}
        for j in jobs:
            if j.addr is None:
                left.append(j)
            else:
                by.setdefault(j.addr, []).append(j)
        for addr, group in by.items():
            for part in _pieces(group):
                got = self._take(addr)
                if got is None:
                    left.extend(part)
                    continue
                c, reused = got
                try:
                    first = c.send_many(part)
                except Exception:
                    self._broken(c, addr, reused)
                    left.extend(part)
                    continue
                sent.append((addr, c, reused, part, first))
        return sent, left

    def collect(self, posted):
        """The replies of post()'s requests: each job read finished (place,
        done); returns the jobs left to read through the own agent (their
        fallback not yet called): those for the own agent only, and those
        whose direct read did not happen."""
        sent, left = posted
        left = list(left)
        for k, (addr, c, reused, part, first) in enumerate(sent):
            try:
                ok = c.recv_many(part, first)
            except Exception:  # as _run: a broken connection; the agent path reads them all again
                self._broken(c, addr, reused)
                ok = [False] * len(part)
            except BaseException:  # e.g. KeyboardInterrupt: this and the later replies unread
                c.close()
                self.discard((sent[k + 1:], []))
                raise
            else:
                self._put(c)
            try:
                for j, good in zip(part, ok):
                    if not good:
                        left.append(j)
                        continue
                    j.v.profile["direct_rows"] += j.rows
                    if j.place is not None:
                        j.place()
                    j.done()
            except BaseException:  # the later connections' replies are never read: closed now
                self.discard((sent[k + 1:], []))
                raise
        return left

    @staticmethod
    def discard(posted):
        """Let go of post()'s requests unread: their connections are closed
        (the replies on their way are dropped with them)."""
        for _, c, _, _, _ in posted[0]:
            c.close()

    def _broken(self, c, addr, reused):
        """A connection that failed mid-request: closed; a pooled one may
        have died with its agent (a restart), so the next read dials afresh;
        a new one that fails leaves the address alone a while; either way
        the owner may have moved (Store._readdress)."""
        c.close()
        if reused:
            self._drop_idle(addr)
        else:
            self._mark_bad(addr)
        self._note_moved(addr)

    def forked(self):
        """A forked child: the parent's connections are closed here (never
        used), and the child dials its own."""
        for cs in self.idle.values():
            for c in cs:
                c.close()
        self._reset()

    def close(self):
        with self.lock:
            self.closed = True
            if self.timer is not None:
                self.timer.cancel()
                self.timer = None
            idle, self.idle = self.idle, {}
        for cs in idle.values():
            for c in cs:
                c.close()

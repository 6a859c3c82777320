"""The client protocol's frames (docs/protocol.md): a 32-byte header, then a
body of little-endian fields."""

import struct

import numpy as np

from ._errors import ArgumentError, ProtocolError, from_status

MAGIC = 0xDD5E
VERSION = 1
HEADER = struct.Struct("<HBBHHIIQQ")  # magic, version, op, status, 0, body length, 0, id, payload
assert HEADER.size == 32
MAX_BODY = 32 << 20

OP_HELLO, OP_CREATE, OP_PUBLISH, OP_LOOKUP, OP_READ, OP_REGISTER, OP_UNREGISTER, OP_FREE, OP_INFO = range(1, 10)
OP_PREFETCH = 10
OP_AUTH, OP_AUTH_PROOF = 11, 12  # the authentication handshake, first on every connection (_auth.py)
OP_BARRIER = 13  # a rank's part in a fence (_fence.py)
OP_READ_RANGE = 14  # contiguous rows in one request (Store.get)

_U16 = struct.Struct("<H")
_U32 = struct.Struct("<I")
_U64 = struct.Struct("<Q")
_I64 = struct.Struct("<q")
_U32I64 = struct.Struct("<Iq")


class Encoder:
    __slots__ = ("b",)

    def __init__(self):
        self.b = bytearray(HEADER.size)

    def u8(self, v):
        self.b.append(v)
        return self

    def u32(self, v):
        self.b += _U32.pack(v)
        return self

    def u64(self, v):
        self.b += _U64.pack(v)
        return self

    def i64(self, *vs):
        for v in vs:
            self.b += _I64.pack(v)
        return self

    def string(self, s):
        e = s.encode()
        if len(e) > 0xFFFF:
            raise ArgumentError(f"ddstore: bad argument: name of {len(e)} bytes: want at most 65535")
        self.b += _U16.pack(len(e))
        self.b += e
        return self

    def string32(self, s):
        e = s.encode()
        self.b += _U32.pack(len(e))
        self.b += e
        return self

    def i64s(self, arr):
        a = np.ascontiguousarray(arr, dtype="<i8")
        self.b += _U32.pack(a.shape[0])
        self.b += a.tobytes()
        return self

    def frame(self, op, req_id):
        HEADER.pack_into(self.b, 0, MAGIC, VERSION, op, 0, 0, len(self.b) - HEADER.size, 0, req_id, 0)
        return self.b


class Decoder:
    __slots__ = ("b", "i")

    def __init__(self, b):
        self.b, self.i = memoryview(b), 0

    def _take(self, n):
        if n < 0 or self.i + n > len(self.b):
            raise ProtocolError(f"ddstore: protocol error: truncated message: {n} bytes needed, {len(self.b) - self.i} left")
        v = self.b[self.i:self.i + n]
        self.i += n
        return v

    def u8(self):
        return self._take(1)[0]

    def u32(self):
        return _U32.unpack(self._take(4))[0]

    def i64(self):
        return _I64.unpack(self._take(8))[0]

    def string(self):
        return bytes(self._take(_U16.unpack(self._take(2))[0])).decode()

    def string32(self):
        return bytes(self._take(self.u32())).decode()

    def i64s(self):
        n = self.u32()
        return np.frombuffer(self._take(8 * n), dtype="<i8").astype(np.int64)

    def strings(self):
        return [self.string() for _ in range(self.u32())]

    def done(self):
        if self.i != len(self.b):
            raise ProtocolError(f"ddstore: protocol error: {len(self.b) - self.i} bytes left over after the message")


def parse_header(b):
    magic, version, op, status, r1, body, r2, req_id, payload = HEADER.unpack(b)
    if magic != MAGIC or version != VERSION or r1 or r2:
        raise ProtocolError(f"ddstore: protocol error: frame magic {magic:#06x} version {version}")
    if body > MAX_BODY:
        raise ProtocolError(f"ddstore: protocol error: frame body of {body} bytes exceeds {MAX_BODY}")
    return op, status, body, req_id, payload


def status_error(status, body):
    d = Decoder(body)
    try:
        msg = bytes(d._take(d.u32())).decode(errors="replace")
        d.done()
    except ProtocolError:
        msg = "ddstore: remote error (undecodable message)"
    return from_status(status, msg)


KIND_ROWS, KIND_RAGGED = 0, 1  # wire.Kind: fixed rows, or rows of a length of their own
MAX_SHAPE = 32


def read_range(e, name, region, table_id, start, count, offset):
    """A ReadRange: rows [start, start+count) into the region from byte
    offset on."""
    return e.string(name).u32(region).i64(table_id, start, count, offset)


def shard(e, name, node, rank, size, rows, disp, itemsize, timeout_ms, attempt, failed, dtype, backing="", total=0,
          kind=KIND_ROWS, items=0, shape=(), group="", client=0, client_age_ms=0, why=""):
    """A Shard body; group is the round's group, the variable's replica
    suffix ("" for the whole job); client, client_age_ms and why are the
    agent's fields: a client sends 0, 0 and ""."""
    e.string(name).string(node).i64(rank, size, rows, disp, itemsize, timeout_ms, attempt).u8(1 if failed else 0)
    e.string(dtype).string32(backing).i64(total).u8(kind).i64(items).i64s(np.asarray(shape, dtype=np.int64))
    return e.string(group).u64(client).i64(client_age_ms).string32(why)


class Table:
    """A published variable's geometry (wire.Table)."""

    __slots__ = ("name", "disp", "itemsize", "shard_rows", "rank_node", "nodes", "addrs", "paths", "dtype", "id",
                 "backing", "total", "kind", "shard_items", "shape", "index")

    @classmethod
    def decode(cls, body):
        d = Decoder(body)
        t = cls()
        t.name, t.disp, t.itemsize = d.string(), d.i64(), d.i64()
        t.shard_rows, t.rank_node = d.i64s(), d.i64s()
        t.nodes, t.addrs, t.paths = d.strings(), d.strings(), d.strings()
        t.dtype = d.string()
        t.id = d.i64()
        t.backing, t.total = d.string32(), d.i64()
        t.kind = d.u8()
        t.shard_items, t.shape, t.index = d.i64s(), d.i64s(), d.string32()
        d.done()
        p = len(t.shard_rows)
        held = int(t.shard_rows.sum()) if p else 0
        if (t.shard_rows < 0).any() or t.total < 0 or (t.total and t.total < held) or (not t.backing and t.total not in (0, held)):
            raise ProtocolError(f"ddstore: protocol error: table of {t.name!r} with {t.total} rows in all, {held} in shards")
        if len(t.rank_node) != p or len(t.paths) not in (0, p) or len(t.addrs) != len(t.nodes):
            raise ProtocolError(f"ddstore: protocol error: table of {t.name!r} with inconsistent lists")
        if p and (t.rank_node.min() < 0 or t.rank_node.max() >= len(t.nodes)):
            raise ProtocolError(f"ddstore: protocol error: table of {t.name!r} names a node out of range")
        if t.kind == KIND_ROWS:
            ok = len(t.shard_items) == 0 and len(t.shape) == 0 and not t.index
        elif t.kind == KIND_RAGGED:
            # A ragged variable's backing file is a pair: values NUL offsets.
            ok = (len(t.shard_items) == p and len(t.shape) <= MAX_SHAPE and (not t.backing or "\0" in t.backing)
                  and not (t.shard_items < 0).any() and not (t.shape < 1).any()
                  and int(np.prod(t.shape, dtype=np.int64)) == t.disp)
        else:
            ok = False
        if not ok:
            raise ProtocolError(f"ddstore: protocol error: table of {t.name!r} of kind {t.kind} with "
                                f"{len(t.shard_items)} shard item counts, trailing shape {list(t.shape)}")
        return t

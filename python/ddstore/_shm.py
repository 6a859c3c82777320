"""Shared memory: the agent's shard segments (files under /dev/shm, mapped
here) and memfd receive regions (handed to the agent over the socket)."""

import errno
import fcntl
import mmap
import os
import stat
import struct
import zlib

import numpy as np

from ._errors import ArgumentError, ProtocolError, UnknownVariable

HEADER_BYTES = 4096
_MAGIC = b"DDSTSHRD"
_FIELDS = struct.Struct("<8sI4xqqqqI")  # magic, version, rank, rows, disp, itemsize, crc
# Version 2 (the segments of a ragged variable): magic, version, kind, rank,
# rows, disp, itemsize, items, crc of bytes 0-55.
_FIELDS2 = struct.Struct("<8sIIqqqqqI")
KIND_ROWS, KIND_RAGGED, KIND_INDEX = 0, 1, 2
# The dropped word (u32 at this offset of the header, outside the checksum):
# the agent sets it to 1 before it unmaps and unlinks a dropped segment, so
# a process still mapping it, whose mapping keeps the old rows readable,
# learns they are a freed variable's (shm.Segment.MarkDropped).
DROPPED_AT = 64


def _offsets_bytes(rows):
    """A ragged shard's offsets, padded to a page (its values start on one)."""
    return ((rows + 1) * 8 + HEADER_BYTES - 1) // HEADER_BYTES * HEADER_BYTES


# Segments up to this size are mapped with MAP_POPULATE.
_POPULATE_MAX = 4 << 30


class Segment:
    """One mapped shard: `rows` is a (rows, row_bytes) uint8 view of it."""

    __slots__ = ("path", "mm", "rows", "rank", "nrows", "disp", "itemsize", "kind", "items", "offsets", "values",
                 "mark")

    def __init__(self, path, writable):
        try:
            fd = os.open(path, (os.O_RDWR if writable else os.O_RDONLY) | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
        except FileNotFoundError:
            raise UnknownVariable(f"ddstore: unknown variable: segment {path} does not exist") from None
        except OSError as e:  # ELOOP: a symbolic link, which is never a segment; EACCES, ...
            what = "is a symbolic link" if e.errno == errno.ELOOP else f"cannot be opened: {e.strerror}"
            raise ArgumentError(f"ddstore: bad argument: segment {path} {what}") from None
        try:
            # As shm.Open: never a segment another user made or may touch.
            st = os.fstat(fd)
            if st.st_uid != os.geteuid():
                raise ArgumentError(f"ddstore: bad argument: segment {path} belongs to uid {st.st_uid}, "
                                    f"not {os.geteuid()}: another user's file, which ddstore does not adopt")
            if not stat.S_ISREG(st.st_mode):
                raise ArgumentError(f"ddstore: bad argument: segment {path} is not a regular file")
            if st.st_mode & 0o077:
                raise ArgumentError(f"ddstore: bad argument: segment {path} has mode {st.st_mode & 0o777:o}: want 0600 "
                                    f"(other users may have read or written it)")
            prot = mmap.PROT_READ | (mmap.PROT_WRITE if writable else 0)
            # Map the pages now (they exist: the agent made the segment) rather
            # than fault them in one by one on first read, which costs more
            # here than the copy of a row; up to a size where that is cheap.
            flags = mmap.MAP_SHARED
            if st.st_size <= _POPULATE_MAX:
                flags |= getattr(mmap, "MAP_POPULATE", 0)
            self.mm = mmap.mmap(fd, st.st_size, flags, prot)
        finally:
            os.close(fd)
        magic, version, self.rank, self.nrows, self.disp, self.itemsize, crc = _FIELDS.unpack_from(self.mm, 0)
        self.kind, self.items, self.offsets, self.values = KIND_ROWS, 0, None, None
        ok = magic == _MAGIC and version == 1 and crc == zlib.crc32(self.mm[:48])
        if magic == _MAGIC and version == 2:
            _, _, self.kind, self.rank, self.nrows, self.disp, self.itemsize, self.items, crc = _FIELDS2.unpack_from(self.mm, 0)
            ok = crc == zlib.crc32(self.mm[:56]) and self.kind in (KIND_RAGGED, KIND_INDEX) and self.nrows >= 0 \
                and self.items >= 0 and self.disp >= 1 and self.itemsize >= 1
        if not ok:
            self.mm.close()
            raise ProtocolError(f"ddstore: protocol error: segment {path} has no valid ddstore header")
        rb = self.disp * self.itemsize
        if self.kind == KIND_RAGGED:
            size = _offsets_bytes(self.nrows) + self.items * rb
        elif self.kind == KIND_INDEX:
            size = (self.nrows + 1) * 8
        else:
            size = self.nrows * rb
        if HEADER_BYTES + size != st.st_size:
            self.mm.close()
            raise ProtocolError(f"ddstore: protocol error: segment {path}: header and file size disagree")
        self.path = path
        # The dropped word as a native u32 (little-endian: every platform
        # ddstore builds for); mark[0] is one aligned 4-byte load.
        self.mark = memoryview(self.mm)[DROPPED_AT:DROPPED_AT + 4].cast("I")
        if self.kind == KIND_ROWS:
            buf = np.frombuffer(self.mm, dtype=np.uint8, count=self.nrows * rb, offset=HEADER_BYTES)
            if not writable:
                buf.flags.writeable = False  # a read-only mapping: numpy must not try
            self.rows = buf.reshape(self.nrows, rb)
            return
        # A ragged shard: its offsets (rows + 1 int64), then its values (a
        # uint8 view, items * row bytes); an index: job-wide offsets.
        self.rows = None
        self.offsets = np.frombuffer(self.mm, dtype="<i8", count=self.nrows + 1, offset=HEADER_BYTES)
        if self.kind == KIND_RAGGED:
            self.values = np.frombuffer(self.mm, dtype=np.uint8, count=self.items * rb,
                                        offset=HEADER_BYTES + _offsets_bytes(self.nrows))
        if not writable:
            self.offsets.flags.writeable = False
            if self.values is not None:
                self.values.flags.writeable = False

    def dropped(self):
        """Whether the agent dropped the segment: rows copied out of it
        before this says so may be a freed variable's."""
        return self.mark[0] != 0

    def close(self):
        # The mark is dropped, not released: a thread reading the variable
        # may still check it; the mapping then lives as long as it does.
        self.rows = self.offsets = self.values = self.mark = None
        try:
            self.mm.close()
        except BufferError:
            pass  # a view of it is still alive; the mapping goes with it


class Region:
    """An anonymous shared-memory region (memfd) of `size` bytes."""

    __slots__ = ("fd", "mm", "size", "id")

    def __init__(self, size):
        self.fd = os.memfd_create("ddstore-recv", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
        try:
            os.ftruncate(self.fd, size)
            # Sealed at this size: the agent maps it and writes into it.
            fcntl.fcntl(self.fd, fcntl.F_ADD_SEALS, fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW)
            self.mm = mmap.mmap(self.fd, size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        except BaseException:
            os.close(self.fd)
            raise
        self.size, self.id = size, 0

    def array(self):
        return np.frombuffer(self.mm, dtype=np.uint8)

    def close(self):
        try:
            self.mm.close()
        except BufferError:
            pass
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

"""Segment files: the disk tier's blocks of up to ``disk.PACK_MAX`` (8 MiB), many to a
file.

Creating a file costs more CPU than writing 100 KB into one (0.5-0.8 ms for the
open(O_CREAT) alone against 0.03 ms for an O_DIRECT append of 100 KB here, thread CPU
clock; ``python -m bench.micro disk-put`` compares whole puts), so blocks of at most
``disk.PACK_MAX`` bytes are appended to a shared segment file instead, and one file
creation serves a whole segment (``SEGMENT_BYTES``).  Layout, under
``CACHE_DIR/blocks/segments/``::

    <stem>.seg   records, each a whole number of ALIGN (4 KiB) pages at a page offset:
                 data | zero padding | trailer
                 trailer = key hash (16 bytes: the block name's xxh128) | u64 data length
                           | u64 xxh3_64(data) | u32 flags (0) | b"NCS1"
    <stem>.idx   the segment's log: 32-byte entries, appended after a record is written
                 (kind 1) and when one is evicted or found corrupt (kind 2):
                 key hash (16) | u32 page | u32 data length | u32 kind | u32 xxh32 of
                 the 28 bytes before it

``<stem>`` is the segment's creation time in ns, 16 hex digits.  A record is laid out
as a block file (``blockfiles.py``) with the key hash in its trailer, so it is written
with O_DIRECT from the same page-aligned buffers and read in one call into a recycled
or fresh buffer, the data returned as a view without a copy.

Start-up reads the logs, never the records: the live records of a segment are its
kind-1 entries minus its kind-2 entries, in log order (its write order).  A log entry
is appended only after its record was written, so a crash leaves at worst a record no
entry names (dead space until the whole segment goes); a damaged entry is skipped, and
a torn tail is cut at start so that later entries stay aligned.  Records are never
trusted for an index: a garbled segment costs checksum failures (misses), never a
crash or a block served for another key.

An evicted record's pages are given back to the filesystem at once by punching a hole
(``fallocate(FALLOC_FL_PUNCH_HOLE)``: ext4, xfs, btrfs, tmpfs, ...), so the bytes a
segment holds on disk are its live records, as with one file per block; a segment
whose records are all dead is deleted.  Where holes cannot be punched the disk tier
stops packing (one file per block again), since dead records would hold their space.
"""
from __future__ import annotations

import collections
import ctypes
import errno
import os
import struct
import time

import xxhash

# O_DIRECT granularity: the page size, a multiple of every disk's logical block size.
ALIGN = 4096
# Bytes per segment file.  The file creation (two files: .seg, .idx) is spread over
# this many bytes of blocks: 640 blocks of 100 KB, 8 of 8 MiB.  Larger segments mean
# fewer files and file descriptors (``SEGMENT_FDS`` segments stay open); smaller ones a
# shorter log.  Eviction is per record, so the size does not change what is
# kept: 64 MiB keeps a 20 GiB cache at ~320 segments.
SEGMENT_BYTES = 64 << 20
# Segments whose two descriptors stay open between uses (reads need no open/close:
# 0.03 ms of CPU per block saved).  256 descriptors leave room under the common 1024
# limit; a segment beyond it is opened when used and closed once unused.
SEGMENT_FDS = 128
DIRNAME = "segments"
REC_TRAILER = struct.Struct("<16sQQI4s")
REC_MAGIC = b"NCS1"
LOG_ENTRY = struct.Struct("<16sIIII")
STORED, DEAD = 1, 2

_FALLOC_FL_KEEP_SIZE = 0x01
_FALLOC_FL_PUNCH_HOLE = 0x02


def record_size(length: int) -> int:
    """Bytes a record of ``length`` data bytes takes: data + trailer, whole pages."""
    return -(-(length + REC_TRAILER.size) // ALIGN) * ALIGN


# The disk tier's index holds one int per block: the data length for a block file, or
# length | page << 32 | segment id << 64 for a record (segment ids start at 1).
def loc(sid: int, page: int, length: int) -> int:
    return length | page << 32 | sid << 64


def loc_sid(v: int) -> int:
    return v >> 64


def loc_page(v: int) -> int:
    return (v >> 32) & 0xFFFFFFFF


def loc_len(v: int) -> int:
    """The data length of any index value (block file or record)."""
    return v & 0xFFFFFFFF if v >> 64 else v


class Segment:
    """One segment file and its log, as the disk tier tracks it (under its lock)."""
    __slots__ = ("sid", "path", "fd", "lfd", "refs", "size", "live", "pending", "sealed",
                 "dropped")

    def __init__(self, sid: int, path: str, size: int = 0, sealed: bool = False):
        self.sid = sid
        self.path = path            # the .seg file; its log is path[:-4] + ".idx"
        self.fd: int | None = None  # O_RDWR (| O_DIRECT), open while cached or in use
        self.lfd: int | None = None  # the log, O_WRONLY | O_APPEND
        self.refs = 0               # users of the descriptors right now
        self.size = size            # bytes reserved so far (the next record's offset)
        self.live = 0               # indexed records
        self.pending = 0            # records reserved, not yet written or failed
        self.sealed = sealed        # no more records will be reserved in it
        self.dropped = False        # deleted: descriptors close when refs reach 0

    @property
    def log_path(self) -> str:
        return self.path[:-4] + ".idx"

    def open(self, direct: bool) -> bool:
        """Open both descriptors; True if the data descriptor is O_DIRECT."""
        flags = os.O_RDWR | os.O_CLOEXEC
        try:
            fd = os.open(self.path, flags | (os.O_DIRECT if direct else 0))
        except OSError as exc:
            if not direct or exc.errno != errno.EINVAL:
                raise
            fd, direct = os.open(self.path, flags), False
        try:
            self.lfd = os.open(self.log_path, os.O_WRONLY | os.O_APPEND | os.O_CLOEXEC)
        except OSError:
            os.close(fd)
            raise
        self.fd = fd
        return direct

    def close(self) -> None:
        for fd in (self.fd, self.lfd):
            if fd is not None:
                try:
                    os.close(fd)
                except OSError:
                    pass
        self.fd = self.lfd = None


class Segments:
    """The disk tier's segments: their ids, the one records are appended to, a spare
    made in advance, and the descriptors kept open (at most ``SEGMENT_FDS`` segments'
    while unused).  ``lock`` is the disk tier's: ``make_spare``, ``use`` and ``unref``
    take it, every other method runs with it held."""

    def __init__(self, lock, segment_bytes: int, not_direct):
        self.lock = lock
        self.segment_bytes = segment_bytes
        self.by_id: dict[int, Segment] = {}
        self.active: Segment | None = None
        self.spare: Segment | None = None
        self._next = 1
        self._open: collections.OrderedDict[int, Segment] = collections.OrderedDict()
        self._not_direct = not_direct         # called when a filesystem refuses O_DIRECT

    def add(self, seg: Segment) -> Segment:
        """Give a segment its id and track it."""
        seg.sid, self._next = self._next, self._next + 1
        self.by_id[seg.sid] = seg
        return seg

    def rotates(self, nbytes: int) -> bool:
        """Whether a record of ``nbytes`` needs a new segment (also read without the
        lock: a stale answer costs a spare made early or a creation under the lock)."""
        seg = self.active
        return seg is None or bool(seg.size and seg.size + nbytes > self.segment_bytes)

    def make_spare(self, make) -> None:
        """Make the next segment with ``make()`` (a file creation, which can wait on
        the filesystem's journal) outside the lock."""
        seg = make()
        with self.lock:
            if self.spare is None and seg is not None:
                self.spare, seg = seg, None
        if seg is not None:                     # another thread made one first
            discard(seg)

    def reserve(self, nbytes: int, actions: list, make) -> tuple[Segment | None, int]:
        """A place for a record of ``nbytes``: (segment, page), the segment referenced
        and its write pending; (None, 0) if ``make`` found packing impossible."""
        seg = self.active
        if self.rotates(nbytes):
            if seg is not None:
                seg.sealed = True
                self.active = None
                if seg.live == 0 and seg.pending == 0:
                    actions.append(self.drop(seg))
            # the spare; made here only if another thread took it meanwhile
            seg, self.spare = self.spare or make(), None
            if seg is None:
                return None, 0
            self.active = self.add(seg)
        self.ref(seg)
        page = seg.size // ALIGN
        seg.size += nbytes
        seg.pending += 1
        return seg, page

    def ref(self, seg: Segment) -> None:
        """Reference a segment whose descriptors are open."""
        seg.refs += 1
        self._open[seg.sid] = seg
        self._open.move_to_end(seg.sid)
        if len(self._open) > SEGMENT_FDS:
            for sid, s in list(self._open.items())[:len(self._open) - SEGMENT_FDS]:
                if s.refs == 0 and s is not self.active:
                    s.close()
                    del self._open[sid]

    def use(self, seg: Segment, direct: bool) -> bool:
        """Reference a segment's descriptors, opening them (outside the lock) if they
        are closed; False if the segment was dropped.  Raises OSError."""
        with self.lock:
            if seg.dropped:
                return False
            if seg.fd is not None:
                self.ref(seg)
                return True
        opened = Segment(seg.sid, seg.path)
        if not opened.open(direct):
            self._not_direct()
        with self.lock:
            ok = not seg.dropped
            if ok:
                if seg.fd is None:
                    seg.fd, seg.lfd = opened.fd, opened.lfd
                    opened.fd = opened.lfd = None
                self.ref(seg)
        opened.close()         # unless used: another thread opened them first, or dropped
        return ok

    def unref(self, seg: Segment) -> None:
        with self.lock:
            seg.refs -= 1
            if seg.refs == 0 and seg.dropped:
                seg.close()
                self._open.pop(seg.sid, None)

    def drop(self, seg: Segment):
        """Forget a segment with no live record; the action (``("segment", seg)``)
        deletes its files once the lock is released."""
        seg.dropped = True
        self.by_id.pop(seg.sid, None)
        if self.active is seg:
            self.active = None
        if seg.refs == 0:
            seg.close()
            self._open.pop(seg.sid, None)
        return ("segment", seg)

    def settle(self, seg: Segment):
        """After its live or pending count fell: drop the segment if it is sealed
        and holds nothing (the action), else None."""
        if seg.sealed and seg.live == 0 and seg.pending == 0 and not seg.dropped:
            return self.drop(seg)
        return None


def create(dirpath: str, direct: bool) -> tuple[str, int, int, bool]:
    """A new empty segment and its log: (path, fd, log fd, whether fd is O_DIRECT)."""
    while True:
        stem = f"{time.time_ns():016x}"
        path = os.path.join(dirpath, stem + ".seg")
        try:
            lfd = os.open(path[:-4] + ".idx", os.O_WRONLY | os.O_APPEND | os.O_CREAT |
                          os.O_EXCL | os.O_CLOEXEC, 0o600)
        except FileExistsError:          # two in the same ns (a clock this coarse)
            time.sleep(1e-6)
            continue
        break
    flags = os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC
    try:
        try:
            fd = os.open(path, flags | (os.O_DIRECT if direct else 0), 0o600)
        except OSError as exc:
            if not direct or exc.errno != errno.EINVAL:
                raise
            fd, direct = os.open(path, flags, 0o600), False
    except BaseException:
        os.close(lfd)
        unlink(path[:-4] + ".idx")
        raise
    return path, fd, lfd, direct


def fill(buf, data, key_hash: bytes, checksum) -> int:
    """Write the record of ``data`` into the page-aligned ``buf``; its size."""
    n = len(data)
    nbytes = record_size(n)
    buf[:n] = data
    end = nbytes - REC_TRAILER.size
    buf[n:end] = bytes(end - n)
    REC_TRAILER.pack_into(buf, end, key_hash, n, checksum(data), 0, REC_MAGIC)
    return nbytes


def check(raw, length: int, key_hash: bytes, checksum):
    """(data view, "") if ``raw`` is the whole record of this key and length and its
    checksum holds, else (None, why)."""
    nbytes = record_size(length)
    if len(raw) != nbytes:
        return None, "short record"
    h, n, digest, flags, magic = REC_TRAILER.unpack_from(raw, nbytes - REC_TRAILER.size)
    if magic != REC_MAGIC or flags != 0 or n != length:
        return None, "bad trailer"
    if h != key_hash:
        return None, "another block's record"
    data = memoryview(raw)[:length]
    if checksum(data) != digest:
        return None, "checksum mismatch"
    return data, ""


def log_entry(key_hash: bytes, page: int, length: int, kind: int) -> bytes:
    head = LOG_ENTRY.pack(key_hash, page, length, kind, 0)[:LOG_ENTRY.size - 4]
    return head + xxhash.xxh32_intdigest(head).to_bytes(4, "little")


def read_log(raw: bytes, seg_size: int) -> list[tuple[bytes, int, int]]:
    """The live records a log names, (key hash, page, length) in log order.  A damaged
    entry is skipped (each is checked alone), as are records past ``seg_size`` (a
    truncated segment) and entries that contradict the layout."""
    live: dict[int, tuple[bytes, int]] = {}       # page -> (hash, length), log order
    size = LOG_ENTRY.size
    for i in range(0, len(raw) - size + 1, size):
        h, page, length, kind, crc = LOG_ENTRY.unpack_from(raw, i)
        if xxhash.xxh32_intdigest(raw[i:i + size - 4]) != crc:
            continue
        if kind == STORED:
            if page * ALIGN + record_size(length) <= seg_size:
                live[page] = (h, length)
        elif kind == DEAD:
            live.pop(page, None)
    return [(h, page, length) for page, (h, length) in live.items()]


def scan(dirpath: str):
    """What a segments directory holds, read-only: ([(path, stem time s, mtime s,
    size, log)], [paths to delete: logs or segments without their other half, stray
    files], [(log with a torn tail, length to cut it to)]).  ``log`` is the raw log:
    ``read_log(log, size)`` gives the records, one segment at a time (all of a 1.28 M
    block tier's at once took ~200 MB more at start)."""
    try:
        names = set(os.listdir(dirpath))
    except FileNotFoundError:
        return [], [], []
    segs, junk, torn = [], [], []
    for name in sorted(names):
        stem, _, ext = name.rpartition(".")
        path = os.path.join(dirpath, name)
        if ext == "idx":
            if stem + ".seg" not in names:
                junk.append(path)
            continue
        if ext != "seg" or stem + ".idx" not in names:
            junk.append(path)
            continue
        try:
            st = os.stat(path)
            with open(path[:-4] + ".idx", "rb") as f:
                raw = f.read()
            born = int(stem, 16) / 1e9
        except (OSError, ValueError):
            junk += [path, path[:-4] + ".idx"]
            continue
        if len(raw) % LOG_ENTRY.size:
            torn.append((path[:-4] + ".idx", len(raw) - len(raw) % LOG_ENTRY.size))
        segs.append((path, born, st.st_mtime, st.st_size, raw))
    return segs, junk, torn


def records(segs, added):
    """(time, name, location) of each record of the scanned segments (``scan``), in
    the order they were stored: by segment, then log order, timed between the
    segment's birth and the next one's (its mtime moves when a hole is punched in it)."""
    for i, ((_, born, mtime, size, log), seg) in enumerate(zip(segs, added)):
        recs = read_log(log, size)
        end = segs[i + 1][1] if i + 1 < len(segs) else mtime
        span = max(0.0, end - born) / max(1, len(recs))
        for j, (h, page, length) in enumerate(recs):
            yield born + j * span, h.hex(), loc(seg.sid, page, length)


_libc = None


def punch_hole(fd: int, offset: int, nbytes: int) -> None:
    """Give ``nbytes`` at ``offset`` back to the filesystem (reads return zeros); raises
    OSError (EOPNOTSUPP where the filesystem cannot)."""
    global _libc
    if _libc is None:
        # the C library this process already has (dlopen(NULL)): find_library("c")
        # runs ldconfig in a subprocess, a fork of the daemon from a disk thread
        lib = ctypes.CDLL(None, use_errno=True)
        lib.fallocate.argtypes = (ctypes.c_int, ctypes.c_int, ctypes.c_int64,
                                  ctypes.c_int64)
        _libc = lib
    if _libc.fallocate(fd, _FALLOC_FL_PUNCH_HOLE | _FALLOC_FL_KEEP_SIZE, offset, nbytes):
        e = ctypes.get_errno()
        raise OSError(e, os.strerror(e))


def discard(seg: Segment) -> None:
    """Close and delete a segment nothing refers to."""
    seg.close()
    unlink(seg.path)
    unlink(seg.log_path)


def unlink(path: str) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass

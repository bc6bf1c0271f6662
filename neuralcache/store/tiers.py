"""Two-tier block cache: a memory tier (lru-dict, bounded in bytes) over a persistent
disk tier (one file per block, bounded in bytes).

A block is identified by ``BlockKey(key, version, index)``: the object's path, its
version (ETag, or size:mtime for POSIX) and the block number, so a changed remote
object can never be served a stale block.

Disk format (``CACHE_DIR/blocks/XY/<xxh128 of the block key>``)::

    data | zero padding | u64 data length | u64 xxh3_64(data) | u32 flags (0) | b"NCB2"

The trailer ends the file and the file is a whole number of ``ALIGN`` (4 KiB) pages, so
a block is written with O_DIRECT from a page-aligned buffer: no page cache pages to
allocate (on a node whose page cache is full, a buffered write reclaims memory on the
writing thread: 1.4-1.7 CPU-s per GiB written against 0.2 with O_DIRECT here, `python
/tmp` microbenchmark in the closing note of issue 10) and the cache does not push the
job's own pages out.  Filesystems without O_DIRECT (tmpfs) get the same bytes through
the page cache.  Files of the older NCB1 layout (header first) are deleted at start.

Writes go to ``*.tmp`` then ``os.replace`` (atomic), so a crash leaves either a whole
block or a tmp file that the next start deletes.  Every read verifies length and
checksum; a bad block is deleted and reported as a miss.  Any OSError is a miss plus a
log line (at most one warning per kind of failure), never an error to the reader.

The disk tier is synchronous; callers run it in worker threads.  Its in-memory index
(name -> size, in LRU order) is rebuilt on start by scanning the 256 sub-directories,
which takes well under a second for 100k blocks (tests/test_cache.py measures it).
"""
from __future__ import annotations

import collections
import errno
import logging
import mmap
import os
import struct
import threading
import time
from dataclasses import dataclass
from typing import Callable

import lru
import xxhash

from .. import buffers, cpuacct

log = logging.getLogger(__name__)

_TRAILER = struct.Struct("<QQI4s")
_MAGIC = b"NCB2"
# O_DIRECT granularity: the page size, a multiple of every disk's logical block size.
ALIGN = 4096
# Page-aligned write buffers kept for reuse (the disk writer runs 2 tasks; a third
# concurrent writer allocates one and frees it).
WRITE_BUFFERS_KEPT = 2
# Memory tier entry cap for lru-dict (it bounds by count); the byte bound is ours.
_MEM_MAX_ENTRIES = 1 << 20
# How many least-recently-used disk blocks the eviction policy looks at to choose a
# victim when an eviction ranking is set (epoch-aware eviction): a small window keeps
# eviction O(1) while letting "consumed this epoch" blocks go first.
EVICT_SCAN = 64
# After a failed write (disk full, read-only, I/O error) the disk tier serves reads
# but stops writing for this long before trying again, so a full disk costs one
# warning and one failed write per interval instead of one per block.
WRITE_RETRY_S = 5.0


@dataclass(frozen=True, slots=True)
class BlockKey:
    key: str
    version: str
    index: int

    def name(self) -> str:
        h = xxhash.xxh3_128_hexdigest(f"{self.key}\0{self.version}\0{self.index}".encode(
            "utf-8", "surrogateescape"))
        return h


class MemoryTier:
    """LRU of block bytes, bounded by total bytes.  Not thread-safe: trio loop only."""

    def __init__(self, limit_bytes: int):
        self.limit = limit_bytes
        self.used = 0
        self._lru = lru.LRU(_MEM_MAX_ENTRIES)

    def get(self, bk: BlockKey) -> bytes | None:
        return self._lru.get(bk)

    def put(self, bk: BlockKey, data: bytes) -> None:
        if len(data) > self.limit:
            return
        old = self._lru.get(bk)
        if old is not None:
            self.used -= len(old)
        self._lru[bk] = data
        self.used += len(data)
        while self.used > self.limit and len(self._lru):
            # Not popitem(): lru-dict 1.4.1 leaks the tuple it returns, and with it
            # the block (+301 MB for 300 evictions of 1 MiB: python -m bench.micro lru-leak).
            victim_key, victim = self._lru.peek_last_item()
            del self._lru[victim_key]
            self.used -= len(victim)

    def drop(self, bk: BlockKey) -> None:
        old = self._lru.pop(bk, None)
        if old is not None:
            self.used -= len(old)

    def __len__(self) -> int:
        return len(self._lru)


class DiskTier:
    """Block files under ``root/blocks``; thread-safe (a lock guards the index)."""

    def __init__(self, root: str, limit_bytes: int, write_retry_s: float = WRITE_RETRY_S):
        self.root = os.path.join(root, "blocks")
        self.write_retry_s = write_retry_s
        self.limit = limit_bytes
        self.used = 0
        self._index: collections.OrderedDict[str, int] = collections.OrderedDict()
        self._owner: dict[str, str] = {}   # block name -> object key (known this run)
        self._lock = threading.Lock()
        self._warned: set[str] = set()
        self.writable = True
        # Set by the daemon for epoch-aware eviction: object key -> rank (lower is
        # evicted first); None means plain LRU.
        self.evict_rank: Callable[[str], float] | None = None
        self.corrupt_blocks = 0
        self.write_errors = 0
        self._retry_at = 0.0
        self.direct = True       # O_DIRECT writes until the filesystem refuses them
        self._buffers = _AlignedBuffers(WRITE_BUFFERS_KEPT)

    # -- start-up ---------------------------------------------------------------
    def load(self) -> int:
        """Create the directory (0700), delete partial writes, index existing blocks.
        Returns the number of blocks indexed."""
        os.makedirs(self.root, mode=0o700, exist_ok=True)
        os.chmod(os.path.dirname(self.root), 0o700)
        entries = []
        old_format = 0
        for sub in os.scandir(self.root):
            if not sub.is_dir():
                continue
            for de in os.scandir(sub.path):
                if de.name.endswith(".tmp"):
                    _unlink(de.path)
                    continue
                try:
                    st = de.stat()
                except OSError:
                    continue
                if st.st_size % ALIGN or st.st_size < ALIGN:   # NCB1 (or damaged)
                    _unlink(de.path)
                    old_format += 1
                    continue
                # the data length is at most this (the padding is < ALIGN): reads
                # take the file size from it, eviction counts it
                entries.append((st.st_mtime, de.name, st.st_size - _TRAILER.size))
        if old_format:
            log.info("disk cache: dropped %d blocks of an older layout (refetched when "
                     "read)", old_format)
        entries.sort()
        with self._lock:
            for _, name, size in entries:
                self._index[name] = size
                self.used += size
        self._evict_to(self.limit)
        return len(entries)

    def _path(self, name: str) -> str:
        return os.path.join(self.root, name[:2], name)

    def _warn(self, kind: str, msg: str, *args) -> None:
        if kind not in self._warned:
            self._warned.add(kind)
            log.warning(msg, *args)
        else:
            log.debug(msg, *args)

    # -- lookups ------------------------------------------------------------------
    def contains(self, bk: BlockKey) -> bool:
        with self._lock:
            return bk.name() in self._index

    def get(self, bk: BlockKey) -> bytes | None:
        t0 = cpuacct.clock()
        try:
            return self._get(bk)
        finally:
            cpuacct.charge("disk_read", t0)

    def _get(self, bk: BlockKey) -> bytes | None:
        name = bk.name()
        with self._lock:
            size = self._index.get(name)
            if size is None:
                return None
            self._index.move_to_end(name)
            self._owner[name] = bk.key
        path = self._path(name)
        try:
            data, why = self._read_checked(path, size)
        except OSError as exc:
            self._warn("read", "disk cache read failed (%s); treating as a miss", exc)
            self._forget(name)
            return None
        if data is None:
            return self._corrupt(name, path, why)
        return data

    def _read_checked(self, path: str, size: int) -> tuple[memoryview | None, str]:
        """(data, "") for a block file whose trailer and checksum hold, else (None, why).
        ``size`` is the index's data length (or an upper bound within ALIGN of it): the
        file is read whole in one call and the data returned without a copy."""
        nbytes = _padded(size)
        raw = self._read_file(path, nbytes)
        if len(raw) != nbytes:
            return None, "short file"
        length, digest, flags, magic = _TRAILER.unpack_from(raw, nbytes - _TRAILER.size)
        if magic != _MAGIC or flags != 0 or _padded(length) != nbytes:
            return None, "bad trailer"
        data = memoryview(raw)[:length]
        if _checksum(data) != digest:
            return None, "checksum mismatch"
        return data, ""

    def _corrupt(self, name: str, path: str, why: str) -> None:
        self.corrupt_blocks += 1
        log.warning("disk cache block %s is corrupt (%s): dropped, will refetch", name, why)
        _unlink(path)
        self._forget(name)
        return None

    def _forget(self, name: str) -> None:
        with self._lock:
            size = self._index.pop(name, None)
            self._owner.pop(name, None)
            if size is not None:
                self.used -= size

    # -- writes ---------------------------------------------------------------------
    def put(self, bk: BlockKey, data: bytes) -> bool:
        """Store a block; False (and a log line) if it could not be stored."""
        t0 = cpuacct.clock()
        try:
            return self._put(bk, data)
        finally:
            cpuacct.charge("disk_write", t0)

    def _put(self, bk: BlockKey, data: bytes) -> bool:
        if len(data) > self.limit:
            return False
        name = bk.name()
        with self._lock:
            # Whether this write is the retry that may turn caching back on. A write that
            # began while writes still worked and finished after another thread's failure
            # must not flip the state back (that made one outage log twice).
            retrying = not self.writable
            if retrying and time.monotonic() < self._retry_at:
                return False
            if name in self._index:
                return True
            # Reserve the space under the lock: concurrent writers each evicting "to the
            # limit minus my block" and then adding overshot the limit (CI soak test).
            victims = self._take_victims(self.limit - len(data))
            self.used += len(data)
        for v in victims:
            _unlink(self._path(v))
        path = self._path(name)
        tmp = f"{path}.{threading.get_ident()}.tmp"
        try:
            try:
                self._write_file(tmp, data)
            except FileNotFoundError:         # first block in this sub-directory
                os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)
                self._write_file(tmp, data)
            os.replace(tmp, path)
        except OSError as exc:
            with self._lock:
                self.used -= len(data)             # give the reservation back
                self.write_errors += 1
                self._retry_at = time.monotonic() + self.write_retry_s
                first = self.writable
                self.writable = False
            if first:
                log.warning("disk cache write failed (%s); reading through without "
                            "caching, retrying every %.0f s", exc, self.write_retry_s)
            return False
        with self._lock:
            resumed = retrying and not self.writable
            if resumed:
                self.writable = True
            if name not in self._index:
                self._index[name] = len(data)      # its bytes were reserved above
            else:
                self.used -= len(data)             # another thread stored it meanwhile
            self._owner[name] = bk.key
        if resumed:
            log.warning("disk cache writes succeed again; caching resumed")
        return True

    def _pick_victim(self) -> str | None:
        if not self._index:
            return None
        rank = self.evict_rank
        if rank is None:
            return next(iter(self._index))
        best, best_rank = None, None
        for i, name in enumerate(self._index):
            if i >= EVICT_SCAN:
                break
            owner = self._owner.get(name)
            r = rank(owner) if owner is not None else float("-inf")
            if best is None or r < best_rank:
                best, best_rank = name, r
        return best

    def _take_victims(self, target: int) -> list[str]:
        """Drop index entries until ``used <= target``; the caller holds the lock and
        unlinks the returned names after releasing it."""
        victims = []
        while self.used > target:
            name = self._pick_victim()
            if name is None:
                break
            self.used -= self._index.pop(name)
            self._owner.pop(name, None)
            victims.append(name)
        return victims

    def _evict_to(self, target: int) -> None:
        with self._lock:
            victims = self._take_victims(target)
        for name in victims:
            _unlink(self._path(name))

    def _read_file(self, path: str, nbytes: int):
        """The first ``nbytes`` of a block file: with O_DIRECT into a fresh page-aligned
        buffer (no page cache fill, no copy), else a plain read."""
        if self.direct:
            try:
                fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_DIRECT)
            except OSError as exc:
                if exc.errno != errno.EINVAL:
                    raise
            else:
                try:
                    view = memoryview(buffers.fresh(nbytes))[:nbytes]
                    return view[:os.preadv(fd, [view], 0)]
                finally:
                    os.close(fd)
        with open(path, "rb", buffering=0) as f:
            if nbytes >= buffers.HUGE_MIN:
                return buffers.read_into(f.readinto, nbytes)
            return f.read(nbytes)

    def _write_file(self, tmp: str, data) -> None:
        """Data, padding and trailer into ``tmp`` from a page-aligned buffer: O_DIRECT
        where the filesystem allows it, else through the page cache."""
        nbytes = _padded(len(data))
        buf = self._buffers.take(nbytes)
        try:
            buf[:len(data)] = data
            buf[len(data):nbytes - _TRAILER.size] = bytes(nbytes - _TRAILER.size - len(data))
            _TRAILER.pack_into(buf, nbytes - _TRAILER.size, len(data), _checksum(data), 0,
                               _MAGIC)
            view = memoryview(buf)[:nbytes]
            try:
                _write_all(tmp, view, os.O_DIRECT if self.direct else 0)
            except OSError as exc:
                if not self.direct or exc.errno != errno.EINVAL:
                    _unlink(tmp)
                    raise
                self.direct = False       # e.g. tmpfs: no O_DIRECT
                log.info("disk cache: %s does not take O_DIRECT writes; writing through "
                         "the page cache", self.root)
                _write_all(tmp, view, 0)
            finally:
                view.release()
        except BaseException:
            _unlink(tmp)
            raise
        finally:
            self._buffers.give(buf)

    def verify_all(self) -> tuple[int, int]:
        """Check every indexed block's checksum, dropping bad ones: (good, bad)."""
        good = bad = 0
        with self._lock:
            entries = list(self._index.items())
        for name, size in entries:
            path = self._path(name)
            try:
                ok = self._read_checked(path, size)[0] is not None
            except OSError:
                ok = False
            if ok:
                good += 1
            else:
                bad += 1
                self._corrupt(name, path, "verify")
        return good, bad

    def drop(self, bk: BlockKey) -> None:
        name = bk.name()
        self._forget(name)
        _unlink(self._path(name))

    def __len__(self) -> int:
        return len(self._index)


def _padded(length: int) -> int:
    """Size on disk of a block of ``length`` data bytes (data + trailer, whole pages)."""
    return -(-(length + _TRAILER.size) // ALIGN) * ALIGN


def _write_all(path: str, view: memoryview, extra_flags: int) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC | extra_flags,
                 0o600)
    try:
        done = 0
        while done < len(view):
            done += os.write(fd, view[done:])
    finally:
        os.close(fd)


class _AlignedBuffers:
    """Page-aligned (anonymous mmap) write buffers, reused: a fresh 8 MiB mapping per
    block would page-fault and zero 2048 pages each time."""

    def __init__(self, keep: int):
        self._keep = keep
        self._free: list[mmap.mmap] = []
        self._lock = threading.Lock()

    def take(self, nbytes: int) -> mmap.mmap:
        with self._lock:
            for i, b in enumerate(self._free):
                if len(b) >= nbytes:
                    return self._free.pop(i)
        return buffers.fresh(max(nbytes, ALIGN))

    def give(self, buf: mmap.mmap) -> None:
        """Keep the ``keep`` largest buffers (a block-sized one serves every size)."""
        with self._lock:
            self._free.append(buf)
            self._free.sort(key=len, reverse=True)
            drop = self._free[self._keep:]
            del self._free[self._keep:]
        for b in drop:
            b.close()


def _checksum(data) -> int:
    t0 = cpuacct.clock()
    digest = xxhash.xxh3_64_intdigest(data)
    cpuacct.charge("checksum", t0)
    return digest


def _unlink(path: str) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass

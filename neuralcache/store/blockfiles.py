"""Block files of the disk tier: one file per block larger than ``disk.PACK_MAX``;
their format, their I/O, the start-up scan, and the page-aligned write buffers that
segment records share.

Format (``CACHE_DIR/blocks/XY/<xxh128 of the block key>``)::

    data | zero padding | u64 data length | u64 xxh3_64(data) | u32 flags (0) | b"NCB2"

The trailer ends the file and the file is a whole number of ``ALIGN`` (4 KiB) pages, so
a block is written with O_DIRECT from a page-aligned buffer: no page cache pages to
allocate (on a node whose page cache is full, a buffered write reclaims memory on the
writing thread: 1.4-1.7 CPU-s per GiB written against 0.2 with O_DIRECT here, `python
/tmp` microbenchmark in the closing note of issue 10) and the cache does not push the
job's own pages out.  Filesystems without O_DIRECT (tmpfs) get the same bytes through
the page cache.  Files of the older NCB1 layout (header first) are deleted at start.

Writes go to ``*.tmp`` then ``os.replace`` (atomic), so a crash leaves either a whole
block or a tmp file that the next start deletes.
"""
from __future__ import annotations

import errno
import mmap
import os
import struct
import threading

import xxhash

from .. import buffers, cpuacct


TRAILER = struct.Struct("<QQI4s")
MAGIC = b"NCB2"
# O_DIRECT granularity: the page size, a multiple of every disk's logical block size.
ALIGN = 4096


def padded(length: int) -> int:
    """Size on disk of a block of ``length`` data bytes (data + trailer, whole pages)."""
    return -(-(length + TRAILER.size) // ALIGN) * ALIGN


def checksum(data) -> int:
    t0 = cpuacct.clock()
    digest = xxhash.xxh3_64_intdigest(data)
    cpuacct.charge("checksum", t0)
    return digest


def scan_files(root: str):
    """The block files under ``root`` (the tier's ``blocks/``), read-only:
    ([(mtime, name, data length upper bound)], [partial writes], [older layout])."""
    files, tmp, old = [], [], []
    try:
        subs = list(os.scandir(root))
    except FileNotFoundError:
        return files, tmp, old
    for sub in subs:
        if len(sub.name) != 2 or not sub.is_dir():      # e.g. segments/
            continue
        for de in os.scandir(sub.path):
            if de.name.endswith(".tmp"):
                tmp.append(de.path)
                continue
            try:
                st = de.stat()
            except OSError:
                continue
            if st.st_size % ALIGN or st.st_size < ALIGN:   # NCB1 (or damaged)
                old.append(de.path)
                continue
            # the data length is at most this (the padding is < ALIGN): reads take the
            # file size from it, eviction counts it
            files.append((st.st_mtime, de.name, st.st_size - TRAILER.size))
    return files, tmp, old


def read_checked(path: str, size: int, direct: bool, take=None):
    """(data, "") for a block file whose trailer and checksum hold, else (None, why).
    ``size`` is the index's data length (or an upper bound within ALIGN of it): the
    file is read whole in one call and the data returned without a copy.  ``take(n)``:
    where the bytes land (buffers.Recycler.take), else fresh memory."""
    nbytes = padded(size)
    raw = _read_file(path, nbytes, direct, take)
    if len(raw) != nbytes:
        return None, "short file"
    length, digest, flags, magic = TRAILER.unpack_from(raw, nbytes - TRAILER.size)
    if magic != MAGIC or flags != 0 or padded(length) != nbytes:
        return None, "bad trailer"
    data = memoryview(raw)[:length]
    if checksum(data) != digest:
        return None, "checksum mismatch"
    return data, ""


def _read_file(path: str, nbytes: int, direct: bool, take=None):
    """The first ``nbytes`` of a block file: with O_DIRECT into a page-aligned buffer
    (``take``'s, else fresh; no page cache fill, no copy), else a plain read."""
    if direct:
        try:
            fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_DIRECT)
        except OSError as exc:
            if exc.errno != errno.EINVAL:
                raise
        else:
            try:
                view = (take or buffers.fresh_view)(nbytes)
                return view[:os.preadv(fd, [view], 0)]
            finally:
                os.close(fd)
    with open(path, "rb", buffering=0) as f:
        if take is not None and nbytes >= buffers.RECYCLE_MIN:
            return buffers.read_into(f.readinto, nbytes, into=take(nbytes))
        if nbytes >= buffers.HUGE_MIN:
            return buffers.read_into(f.readinto, nbytes)
        return f.read(nbytes)


def write_file(tmp: str, data, bufs: "AlignedBuffers", direct: bool) -> bool:
    """Data, padding and trailer into ``tmp`` from a page-aligned buffer: O_DIRECT
    where the filesystem allows it, else through the page cache.  Returns whether
    O_DIRECT was used (False: not asked for, or refused with EINVAL)."""
    nbytes = padded(len(data))
    buf = bufs.take(nbytes)
    try:
        buf[:len(data)] = data
        buf[len(data):nbytes - TRAILER.size] = bytes(nbytes - TRAILER.size - len(data))
        TRAILER.pack_into(buf, nbytes - TRAILER.size, len(data), checksum(data), 0, MAGIC)
        view = memoryview(buf)[:nbytes]
        try:
            _write_all(tmp, view, os.O_DIRECT if direct else 0)
        except OSError as exc:
            if not direct or exc.errno != errno.EINVAL:
                _unlink(tmp)
                raise
            _write_all(tmp, view, 0)
            direct = False
        finally:
            view.release()
    except BaseException:
        _unlink(tmp)
        raise
    finally:
        bufs.give(buf)
    return direct


def _write_all(path: str, view: memoryview, extra_flags: int) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC | extra_flags,
                 0o600)
    try:
        done = 0
        while done < len(view):
            done += os.write(fd, view[done:])
    finally:
        os.close(fd)


class AlignedBuffers:
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


def _unlink(path: str) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass


def file_location(path: str) -> tuple[str, int, int]:
    """(path, 0, data length) of a block file; the length read from its trailer (the
    file's size less the trailer if that is damaged)."""
    size = os.path.getsize(path)
    with open(path, "rb") as f:
        f.seek(max(0, size - TRAILER.size))
        tail = f.read()
    try:
        length = TRAILER.unpack(tail)[0]
    except struct.error:
        length = max(0, size - TRAILER.size)
    if padded(length) != size:
        length = max(0, size - TRAILER.size)
    return path, 0, length

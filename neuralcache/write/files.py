"""The state of a file with data in the journal, and the handles the FUSE edge holds.

A ``LocalFile`` exists from the moment a file is created, truncated or first written
until the remote has its last version and no writer holds it.  Its data is one
staging file (journal.py).  A staging file is *sealed* once a journal record names it
and no writer may change it any more: only then may it be uploaded.  A write to a
sealed staging file first copies it to a new one (copy on write), so an upload never
reads bytes that change under it.

``Gate`` orders access to one LocalFile: writes and reads share it; sealing, copy on
write, truncation and materialising from the remote take it alone.  Taking a free
gate never yields to the trio scheduler, so a caller that registers a LocalFile and
takes its gate in the same step is first.
"""
from __future__ import annotations

import ctypes
import os
import time
from dataclasses import dataclass, field

import trio

from ..errors import JournalError
from .journal import journal_error

# Prefix of the version of a file whose data is in the journal: no remote version
# looks like this, so the read cache never keys blocks by it.
LOCAL_VERSION = "local:"
# Early writeback: after this many bytes written to a staging file since the last
# kick, the write that crossed it asks the kernel to start writing the file's dirty
# pages to disk (``start_writeback``), so the fsync of close() finds little left to do
# instead of the whole file.  `python -m bench run --scenario checkpoint --systems
# local,neuralcache`, seven alternating pairs: close() of a 1 GiB torch.save 3.28 ->
# 2.89 s (medians), lower in 6 of 7 (bench/RESULTS.md); `python -m bench.micro
# writeback`: the fsync after 1 GiB of 1 MiB pwrites 0.42-0.45 -> 0.00-0.07 s.  8 MiB:
# the uploader's part size (one kick per part), a few ms of a local disk's bandwidth.
# 0 turns it off.
WRITEBACK_STEP = 8 << 20


class Gate:
    """Shared/exclusive lock for one LocalFile; exclusive waiters go first."""

    def __init__(self) -> None:
        self.shared = 0
        self.exclusive = False
        self._waiting_exclusive = 0
        self._lot = trio.lowlevel.ParkingLot()

    async def acquire_shared(self) -> None:
        while self.exclusive or self._waiting_exclusive:
            await self._lot.park()
        self.shared += 1

    def release_shared(self) -> None:
        self.shared -= 1
        self._lot.unpark_all()

    async def acquire_exclusive(self) -> None:
        self._waiting_exclusive += 1
        try:
            while self.exclusive or self.shared:
                await self._lot.park()
        finally:
            self._waiting_exclusive -= 1
        self.exclusive = True

    def release_exclusive(self) -> None:
        self.exclusive = False
        self._lot.unpark_all()

    def held_shared(self) -> "_Held":
        return _Held(self, False)

    def held_exclusive(self) -> "_Held":
        return _Held(self, True)


class _Held:
    __slots__ = ("gate", "excl")

    def __init__(self, gate: Gate, excl: bool):
        self.gate, self.excl = gate, excl

    async def __aenter__(self) -> None:
        if self.excl:
            await self.gate.acquire_exclusive()
        else:
            await self.gate.acquire_shared()

    async def __aexit__(self, *exc) -> None:
        if self.excl:
            self.gate.release_exclusive()
        else:
            self.gate.release_shared()


@dataclass(eq=False)
class LocalFile:
    inode: int
    key: str                        # its path now (renames follow it)
    staging: str                    # current staging file
    fd: int | None                  # read-write descriptor of it while writers hold it
    size: int = 0
    mtime: float = field(default_factory=time.time)
    writers: int = 0                # write handles attached
    sealed: bool = False            # staging may not change: it may be uploaded
    dirty: bool = False             # changed since its last journal record
    dir_synced: bool = False        # the staging file's directory entry is fsynced
    remote_base: bool = False       # the remote may hold an object at ``key``
    unlinked: bool = False
    uploaded: object = None         # ObjectInfo of the upload of the current staging
    fresh: bool = False             # created empty and never copied: may stream
    stream: object = None           # stream.Stream sending parts while it is written
    unkicked: int = 0               # bytes written since the last start_writeback
    gate: Gate = field(default_factory=Gate)
    # write-behind (behind.py): token -> (offset, end) of each write answered but not
    # yet in the staging file; the first failed one's error and offset
    inflight: dict = field(default_factory=dict)
    error: BaseException | None = None
    error_at: int = 0

    @property
    def version(self) -> str:
        return LOCAL_VERSION + self.staging


class WriteHandle:
    """A file opened with write access.  ``lf`` is attached on the first write (or at
    open with O_TRUNC / for a new file): until then reads go to the remote version
    ``pinned`` like a read-only open, so O_RDWR opens that only read copy nothing."""

    __slots__ = ("inode", "lf", "pinned", "pid", "append")

    def __init__(self, inode: int, lf: LocalFile | None, pinned, pid: int, append: bool):
        self.inode, self.lf, self.pinned, self.pid, self.append = inode, lf, pinned, pid, append


class ReadHandle:
    """A read-only open of a file with journal data: its own descriptor on the staging
    file it reads (readers.py moves it to the file's current one; ``spent`` keeps the
    descriptors it left while ``reading``, its reads in flight, is not 0; ``pin``:
    the remote object it reads once it gave its copy up under a full journal)."""

    __slots__ = ("lf", "staging", "fd", "spent", "reading", "pin")

    def __init__(self, lf: LocalFile, staging: str, fd: int):
        self.lf, self.staging, self.fd = lf, staging, fd
        self.spent: list[int] = []
        self.reading = 0
        self.pin = None


class SyncHandle:
    """``.neuralcache/sync``: write a command, read the answer (the read waits)."""

    __slots__ = ("command", "answer")

    def __init__(self) -> None:
        self.command = bytearray()
        self.answer: bytes | None = None


# -- blocking helpers (worker threads) -------------------------------------------------
def pwrite_all(fd: int, data: bytes, offset: int, writeback: bool = False) -> None:
    """Write all of ``data`` at ``offset``; then, with ``writeback``, start the
    writeback of the file's dirty pages (``start_writeback``)."""
    view = memoryview(data)
    try:
        while view:
            n = os.pwrite(fd, view, offset)
            view, offset = view[n:], offset + n
    except OSError as exc:
        raise journal_error(exc, "writing to the journal") from None
    if writeback:
        start_writeback(fd)


def _sync_file_range():
    try:
        # the C library this process already has (dlopen(NULL)), without
        # find_library's ldconfig subprocess
        f = ctypes.CDLL(None, use_errno=True).sync_file_range
    except (OSError, AttributeError):       # not glibc/Linux: no early writeback
        return None
    f.argtypes = [ctypes.c_int, ctypes.c_longlong, ctypes.c_longlong, ctypes.c_uint]
    f.restype = ctypes.c_int
    return f


_SYNC_FILE_RANGE = _sync_file_range()
SYNC_FILE_RANGE_WRITE = 2       # <fcntl.h>: start writeback of dirty pages, wait for none


def start_writeback(fd: int) -> bool:
    """Ask the kernel to start writing ``fd``'s dirty pages to disk (Linux
    sync_file_range(SYNC_FILE_RANGE_WRITE) over the whole file: it waits for no I/O,
    only for room in a full device queue; ctypes releases the GIL).  A hint, so it
    never fails: without a WAIT flag it does not consume the file's writeback error
    (errseq), so a failed writeback is still reported by close()'s fsync.  True if
    the kernel took it."""
    if _SYNC_FILE_RANGE is None:
        return False
    return _SYNC_FILE_RANGE(fd, 0, 0, SYNC_FILE_RANGE_WRITE) == 0


def pread(fd: int, size: int, offset: int) -> bytes:
    try:
        return os.pread(fd, size, offset)
    except OSError as exc:
        raise JournalError(f"reading from the journal: {exc.strerror}") from None


def copy_prefix(src: str, dst_fd: int, length: int) -> None:
    """The first ``length`` bytes of file ``src`` into ``dst_fd`` (copy on write)."""
    try:
        fd = os.open(src, os.O_RDONLY | os.O_CLOEXEC)
    except OSError as exc:
        raise journal_error(exc, "opening a staging file") from None
    try:
        off = 0
        while off < length:
            try:
                n = os.copy_file_range(fd, dst_fd, length - off, off, off)
            except OSError:
                n = 0
            if n <= 0:          # not supported here, or past the source's end
                data = os.pread(fd, min(8 << 20, length - off), off)
                if not data:
                    break
                pwrite_all(dst_fd, data, off)
                n = len(data)
            off += n
    except OSError as exc:
        raise journal_error(exc, "copying a staging file") from None
    finally:
        os.close(fd)


def fsync(fd: int) -> None:
    try:
        os.fsync(fd)
    except OSError as exc:
        raise journal_error(exc, "syncing a staging file") from None


def truncate(fd: int, size: int) -> None:
    try:
        os.ftruncate(fd, size)
    except OSError as exc:
        raise journal_error(exc, "truncating a staging file") from None

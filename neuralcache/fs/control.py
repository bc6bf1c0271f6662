"""The control directory inside a mount: ``MOUNT/.neuralcache/``.

    stats.json  read   live counters (the JSON of `neuralcache stats --json`)
    hints       write  the job's upcoming read order: one path per line, relative to
                       the mount root, written in order from the start; applied when
                       the writer closes the file (an empty file clears the hints); a
                       malformed hint fails the write() that carries it with EINVAL
                       and changes nothing.  Paths are not checked against the
                       listing (directories are listed as they are used): one that
                       names nothing is skipped when its turn comes
    trace       read   the access trace ring as JSON Lines (DEVELOPING.md)
    query       write "cached PATH" / "version PATH" lines, then read one answer line
                       each (what `warm --check` and `manifest export` ask of files)
    sync        write a command, then read the answer (a --writable mount only):
                       "sync" waits until everything written so far is on the
                       remote; "discard PATH" drops PATH's pending upload; "force"
                       lets the next unmount leave pending uploads to the next mount.
                       The answer is one line, "ok ..." or "error: ..." (what
                       `neuralcache sync` and `neuralcache umount` use)

The directory is hidden from readdir of the root (so dataset walkers such as
ImageFolder never see it) but resolves by name.  Contents are produced when a file is
opened, so one open sees one consistent snapshot.

The mode bits tell the truth (the mount uses the kernel's default_permissions, so the
bits are what is enforced): without --allow-other only the mounting user can reach the
mount at all, so everything is owner-only; with it (``shared``), every user may read
stats.json and write hints (a training job rarely runs as the user that mounted), and
the trace, which shows every user's reads, stays the owner's.  ``sync`` stays the
owner's too: --discard drops data.
"""
from __future__ import annotations

import errno
import os
import stat
import threading
import time
from typing import Callable

import pyfuse3
from predictors.hints import HintStream

from ..admin.mounts import CONTROL_DIR
from ..buffers import release_free_memory
from ..errors import UserError
from ..store.blocks import Pinned

DIRNAME = CONTROL_DIR
DIR_INODE = 2
STATS_INODE = 3
HINTS_INODE = 4
TRACE_INODE = 5
SYNC_INODE = 6
QUERY_INODE = 7
_FILES = {"stats.json": STATS_INODE, "hints": HINTS_INODE, "trace": TRACE_INODE,
          "query": QUERY_INODE}
# Mode bits (see the module docstring): owner-only, and with --allow-other.
_MODES = {DIR_INODE: 0o500, STATS_INODE: 0o400, HINTS_INODE: 0o600, TRACE_INODE: 0o400,
          SYNC_INODE: 0o600, QUERY_INODE: 0o600}
_SHARED_MODES = {DIR_INODE: 0o555, STATS_INODE: 0o444, HINTS_INODE: 0o622,
                 TRACE_INODE: 0o400, SYNC_INODE: 0o600, QUERY_INODE: 0o666}
# Lines of one query (``query`` file): its answer is computed on the trio thread in one
# go, ~30 us a line; 2,000 lines keep that under ~60 ms.
MAX_QUERY_LINES = 2000
# Largest hint file accepted: 1 GiB holds predictors.hints.MAX_HINTS (10 M) paths of
# ~100 bytes; what the daemon keeps of them is ~12 bytes a path (PackedOrder).
MAX_HINT_BYTES = 1 << 30


def is_control_inode(inode: int) -> bool:
    return DIR_INODE <= inode <= QUERY_INODE


class ContentHandle:
    """A read-only snapshot taken at open."""

    def __init__(self, content: bytes):
        self.content = content

    def read(self, off: int, size: int) -> bytes:
        return self.content[off:off + size]


class HintsHandle:
    """The hints file open for writing: paths are checked and packed as the writes come
    (predictors.hints.HintStream, in a worker thread: ``write`` may take ~25 ms per
    128 KiB), so a bad path fails the write() that carries it with EINVAL and an epoch
    of a million paths is never held as text; close() installs the order."""

    threaded_write = True       # fs/operations.py runs write() in a worker thread

    def __init__(self, apply: Callable[[object], int], current: bytes, truncate: bool):
        self._apply = apply
        self._current = current
        self._stream: HintStream | None = None
        self._next = 0              # the offset the next write must start at
        self._truncate = truncate   # O_TRUNC and nothing written: clear the hints
        self._lock = threading.Lock()

    def read(self, off: int, size: int) -> bytes:
        return self._current[off:off + size]

    def write(self, off: int, data: bytes) -> int:
        with self._lock:
            self._truncate = False      # written to: not an empty file (even if refused)
            if off + len(data) > MAX_HINT_BYTES:
                self._stream = None
                raise pyfuse3.FUSEError(errno.EFBIG)
            if off != self._next:
                self._stream = None
                raise UserError("hints are written in order from the start of the file "
                                f"(a write at {off}, expected {self._next})")
            if self._stream is None:
                self._stream = HintStream()
            try:
                self._stream.feed(bytes(data))
            except ValueError as exc:     # refused whole: close() changes nothing
                self._stream, self._next = None, 0
                raise UserError(f"hints refused: {exc}") from None
            self._next += len(data)
            return len(data)

    def finish(self) -> object:
        """The written order, sealed (or [] to clear the hints, or None: nothing to
        install).  Runs in a worker thread (fs/operations.py), so that sealing an
        epoch and handing the parse's freed memory back (malloc_trim) stay off the
        trio thread."""
        with self._lock:
            stream, self._stream = self._stream, None
            truncate, self._truncate = self._truncate, False
            if stream is None:
                return [] if truncate else None
            try:
                order = stream.finish()
            except ValueError as exc:
                raise UserError(f"hints refused: {exc}") from None
            if len(order) > 100_000:
                release_free_memory()         # what parsing them allocated and freed
            return order

    def install(self, order: object) -> None:
        """On the trio thread: hand what ``finish`` returned to the prefetcher."""
        if order is not None:
            self._apply(order)


class QueryHandle:
    """``.neuralcache/query``: write lines ``cached PATH`` or ``version PATH`` (PATH
    relative to the mount root), then read one answer line per query: the bytes of the
    file held by the caches (what `neuralcache warm --check` adds up), or the version
    (ETag, or size:mtime) the next open will pin; ``-`` for a path that is not a file.
    What extended attributes would carry, without a getxattr request per file: `ls -l`
    asks every file for two attributes, so the mount answers getxattr with ENOSYS once
    and the kernel asks no more."""

    def __init__(self, answer: Callable[[list[str]], bytes]):
        self._answer = answer
        self.command = bytearray()
        self.result: bytes | None = None

    def write(self, off: int, data: bytes) -> int:
        self.command += data
        self.result = None
        return len(data)

    def read(self, off: int, size: int) -> bytes:
        if self.result is None:
            lines = self.command.decode("utf-8", "surrogateescape").splitlines()
            if len(lines) > MAX_QUERY_LINES:
                raise UserError(f"a query is at most {MAX_QUERY_LINES} lines")
            self.result = self._answer(lines)
        return self.result[off:off + size]


class Control:
    def __init__(self, *, stats: Callable[[], bytes], trace: Callable[[], bytes],
                 apply_hints: Callable[[list[str]], int], hints_status: Callable[[], bytes],
                 uid: int, gid: int, shared: bool = False,
                 sync_open: Callable[[], object] | None = None):
        self._stats = stats
        self._trace = trace
        self._apply_hints = apply_hints
        self._hints_status = hints_status
        self.uid, self.gid = uid, gid
        self._modes = _SHARED_MODES if shared else _MODES
        self._t = time.time_ns()
        # A writable mount's sync file: a handle the write layer serves.
        self._sync_open = sync_open
        self.query: Callable[[list[str]], bytes] | None = None   # set by the daemon
        self._files = dict(_FILES, **({"sync": SYNC_INODE} if sync_open else {}))

    def getattr(self, inode: int) -> pyfuse3.EntryAttributes:
        a = pyfuse3.EntryAttributes()
        a.st_ino = inode
        a.entry_timeout = 1.0
        a.attr_timeout = 0.0   # always ask: contents change
        if inode == DIR_INODE:
            a.st_mode = stat.S_IFDIR | self._modes[inode]
            a.st_nlink = 2
        else:
            a.st_mode = stat.S_IFREG | self._modes[inode]
            a.st_nlink = 1
        a.st_size = 0
        a.st_uid, a.st_gid = self.uid, self.gid
        a.st_atime_ns = a.st_mtime_ns = a.st_ctime_ns = self._t
        a.st_blksize = 4096
        return a

    def lookup(self, parent: int, name: str) -> pyfuse3.EntryAttributes:
        if parent == DIR_INODE and name in self._files:
            return self.getattr(self._files[name])
        if parent == DIR_INODE and name in (".", ".."):
            return self.getattr(DIR_INODE)
        if name == DIRNAME:
            return self.getattr(DIR_INODE)
        raise pyfuse3.FUSEError(errno.ENOENT)

    def remember(self, inode: int) -> None:
        """Control inodes are static: lookup counts need no tracking."""

    def entries(self, inode: int) -> list:
        if inode != DIR_INODE:
            raise pyfuse3.FUSEError(errno.ENOTDIR)
        return [(name, self.getattr(ino)) for name, ino in sorted(self._files.items())]

    def open(self, inode: int, flags: int, ctx) -> object:
        if inode == DIR_INODE:
            raise pyfuse3.FUSEError(errno.EISDIR)
        if inode == SYNC_INODE:
            if self._sync_open is None:
                raise pyfuse3.FUSEError(errno.ENOENT)
            return self._sync_open()
        writing = flags & os.O_ACCMODE != os.O_RDONLY
        if inode == QUERY_INODE:
            if self.query is None:
                raise pyfuse3.FUSEError(errno.ENOENT)
            return QueryHandle(self.query)
        if inode != HINTS_INODE and writing:
            raise pyfuse3.FUSEError(errno.EACCES)
        if inode == STATS_INODE:
            return ContentHandle(self._stats())
        if inode == TRACE_INODE:
            return ContentHandle(self._trace())
        return HintsHandle(self._apply_hints, self._hints_status(),
                           writing and bool(flags & os.O_TRUNC))


def answer_query(ns, store, writes, lines: list[str]) -> bytes:
    """The ``query`` file's answer (QueryHandle): per line ``cached PATH`` (bytes of the
    file in the cache tiers) or ``version PATH``; "-" for anything else."""
    out = []
    for line in lines:
        what, _, path = line.partition(" ")
        node = ns.by_path(path.strip("/"))
        if node is None or node.is_dir or what not in ("cached", "version"):
            out.append("-")
        elif what == "version":
            out.append(node.version)
        else:
            key = writes.remote_key(node) if writes is not None else node.key
            p = Pinned(key, node.version, node.size)
            out.append(str(sum(store.block_range(p, i)[1] for i in range(store.nblocks(p))
                               if store.cached(p, i))))
    return ("\n".join(out) + "\n").encode("utf-8", "surrogateescape") if out else b""

"""The control directory inside a mount: ``MOUNT/.neuralcache/``.

    stats.json  read   live counters (the JSON of `neuralcache stats --json`)
    hints       write  the job's upcoming read order: one path per line, relative to
                       the mount root; applied when the writer closes the file; a
                       malformed hint fails close() with EINVAL and changes nothing
    trace       read   the access trace ring as JSON Lines (DEVELOPING.md)
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
import time
from typing import Callable

import pyfuse3

from ..errors import UserError

DIRNAME = ".neuralcache"
DIR_INODE = 2
STATS_INODE = 3
HINTS_INODE = 4
TRACE_INODE = 5
SYNC_INODE = 6
_FILES = {"stats.json": STATS_INODE, "hints": HINTS_INODE, "trace": TRACE_INODE}
# Mode bits (see the module docstring): owner-only, and with --allow-other.
_MODES = {DIR_INODE: 0o500, STATS_INODE: 0o400, HINTS_INODE: 0o600, TRACE_INODE: 0o400,
          SYNC_INODE: 0o600}
_SHARED_MODES = {DIR_INODE: 0o555, STATS_INODE: 0o444, HINTS_INODE: 0o622,
                 TRACE_INODE: 0o400, SYNC_INODE: 0o600}
# Extended attributes of regular files (operations.getxattr; read by `neuralcache warm`).
XATTR_CACHED = "user.neuralcache.cached"      # bytes of the file held by the caches
XATTR_VERSION = "user.neuralcache.version"    # ETag or size:mtime the next open pins
# Largest hint file accepted: 64 MiB holds an epoch order of ~1M paths of ~60 bytes.
MAX_HINT_BYTES = 64 << 20


def is_control_inode(inode: int) -> bool:
    return DIR_INODE <= inode <= SYNC_INODE


class ContentHandle:
    """A read-only snapshot taken at open."""

    def __init__(self, content: bytes):
        self.content = content

    def read(self, off: int, size: int) -> bytes:
        return self.content[off:off + size]


class HintsHandle:
    def __init__(self, apply: Callable[[list[str]], int], current: bytes):
        self._apply = apply
        self._buf = bytearray()
        self._dirty = False
        self._current = current

    def read(self, off: int, size: int) -> bytes:
        return self._current[off:off + size]

    def write(self, off: int, data: bytes) -> int:
        if off + len(data) > MAX_HINT_BYTES:
            raise pyfuse3.FUSEError(errno.EFBIG)
        if off > len(self._buf):
            self._buf.extend(b"\0" * (off - len(self._buf)))
        self._buf[off:off + len(data)] = data
        self._dirty = True
        return len(data)

    def flush(self) -> None:
        if not self._dirty:
            return
        self._dirty = False
        try:
            text = self._buf.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise UserError(f"hints are not UTF-8 text: {exc}") from None
        paths = [ln.strip() for ln in text.splitlines()]
        paths = [p for p in paths if p]
        self._apply(paths)


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
        if inode != HINTS_INODE and writing:
            raise pyfuse3.FUSEError(errno.EACCES)
        if inode == STATS_INODE:
            return ContentHandle(self._stats())
        if inode == TRACE_INODE:
            return ContentHandle(self._trace())
        return HintsHandle(self._apply_hints, self._hints_status())

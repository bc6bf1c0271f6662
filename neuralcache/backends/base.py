"""The backend protocol: a few blocking calls, run by callers in worker threads.

Every method raises only the domain errors of ``neuralcache.errors`` (NotFound,
PermissionDenied, Unavailable, VersionChanged); retries happen inside.

The write calls (used only by a ``--writable`` mount, from neuralcache/write/) are
each safe to repeat after a crash or a lost answer: the journal replays them.
"""
from __future__ import annotations

import errno
import io
import os
from concurrent.futures import FIRST_COMPLETED, ThreadPoolExecutor, wait
from dataclasses import dataclass
from typing import Callable, Iterator, Protocol

# Longest file name most Linux filesystems (and the kernel's FUSE layer) accept.
NAME_MAX = 255


@dataclass(frozen=True, slots=True)
class ObjectInfo:
    key: str        # path relative to the source root, '/'-separated, no leading '/'
    size: int
    version: str    # ETag for S3, "size:mtime_ns" for POSIX
    mtime: float    # seconds since the epoch


def valid_key(key: str) -> bool:
    """True if ``key`` maps to a path inside the mount root.

    Keys with empty, ``.`` or ``..`` components, NUL bytes, or components longer than
    NAME_MAX bytes cannot be shown safely and are skipped (with a log line) by listing.
    """
    if not key or key.startswith("/") or "\x00" in key:
        return False
    for part in key.split("/"):
        if part in ("", ".", "..") or len(part.encode("utf-8", "surrogateescape")) > NAME_MAX:
            return False
    return True


class FileWindow(io.RawIOBase):
    """``length`` bytes of an open file from ``offset``, read on demand: the body of a
    large upload part, so that sending it holds at most ``CHUNK`` bytes in memory
    (botocore reads it to checksum, seeks back, and reads it again to send it).
    Reading past the file's end is an error: the staging file must not shrink."""

    # Largest read: 1 MiB, botocore's own checksum chunk.
    CHUNK = 1 << 20

    def __init__(self, fd: int, offset: int, length: int):
        super().__init__()
        self.fd, self.offset, self.length, self.pos = fd, offset, length, 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self.pos

    def seek(self, pos: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self.pos, io.SEEK_END: self.length}[whence]
        self.pos = max(0, min(self.length, base + pos))
        return self.pos

    def read(self, n: int | None = -1) -> bytes:
        if n is None or n < 0:
            n = self.length - self.pos
        n = min(n, self.length - self.pos, self.CHUNK)
        if n <= 0:
            return b""
        data = os.pread(self.fd, n, self.offset + self.pos)
        if not data:
            raise OSError(errno.EIO, "file shorter than the part being sent")
        self.pos += len(data)
        return data

    def readinto(self, b) -> int:
        data = self.read(len(b))
        b[:len(data)] = data
        return len(data)

    def __len__(self) -> int:
        return self.length


def walk_parallel(scan: Callable[[str], tuple[list[ObjectInfo], list[str]]], start: str,
                  workers: int) -> Iterator[ObjectInfo]:
    """Breadth-first listing: ``scan(dir)`` returns (objects, sub-directories) and runs
    in ``workers`` threads, one directory each, so a remote listing costs ~depth round
    trips instead of one per directory."""
    with ThreadPoolExecutor(workers, thread_name_prefix="nc-list") as pool:
        pending = {pool.submit(scan, start)}
        while pending:
            done, pending = wait(pending, return_when=FIRST_COMPLETED)
            for fut in done:
                objs, dirs = fut.result()
                yield from objs
                for d in dirs:
                    pending.add(pool.submit(scan, d))


class Backend(Protocol):
    description: str
    # The remote's limits, checked by a --writable mount before it accepts a name or a
    # length (write/limits.py): the largest object in bytes (None: no limit of its
    # own) and the longest key (None: none).
    max_object_size: int | None
    max_key_bytes: int | None

    def key_bytes(self, key: str) -> int:
        """Length of ``key`` as the remote counts it (the prefix included)."""

    def check(self) -> None:
        """Raise a domain error if the source cannot be listed and read."""

    def list_all(self) -> Iterator[ObjectInfo]:
        """Every object under the source root (parallel inside), in no special order."""

    def list_dir(self, key: str) -> Iterator[tuple[list[ObjectInfo], list[str]]]:
        """The directory ``key`` ("" for the root), in pages: (its files, the names of
        its subdirectories).  A missing directory is empty."""

    def probe(self, key: str) -> tuple[ObjectInfo | None, bool]:
        """(the object at ``key`` or None, whether ``key`` is a directory)."""

    def stat(self, key: str) -> ObjectInfo:
        """Current metadata of one object."""

    def read(self, key: str, offset: int, length: int, version: str) -> bytes:
        """Exactly ``length`` bytes at ``offset`` (fewer only at end of object) of
        ``version``; VersionChanged if the object is no longer that version."""

    # -- writes ----------------------------------------------------------------------
    def put(self, key: str, data: bytes) -> ObjectInfo:
        """Create or replace ``key`` with ``data`` in one request (small files)."""

    def create_multipart(self, key: str) -> str:
        """Start a multipart upload of ``key``; returns its upload id."""

    def upload_part(self, key: str, upload_id: str, number: int, offset: int,
                    data: bytes | FileWindow) -> str:
        """Part ``number`` (1-based, at byte ``offset``); returns the part's tag.  Parts
        may be sent in any order and in parallel; all but the last are the same size.
        ``data`` is the bytes, or for a large part a FileWindow to read them from."""

    def complete_multipart(self, key: str, upload_id: str, parts: list[tuple[int, str]],
                           size: int) -> ObjectInfo:
        """Publish the upload (readers see the old object or the whole new one)."""

    def abort_multipart(self, key: str, upload_id: str) -> None:
        """Drop an upload (best effort, never raises)."""

    def copy(self, src: str, dst: str) -> ObjectInfo:
        """Server-side copy, replacing ``dst``; NotFound if ``src`` is missing."""

    def delete(self, key: str) -> None:
        """Remove ``key``; a missing key is not an error."""

    def close(self) -> None:
        """Release connections."""

"""POSIX backend: a directory, e.g. an NFS or SMB mount of the dataset.

The version of a file is "size:mtime_ns"; a read checks the version after reading
(fstat on the same descriptor), so a file replaced mid-read raises VersionChanged
instead of returning a mix of two versions.  Symlinks are followed only when their
target stays inside the root.
"""
from __future__ import annotations

import errno
import logging
import os
from typing import Iterator

from ..errors import NotFound, PermissionDenied, Unavailable, UserError, VersionChanged
from .base import ObjectInfo, valid_key, walk_parallel

log = logging.getLogger(__name__)

# Directories scanned in parallel at mount time (NFS answers one round trip per readdir).
LIST_WORKERS = 16


def _version(st: os.stat_result) -> str:
    return f"{st.st_size}:{st.st_mtime_ns}"


def _map_oserror(exc: OSError, what: str) -> Exception:
    if exc.errno in (errno.ENOENT, errno.ENOTDIR):
        return NotFound(f"{what}: not found")
    if exc.errno in (errno.EACCES, errno.EPERM):
        return PermissionDenied(f"{what}: permission denied")
    return Unavailable(f"{what}: {os.strerror(exc.errno or 0)}")


class PosixBackend:
    def __init__(self, root: str):
        self.root = os.path.realpath(root)
        self.description = self.root

    def check(self) -> None:
        if not os.path.exists(self.root):
            raise UserError(f"source directory {self.root} does not exist")
        if not os.path.isdir(self.root):
            raise UserError(f"source {self.root} is not a directory (use s3://BUCKET for S3)")
        if not os.access(self.root, os.R_OK | os.X_OK):
            raise UserError(f"source directory {self.root} is not readable by this user")

    def _path(self, key: str) -> str:
        if not valid_key(key):
            raise NotFound(f"{key!r}: not a valid path")
        return os.path.join(self.root, key)

    def _inside(self, path: str) -> bool:
        real = os.path.realpath(path)
        return real == self.root or real.startswith(self.root + os.sep)

    def _scan(self, rel: str) -> tuple[list[ObjectInfo], list[str]]:
        objs: list[ObjectInfo] = []
        dirs: list[str] = []
        base = os.path.join(self.root, rel) if rel else self.root
        try:
            it = os.scandir(base)
        except OSError as exc:
            log.warning("cannot list %s: %s", base, exc)
            return objs, dirs
        with it:
            for de in it:
                key = f"{rel}/{de.name}" if rel else de.name
                if not valid_key(key):
                    log.warning("skipping name that cannot be a path: %r", key)
                    continue
                try:
                    if de.is_symlink() and not self._inside(de.path):
                        log.warning("skipping symlink leaving the source: %s", key)
                        continue
                    if de.is_dir():
                        dirs.append(key)
                    elif de.is_file():
                        st = de.stat()
                        objs.append(ObjectInfo(key, st.st_size, _version(st), st.st_mtime))
                except OSError as exc:
                    log.warning("skipping %s: %s", key, exc)
        return objs, dirs

    def list_all(self) -> Iterator[ObjectInfo]:
        return walk_parallel(self._scan, "", LIST_WORKERS)

    def stat(self, key: str) -> ObjectInfo:
        path = self._path(key)
        try:
            st = os.stat(path)
        except OSError as exc:
            raise _map_oserror(exc, key) from None
        if not os.path.isfile(path) or not self._inside(path):
            raise NotFound(f"{key}: not a regular file")
        return ObjectInfo(key, st.st_size, _version(st), st.st_mtime)

    def read(self, key: str, offset: int, length: int, version: str) -> bytes:
        path = self._path(key)
        try:
            fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        except OSError as exc:
            raise _map_oserror(exc, key) from None
        try:
            chunks = []
            done = 0
            while done < length:
                b = os.pread(fd, length - done, offset + done)
                if not b:
                    break
                chunks.append(b)
                done += len(b)
            st = os.fstat(fd)
        except OSError as exc:
            raise _map_oserror(exc, key) from None
        finally:
            os.close(fd)
        if version and _version(st) != version:
            raise VersionChanged(f"{key}: file changed on the source")
        data = b"".join(chunks)
        if len(data) != length:
            raise VersionChanged(f"{key}: file shorter than expected")
        return data

    def close(self) -> None:
        pass

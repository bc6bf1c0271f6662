"""POSIX backend: a directory, e.g. an NFS or SMB mount of the dataset.

The version of a file is "size:mtime_ns"; a read checks the version after reading
(fstat on the same descriptor), so a file replaced mid-read raises VersionChanged
instead of returning a mix of two versions.  Symlinks are followed only when their
target stays inside the root.

Writes (a ``--writable`` mount) treat the directory like an object store: a file is
written to a temporary file in its target directory (``TMP_PREFIX``, never listed),
fsynced, renamed over the target and the directory fsynced, so a reader sees the old
file or the new one, never a part.  Parent directories are created as needed and
removed again when a delete empties them (directories exist only as parents of files,
as on S3).
"""
from __future__ import annotations

import errno
import logging
import os
import uuid
from typing import Iterator

from ..buffers import RECYCLE_MIN, read_into
from ..errors import NotFound, PermissionDenied, Unavailable, UserError, VersionChanged
from .base import FileWindow, ObjectInfo, valid_key, walk_parallel

log = logging.getLogger(__name__)

# Directories scanned in parallel at mount time (NFS answers one round trip per readdir).
LIST_WORKERS = 16
# Filesystem types whose listings wait on the network (a stat each may be a round
# trip): the lister lists ahead in parallel there, one at a time elsewhere
# (meta/lister.py CRAWL_AHEAD).  From /proc/self/mounts; fuse.* covers sshfs,
# s3fs, gcsfuse and the like.
NETWORK_FS = {"nfs", "nfs4", "cifs", "smb3", "smbfs", "ceph", "lustre", "gpfs", "9p",
              "glusterfs", "beegfs", "wekafs", "afs", "ocfs2", "gfs2", "panfs", "orangefs"}


def network_fs(path: str, mounts: str = "/proc/self/mounts") -> bool:
    """Whether ``path`` (a real path) lies on a network filesystem (True when unsure)."""
    best, fstype = "", None
    try:
        with open(mounts) as f:
            for line in f:
                parts = line.split()
                if len(parts) < 3:
                    continue
                mp = parts[1].replace("\\040", " ")
                if (path == mp or path.startswith(mp.rstrip("/") + "/")) and len(mp) >= len(best):
                    best, fstype = mp, parts[2]
    except OSError:
        return True
    if fstype is None:
        return True
    return fstype in NETWORK_FS or fstype.startswith("fuse.") or fstype == "fuse"


# Name prefix of files being written (a put or upload in progress): skipped by listing.
TMP_PREFIX = ".neuralcache-tmp-"


def _version(st: os.stat_result) -> str:
    return f"{st.st_size}:{st.st_mtime_ns}"


def _map_oserror(exc: OSError, what: str) -> Exception:
    if exc.errno in (errno.ENOENT, errno.ENOTDIR):
        return NotFound(f"{what}: not found")
    if exc.errno in (errno.EACCES, errno.EPERM):
        return PermissionDenied(f"{what}: permission denied")
    return Unavailable(f"{what}: {os.strerror(exc.errno or 0)}")


def _pwrite_all(fd: int, data, off: int) -> None:
    view = memoryview(data)
    while view:
        n = os.pwrite(fd, view, off)
        view, off = view[n:], off + n


_ZEROS = bytes(FileWindow.CHUNK)


def _write_part(fd: int, data, offset: int) -> None:
    """A part's bytes (``data``: bytes, or a FileWindow on the staging file) into ``fd``
    at ``offset``, keeping holes: a sparse checkpoint (``ftruncate`` to 1 TiB, a few
    bytes at its end) lands as sparse as it was written, not as a terabyte of zeros.
    A run of zeros is written only over data ``fd`` already holds there (an earlier
    try of the part); a hole stays a hole (``complete_multipart`` sets the size).  A
    window's holes are found without reading them (SEEK_DATA / SEEK_HOLE)."""
    if not isinstance(data, FileWindow):
        view = memoryview(data)
        for pos in range(0, len(view), FileWindow.CHUNK):
            chunk = view[pos:pos + FileWindow.CHUNK]
            if chunk == _ZEROS[:len(chunk)]:
                _zero_data(fd, offset + pos, offset + pos + len(chunk))
            else:
                _pwrite_all(fd, chunk, offset + pos)
        return
    start, end = data.offset, data.offset + data.length
    pos = start
    while pos < end:
        data_at, hole_at = _extent(data.fd, pos, end)
        _zero_data(fd, offset + pos - start, offset + data_at - start)   # (a hole)
        pos = data_at
        while pos < hole_at:
            chunk = os.pread(data.fd, min(FileWindow.CHUNK, hole_at - pos), pos)
            if not chunk:
                raise OSError(errno.EIO, "file shorter than the part being sent")
            _write_part(fd, chunk, offset + pos - start)
            pos += len(chunk)


def _extent(fd: int, pos: int, end: int) -> tuple[int, int]:
    """(where the next data of ``fd`` at or after ``pos`` starts, where it ends), both
    within ``end``; (end, end) when there is none.  A filesystem without holes reports
    all of it as data."""
    try:
        data_at = min(os.lseek(fd, pos, os.SEEK_DATA), end)
        hole_at = min(os.lseek(fd, data_at, os.SEEK_HOLE), end) if data_at < end else end
    except OSError as exc:
        if exc.errno == errno.ENXIO:      # no data past pos
            return end, end
        if exc.errno in (errno.EINVAL, errno.EOPNOTSUPP):   # no SEEK_DATA here
            return pos, end
        raise
    return data_at, hole_at


def _zero_data(fd: int, lo: int, hi: int) -> None:
    """Zeros over whatever data ``fd`` holds in ``[lo, hi)``; its holes stay."""
    while lo < hi:
        data_at, hole_at = _extent(fd, lo, hi)
        for at in range(data_at, hole_at, FileWindow.CHUNK):
            _pwrite_all(fd, _ZEROS[:min(FileWindow.CHUNK, hole_at - at)], at)
        lo = hole_at


class PosixBackend:
    # The source filesystem's largest file, measured by a --writable mount
    # (``measure_limits``; until then None: unchecked); a path is at most PATH_MAX
    # (4,096 bytes with its NUL).
    max_object_size = None
    max_key_bytes = 4095
    # A buffers.Recycler that block reads land in (the daemon sets it), as for S3.
    read_buffers = None

    def key_bytes(self, key: str) -> int:
        return len(os.fsencode(os.path.join(self.root, key)))

    def __init__(self, root: str):
        self.root = os.path.realpath(root)
        self.description = self.root
        self.lists_over_network = network_fs(self.root)

    def measure_limits(self) -> None:
        """``max_object_size`` from the source filesystem (write/limits.py
        ``largest_file``: 63 ftruncates of an unlinked temporary file in the root; a
        network filesystem's round trip each, once per mount).  A source where that
        fails (read-only, no permission) stays unchecked: its writes fail anyway."""
        from ..write.limits import largest_file
        try:
            self.max_object_size = largest_file(self.root, TMP_PREFIX)
        except OSError as exc:
            log.warning("%s: cannot measure the largest file it holds (%s)", self.root, exc)

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
                if de.name.startswith(TMP_PREFIX):
                    continue      # a write in progress (or left by a crash)
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

    def list_dir(self, key: str) -> Iterator[tuple[list[ObjectInfo], list[str]]]:
        """One directory as one page: (files, subdirectory names)."""
        objs, dirs = self._scan(key)
        yield objs, [d.rpartition("/")[2] for d in dirs]

    def probe(self, key: str) -> tuple[ObjectInfo | None, bool]:
        try:
            return self.stat(key), False
        except NotFound:
            pass
        path = self._path(key)
        return None, os.path.isdir(path) and self._inside(path)

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
            bufs = self.read_buffers
            if bufs is not None and length >= RECYCLE_MIN:
                os.lseek(fd, offset, os.SEEK_SET)        # this read's own descriptor
                data = read_into(lambda v: os.readv(fd, [v]), length,
                                 into=bufs.take(length))
            else:
                data = pread_exact(fd, length, offset)
            st = os.fstat(fd)
        except OSError as exc:
            raise _map_oserror(exc, key) from None
        finally:
            os.close(fd)
        if version and _version(st) != version:
            raise VersionChanged(f"{key}: file changed on the source")
        if len(data) != length:
            raise VersionChanged(f"{key}: file shorter than expected")
        return data

    # -- writes ----------------------------------------------------------------------
    def _target(self, key: str) -> str:
        path = self._path(key)
        if not self._inside(os.path.dirname(path)):
            raise PermissionDenied(f"{key}: outside the source directory")
        return path

    def _tmp_in_dir_of(self, key: str) -> str:
        """A new temporary file's path next to ``key``, creating parent directories."""
        path = self._target(key)
        try:
            os.makedirs(os.path.dirname(path), exist_ok=True)
        except OSError as exc:
            raise _map_oserror(exc, key) from None
        return os.path.join(os.path.dirname(path), TMP_PREFIX + uuid.uuid4().hex)

    def _publish(self, tmp: str, key: str, fd: int) -> ObjectInfo:
        """fsync ``fd`` (the temp file), rename it over ``key``, fsync the directory."""
        path = self._target(key)
        try:
            os.fsync(fd)
            st = os.fstat(fd)
            os.replace(tmp, path)
            fsync_dir(os.path.dirname(path))
        except OSError as exc:
            _unlink_quietly(tmp)
            raise _map_oserror(exc, key) from None
        return ObjectInfo(key, st.st_size, _version(st), st.st_mtime)

    def put(self, key: str, data: bytes) -> ObjectInfo:
        tmp = self._tmp_in_dir_of(key)
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644)
        except OSError as exc:
            raise _map_oserror(exc, key) from None
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view):]
        except OSError as exc:
            _unlink_quietly(tmp)
            raise _map_oserror(exc, key) from None
        try:
            return self._publish(tmp, key, fd)
        finally:
            os.close(fd)

    def create_multipart(self, key: str) -> str:
        """The upload id is the temporary file's path relative to the root."""
        tmp = self._tmp_in_dir_of(key)
        try:
            os.close(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644))
        except OSError as exc:
            raise _map_oserror(exc, key) from None
        return os.path.relpath(tmp, self.root)

    def _upload_path(self, key: str, upload_id: str) -> str:
        path = os.path.join(self.root, upload_id)
        if (not os.path.basename(path).startswith(TMP_PREFIX)
                or os.path.dirname(path) != os.path.dirname(self._target(key))):
            raise NotFound(f"{key}: no such upload {upload_id!r}")
        return path

    def upload_part(self, key: str, upload_id: str, number: int, offset: int,
                    data: bytes | FileWindow) -> str:
        path = self._upload_path(key, upload_id)
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CLOEXEC)   # no O_CREAT: aborted = gone
        except OSError as exc:
            raise _map_oserror(exc, f"{key} (upload)") from None
        try:
            _write_part(fd, data, offset)
        except OSError as exc:
            raise _map_oserror(exc, key) from None
        finally:
            os.close(fd)
        return f"{number}:{len(data)}"

    def complete_multipart(self, key: str, upload_id: str, parts: list[tuple[int, str]],
                           size: int) -> ObjectInfo:
        path = self._upload_path(key, upload_id)
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CLOEXEC)
        except OSError as exc:
            raise _map_oserror(exc, f"{key} (upload)") from None
        try:
            os.ftruncate(fd, size)
            return self._publish(path, key, fd)
        except OSError as exc:
            raise _map_oserror(exc, key) from None
        finally:
            os.close(fd)

    def abort_multipart(self, key: str, upload_id: str) -> None:
        try:
            _unlink_quietly(self._upload_path(key, upload_id))
        except NotFound:
            pass

    def copy(self, src: str, dst: str) -> ObjectInfo:
        """A hard link (or a copy where links fail) published like a put: files are
        never modified in place, so sharing the inode is safe."""
        spath = self._path(src)
        if not os.path.isfile(spath) or not self._inside(spath):
            raise NotFound(f"copy {src}: not found")
        tmp = self._tmp_in_dir_of(dst)
        try:
            try:
                os.link(spath, tmp)
            except OSError:
                import shutil

                shutil.copyfile(spath, tmp)
            fd = os.open(tmp, os.O_RDONLY | os.O_CLOEXEC)
        except OSError as exc:
            _unlink_quietly(tmp)
            raise _map_oserror(exc, f"copy {src}") from None
        try:
            return self._publish(tmp, dst, fd)
        finally:
            os.close(fd)

    def delete(self, key: str) -> None:
        """Remove ``key`` (a missing one is fine), then the parent directories it
        leaves empty, up to the root."""
        path = self._target(key)
        try:
            os.unlink(path)
        except FileNotFoundError:
            return
        except OSError as exc:
            raise _map_oserror(exc, key) from None
        d = os.path.dirname(path)
        try:
            fsync_dir(d)
            while d != self.root and d.startswith(self.root + os.sep):
                os.rmdir(d)          # fails (and stops) at the first non-empty one
                d = os.path.dirname(d)
                fsync_dir(d)
        except OSError:
            pass

    def close(self) -> None:
        pass


def pread_exact(fd: int, length: int, offset: int) -> bytes:
    """``length`` bytes at ``offset`` (fewer only at end of file); OSError as raised."""
    chunks, done = [], 0
    while done < length:
        b = os.pread(fd, length - done, offset + done)
        if not b:
            break
        chunks.append(b)
        done += len(b)
    return b"".join(chunks)


def fsync_dir(path: str) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_up(path: str) -> None:
    """fsync ``path`` and every directory above it on the same filesystem: a new entry
    survives a power cut only once its parent directory is fsynced (ext4, XFS), so a
    journal made in a fresh --cache-dir would otherwise vanish whole with it."""
    path = os.path.abspath(path)
    dev = os.stat(path).st_dev
    while True:
        fsync_dir(path)
        parent = os.path.dirname(path)
        if parent == path or os.stat(parent).st_dev != dev:
            return
        path = parent


def _unlink_quietly(path: str) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass

"""What the remote can hold, checked before a --writable mount accepts a name or a
length: a change the remote cannot take is refused by the syscall that asks for it
(ENAMETOOLONG, EFBIG), never accepted into the journal to fail at upload forever.

The limits are the backend's (``max_key_bytes``, ``max_object_size``, ``key_bytes``:
backends/s3.py and backends/posix.py say where they come from) and the journal's: a
file is staged there before it is uploaded, so a length its filesystem cannot hold
is refused too (``largest_file``).
"""
from __future__ import annotations

import errno
import os
import tempfile

from ..backends.base import NAME_MAX
from ..errors import FileTooBig, NameTooLong


def check_name(name: str) -> None:
    """One path component: at most NAME_MAX bytes (what every Linux filesystem and the
    kernel's own checks allow)."""
    if len(name.encode("utf-8", "surrogateescape")) > NAME_MAX:
        raise NameTooLong(f"{name[:40]}...: a name is at most {NAME_MAX} bytes")


def check_key(backend, key: str, longest_below: int = 0) -> None:
    """``key`` (and, for a directory, its longest descendant: ``longest_below`` more
    bytes) fits the remote's key length."""
    limit = getattr(backend, "max_key_bytes", None)
    if limit is not None and backend.key_bytes(key) + longest_below > limit:
        raise NameTooLong(f"{key[:60]}...: longer than the remote's {limit}-byte keys")


# The extension that tells a filesystem with holes from one without (st_blocks stays 0).
SPARSE_PROBE = 1 << 20


def check_size(backend, size: int, journal_max: int | None = None) -> None:
    """A file of ``size`` bytes fits the remote's largest object and the journal
    filesystem's largest file (``journal_max``: ``largest_file`` of its staging
    directory; past it a write fails in its worker thread, after it was answered)."""
    limit = getattr(backend, "max_object_size", None)
    if limit is not None and size > limit:
        raise FileTooBig(f"{size} bytes: the remote holds objects of at most {limit} bytes")
    if journal_max is not None and size > journal_max:
        raise FileTooBig(f"{size} bytes: the write journal's filesystem holds files of at "
                         f"most {journal_max} bytes")


def largest_file(directory: str, prefix: str = ".nc-size-") -> int | None:
    """The largest size a file in ``directory`` may have: a binary search with
    ``ftruncate`` on an unlinked, empty temporary file (63 calls, no data written; ext4
    with 4 KiB blocks: 16 TiB - 4 KiB; XFS, tmpfs: 2**63 - 1).  None (not measured)
    on a filesystem that allocates what ``ftruncate`` extends (no holes: FAT, some
    FUSE filesystems), where the search would write that much.  Blocking: call it from
    a worker thread."""
    fd, path = tempfile.mkstemp(prefix=prefix, dir=directory)
    try:
        os.unlink(path)
        os.ftruncate(fd, SPARSE_PROBE)
        if os.fstat(fd).st_blocks:
            return None
        lo, hi = 0, 1 << 63          # lo fits, hi does not (2**63 is past off_t)
        while hi - lo > 1:
            mid = (lo + hi) // 2
            try:
                os.ftruncate(fd, mid)
                lo = mid
            except OSError as exc:
                if exc.errno not in (errno.EFBIG, errno.EINVAL):
                    raise
                hi = mid
        os.ftruncate(fd, 0)
        return lo
    finally:
        os.close(fd)

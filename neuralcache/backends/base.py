"""The backend protocol: a few blocking calls, run by callers in worker threads.

Every method raises only the domain errors of ``neuralcache.errors`` (NotFound,
PermissionDenied, Unavailable, VersionChanged); retries happen inside.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Iterator, Protocol

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


class Backend(Protocol):
    description: str

    def check(self) -> None:
        """Raise a domain error if the source cannot be listed and read."""

    def list_all(self) -> Iterator[ObjectInfo]:
        """Every object under the source root (parallel inside), in no special order."""

    def stat(self, key: str) -> ObjectInfo:
        """Current metadata of one object."""

    def read(self, key: str, offset: int, length: int, version: str) -> bytes:
        """Exactly ``length`` bytes at ``offset`` (fewer only at end of object) of
        ``version``; VersionChanged if the object is no longer that version."""

    def close(self) -> None:
        """Release connections."""

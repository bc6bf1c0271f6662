"""What the remote can hold, checked before a --writable mount accepts a name or a
length: a change the remote cannot take is refused by the syscall that asks for it
(ENAMETOOLONG, EFBIG), never accepted into the journal to fail at upload forever.

The limits are the backend's (``max_key_bytes``, ``max_object_size``, ``key_bytes``:
backends/s3.py and backends/posix.py say where they come from).
"""
from __future__ import annotations

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


def check_size(backend, size: int) -> None:
    """A file of ``size`` bytes fits the remote's largest object."""
    limit = getattr(backend, "max_object_size", None)
    if limit is not None and size > limit:
        raise FileTooBig(f"{size} bytes: the remote holds objects of at most {limit} bytes")

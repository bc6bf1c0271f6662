"""What an open file handle reads: one version of one object (``Pinned``), and a read
of it that follows a rename made on this mount while it waited (``read_following``)."""
from __future__ import annotations

from dataclasses import dataclass

from ..errors import NotFound


@dataclass(frozen=True, slots=True)
class Pinned:
    """One version of one object, as pinned by an open file handle."""
    key: str
    version: str
    size: int


async def read_following(store, pin, off: int, size: int) -> bytes | memoryview:
    """``store.read`` of the object ``pin()`` names, following a rename made on this
    mount while the read waited: its copy ended (write/names.py ``_moved``), the old
    key was deleted and the read got NotFound, and ``pin()`` now names the copy,
    which is read instead.  NotFound if ``pin()`` names the same object, or None
    (the file was removed)."""
    p = pin()
    try:
        return await store.read(p, off, size)
    except NotFound:
        q = pin()
        if q is None or q == p:
            raise
        return await store.read(q, off, size)

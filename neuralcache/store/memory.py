"""The block key every tier uses, and the memory tier (lru-dict, bounded in bytes).

A block is identified by ``BlockKey(key, version, index)``: the object's path, its
version (ETag, or size:mtime for POSIX) and the block number, so a changed remote
object can never be served a stale block.
"""
from __future__ import annotations

from dataclasses import dataclass

import lru
import xxhash

# Memory tier entry cap for lru-dict (it bounds by count); the byte bound is ours.
_MEM_MAX_ENTRIES = 1 << 20


@dataclass(frozen=True, slots=True)
class BlockKey:
    key: str
    version: str
    index: int

    def name(self) -> str:
        """32 hex digits (xxh128 of key, version and index): the block's name on disk."""
        h = xxhash.xxh3_128_hexdigest(f"{self.key}\0{self.version}\0{self.index}".encode(
            "utf-8", "surrogateescape"))
        return h


class MemoryTier:
    """LRU of block bytes, bounded by total bytes.  Not thread-safe: trio loop only."""

    def __init__(self, limit_bytes: int, release=None):
        self.limit = limit_bytes
        self.used = 0
        self._lru = lru.LRU(_MEM_MAX_ENTRIES)
        # called with each block's bytes as the tier lets go of them (evicted, dropped
        # or replaced): buffers.Recycler.give
        self._release = release or (lambda data: None)
        # called with (key, bytes) of each block the byte bound evicts, before it goes
        # (BlockStore._evicting: a block only memory holds goes to the disk writers)
        self.evicting = None

    def get(self, bk: BlockKey) -> bytes | None:
        """The block's bytes, now the most recently used; None if not held."""
        return self._lru.get(bk)

    def __contains__(self, bk: BlockKey) -> bool:
        """Held?  (Leaves the LRU order as it is.)"""
        return bk in self._lru

    def put(self, bk: BlockKey, data: bytes) -> None:
        if len(data) > self.limit:
            return
        old = self._lru.get(bk)
        if old is not None:
            self.used -= len(old)
        self._lru[bk] = data
        self.used += len(data)
        if old is not None and old is not data:
            self._release(old)
        while self.used > self.limit and len(self._lru):
            # Not popitem(): lru-dict 1.4.1 leaks the tuple it returns, and with it
            # the block (+301 MB for 300 evictions of 1 MiB: python -m bench.micro lru-leak).
            victim_key, victim = self._lru.peek_last_item()
            del self._lru[victim_key]
            self.used -= len(victim)
            if self.evicting is not None:
                self.evicting(victim_key, victim)
            self._release(victim)

    def drop(self, bk: BlockKey) -> None:
        old = self._lru.pop(bk, None)
        if old is not None:
            self.used -= len(old)
            self._release(old)

    def items(self) -> list[tuple[BlockKey, bytes]]:
        """Every (key, bytes) held, most recently used first (a copy: a snapshot)."""
        return self._lru.items()

    def __len__(self) -> int:
        return len(self._lru)

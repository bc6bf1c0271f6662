"""The cache tiers by name, for the modules that import them from here (daemon.py,
store/blocks.py, store/shared.py): ``BlockKey`` and ``MemoryTier`` (memory.py), and
``DiskTier`` (disk.py: block files and segment files, segments.py, blockfiles.py)."""
from __future__ import annotations

from .disk import DiskTier, stored_blocks
from .memory import BlockKey, MemoryTier

__all__ = ["BlockKey", "DiskTier", "MemoryTier", "stored_blocks"]

"""The speculative ledger: the blocks read-ahead and prefetch loaded that no reader has
read yet, where they are, and how many bytes of them each tier holds.  The
prefetcher's two budgets read it (ahead/prefetch.py): memory's (``unread`` plus
``unjoined``) and the disk's (``on_disk`` plus ``staging``).  The stats' read-ahead
and prefetch "used" bytes are counted here when a reader takes such a block.

BlockStore (store/blocks.py) owns one and calls it from the trio loop only.
"""
from __future__ import annotations

import lru

from . import limiter as lim
from ..stats import Stats

# Speculatively loaded blocks remembered per tier, to count whether they were used
# (~300 bytes each: 20 MB at most per tier).  A block the disk tier evicts unread stays
# counted in ``on_disk`` until this many newer ones pass, or until ``stage_room``
# finds it gone.  Staged loads stop with the table nearly full (STAGE_ENTRIES_MAX), so
# that none of them is forgotten uncounted: 57,344 files of 100 KB are 5.7 GB ahead.
SPECULATIVE_MEMORY = 1 << 16
STAGE_ENTRIES_MAX = SPECULATIVE_MEMORY * 7 // 8
# Prefetched bytes the disk tier may hold unread, as a fraction of its size: staged
# loads (BlockStore.prefetch ``stage``, started when memory's prefetch budget is full) and
# blocks memory evicted unread.  Without an order to follow (a shuffled epoch, no
# hints), a file read is one of those with the odds staged / unread files left, so the
# more the better, up to the dataset; half keeps the other half for what the job read
# before.  Staging also waits for free space (BlockStore.stage_room): evicting blocks
# to make room took blocks this epoch still had to read (the epoch-aware eviction ranks
# a prefetched block above them), and a dataset twice the disk tier (`python -m bench
# run --scenario overflow --systems neuralcache`) fetched 270-300 -> 400-466 MB over
# the link in epoch 2; into free space only, 287/278 against 319/262, and its epoch 1
# (the disk filling) 182/163 against 138/133 MB/s, shuffled shards 307/304 against
# 266/261 MB/s (old new new old, bench/RESULTS.md).  3,000 x
# 100 KB files read once, shuffled, through a 64 MiB memory tier (python -m
# bench.breakdown --size 8M --files 3000 --mount-args "--memory-cache-size 64M", a 316
# MB disk tier): 207/252 files/s without staging; with a quarter of the disk 354/368;
# with half 518/514/422; with a quarter of 2 GiB 514 against 254.
STAGE_FRACTION = 0.5


class Ledger:
    def __init__(self, stats: Stats, taken=None):
        self.stats = stats
        # called with each block a reader takes from memory: the disk tier's copy
        # (DiskTier.taken), written unread or read there long ago, is read now
        self.taken = taken or (lambda bk: None)
        # BlockKey -> (kind, bytes): loaded into memory, not read by anyone yet
        self._unread = lru.LRU(SPECULATIVE_MEMORY, callback=self._unread_dropped)
        # ... and those the disk tier holds instead: memory evicted them unread, or a
        # staged load (BlockStore.prefetch ``stage``) put them there and not in memory
        self._on_disk = lru.LRU(SPECULATIVE_MEMORY, callback=self._on_disk_dropped)
        self.unread = 0       # bytes in _unread
        self.on_disk = 0      # bytes in _on_disk
        self.inflight = 0     # bytes of speculative loads in flight
        self.unjoined = 0     # ... of those, for memory with no reader joined yet
        self.staging = 0      # ... of those, staged loads (bound for the disk tier)

    # -- in flight -------------------------------------------------------------------
    def started(self, n: int, stage: bool, unjoined: int) -> None:
        """A speculative load of ``n`` bytes began (0 for a demand load); ``unjoined``
        of them are for memory with no reader yet."""
        self.inflight += n
        self.staging += n if stage else 0
        self.unjoined += unjoined

    def joined(self, unjoined: int) -> None:
        """A reader joined a load in flight: its bytes no longer land unread."""
        self.unjoined -= unjoined

    def ended(self, n: int, stage: bool, unjoined: int) -> None:
        """The load ``started`` ended (loaded, failed or cancelled)."""
        self.inflight -= n
        self.staging -= n if stage else 0
        self.unjoined -= unjoined

    # -- memory ----------------------------------------------------------------------
    def loaded(self, bk, kind, n: int) -> None:
        """A speculative block landed in memory unread (counted once: one evicted unread
        and loaded again replaces its entry; lru-dict calls no callback then)."""
        old = self._unread.pop(bk, None)
        if old is not None:
            self.unread -= old[1]
        self._unread[bk] = (kind, n)
        self.unread += n

    def read(self, bk, n: int) -> None:
        """A reader took ``bk`` from memory (or joined its load); the disk tier hears
        of it (``taken``)."""
        entry = self._unread.pop(bk, None)
        if entry is not None:
            self.unread -= entry[1]
            self.count_used(entry[0], n)
        self.taken(bk)

    def evicted(self, bk, on_disk) -> None:
        """Memory let ``bk`` go; ``on_disk()``: whether the disk tier holds it or will.
        Unread, it stops counting against memory's budget and, on disk, counts against
        the disk's, and a read of it there counts as used."""
        entry = self._unread.pop(bk, None)
        if entry is not None:
            self.unread -= entry[1]
        if not on_disk():      # (called for every block: it queues the late disk write)
            if entry is not None and entry[0] is not None:    # (fetched speculatively)
                self.stats.ahead_lost_memory_bytes += entry[1]
        elif entry is not None:
            self._disk_put(bk, entry)

    def waiting(self, bk) -> bool:
        """``bk`` was fetched ahead and no reader has read it yet."""
        return bk in self._unread or bk in self._on_disk

    # -- disk ------------------------------------------------------------------------
    def staged(self, bk, kind, n: int) -> None:
        """A staged load stored ``bk`` in the disk tier and not in memory."""
        self._disk_put(bk, (kind, n))
        if kind == lim.PREFETCH:
            self.stats.prefetch_bytes_staged += n

    def from_disk(self, bk):
        """``bk`` was read from the disk tier, or is gone from it: its (kind, bytes)
        if it was an unread speculative one there, else None."""
        entry = self._on_disk.pop(bk, None)
        if entry is not None:
            self.on_disk -= entry[1]
        return entry

    def gone_from_disk(self, bk) -> None:
        """The disk tier no longer holds ``bk``: if it was an unread speculative block
        there, the disk evicted it unread (the stats' ``ahead_lost_disk_bytes``)."""
        entry = self.from_disk(bk)
        if entry is not None:
            self.stats.ahead_lost_disk_bytes += entry[1]

    def stage_room(self, limit: int, contains) -> int:
        """Bytes staged loads may still bring: ``limit`` less the unread bytes on disk
        and on their way there.  When that is none, first forget the oldest entries the
        disk tier no longer holds (``contains(bk)`` False: it evicted them unread),
        whichever bound (bytes, or entries: small files) is reached."""
        if self.on_disk + self.staging >= limit or len(self._on_disk) >= STAGE_ENTRIES_MAX:
            while len(self._on_disk):
                bk, _ = self._on_disk.peek_last_item()
                if contains(bk):
                    break
                self.gone_from_disk(bk)
        if len(self._on_disk) >= STAGE_ENTRIES_MAX:
            return 0
        return max(0, limit - self.on_disk - self.staging)

    def _disk_put(self, bk, entry) -> None:
        self.from_disk(bk)
        self._on_disk[bk] = entry
        self.on_disk += entry[1]

    # -- counts ----------------------------------------------------------------------
    def count_used(self, kind, n: int) -> None:
        if kind == lim.READAHEAD:
            self.stats.readahead_bytes_used += n
        elif kind == lim.PREFETCH:
            self.stats.prefetch_bytes_used += n

    def _unread_dropped(self, bk, entry) -> None:
        self.unread -= entry[1]

    def _on_disk_dropped(self, bk, entry) -> None:
        self.on_disk -= entry[1]

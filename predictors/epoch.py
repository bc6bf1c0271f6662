"""Epoch detection and epoch-aware eviction priority.

Under per-epoch shuffling LRU thrashes: with a cache holding a fraction f of the data
it hits f + (1-f)ln(1-f) per epoch (0.15 at f = 0.5), while evicting what was already
consumed this epoch keeps a fixed subset and hits f (0.50). ``EpochTracker`` finds the
epoch boundaries from the access stream and ranks paths for eviction:

    class 0  consumed this epoch and no longer active -> evict first, newest consumed first
             (newest-first also keeps the head of a repeated order across epochs);
    class 1  consumed this epoch but accessed within the last ACTIVE_EVENTS events (a
             reader may still be working on it, e.g. a shard read in chunks);
    class 2  not read this epoch (still to come, or unknown/prefetched) -> LRU among them.
"""
from __future__ import annotations

import sys
from collections import OrderedDict, deque
from typing import Callable, Iterable

from .base import Catalog
from .events import Event

# A re-open of a path within this many opens of distinct paths is the same reader (or
# another worker) touching it again, not a new pass: 32 covers 8 DataLoader workers x
# prefetch_factor 2 x 2 files each in flight.
ACTIVE_OPENS = 32
# A path accessed (open or read) within the last this-many events is "still being read"
# and protected from eviction: 64 = 8 workers each issuing ~8 reads of a shard in chunks
# while the others do the same.
ACTIVE_EVENTS = 64
# A re-read of something already consumed this epoch ends the epoch once this fraction
# of the expected working set was read (stragglers and dropped tail batches mean real
# epochs rarely cover 100%: drop_last loses < 1 batch, DistributedSampler pads < w).
EPOCH_REREAD_COVERAGE = 0.8
# In the first epoch the working set is unknown (the job may read a subset of the
# catalog): a re-read of a path consumed at least this fraction of the epoch's opens ago
# also ends the epoch. 0.5: a re-read of "the first half" cannot be a local re-open.
REREAD_MIN_AGE_FRAC = 0.5
# ...but not before this many distinct opens: tiny epochs are indistinguishable from
# a job re-opening a few files (e.g. a config or index file).
MIN_EPOCH_OPENS = 16
# ``spent``: a job is taken to read in epochs (each file about once per epoch) while its
# re-reads within the current epoch (of a file consumed more than ACTIVE_OPENS opens
# before: random access) stay under this fraction of the files it consumed.
SPENT_REREAD_FRACTION = 0.1

_CLASS = 1e12  # separates the rank classes; sequence numbers stay far below it

# A path's record in ``EpochTracker._rec`` is one int of five _BITS-bit fields: the
# epoch it was last consumed in, the seq of that consumption, its position in that
# epoch's order of first accesses, its position in the epoch before plus one (0: not
# read then), the number of its last open (0: never opened).  One int (~56 B) instead of
# five maps' entries and int objects: ~290 B per file of a 1.28 M-file epoch went to
# ~190 (with the key and the order's slot), and the epoch after needs no more maps.
# 48 bits: 2.8e14 opens, 10,000 a second for 890 years.
_BITS = 48
_MASK = (1 << _BITS) - 1
_SEQ, _POS, _PREV, _OPEN = _BITS, 2 * _BITS, 3 * _BITS, 4 * _BITS


class EpochTracker:
    """Observes events, tracks epochs, answers ``consumed(path)`` and ``evict_rank(path)``."""

    name = "epoch"

    def __init__(self, catalog: Iterable[tuple[str, int]] | Catalog = ()):
        self.epoch = 0
        self.seq = 0                       # distinct-path accesses so far (all epochs)
        self._rec: dict[str, int] = {}     # path -> its record (_BITS, above)
        self.count = 0                     # distinct paths consumed in the current epoch
        self.prev_count = 0                # distinct paths consumed in the previous epoch
        self.covered_prev = 0              # last epoch's paths consumed in the current one
        self._members_cur: list[str] = []
        # last epoch's paths in first-access order: the working set (each once)
        self.prev_order: list[str] = []
        self.opens = 0                     # open events observed
        self.opened_paths = 0              # distinct paths opened (all epochs)
        self.boundaries: list[int] = []    # seq at which each new epoch started
        self.events = 0                    # all events observed
        self._rereads: deque = deque(maxlen=ACTIVE_OPENS)  # (seq, path) within-epoch re-reads
        # path -> event number of its last access, for the last ACTIVE_EVENTS distinct
        # paths only: each accessed within ACTIVE_EVENTS events is among them (it was
        # every path ever: ~100 B per file of a 1.28 M-file epoch, for ``active``)
        self._touch: OrderedDict[str, int] = OrderedDict()
        self.random_rereads = 0            # this epoch's re-reads of consumed paths
        self.bytes = 0                     # bytes of the paths consumed this epoch
        self.prev_bytes = 0                # ... and in the previous one
        # ``spent`` only after an epoch of at least this many bytes (the daemon sets
        # the disk tier's size: an epoch that fits has nothing to gain from it, and a
        # skewed job, a hot set read again and again, cuts "epochs" of a few files)
        self.spent_floor = 0
        # ... and in the first epoch only while prefetched blocks wait on the disk tier
        # unread (the daemon sets the block store's count; ``spent``)
        self.ahead_waiting: Callable[[], bool] = lambda: False
        self._seen_ev: Event | None = None      # ``see``: the last event and its answer
        self._seen = (False, False, False, 0)
        self.set_catalog(catalog)

    def see(self, ev: Event) -> tuple[bool, bool, bool, int]:
        """``observe(ev)`` once however many predictors share this tracker (the ensemble's
        successor, epoch-set and features: one tracker's per-path state instead of three,
        ~400 B per file of a 1.28 M-file epoch); each gets the same answer: (a new epoch
        started, ``ev.path`` was consumed before it, was active before it, the number of
        its last open before it or 0).  "Once" is by the Event object: give a repeated
        access a new Event."""
        if ev is not self._seen_ev:
            path = ev.path
            was, active = self.consumed(path), self.active(path)
            last_open = self._rec.get(path, 0) >> _OPEN
            self._seen = (self.observe(ev), was, active, last_open)
            self._seen_ev = ev
        return self._seen

    def set_catalog(self, entries: Iterable[tuple[str, int]] | Catalog) -> None:
        self.catalog_size = len(Catalog.of(entries))

    # -- expected working-set size of the current epoch
    def expected_size(self) -> int:
        if self.epoch > 0 and self.prev_count:
            return self.prev_count
        return self.catalog_size

    def coverage(self) -> float:
        n = self.expected_size()
        return self.count / n if n else 0.0

    def observe(self, ev: Event) -> bool:
        """Returns True if this event started a new epoch.

        Opens and reads both count as accesses; a read never ends an epoch (a worker may
        keep a shard open and read it in chunks long after it opened it)."""
        # one str per path however many accesses made it (the daemon makes a new one
        # per open): the record's key, this epoch's order and last epoch's are one
        # object, not three copies from the third epoch on.  The interned table costs
        # ~25 B a path (~30 MB at 1.28 M); its strings leave it with their last
        # reference on CPython 3.11 (3.12.0-3.12.5 kept them: a process building many
        # trackers over different paths would hold them all)
        path = ev.path
        if type(path) is str:       # (sys.intern takes no subclass)
            path = sys.intern(path)
        self.events += 1
        touch = self._touch
        touch[path] = self.events
        touch.move_to_end(path)
        if len(touch) > ACTIVE_EVENTS:
            touch.popitem(last=False)
        started = self._observe(ev, path)
        if ev.op == "open":
            self.opens += 1
            rec = self._rec[path]
            if not rec >> _OPEN:
                self.opened_paths += 1
            self._rec[path] = (rec & ((1 << _OPEN) - 1)) | (self.opens << _OPEN)
        return started

    def _observe(self, ev: Event, path: str) -> bool:
        rec = self._rec.get(path)
        if rec is not None and rec & _MASK == self.epoch:
            if ev.op != "open":
                return False
            age = self.seq - ((rec >> _SEQ) & _MASK)
            if age <= ACTIVE_OPENS:
                self._rereads.append((self.seq, path))
                return False  # local re-open (another worker, a header re-read)
            n = self.expected_size()
            covered = n > 0 and self.count >= EPOCH_REREAD_COVERAGE * n
            old = (self.epoch == 0 and self.count >= MIN_EPOCH_OPENS
                   and age >= REREAD_MIN_AGE_FRAC * self.count)
            if not (covered or old):
                self.seq += 1                 # re-read within the epoch (random access)
                self.random_rereads += 1
                self._rec[path] = (rec & ~(_MASK << _SEQ)) | (self.seq << _SEQ)
                self._rereads.append((self.seq, path))
                return False
            carry = list(dict.fromkeys(p for s, p in self._rereads
                                      if s > self.seq - ACTIVE_OPENS and p != path))
            self._new_epoch()
            for p in carry:    # re-reads just before the boundary were the new epoch's first
                self._consume(p)
            started = True
        else:
            started = False
        self.seq += 1
        if self._consume(path, ev.size):
            self._new_epoch()       # working set fully covered: next access is a new epoch
            started = True
        return started

    def _consume(self, path: str, size: int = 0) -> bool:
        """Record the first access of path in this epoch; True if that completes the
        previous epoch's working set."""
        old = self._rec.get(path)
        in_prev = old is not None and old & _MASK == self.epoch - 1   # (once per epoch)
        prev = ((old >> _POS) & _MASK) + 1 if in_prev else 0
        opened = 0 if old is None else old >> _OPEN
        self._rec[path] = (self.epoch | self.seq << _SEQ | self.count << _POS
                           | prev << _PREV | opened << _OPEN)
        self._members_cur.append(path)
        self.count += 1
        self.bytes += size
        if in_prev:
            self.covered_prev += 1
            return self.covered_prev >= self.prev_count
        return False

    def current_members(self) -> list[str]:
        """Paths consumed so far in the current epoch, in order (just after a boundary:
        the few that were carried over into the new epoch)."""
        return self._members_cur

    def _new_epoch(self) -> None:
        self.prev_order = self._members_cur
        self.prev_count = len(self.prev_order)
        self._members_cur = []
        self._rereads.clear()
        self.random_rereads = 0
        self.prev_bytes, self.bytes = self.bytes, 0
        self.count = 0
        self.covered_prev = 0
        self.epoch += 1
        self.boundaries.append(self.seq)

    def consumed(self, path: str) -> bool:
        """True if the path was read in the current epoch."""
        rec = self._rec.get(path)
        return rec is not None and rec & _MASK == self.epoch

    def prev_position(self, path: str) -> int:
        """The path's position in ``prev_order`` (last epoch's), or -1."""
        rec = self._rec.get(path)
        if rec is None:
            return -1
        e = rec & _MASK
        if e == self.epoch:
            return ((rec >> _PREV) & _MASK) - 1
        if e == self.epoch - 1:
            return (rec >> _POS) & _MASK
        return -1

    def spent(self, path: str) -> bool:
        """A block of ``path`` just read or stored goes to the front of the disk tier's
        eviction order (store/disk.py ``spent``), where the ranking looks for victims
        and takes the newest consumed first: consumed this epoch, few re-reads within
        it (SPENT_REREAD_FRACTION), and
        * after the first epoch, for a job seen to read in epochs larger than the tier
          (the last one ``spent_floor`` bytes or more).  A job that re-reads a hot set
          cuts "epochs" of a few files: there blocks keep LRU's order;
        * in the first epoch, while prefetched blocks wait on the tier unread
          (``ahead_waiting``): a shuffled epoch over twice the tier prefetches files
          it will read later (unknown to the ranking: kept), and with LRU's order the
          full tier let the oldest of them go unread, to be fetched again.  `python
          -m bench.tools.epochs` (3,000 x 100 KB, a 150 MiB tier), 2602843 against
          this, new old old new: epoch 1 fetched 395 / 395 MiB for the 293 MiB
          dataset (91-101 of it prefetched and evicted from the disk unread: the
          stats' ahead_lost_disk_bytes) against 293.0 / 293.0 and none lost, at 188 /
          193 files/s against 319 / 325; epochs 2-4 the same.  Not without prefetched
          blocks waiting: a first pass larger than the tier and then re-reads of what
          it read last (a review) missed half of them or more under this order,
          where LRU hit them all.
          (A floor on the first epoch's bytes so far came too late: staged blocks
          fill the tier before the reads do, tests/test_cache.py.)"""
        if (not self.consumed(path)
                or self.random_rereads > SPENT_REREAD_FRACTION * self.count):
            return False
        if self.epoch == 0:
            return self.ahead_waiting()
        return self.prev_bytes >= self.spent_floor

    def active(self, path: str) -> bool:
        """Accessed within the last ACTIVE_EVENTS events (probably still being read)."""
        e = self._touch.get(path)
        return e is not None and self.events - e < ACTIVE_EVENTS

    def evict_rank(self, path: str) -> float:
        """Lower = evict first (see module docstring for the three classes)."""
        rec = self._rec.get(path)
        if rec is None:
            return 2 * _CLASS + self.seq      # unknown (e.g. prefetched, not yet read)
        s = (rec >> _SEQ) & _MASK
        if rec & _MASK == self.epoch:
            if self.active(path):
                return _CLASS + s
            return float(self.seq - s)        # newest consumed first
        return 2 * _CLASS + s                 # LRU among the not-yet-consumed

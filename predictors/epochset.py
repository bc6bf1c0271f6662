"""Shuffled epochs over a working set: each member is read once per epoch in an unknown
order, so the members not yet read this epoch are the candidates.

Every unread member will be read this epoch, so each prediction's prob is the chance
of being read at all this epoch (1.0 once the working set is known, FIRST_EPOCH_PROB_SCALE
while it is guessed) and eta, the expected wait for a uniformly placed member
((remaining+1)/2 opens), says that it is not needed soon.  A guess says a file will be
read, not how much of it: a member larger than WHOLE_FILE_MAX is predicted as its head
only (HEAD_BYTES), and read-ahead fetches the rest once the file is read.
They are listed in listing order so that successive predictions are stable (a
scheduler working down the list makes progress instead of chasing a reshuffled list).
In the first epoch the working set is unknown: the unread part of the catalog under the
*scope* stands in, with a lower prob.  The scope is the deepest directory containing
every file opened so far (train/ when a job reads train/class*/..., never val/), a
contiguous range of the sorted catalog.
"""
from __future__ import annotations

from typing import Iterable

import numpy as np

from .base import Catalog, OpenRate, Prediction, whole_file
from .epoch import EpochTracker
from .events import Event
from .packed import PackedCatalog

# In the first epoch the catalog may be much larger than what the job reads (train/ vs
# val/, several datasets under one prefix): halve the prob.
FIRST_EPOCH_PROB_SCALE = 0.5
# Chunk of the membership mask scanned per step when collecting candidates.
SCAN_CHUNK = 8192
# Members up to this size are predicted whole; larger ones by their head only: fio's
# random reads over 256 MiB files made whole-file guesses fetch the dataset twice
# (prefetch precision 0.04 in bench/).
WHOLE_FILE_MAX = 32 << 20
# The head of a large member: the first FUSE read request of a file (1 MiB, the largest
# the kernel sends), so the scheduler fetches the block holding it.
HEAD_BYTES = 1 << 20
# A new catalog marks this epoch's members read so far in its ``read`` mask, so that
# the next boundary needs no lookups (0.6 s of the trio thread for ImageNet's 1.28 M,
# `python -m bench.tools.predscale`).  Up to this many members, one lookup each (2-5 us
# by binary search in a packed catalog: 30-80 ms at most).  With more, a packed catalog
# takes the old one's mask for the directories both share and asks the tracker about
# each file of the new ones (CARRY_FILES_MAX): the daemon's catalog grows while the crawl
# lists the dataset, every 2 s at most (ahead/prefetch.py), long after this many opens.
# Otherwise (a plain catalog, or an old mask that was not whole) the boundary looks
# them up, once.  (``Catalog.indices`` sorts the whole catalog's hashes, ~0.15 s, too
# slow for each new catalog.)
REMAP_MEMBERS_MAX = 16384
# ... and the carry asks the tracker about at most this many files of new directories
# for one new catalog (0.6 us a file: `bench.tools.predscale ... grow`'s new catalogs of
# 51,240 new files took 31.6 ms; so ~80 ms at most); a catalog bringing more (a second
# dataset joining at once) leaves the boundary to the lookups, once.
CARRY_FILES_MAX = 131072


class EpochSetPredictor:
    name = "epochset"

    def __init__(self, catalog: Iterable[tuple[str, int]] | Catalog = (),
                 tracker: EpochTracker | None = None):
        self.tracker = EpochTracker() if tracker is None else tracker   # shared: see()
        self.rate = OpenRate()
        self.catalog: Catalog | None = None
        self.read: np.ndarray | None = None
        self.read_whole, self.read_epoch = False, -1
        self.set_catalog(catalog)

    def set_catalog(self, entries: Iterable[tuple[str, int]] | Catalog) -> None:
        old, old_read = self.catalog, self.read
        carry = self.read_whole and self.read_epoch == self.tracker.epoch
        self.catalog = Catalog.of(entries)
        self.tracker.set_catalog(self.catalog)
        n = len(self.catalog)
        self.unread = np.ones(n, dtype=bool)     # candidates: members not read this epoch
        # Whole files the caller has cached or on their way this epoch (the one record
        # of that: the daemon's scheduler asks is_planned() instead of keeping its own)
        self.planned = np.zeros(n, dtype=bool)
        # members read this epoch, as far as this catalog has seen them: the next
        # epoch's candidates without looking each up again (``_boundary``)
        self.read = np.zeros(n, dtype=bool)
        members = self.tracker.current_members()
        self.read_epoch = self.tracker.epoch     # the epoch ``read`` is of
        if len(members) <= REMAP_MEMBERS_MAX:    # one lookup each
            self.read_whole = True
            if members:
                get = self.catalog.index.get
                self.read[[i for i in map(get, members) if i is not None]] = True
        elif carry and isinstance(old, PackedCatalog) and \
                isinstance(self.catalog, PackedCatalog):
            # the old mask where both catalogs share a directory, each file of the
            # others asked of the tracker (REMAP_MEMBERS_MAX, CARRY_FILES_MAX)
            fresh = self.catalog.carry(old, old_read, self.read)
            self.read_whole = sum(len(seg) for _, seg in fresh) <= CARRY_FILES_MAX
            consumed = self.tracker.consumed
            for start, seg in fresh if self.read_whole else ():
                p = seg.prefix
                for j in range(len(seg)):
                    if consumed(p + seg.name(j)):
                        self.read[start + j] = True
        else:
            self.read_whole = False              # looked up at the boundary
        self.remaining = n
        self.first_epoch = True
        self.scope: str | None = None      # directory prefix ("" = everything) or None
        self.scope_range = (0, n)

    def _widen_scope(self, path: str) -> None:
        d = path.rsplit("/", 1)[0] + "/" if "/" in path else ""
        if self.scope is None:
            new = d
        elif d.startswith(self.scope):
            return
        else:
            a, b = self.scope.split("/")[:-1], d.split("/")[:-1]
            k = 0
            while k < min(len(a), len(b)) and a[k] == b[k]:
                k += 1
            new = "/".join(a[:k]) + "/" if k else ""
        if new != self.scope:
            self.scope = new
            self.scope_range = self.catalog.scope_range(new)

    def observe(self, ev: Event) -> None:
        if ev.op == "open":
            self.rate.observe_open(ev.t)
            if self.first_epoch and ev.path in self.catalog.index:
                self._widen_scope(ev.path)
        if self.tracker.see(ev)[0]:
            self._boundary()
        elif self.tracker.consumed(ev.path):
            self._mark_read(ev.path)

    def _boundary(self) -> None:
        """Last epoch's members are this one's candidates.  Where this catalog saw the
        whole epoch, they are its ``read`` mask; else each is looked up (by str hash
        in a packed catalog: 0.6 s of the trio thread for ImageNet's 1.28 M, where the
        mask's copy takes a millisecond)."""
        prev = self.tracker.prev_order
        if self.read_whole and self.read_epoch == self.tracker.epoch - 1:
            self.unread, self.read = self.read, self.unread
            # the one member this epoch's events did not mark: the read that completed
            # the working set, consumed in the epoch it ended (a no-op otherwise)
            i = self.catalog.index.get(prev[-1]) if prev else None
            if i is not None:
                self.unread[i] = True
        else:
            self.unread[:] = False
            self.unread[self.catalog.indices(prev)] = True
        self.read[:] = False
        self.read_whole, self.read_epoch = True, self.tracker.epoch
        self.remaining = int(np.count_nonzero(self.unread))
        self.planned[:] = False
        self.first_epoch = False
        for p in self.tracker.current_members():
            self._mark_read(p)

    def note_planned(self, path: str) -> None:
        """The caller has this member cached or on its way: stop offering it this epoch
        (so the next predictions reach further into the unread set)."""
        i = self.catalog.index.get(path)
        if i is not None:
            self.planned[i] = True

    def is_planned(self, path: str) -> bool:
        i = self.catalog.index.get(path)
        return i is not None and bool(self.planned[i])

    def clear_planned(self) -> None:
        self.planned[:] = False

    def _mark_read(self, path: str) -> None:
        i = self.catalog.index.get(path)
        if i is not None:
            self.read[i] = True
            if self.unread[i]:
                self.unread[i] = False
                self.remaining -= 1

    def predict(self, max_items: int, prob_scale: float = 1.0) -> list[Prediction]:
        r = self.remaining
        if r <= 0 or max_items <= 0:
            return []
        prob = prob_scale
        if self.first_epoch:
            prob *= FIRST_EPOCH_PROB_SCALE
        eta = self.rate.eta((r + 1) / 2)
        cat, u = self.catalog, self.unread
        lo, hi = self.scope_range if self.first_epoch else (0, len(u))
        out: list[Prediction] = []
        pl = self.planned
        for start in range(lo, hi, SCAN_CHUNK):
            stop = min(hi, start + SCAN_CHUNK)
            for i in np.flatnonzero(u[start:stop] & ~pl[start:stop]).tolist():
                j = start + i
                size = cat.sizes[j]
                out.append(whole_file(cat, cat.paths[j], eta, prob, self.name,
                                      size if size <= WHOLE_FILE_MAX else HEAD_BYTES))
                if len(out) >= max_items:
                    return out
        return out

"""A known read order plus a cursor that tolerates out-of-order reads.

Shared by the hint predictor (the job's own upcoming order) and the successor predictor
(last epoch's order). Several loader workers consume one order interleaved: each takes
a batch, so opens arrive scrambled within a window of positions. The cursor marks
positions consumed, keeps a low-water mark ``lo`` (first unconsumed position) and a
high-water mark ``hi`` (furthest consumed), and predicts the unconsumed positions from
``lo`` on — the holes other workers are still to fill first, then the frontier.
"""
from __future__ import annotations

from typing import Sequence

import numpy as np

# Out-of-order reads accepted ahead of the low-water mark: 8 workers x prefetch_factor 2
# x batch 64 = 1024 positions in flight in a PyTorch DataLoader; x4 for slack.
ORDER_WINDOW = 4096
# Positions this far behind the furthest consumed one are given up as skipped (a job that
# drops a hinted item must not pin the cursor forever). Larger than ORDER_WINDOW so that
# slow workers are never skipped.
SKIP_BEHIND = 2 * ORDER_WINDOW
# A far jump (beyond ORDER_WINDOW) is followed only if the next far read confirms it
# (lands within ORDER_WINDOW of the first): one stray open must not skip the order.
# (No constant: confirmation by exactly one more read.)


class OrderCursor:
    __slots__ = ("order", "_pos", "_ptr", "consumed", "lo", "hi", "_pending", "left")

    def __init__(self, order: Sequence[str]):
        self.order = list(order)
        self._pos: dict[str, int | list[int]] = {}
        for i, p in enumerate(self.order):
            cur = self._pos.get(p)
            if cur is None:
                self._pos[p] = i
            elif isinstance(cur, list):
                cur.append(i)
            else:
                self._pos[p] = [cur, i]
        self._ptr: dict[str, int] = {}       # for repeated paths: index into their list
        self.consumed = np.zeros(len(self.order), dtype=bool)
        self.lo = 0
        self.hi = -1
        self._pending: int | None = None
        self.left = len(self.order)          # unconsumed positions

    def __len__(self) -> int:
        return len(self.order)

    @property
    def done(self) -> bool:
        return self.lo >= len(self.order)

    def _candidate(self, path: str) -> int | None:
        pos = self._pos.get(path)
        if pos is None:
            return None
        if isinstance(pos, int):
            return pos if pos >= self.lo and not self.consumed[pos] else None
        j = self._ptr.get(path, 0)
        while j < len(pos) and (pos[j] < self.lo or self.consumed[pos[j]]):
            j += 1
        self._ptr[path] = j
        if j < len(pos):
            return pos[j]
        return None

    def consume(self, path: str) -> tuple[int, int] | None:
        """Mark the next occurrence of path consumed. Returns (position, rank): rank is
        how many unconsumed positions preceded it (0 = exactly the first predicted), or
        None if the path is not (or no longer) in the order ahead of the cursor."""
        p = self._candidate(path)
        if p is None:
            return None
        rank = (p - self.lo) - int(np.count_nonzero(self.consumed[self.lo:p]))
        if p - max(self.lo, self.hi) > ORDER_WINDOW:
            pend, self._pending = self._pending, p
            if pend is None or abs(p - pend) > ORDER_WINDOW:
                return None          # stray far read: wait for confirmation
            self._mark(pend)
        self._pending = None
        self._mark(p)
        return p, rank

    def _mark(self, p: int) -> None:
        c = self.consumed
        if c[p]:
            return
        c[p] = True
        self.left -= 1
        if p > self.hi:
            self.hi = p
        n = len(c)
        if self.hi - self.lo > SKIP_BEHIND:
            self.lo = self.hi - SKIP_BEHIND
        lo = self.lo
        while lo < n and c[lo]:
            lo += 1
        self.lo = lo

    def upcoming(self, k: int) -> list[int]:
        """Up to k unconsumed positions from the low-water mark on, in order."""
        if k <= 0 or self.done:
            return []
        lo = self.lo
        span = max(self.hi - lo + 1, 0) + k
        free = np.flatnonzero(~self.consumed[lo:lo + span])
        return (free[:k] + lo).tolist()

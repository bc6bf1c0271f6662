"""A known read order plus a cursor that tolerates out-of-order reads.

Shared by the hint predictor (the job's own upcoming order) and the successor predictor
(last epoch's order). Several loader workers consume one order interleaved: each takes
a batch, so opens arrive scrambled within a window of positions. The cursor marks
positions consumed, keeps a low-water mark ``lo`` (first unconsumed position) and a
high-water mark ``hi`` (furthest consumed), and predicts the unconsumed positions from
``lo`` on — the holes other workers are still to fill first, then the frontier.
"""
from __future__ import annotations

import zlib
from typing import Callable, Iterable, Sequence

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


# PackedOrder: paths per compressed chunk (~4,096 x 40-byte paths = 160 KB raw, ~30 KB
# packed: one decompression per 4,096 positions the cursor passes).
PACK_CHUNK = 4096
# Decompressed chunks kept (the cursor's window spans at most two).
CHUNKS_KEPT = 4
_MASK32 = 0xFFFFFFFF


class PackedOrder:
    """A long order of paths held compactly (an epoch of ImageNet, 1.28 M paths, in
    ~15 MB instead of ~150 MB of Python strings): the paths in zlib-compressed chunks of
    PACK_CHUNK, and a 32-bit hash per position to find a path's positions (a numpy
    scan, ~0.5 ms per million; candidates are checked against the real path).  Built
    incrementally (``extend``), so a writer streaming millions of paths never holds
    them all; read-only once ``seal``ed."""

    def __init__(self, paths: Iterable[str] = ()):
        self._chunks: list[bytes] = []
        self._pending: list[str] = []
        self._hashes: list[np.ndarray] = []
        self._h: np.ndarray | None = None
        self._n = 0
        self._cache: dict[int, list[str]] = {}
        self.extend(paths)

    def extend(self, paths: Iterable[str]) -> None:
        assert self._h is None, "sealed"
        paths = list(paths)
        self._hashes.append((np.array(list(map(hash, paths)), dtype=np.int64) & _MASK32)
                            .astype(np.uint32))
        self._n += len(paths)
        self._pending += paths
        while len(self._pending) >= PACK_CHUNK:
            self._pack(self._pending[:PACK_CHUNK])
            del self._pending[:PACK_CHUNK]

    def _pack(self, paths: list[str]) -> None:
        self._chunks.append(zlib.compress("\n".join(paths).encode("utf-8", "surrogatepass"),
                                          1))

    def seal(self) -> "PackedOrder":
        if self._h is None:
            if self._pending:
                self._pack(self._pending)
                self._pending = []
            self._h = np.concatenate(self._hashes) if self._hashes else \
                np.zeros(0, dtype=np.uint32)
            self._hashes = []
        return self

    def nbytes(self) -> int:
        return sum(len(c) for c in self._chunks) + (self._h.nbytes if self._h is not None
                                                     else 0)

    def __len__(self) -> int:
        return self._n

    def _chunk(self, c: int) -> list[str]:
        got = self._cache.get(c)
        if got is None:
            got = zlib.decompress(self._chunks[c]).decode("utf-8", "surrogatepass").split("\n")
            if len(self._cache) >= CHUNKS_KEPT:
                self._cache.pop(next(iter(self._cache)))
            self._cache[c] = got
        return got

    def __getitem__(self, i: int) -> str:
        if i < 0:
            i += self._n
        if not 0 <= i < self._n:
            raise IndexError(i)
        return self._chunk(i // PACK_CHUNK)[i % PACK_CHUNK]

    def __iter__(self):
        for i in range(self._n):
            yield self[i]

    def positions(self, path: str) -> list[int]:
        """Every position of ``path``, ascending."""
        cand = np.flatnonzero(self.seal()._h == (hash(path) & _MASK32))
        return [int(i) for i in cand if self[int(i)] == path]


class _ListOrder(list):
    """A plain list of paths with a path -> positions map (short orders)."""

    def __init__(self, paths: Iterable[str]):
        super().__init__(paths)
        self._pos: dict[str, list[int]] = {}
        for i, p in enumerate(self):
            self._pos.setdefault(p, []).append(i)

    def positions(self, path: str) -> list[int]:
        return self._pos.get(path, [])


class _UniqueOrder:
    """A list of distinct paths whose owner already knows each one's position (the
    epoch tracker's record, for last epoch's order): no map of its own, ~150 B per path
    of a 1.28 M-file epoch."""

    def __init__(self, paths: Sequence[str], position: Callable[[str], int]):
        self._paths, self._position = paths, position

    def __len__(self) -> int:
        return len(self._paths)

    def __getitem__(self, i: int) -> str:
        return self._paths[i]

    def positions(self, path: str) -> list[int]:
        p = self._position(path)
        # checked against the list: an owner answering for another order is a miss,
        # not a wrong slot
        return [p] if 0 <= p < len(self._paths) and self._paths[p] == path else []


class _Window:
    """path -> positions for a span of a PackedOrder around the cursor, so that the
    opens a cursor consumes (within ORDER_WINDOW of it) cost a dict lookup, not a scan."""

    SPAN = 3 * ORDER_WINDOW

    def __init__(self, order: PackedOrder, lo: int):
        self.lo, self.hi = lo, min(len(order), lo + self.SPAN)
        self.pos: dict[str, list[int]] = {}
        for i in range(self.lo, self.hi):
            self.pos.setdefault(order[i], []).append(i)


class OrderCursor:
    __slots__ = ("order", "consumed", "lo", "hi", "_pending", "left", "_win")

    def __init__(self, order: Sequence[str] | PackedOrder,
                 position: Callable[[str], int] | None = None):
        """``position``: for an order of distinct paths, the caller's path -> position
        (-1: not in it), used instead of a map built here."""
        if isinstance(order, PackedOrder):
            self.order = order.seal()
        elif position is not None:
            self.order = _UniqueOrder(order, position)
        else:
            self.order = _ListOrder(order)
        self._win: _Window | None = None
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

    def _positions(self, path: str) -> list[int]:
        order = self.order
        if not isinstance(order, PackedOrder):
            return order.positions(path)
        w = self._win
        if w is None or self.lo >= w.lo + ORDER_WINDOW:
            w = self._win = _Window(order, self.lo)
        near = [p for p in w.pos.get(path, ()) if p >= self.lo and not self.consumed[p]]
        return near or order.positions(path)       # a far read: scan the whole order

    def _candidate(self, path: str) -> int | None:
        pos = self._positions(path)
        if not pos:
            return None
        lo, consumed = self.lo, self.consumed
        for p in pos:
            if p >= lo and not consumed[p]:
                return p
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

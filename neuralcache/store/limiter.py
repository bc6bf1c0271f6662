"""A concurrency limiter with priorities, for backend requests.

Demand reads (a process is waiting) always go before read-ahead and prefetch, and
``reserved`` slots are kept free for demand so speculative work can never occupy the
whole link.  A waiter's priority can be raised while it waits (a demand read joined a
queued prefetch of the same block).  trio only; not thread-safe.
"""
from __future__ import annotations

import heapq
import itertools

import trio

DEMAND = 0      # lower number = more urgent
READAHEAD = 1
PREFETCH = 2


class Ticket:
    __slots__ = ("priority", "seq", "event", "granted", "queued")

    def __init__(self, priority: int, seq: int):
        self.priority = priority
        self.seq = seq
        self.event = trio.Event()
        self.granted = False
        self.queued = False


class PriorityLimiter:
    """Waiters sit in a heap ordered by (priority, arrival); a cancelled waiter or one
    whose priority was raised leaves a stale heap entry that dispatch skips, so every
    operation is O(log n) -- thousands of queued prefetches made a linear scan per
    grant the daemon's top CPU cost on the maze bench's 250-byte files
    (``python -m bench.micro prefetch-cpu``)."""

    def __init__(self, total: int, reserved_for_demand: int):
        if total < 1 or not 0 <= reserved_for_demand < total:
            raise ValueError("need total >= 1 and 0 <= reserved < total")
        self.total = total
        self.reserved = reserved_for_demand
        self.busy = 0
        self._heap: list[tuple[int, int, Ticket]] = []
        self._waiting = 0
        self._seq = itertools.count()

    def _may_start(self, priority: int) -> bool:
        cap = self.total if priority == DEMAND else self.total - self.reserved
        return self.busy < cap

    def ticket(self, priority: int) -> Ticket:
        return Ticket(priority, next(self._seq))

    async def acquire(self, t: Ticket) -> None:
        if not self._waiting and self._may_start(t.priority):
            self.busy += 1
            t.granted = True
            return
        t.queued = True
        self._waiting += 1
        heapq.heappush(self._heap, (t.priority, t.seq, t))
        self._dispatch()
        try:
            await t.event.wait()
        except BaseException:
            if t.granted:
                self.release()
            elif t.queued:
                t.queued = False          # its heap entry is now stale
                self._waiting -= 1
            raise

    def raise_priority(self, t: Ticket, priority: int) -> None:
        if priority < t.priority:
            t.priority = priority
            if t.queued:
                heapq.heappush(self._heap, (priority, t.seq, t))  # the old entry goes stale
                self._dispatch()

    def release(self) -> None:
        self.busy -= 1
        self._dispatch()

    def _dispatch(self) -> None:
        heap = self._heap
        while heap:
            priority, _, t = heap[0]
            if not t.queued or priority != t.priority:
                heapq.heappop(heap)
                continue
            if not self._may_start(priority):
                return
            heapq.heappop(heap)
            t.queued = False
            self._waiting -= 1
            if not self._waiting:
                heap.clear()      # only stale entries (cancelled, re-prioritised) remain
            self.busy += 1
            t.granted = True
            t.event.set()

    @property
    def waiting(self) -> int:
        return self._waiting

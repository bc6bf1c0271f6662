"""A concurrency limiter with priorities, for backend requests.

Demand reads (a process is waiting) always go before read-ahead and prefetch, and
``reserved`` slots are kept free for demand so speculative work can never occupy the
whole link.  Optionally the bytes in flight are bounded too (``byte_cap``: each ticket
says how many bytes its request brings; a request starts when it fits, or when nothing
else is in flight), with ``reserved_bytes`` of it kept for demand in the same way:
many requests for small objects, few for large ones.  A waiter's priority can be
raised while it waits (a demand read joined a queued prefetch of the same block).
trio only; not thread-safe.
"""
from __future__ import annotations

import heapq
import itertools

import trio

DEMAND = 0      # lower number = more urgent
READAHEAD = 1
PREFETCH = 2


class Ticket:
    __slots__ = ("priority", "seq", "nbytes", "event", "granted", "queued")

    def __init__(self, priority: int, seq: int, nbytes: int = 0):
        self.priority = priority
        self.seq = seq
        self.nbytes = nbytes
        self.event = trio.Event()
        self.granted = False
        self.queued = False


class PriorityLimiter:
    """Waiters sit in a heap ordered by (priority, arrival); a cancelled waiter or one
    whose priority was raised leaves a stale heap entry that dispatch skips, so every
    operation is O(log n) -- thousands of queued prefetches made a linear scan per
    grant the daemon's top CPU cost on the maze bench's 250-byte files
    (``python -m bench.micro prefetch-cpu``)."""

    def __init__(self, total: int, reserved_for_demand: int, byte_cap: int | None = None,
                 reserved_bytes: int = 0):
        if total < 1 or not 0 <= reserved_for_demand < total:
            raise ValueError("need total >= 1 and 0 <= reserved < total")
        if byte_cap is not None and not 0 <= reserved_bytes < byte_cap:
            raise ValueError("need 0 <= reserved_bytes < byte_cap")
        self.total = total
        self.reserved = reserved_for_demand
        self.byte_cap = byte_cap
        self.reserved_bytes = reserved_bytes
        self.busy = 0
        self.busy_bytes = 0
        self._heap: list[tuple[int, int, Ticket]] = []
        self._waiting = 0
        self._seq = itertools.count()

    def _may_start(self, priority: int, nbytes: int) -> bool:
        demand = priority == DEMAND
        if self.busy >= (self.total if demand else self.total - self.reserved):
            return False
        if self.byte_cap is None or not self.busy:
            return True
        cap = self.byte_cap if demand else self.byte_cap - self.reserved_bytes
        return self.busy_bytes + nbytes <= cap

    def ticket(self, priority: int, nbytes: int = 0) -> Ticket:
        return Ticket(priority, next(self._seq), nbytes)

    def _grant(self, t: Ticket) -> None:
        self.busy += 1
        self.busy_bytes += t.nbytes
        t.granted = True

    async def acquire(self, t: Ticket) -> None:
        if not self._waiting and self._may_start(t.priority, t.nbytes):
            self._grant(t)
            return
        t.queued = True
        self._waiting += 1
        heapq.heappush(self._heap, (t.priority, t.seq, t))
        self._dispatch()
        try:
            await t.event.wait()
        except BaseException:
            if t.granted:
                self.release(t)
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

    def release(self, t: Ticket) -> None:
        """The granted request of ticket ``t`` ended: its slot and its bytes are free."""
        self.busy -= 1
        self.busy_bytes -= t.nbytes
        self._dispatch()

    def _dispatch(self) -> None:
        heap = self._heap
        while heap:
            priority, _, t = heap[0]
            if not t.queued or priority != t.priority:
                heapq.heappop(heap)
                continue
            if not self._may_start(priority, t.nbytes):
                return
            heapq.heappop(heap)
            t.queued = False
            self._waiting -= 1
            if not self._waiting:
                heap.clear()      # only stale entries (cancelled, re-prioritised) remain
            self._grant(t)
            t.event.set()

    @property
    def waiting(self) -> int:
        return self._waiting

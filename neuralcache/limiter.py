"""A concurrency limiter with priorities, for backend requests.

Demand reads (a process is waiting) always go before read-ahead and prefetch, and
``reserved`` slots are kept free for demand so speculative work can never occupy the
whole link.  A waiter's priority can be raised while it waits (a demand read joined a
queued prefetch of the same block).  trio only; not thread-safe.
"""
from __future__ import annotations

import itertools

import trio

DEMAND = 0      # lower number = more urgent
READAHEAD = 1
PREFETCH = 2


class Ticket:
    __slots__ = ("priority", "seq", "event", "granted")

    def __init__(self, priority: int, seq: int):
        self.priority = priority
        self.seq = seq
        self.event = trio.Event()
        self.granted = False


class PriorityLimiter:
    def __init__(self, total: int, reserved_for_demand: int):
        if total < 1 or not 0 <= reserved_for_demand < total:
            raise ValueError("need total >= 1 and 0 <= reserved < total")
        self.total = total
        self.reserved = reserved_for_demand
        self.busy = 0
        self._waiting: list[Ticket] = []
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
        self._waiting.append(t)
        self._dispatch()
        try:
            await t.event.wait()
        except BaseException:
            if t.granted:
                self.release()
            elif t in self._waiting:
                self._waiting.remove(t)
            raise

    def raise_priority(self, t: Ticket, priority: int) -> None:
        if priority < t.priority:
            t.priority = priority
            if not t.granted:
                self._dispatch()

    def release(self) -> None:
        self.busy -= 1
        self._dispatch()

    def _dispatch(self) -> None:
        while self._waiting:
            best = min(self._waiting, key=lambda w: (w.priority, w.seq))
            if not self._may_start(best.priority):
                return
            self._waiting.remove(best)
            self.busy += 1
            best.granted = True
            best.event.set()

    @property
    def waiting(self) -> int:
        return len(self._waiting)

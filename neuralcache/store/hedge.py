"""Hedged fetches: a reader waiting on a block whose GET takes much longer than usual
gets a second, identical GET; the first answer wins and the loser's thread is
abandoned, its result dropped (the "tail at scale" hedge).  A stalled connection
answers nothing until the S3 read timeout (5 s, backends/s3.py), so without a hedge one
stalled GET costs its reader those 5 s and a retry.

A reader comes to wait on a GET in two ways:

* its own demand miss: ``demand`` runs the GET and hedges it after ``delay``;
* it joins a GET that read-ahead or prefetch started before anyone read the block.
  Such a GET runs unhedged (a stall costs no reader yet) as a ``Running``; a reader
  that joins it waits through ``Running.join``, which starts a hedge once the GET has
  run ``delay`` since it began (at once if it already has), and the first hedge to
  answer ends the GET.

Either way a hedge that has not answered ``delay`` after it started is hedged again,
up to HEDGES in all.

Before the joined GETs were hedged, `python -m bench.soak faults --gib 1` (1 % of
requests reset and 1 % stalled for 20 s) read at 0.37-0.53x of its fault-free rate,
slowest read 4.7-4.8 s; after, 0.87-0.95x and 0.7-0.8 s (bench/RESULTS.md,
thirty-second sitting).

A hedge takes no slot of the priority limiter (it stands in for a request that holds
one); its thread comes from a limiter of its own (``BlockStore``'s HEDGE_THREADS), so
that stalled hedges can neither take the threads of fetches nor those of trio's
default limiter, which the write path uses.  A first GET a hedge beat goes on in its
thread until it ends (the read timeout, the backend's retries), holding its fetch
thread; its bytes are dropped and it writes nothing to the disk tier (``ended``).  Only
reads from the remote are hedged, never disk loads.
"""
from __future__ import annotations

import logging
import math
from typing import Awaitable, Callable

import trio

from ..errors import BackendError
from ..stats import Stats

log = logging.getLogger(__name__)

# A hedge starts after HEDGE_FACTOR x the p90 of recent fetch latencies, within
# [HEDGE_MIN_S, HEDGE_MAX_S] (hedging at ~p95 costs a few % more requests, per "The
# Tail at Scale").  Before 20 samples, HEDGE_MAX_S.  The floor keeps a hedge off a
# GET that is merely queued behind a busy link.
HEDGE_FACTOR = 3.0
HEDGE_MIN_S = 0.5
HEDGE_MAX_S = 4.0
# Hedges per GET at most, one more each hedge delay: with 5 % of requests stalled, one
# hedge in 20 stalls as well, and with a single hedge that cost its reader the 5 s
# read timeout (bench/RESULTS.md, thirty-second sitting).  A second one makes that 1 in
# 400; each is sent only while the GET still has not answered.
HEDGES = 2


def delay(stats: Stats, max_s: float = HEDGE_MAX_S) -> float:
    """Seconds a GET may run before a waiting reader hedges it."""
    p90 = stats.latency_quantile(0.9, default=max_s)
    return min(max_s, max(min(HEDGE_MIN_S, max_s), HEDGE_FACTOR * p90))


async def demand(read: Callable[[], bytes], delay_s: float, stats: Stats, what: str,
                 limiter: trio.CapacityLimiter,
                 first: Callable[[], Awaitable[bytes | None]] | None = None) -> bytes:
    """``read()`` (blocking) in a thread for a waiting reader, hedged every ``delay_s``
    (hedges' threads from ``limiter``) up to HEDGES times; the first answer wins.  It
    fails only once every attempt started has failed (each after the backend's own
    retries).  ``first``: the first attempt's read on this thread, None when it cannot
    (then ``read()`` in a thread)."""
    send, recv = trio.open_memory_channel(HEDGES + 1)

    async def attempt(lim, on_loop=None):
        try:
            data = await on_loop() if on_loop is not None else None
            if data is None:
                data = await trio.to_thread.run_sync(read, abandon_on_cancel=True,
                                                     limiter=lim)
            res = ("ok", data)
        except BackendError as exc:
            res = ("err", exc)
        send.send_nowait(res)

    async with trio.open_nursery() as n:
        n.start_soon(attempt, None, first)  # (trio's default thread limiter, as before)
        started, failed = 1, 0
        next_at = trio.current_time() + delay_s
        while True:
            res = None
            with trio.move_on_at(next_at if started <= HEDGES else math.inf):
                res = await recv.receive()
            if res is None:
                stats.hedged_requests += 1
                log.info("hedging a slow read of %s", what)
                n.start_soon(attempt, limiter)
                started += 1
                next_at = trio.current_time() + delay_s
                continue
            if res[0] == "ok":
                break
            failed += 1
            if failed == started:     # nothing left that may still answer
                break
        n.cancel_scope.cancel()
    if res[0] == "err":
        raise res[1]
    return res[1]


class Running:
    """A GET started with no reader waiting, which a reader may join (see the module
    doc).  ``run`` is the GET; ``join`` is the reader's wait."""

    __slots__ = ("_last", "_scope", "_hedges", "_out", "_idle", "_data", "ended")

    def __init__(self):
        self._last = trio.current_time()    # the GET's or the last hedge's start (trio's
                                            # clock: move_on_at's)
        self._scope = trio.CancelScope()
        self._hedges: list[trio.CancelScope] = []      # the hedges started
        self._out = 0                                   # ... and not ended yet
        self._idle = trio.Event()                       # set when _out drops to 0
        self._data = None                               # the first hedge's answer
        self.ended = False     # run() returned: a late thread's bytes are not wanted

    async def run(self, first: Callable[[], Awaitable[bytes]]) -> bytes:
        """``await first()``, unless a hedge answers sooner: then its answer.  If the
        first GET fails while hedges are out, their answer (if any) is the result."""
        try:
            with self._scope:
                try:
                    return await first()
                except BackendError:
                    if self._data is None and self._out:
                        await self._idle.wait()   # a hedge's answer cancels this wait
                    if self._data is None:
                        raise
            return self._data     # (a hedge answered: it cancelled the scope)
        finally:
            self.ended = True
            for h in self._hedges:                # drop the hedges still out
                h.cancel()

    async def join(self, done: trio.Event, read: Callable[[], bytes], delay_s: float,
                   nursery: trio.Nursery, stats: Stats, what: str,
                   limiter: trio.CapacityLimiter) -> None:
        """Wait for ``done`` (the load this GET belongs to).  Once the GET has run
        ``delay_s`` without an answer, start a hedge, ``read()`` in a thread from
        ``limiter``, in ``nursery``, and another each ``delay_s`` after the last:
        HEDGES at most, whoever joins."""
        while len(self._hedges) < HEDGES:
            with trio.move_on_at(self._last + delay_s):
                await done.wait()
                return
            if done.is_set() or self.ended:
                return
            if len(self._hedges) < HEDGES and trio.current_time() >= self._last + delay_s:
                scope = trio.CancelScope()
                self._hedges.append(scope)
                self._last = trio.current_time()
                if not self._out:
                    self._idle = trio.Event()
                self._out += 1
                stats.hedged_requests += 1
                log.info("hedging a slow read of %s (a reader joined it)", what)
                nursery.start_soon(self._run_hedge, scope, read, what, limiter)
        await done.wait()

    async def _run_hedge(self, scope: trio.CancelScope, read: Callable[[], bytes],
                         what: str, limiter: trio.CapacityLimiter) -> None:
        try:
            with scope:
                try:
                    data = await trio.to_thread.run_sync(read, abandon_on_cancel=True,
                                                         limiter=limiter)
                except BackendError:
                    return        # the first GET (and any other hedge) goes on
                except Exception:  # a bug must not take the store's nursery down
                    log.exception("hedged read of %s failed", what)
                    return
                if self._data is None and not self.ended:
                    self._data = data
                    self._scope.cancel()
        finally:
            self._out -= 1
            if not self._out:
                self._idle.set()

"""Hedged fetches: a reader waiting on a block whose GET takes much longer than usual
gets a second, identical GET; the first answer wins and the loser's thread is
abandoned, its result dropped (the "tail at scale" hedge).  A stalled connection
answers nothing until the S3 read timeout (5 s, backends/s3.py), so without a hedge one
stalled GET costs its reader those 5 s and a retry.

A reader comes to wait on a GET in two ways:

* its own demand miss: ``demand`` runs the GET and hedges it after ``delay``;
* it joins a GET that read-ahead or prefetch started before anyone read the block.
  Such a GET runs unhedged (a stall costs no reader yet) as a ``Running``; a reader
  that joins it waits through ``Running.join``, which starts one hedge once the GET has
  run ``delay`` since it began (at once if it already has), and the hedge's answer ends
  the GET.  Before, a joined read-ahead GET was never hedged: `python -m bench.soak
  faults --gib 1` (1 % of requests reset and 1 % stalled for 20 s) read at 0.39x of
  its fault-free rate, slowest read 4.9 s (bench/RESULTS.md, thirty-second sitting).

A hedge takes no slot of the priority limiter: it stands in for a request that holds
one.  Only reads from the remote are hedged, never disk loads.
"""
from __future__ import annotations

import logging
from typing import Callable

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


def delay(stats: Stats, max_s: float = HEDGE_MAX_S) -> float:
    """Seconds a GET may run before a waiting reader hedges it."""
    p90 = stats.latency_quantile(0.9, default=max_s)
    return min(max_s, max(min(HEDGE_MIN_S, max_s), HEDGE_FACTOR * p90))


async def demand(read: Callable[[], bytes], delay_s: float, stats: Stats,
                 what: str) -> bytes:
    """``read()`` (blocking) in a thread for a waiting reader, hedged after
    ``delay_s``; if one attempt fails the other may still answer."""
    send, recv = trio.open_memory_channel(2)

    async def attempt():
        try:
            res = ("ok", await trio.to_thread.run_sync(read, abandon_on_cancel=True))
        except BackendError as exc:
            res = ("err", exc)
        send.send_nowait(res)

    async with trio.open_nursery() as n:
        n.start_soon(attempt)
        outcome = None
        with trio.move_on_after(delay_s):
            outcome = await recv.receive()
        if outcome is None:
            stats.hedged_requests += 1
            log.info("hedging a slow read of %s", what)
            n.start_soon(attempt)
            outcome = await recv.receive()
            if outcome[0] == "err":   # one failed: the other may still succeed
                outcome2 = await recv.receive()
                if outcome2[0] == "ok":
                    outcome = outcome2
        n.cancel_scope.cancel()
    if outcome[0] == "err":
        raise outcome[1]
    return outcome[1]


class Running:
    """A GET started with no reader waiting, which a reader may join (see the module
    doc).  ``run`` is the GET; ``join`` is the reader's wait."""

    __slots__ = ("t0", "_scope", "_hedge", "_data")

    def __init__(self):
        self.t0 = trio.current_time()       # (trio's clock: move_on_at's)
        self._scope = trio.CancelScope()
        self._hedge: trio.CancelScope | None = None    # the hedge, once started
        self._data = None                               # the hedge's answer

    async def run(self, first) -> bytes:
        """``await first()``, unless a hedge answers sooner: then its answer."""
        with self._scope:
            try:
                return await first()
            finally:
                if self._hedge is not None:       # the first GET ended: drop the hedge
                    self._hedge.cancel()
        return self._data      # (the hedge cancelled the scope after setting it)

    async def join(self, done: trio.Event, read: Callable[[], bytes], delay_s: float,
                   nursery: trio.Nursery, stats: Stats, what: str) -> None:
        """Wait for ``done`` (the load this GET belongs to); once the GET has run
        ``delay_s``, start one hedge, ``read()`` in a thread, in ``nursery``."""
        if self._hedge is None:
            with trio.move_on_at(self.t0 + delay_s):
                await done.wait()
                return
            if self._hedge is None and not done.is_set():
                self._hedge = trio.CancelScope()
                stats.hedged_requests += 1
                log.info("hedging a slow read of %s (a reader joined it)", what)
                nursery.start_soon(self._run_hedge, read, what)
        await done.wait()

    async def _run_hedge(self, read: Callable[[], bytes], what: str) -> None:
        with self._hedge:
            try:
                data = await trio.to_thread.run_sync(read, abandon_on_cancel=True)
            except BackendError:
                return            # the first GET goes on (and retries)
            except Exception:     # a bug must not take the store's nursery down
                log.exception("hedged read of %s failed", what)
                return
            self._data = data
            self._scope.cancel()

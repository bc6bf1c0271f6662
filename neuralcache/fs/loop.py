"""The FUSE request loop's two waits, made cheap when requests are already queued.

pyfuse3's loop (``pyfuse3.main``) takes each request in three steps on the trio thread:
acquire its read lock (``trio.Lock``: a scheduler pass even when nobody holds it), wait
for the ``/dev/fuse`` fd to be readable (``trio.lowlevel.wait_readable``: an
``epoll_ctl`` to register, a park, the I/O poll to wake it, an ``epoll_ctl`` to
unregister), then read.  With the kernel sending a request every few tens of
microseconds those waits were ~25 % of the trio thread's busy samples on a warm epoch of
small files (py-spy ``--native``: ``epoll_ctl`` 10.8 %, the lock 11.7 %), where a file
costs two requests (OPEN, RELEASE) and nothing else.

pyfuse3 reaches trio through its module global ``trio`` (``pyfuse3.asyncio`` swaps it
for asyncio the same way).  ``install()`` gives it a stand-in that forwards everything
to trio except two things:

- ``Lock``: a lock whose uncontended acquire takes no scheduler pass (waiters park on a
  trio ParkingLot, first come first served).  Only pyfuse3's read lock uses it.
- ``lowlevel.wait_readable``: a zero-timeout ``poll()`` of the fd first; when a request
  is already there it returns at once, and every READY_BATCH-th time in a row through
  one scheduler pass (``trio.lowlevel.checkpoint``), so every other task (a handler
  whose fetch finished, a worker thread's result, a timer) still runs within a few
  requests, and a cancelled loop (a part of the daemon failed) stops within a few too.
  The pass comes after the poll, never between pyfuse3's exit check and the wait: a
  ``terminate()`` meanwhile would close the fd under a task about to wait on it.  When
  nothing is queued, trio's own ``wait_readable``.

Nothing else of the loop changes: one task reads at a time, the read that follows is
pyfuse3's.  NEURALCACHE_FAST_LOOP=0 leaves pyfuse3 on plain trio.
"""
from __future__ import annotations

import os
import select
import types

import pyfuse3
import trio

# On unless NEURALCACHE_FAST_LOOP=0 (bench pairs in bench/RESULTS.md).
FAST_LOOP = os.environ.get("NEURALCACHE_FAST_LOOP", "1") == "1"
# Requests taken back to back (the fd already readable) before the loop lets the other
# tasks run.  A request that waits on anything (a fetch, a worker thread) lets them run
# anyway; this bounds the run of ones that do not (OPEN, RELEASE, LOOKUP from the
# table: ~40 us each).  8: `python -m bench.tools.warmfiles` with
# NEURALCACHE_READY_BATCH=1/4/8/16 (bench/RESULTS.md, fourteenth sitting).
READY_BATCH = max(1, int(os.environ.get("NEURALCACHE_READY_BATCH", "8")))


class _Lock:
    """An async lock for one trio thread: ``async with`` takes it at once when free."""

    def __init__(self) -> None:
        self._held = False
        self._lot = trio.lowlevel.ParkingLot()

    @trio.lowlevel.enable_ki_protection
    async def __aenter__(self) -> None:
        if self._held or self._lot:
            await self._lot.park()      # the releaser hands it over (_held stays True)
        else:
            await trio.lowlevel.checkpoint_if_cancelled()   # no pass unless cancelled
            self._held = True

    @trio.lowlevel.enable_ki_protection
    async def __aexit__(self, *exc) -> None:
        if self._lot:
            self._lot.unpark(count=1)   # ownership passes to the first waiter
        else:
            self._held = False


_polls: dict[int, select.poll] = {}
_ready_run = 0          # requests taken back to back since the last scheduler pass


async def _wait_readable(fd: int) -> None:
    global _ready_run
    p = _polls.get(fd)
    if p is None:
        p = _polls[fd] = select.poll()
        p.register(fd, select.POLLIN)
    if p.poll(0):
        _ready_run += 1
        if _ready_run >= READY_BATCH:
            _ready_run = 0
            await trio.lowlevel.checkpoint()    # a cancelled loop stops here
    else:
        _ready_run = 0
        await trio.lowlevel.wait_readable(fd)


class _Lowlevel(types.SimpleNamespace):
    def __getattr__(self, name):
        return getattr(trio.lowlevel, name)


class _Trio(types.SimpleNamespace):
    def __getattr__(self, name):
        return getattr(trio, name)


def install() -> bool:
    """Give pyfuse3 the stand-in (before ``pyfuse3.main``); False when turned off."""
    if not FAST_LOOP:
        return False
    pyfuse3.trio = _Trio(Lock=_Lock, lowlevel=_Lowlevel(wait_readable=_wait_readable))
    return True

"""Writing blocks to the disk tier within a time budget: what a clean unmount does with
the blocks only memory held (``BlockStore.write_back`` gathers them)."""
from __future__ import annotations

import logging

import trio

log = logging.getLogger(__name__)

# After the unmount, at most this long writing to the disk tier the blocks only memory
# held (BlockStore.write_back, called by the daemon): the default 1 GiB memory tier on
# a disk that takes ~100 MB/s.  `python -m bench.breakdown --size 1G --files 0
# --throttle-writes 100M`: the umount after a cold 1 GiB read took 7.6-8.0 s and the
# next mount fetched nothing; unthrottled 0.3 s (bench/RESULTS.md, twenty-third
# sitting).  Within `neuralcache umount`'s 30 s wait for the daemon and the systemd
# unit's TimeoutStopSec=60; a signal stops it sooner.
WRITE_BACK_S = 10.0
# Writers of ``write_back`` (at unmount): two per core, so one can wait on the disk while
# another checksums (a guess, not measured against other counts; the disk threads,
# blocks.py DISK_THREADS, bound them anyway).
WRITE_BACK_WRITERS = 4


async def write_blocks(disk, blocks: list, budget_s: float,
                       limiter: trio.CapacityLimiter, done: list) -> tuple[int, int, bool]:
    """Write ``blocks`` ((BlockKey, bytes), in order) with ``disk.put``,
    WRITE_BACK_WRITERS at a time through ``limiter``'s threads, adding the blocks and
    bytes written to ``done`` as they land (a caller cancelled midway still knows).
    No write starts after ``budget_s`` seconds (or the caller's cancel), nor after a
    write failed with the disk refusing writes (an outage: ``put`` is tried once
    even if an earlier outage is not over, and within its retry window returns False
    at once); those under way finish (a thread is never abandoned), and ``disk.put``
    is atomic either way.  (blocks written, bytes written, whether all were)."""
    pending = iter(blocks)
    n0, b0 = done
    stop = False

    async def writer():
        nonlocal stop
        for bk, data in pending:
            if stop:
                return
            try:
                ok = await trio.to_thread.run_sync(disk.put, bk, data, limiter=limiter)
            except Exception:  # a cache failure is never a reader's failure
                log.exception("disk cache write failed")
                ok = False
            if ok:
                done[0] += 1
                done[1] += len(data)
            elif not disk.writable:          # an outage: leave the rest
                stop = True

    with trio.move_on_after(budget_s):
        async with trio.open_nursery() as n:
            for _ in range(WRITE_BACK_WRITERS):
                n.start_soon(writer)
    return done[0] - n0, done[1] - b0, done[0] - n0 == len(blocks)

"""Many small blocking disk calls in few worker-thread jobs.

Writes: one worker-thread job writes every small block that a background writer finds
queued (``blocks.BlockStore._disk_writer``; ``gather``, ``put_all``).  A cold small
file's block is fetched on the trio thread (backends/s3trio.py).  Written one thread
job per block (to the disk tier in its own job, or by the writers one job each), the
hand-offs cost about as much CPU as the writes: `python -m bench.breakdown --size 1M
--files 2000`, two pairs (bench/RESULTS.md, thirty-ninth sitting), worker threads
0.42-0.56 ms per cold 100 KB file before, 0.23-0.26 batched, the writes and their
checksums 0.18-0.29 of it.  The writer that takes a small block waits up to
BATCH_LINGER_S for more, then writes them all in one job.  A block waiting here is
served from the queue (``BlockStore._queued``) like any other queued write, so the
wait costs no reader anything; the queue's byte bound is as before.  Blocks of a
batch are written one after another: one failed write is logged and the others go on.

Reads: a ``Combined`` function runs in at most a few jobs at once; the calls made while
they are all busy go together in the next one (no call waits while a job is free).  The
block store reads the small blocks it loads ahead from the disk tier this way (a
prefetch plan starts many at once), not one job each.
"""
from __future__ import annotations

import collections
import logging

import trio

log = logging.getLogger(__name__)

# How long a writer that took a small block waits for more before its thread job:
# 10 ms, at ~700 cold files/s shared by two writers, is ~4 blocks per job, and is small
# beside the 60 ms round trip each of those blocks took to arrive.  0 writes each block
# in a job of its own (the old behaviour).
BATCH_LINGER_S = 0.01
# A writer waits for more only while its batch is under both of these: a block at least
# BATCH_MAX_BYTES (the default 8 MiB blocks) is written at once, alone, as before (its
# write dwarfs a hand-off); 32 blocks of 100 KB are ~3 MiB, a few ms of disk writes.
BATCH_MAX_BLOCKS = 32
BATCH_MAX_BYTES = 4 << 20


async def gather(recv: trio.MemoryReceiveChannel, batch: list[tuple],
                 linger_s: float = BATCH_LINGER_S) -> None:
    """Add to ``batch`` (the (key, data) items a writer took from ``recv``) what else
    arrives on ``recv`` within ``linger_s``, while the batch stays under
    BATCH_MAX_BLOCKS and BATCH_MAX_BYTES.  Extends the caller's list in place, so that
    what it took is the caller's to write back if it is cancelled meanwhile."""
    size = sum(len(data) for _, data in batch)
    deadline = trio.current_time() + linger_s
    while len(batch) < BATCH_MAX_BLOCKS and size < BATCH_MAX_BYTES:
        item = None
        with trio.move_on_at(deadline):
            try:
                item = await recv.receive()
            except (trio.EndOfChannel, trio.ClosedResourceError):
                pass
        if item is None:
            return
        batch.append(item)
        size += len(item[1])


def put_all(disk, batch: list[tuple], unread: list[bool], stored: list[bool]) -> None:
    """In a worker thread: ``disk.put`` each (key, data) of ``batch``, in order, with
    its ``unread`` flag; ``stored[i]`` is set to what the put returned.  A failure is
    logged (a cache failure is never a reader's failure) and the rest go on."""
    for i, (bk, data) in enumerate(batch):
        try:
            stored[i] = disk.put(bk, data, unread[i])
        except Exception:
            log.exception("disk cache write failed")


class _Call:
    __slots__ = ("arg", "size", "result", "error", "done", "dropped")

    def __init__(self, arg, size: int):
        self.arg, self.size, self.result, self.error = arg, size, None, None
        self.done = trio.Event()
        self.dropped = False     # its caller left before a job took it: not run


class Combined:
    """``await call(nursery, arg, size)``: ``fn(arg)`` in a worker thread, with at most
    ``jobs`` jobs (from ``limiter``) at once, each running the calls waiting when it
    starts, in order, up to BATCH_MAX_BLOCKS calls or BATCH_MAX_BYTES of ``size`` (so
    that a reader who joins one of them waits for a few ms of disk reads at most).
    ``fn``'s exception is the call's.  A job cancelled before its thread began (the
    unmount) answers None to its calls and to every call still waiting."""

    def __init__(self, fn, jobs: int, limiter: trio.CapacityLimiter):
        self.fn, self.jobs, self.limiter = fn, jobs, limiter
        self._waiting: collections.deque[_Call] = collections.deque()
        self._running = 0
        self.calls = self.batches = 0      # (tests; how well calls combine)

    async def call(self, nursery: trio.Nursery, arg, size: int = 0):
        c = _Call(arg, size)
        self._waiting.append(c)
        if self._running < self.jobs:
            nursery.start_soon(self._run)
            self._running += 1
        try:
            await c.done.wait()
        except BaseException:
            c.dropped = True
            raise
        if c.error is not None:
            raise c.error
        return c.result

    async def _run(self) -> None:
        try:
            while self._waiting:
                batch, size = [], 0
                while (self._waiting and len(batch) < BATCH_MAX_BLOCKS
                       and size < BATCH_MAX_BYTES):
                    c = self._waiting.popleft()
                    if not c.dropped:
                        batch.append(c)
                        size += c.size
                if not batch:
                    continue
                self.calls += len(batch)
                self.batches += 1
                try:
                    await trio.to_thread.run_sync(self._all, batch, limiter=self.limiter)
                finally:
                    for c in batch:
                        c.done.set()
        except BaseException:        # cancelled: no job of ours may take the rest
            while self._waiting:
                self._waiting.popleft().done.set()
            raise
        finally:
            self._running -= 1

    def _all(self, batch: list[_Call]) -> None:
        for c in batch:
            if c.dropped:
                continue
            try:
                c.result = self.fn(c.arg)
            except Exception as exc:
                c.error = exc

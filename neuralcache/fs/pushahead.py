"""EXPERIMENT, reverted in the next commit (bench/RESULTS.md, forty-first sitting):
rerun with `git checkout` of this commit and `PA_SKIP_MB=S PA_AHEAD_MB=A python -m
bench.breakdown --size 1G --files 0` (S=0 A=32, S=16 A=64).

A sequential reader's next blocks, when this node holds them (the memory or the disk
tier), go into the kernel page cache ahead of it, so that the reader finds them there
and sends no READ (issue 20, "from the disk cache").

Why: a READ's answer is copied into the kernel by pyfuse3 on the trio thread with the
GIL held (``fuse_reply_buf``): reading 1 GiB from the disk cache, that copy was 54 % of
the trio thread's samples, and every other request and the disk tier's worker threads
waited behind it.  ``pyfuse3.notify_store`` makes the same copy with the GIL released,
here in a worker thread, beside the trio thread on the other core; the trio thread then
answers a READ per PUSH_AHEAD_BYTES instead of one per MiB.

What is pushed: the blocks after a READ of an established stream (ahead/readahead.py),
up to PUSH_AHEAD_BYTES past it, that are in the memory tier or the disk tier now.  A
block still on its way from the remote is not waited for (the READ path and the
read-ahead serve it; a push of it would copy it a second time).  A pushed range counts
as read for the handle's read-ahead (its window keeps growing, the blocks it leaves
behind leave the memory tier) and for the prefetcher.  Read-only mounts, handles
without O_DIRECT (fs/operations.py decides).

The bytes are the handle's pinned version's, checked as any disk-tier read (the
block's checksum).  No page of an old version lands after an open of a new one: a push
starts only while the inode's kernel version (fs/pagedrop.KernelVersions) is the
handle's, and an open that finds the version changed (answered with keep_cache off,
so the kernel drops the inode's pages) first waits for the inode's pushes in flight
(``settled``).  A push may wait on a page lock that a READ in flight holds (the
kernel's own read-ahead of the same pages): in a worker thread, never the trio thread
that answers that READ; abandoned at unmount like fs/pagedrop.py's drops.
"""
from __future__ import annotations

import logging
import threading

import pyfuse3
import trio

from ..ahead.readahead import STREAK_MIN
from ..stats import Stats
from ..store.blocks import BlockStore
from .pagedrop import KernelVersions

log = logging.getLogger(__name__)

# How far past a READ its stream's cached blocks are pushed.  A reader that stops early
# leaves at most this much pushed and unread in the page cache (as the kernel's own
# read-ahead window, daemon.KERNEL_READAHEAD_KB, does).  0 turns pushing ahead off.
import os
PUSH_AHEAD_BYTES = int(os.environ.get("PA_AHEAD_MB", "32")) << 20
PUSH_SKIP = int(os.environ.get("PA_SKIP_MB", "0")) << 20
# Pushes at once, each in a worker thread (one copy of a block into the kernel): this
# machine's 2 cores, one beside the trio thread and one for the disk tier's reads.
PUSH_THREADS = 2


class AheadPusher:
    """``after_read`` from Operations.read; ``settled`` from its open; ``run`` is a
    task of the mount's nursery (no pushes until it runs)."""

    def __init__(self, store: BlockStore, stats: Stats, versions: KernelVersions,
                 prefetcher=None) -> None:
        self.store, self.stats, self.versions = store, stats, versions
        self.prefetcher = prefetcher
        self._limiter = trio.CapacityLimiter(PUSH_THREADS)
        self._nursery: trio.Nursery | None = None
        self._stop = threading.Event()     # set when run() ends (see _store)
        self._busy: dict[int, int] = {}            # inode -> pushes in flight
        self._idle: dict[int, trio.Event] = {}     # inode -> set when they are done

    async def run(self, task_status=trio.TASK_STATUS_IGNORED) -> None:
        try:
            async with trio.open_nursery() as n:
                self._nursery = n
                task_status.started()
                await trio.sleep_forever()
        finally:
            self._nursery = None
            self._stop.set()

    def after_read(self, inode: int, h, off: int, n: int) -> None:
        """A READ of handle ``h`` answered [off, off+n): push its stream's next cached
        blocks (the module doc)."""
        ra = h.readahead
        if self._nursery is None or ra is None or ra.streak < STREAK_MIN \
                or PUSH_AHEAD_BYTES <= 0:
            return
        store, p = self.store, h.pinned
        bs = store.block_size
        first = max(h.pushed_upto, (off + n + PUSH_SKIP + bs - 1) // bs)
        stop = min(store.nblocks(p), (off + n + PUSH_SKIP + PUSH_AHEAD_BYTES) // bs)
        if first >= stop or self.versions.get_same(inode, p.version) is not True:
            return
        i = first
        while i < stop and store.held(p, i):
            start, length = store.block_range(p, i)
            self._busy[inode] = self._busy.get(inode, 0) + 1
            self._nursery.start_soon(self._push, inode, h, p, i)
            # the range counts as read: the read-ahead's window and what it leaves
            # behind, the prefetcher's observation
            for j in ra.on_read(start, length, store.nblocks(p), store.latency_estimate()):
                store.prefetch(p, j)
            for j in ra.behind():
                if j < i:                   # (this one goes once it is pushed)
                    store.consumed(p, j)
            if self.prefetcher is not None:
                self.prefetcher.on_read(p.key, start, length, p.size, h.pid)
            i += 1
        h.pushed_upto = max(h.pushed_upto, i)

    async def _push(self, inode: int, h, p, i: int) -> None:
        st = self.stats
        try:
            data, _ = await self.store.get(p, i)    # the memory tier's, or the disk's
            # (the handle closed, or an open of a new version meanwhile: not pushed)
            if h.released or self.versions.get_same(inode, p.version) is not True:
                return
            ok = await trio.to_thread.run_sync(
                _store, inode, i * self.store.block_size, data, self._stop,
                limiter=self._limiter, abandon_on_cancel=True)
            if ok:
                st.pushed_ahead_blocks += 1
                st.pushed_bytes += len(data)
                st.bytes_served += len(data)
                self.store.consumed(p, i)           # the page cache has it now
        except Exception as exc:     # nothing lost: the reader's READ reads it instead
            st.push_errors += 1
            log.debug("pushing block %d of %s ahead failed: %s", i, p.key, exc)
        finally:
            left = self._busy[inode] - 1
            if left:
                self._busy[inode] = left
            else:
                del self._busy[inode]
                idle = self._idle.pop(inode, None)
                if idle is not None:
                    idle.set()

    async def settled(self, inode: int) -> None:
        """Return once no push of ``inode`` is in flight."""
        if inode in self._busy:
            idle = self._idle.setdefault(inode, trio.Event())
            await idle.wait()


def _store(inode: int, off: int, data, stop: threading.Event) -> bool:
    """(worker thread) The push itself; False once the mount is stopping (pyfuse3's
    session is closed after the mount's nursery ends)."""
    if stop.is_set():
        return False
    try:
        pyfuse3.notify_store(inode, off, data)
    except OSError as exc:      # e.g. ENOENT: the kernel dropped the inode meanwhile
        log.debug("notify_store of inode %d at %d failed: %s", inode, off, exc)
        return False
    return True

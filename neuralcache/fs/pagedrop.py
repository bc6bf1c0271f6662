"""The kernel drops the cached pages of a file whose object changed on the remote
(meta/lister.py finds the change at a refresh; fs/operations.py asks here).

Off the request thread: the kernel locks each page to drop it, and a READ of that inode
in flight holds its page locked until the request thread answers it, so a drop made
there would wait for itself.  One task and one worker thread at a time, in batches: a
refresh that finds thousands of changed files queues each inode once and costs one
thread hand-off per DROP_BATCH inodes (it was a task and a thread per inode, held until
trio's thread limit let each run).  Until its pages go, the next open of the inode
is answered with keep_cache off (fs/operations.py forgets the version it opened).
"""
from __future__ import annotations

import itertools
import logging

import pyfuse3
import trio

log = logging.getLogger(__name__)

# Inodes dropped per worker-thread hand-off.  A drop of an inode with no cached pages
# is one notify write (a few microseconds); 64 keeps a batch well under a millisecond
# of kernel time, so the batch after it (a file changed again) is not held up.
DROP_BATCH = 64


class PageDropper:
    """``drop(inode)`` from the trio thread; ``run`` (a task of the mount's nursery)
    does the drops in a worker thread, oldest first, each queued inode once."""

    def __init__(self) -> None:
        self._queued: dict[int, None] = {}      # an ordered set
        self._wake = trio.Event()
        self.dropped = 0

    def drop(self, inode: int) -> None:
        self._queued[inode] = None
        self._wake.set()

    def pending(self) -> int:
        return len(self._queued)

    async def run(self, task_status=trio.TASK_STATUS_IGNORED) -> None:
        task_status.started()
        while True:
            await self._wake.wait()
            self._wake = trio.Event()
            while self._queued:
                batch = list(itertools.islice(self._queued, DROP_BATCH))
                for inode in batch:
                    del self._queued[inode]
                try:
                    # abandoned on cancel: a drop waiting on a page lock of a READ the
                    # stopped loop will never answer must not hold the unmount up
                    await trio.to_thread.run_sync(_drop_all, batch, abandon_on_cancel=True)
                except Exception:  # the next open drops the pages anyway (keep_cache off)
                    log.exception("dropping the kernel's pages of %d inodes failed",
                                  len(batch))
                self.dropped += len(batch)


def _drop_all(inodes: list[int]) -> None:
    """(worker thread)"""
    for inode in inodes:
        try:
            pyfuse3.invalidate_inode(inode)
        except OSError:
            pass     # the kernel does not know this inode: nothing to drop

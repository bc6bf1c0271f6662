"""The kernel drops the cached pages of a file whose object changed on the remote
(meta/lister.py finds the change at a refresh; fs/operations.py asks here).

Off the request thread: the kernel locks each page to drop it, and a READ of that inode
in flight holds its page locked until the request thread answers it, so a drop made
there would wait for itself.  One task and one worker thread at a time, in batches: a
refresh that finds thousands of changed files queues each inode once and costs one
thread hand-off per DROP_BATCH inodes (it was a task and a thread per inode, held until
trio's thread limit let each run).  Until its pages go, the next open of the inode
is answered with keep_cache off (fs/operations.py forgets the version it opened).

``KernelVersions`` is that record: the version of each inode at its last open, which
the kernel's pages hold.
"""
from __future__ import annotations

import itertools
import logging
import threading

import numpy as np
import pyfuse3
import trio

log = logging.getLogger(__name__)

# Inodes dropped per worker-thread hand-off.  A drop of an inode with no cached pages
# is one notify write (a few microseconds).  One whose page a READ in flight holds
# locked waits until that READ is answered (up to store/blocks.py's demand deadline),
# and the rest of its batch and the batches after it wait with it: nothing is served
# wrong meanwhile (the next open of a changed file is answered with keep_cache off), the
# drops come late.  64 is a refresh's thousands of changed files in tens of hand-offs.
DROP_BATCH = 64


class PageDropper:
    """``drop(inode)`` from the trio thread; ``run`` (a task of the mount's nursery)
    does the drops in a worker thread, oldest first, each queued inode once."""

    def __init__(self) -> None:
        self._queued: dict[int, None] = {}      # an ordered set
        self._batch: frozenset[int] = frozenset()  # being dropped in the worker now
        self._wake = trio.Event()
        # set when run() ends: an abandoned batch stops before its next inode (pyfuse3's
        # session is closed after the mount's nursery ends)
        self._stop = threading.Event()
        self.dropped = 0

    def drop(self, inode: int) -> None:
        self._queued[inode] = None
        self._wake.set()

    def pending(self) -> int:
        return len(self._queued)

    def waiting(self, inode: int) -> bool:
        """``inode`` is queued or being dropped: the kernel may still hold its old
        attributes (a drop invalidates them with the pages)."""
        return inode in self._queued or inode in self._batch

    async def run(self, task_status=trio.TASK_STATUS_IGNORED) -> None:
        task_status.started()
        try:
            while True:
                await self._wake.wait()
                self._wake = trio.Event()
                while self._queued:
                    batch = list(itertools.islice(self._queued, DROP_BATCH))
                    for inode in batch:
                        del self._queued[inode]
                    self._batch = frozenset(batch)
                    try:
                        # abandoned on cancel: a drop waiting on a page lock of a READ
                        # the stopped loop will never answer must not hold the unmount
                        await trio.to_thread.run_sync(_drop_all, batch, self._stop,
                                                      abandon_on_cancel=True)
                        self.dropped += len(batch)
                    except Exception:  # the next open drops them anyway (keep_cache off)
                        log.exception("dropping the kernel's pages of %d inodes failed",
                                      len(batch))
                    finally:
                        self._batch = frozenset()
        finally:
            self._stop.set()


def _drop_all(inodes: list[int], stop: threading.Event) -> None:
    """(worker thread)"""
    for inode in inodes:
        if stop.is_set():
            return
        try:
            pyfuse3.invalidate_inode(inode)
        except OSError:
            pass     # the kernel does not know this inode: nothing to drop


# Inodes whose kernel version ``KernelVersions`` keeps in its array: 2**24 (16.8 M)
# inodes, 128 MB of address space that is resident only where written (a 4 KiB page per
# 512 consecutive inodes: a directory's files are numbered together).  Higher inodes go
# to a dict (~100 B each).  Sized so that ImageNet's 1.28 M files or a 10 M-object
# bucket never leave the array.
ARRAY_INODES = 1 << 24


class KernelVersions:
    """inode -> the version it was last opened at (so the kernel's pages are of it), as
    a 64-bit hash of the version: in a zeroed array indexed by inode (inodes are
    numbered from 1 up: namespace.py), allocated once and never copied, so that only
    its pages of inodes opened use memory: 8 bytes per inode where a job opens most of
    a directory, a page where it opens one file in 512.  It was a dict of version
    strings, ~150 bytes per file opened: ~190 MB after an epoch over ImageNet's 1.28 M
    files.  Two versions of one file taken for the same would need a 64-bit hash
    collision (str hashes are stable within the process that made them)."""

    def __init__(self, array_inodes: int = ARRAY_INODES) -> None:
        self._h = np.zeros(array_inodes, dtype=np.int64)    # 0: unknown (calloc: lazy)
        self._over: dict[int, int] = {}                      # inodes past the array

    @staticmethod
    def _hash(version: str) -> int:
        return hash(version) or 1

    def get_same(self, inode: int, version: str) -> bool | None:
        """None if unknown (never opened, or forgotten), else whether it was ``version``."""
        h = int(self._h[inode]) if inode < len(self._h) else self._over.get(inode, 0)
        return None if h == 0 else h == self._hash(version)

    def set(self, inode: int, version: str) -> None:
        if inode < len(self._h):
            self._h[inode] = self._hash(version)
        else:
            self._over[inode] = self._hash(version)

    def forget(self, inode: int) -> None:
        if inode < len(self._h):
            self._h[inode] = 0
        else:
            self._over.pop(inode, None)

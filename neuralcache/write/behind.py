"""Write-behind: a FUSE WRITE is answered once its bytes are handed to a worker thread,
not once they are in the staging file, so that the writer's next chunk (a serializer's
work: ``torch.save``) overlaps with this chunk's ``pwrite`` instead of waiting for it.

What keeps it exact (the rules write/layer.py relies on):

* A write waits for every write still in flight on the same file that it overlaps, so
  overlapping writes land in the order they were answered; disjoint ones (a sequential
  writer's) land in any order.
* Each write in flight holds its file's gate shared (write/files.py ``Gate``), so all
  that takes the gate exclusive (``close()``'s fsync and journal record, truncate, copy
  on write, ``neuralcache sync``) first waits for every write in flight.
* Reads of a file being written wait until nothing is in flight on it
  (read-after-write, from any descriptor).
* A write pwrites through its own duplicate of the staging file's descriptor, so
  closing the file's descriptor meanwhile (the file unlinked while open) can never
  send its bytes into another file that reuses the number.
* A write that finds the journal's disk full waits, holding its place, while uploads
  in flight can free space (``room``: write/layer.py ``_journal_room``) and lands
  then; only a write that nothing can make room for fails with ENOSPC.
* A write that fails to land (ENOSPC, EIO, EFBIG) marks its file: the file's next write,
  ``close()`` and ``fsync()`` fail with that error and its data is not journaled (the
  remote keeps the previous version) until a truncate cuts below the failed range
  (``O_TRUNC``, ``ftruncate``) or the file is unlinked.  Local disks report a failed
  writeback the same way, at the next ``fsync``/``close``.  ``close()`` remains the
  point where written data is acknowledged (docs/checkpoints.md).
"""
from __future__ import annotations

import collections
import itertools
import logging
import os
from typing import Awaitable, Callable

import trio

from ..errors import FileTooBig, JournalError, JournalFull
from .files import LocalFile, pwrite_all
from .journal import journal_error

log = logging.getLogger(__name__)

# Bytes answered but not yet in staging files, all files together: 16 FUSE writes of
# 1 MiB (the mount's max_write) -- enough for a writer never to wait on a healthy
# disk (a 1 MiB pwrite into the page cache takes ~0.3 ms), and a bound on the daemon's
# memory when the disk stalls.
MAX_BYTES = 16 << 20


def _pwrite_own(fd: int, data: bytes, offset: int, kick: bool) -> None:
    """pwrite_all through ``fd`` (a duplicate), then close it."""
    try:
        pwrite_all(fd, data, offset, kick)
    finally:
        try:
            os.close(fd)
        except OSError:
            pass


class WriteBehind:
    """The writes in flight of one mount (``LocalFile.inflight`` holds each file's)."""

    def __init__(self, disk: trio.CapacityLimiter, max_bytes: int = MAX_BYTES):
        self._disk = disk
        self.max_bytes = max_bytes
        self.bytes = 0             # answered, not yet landed
        self.failures = 0          # writes that did not land (read by stats)
        self.full_waits = 0        # times a write waited for journal space (stats)
        # async (lf) -> bool: the journal is full; True once space may have been freed
        # (try again), False if nothing pending can free it.  None: fail at once.
        self.room: Callable[[LocalFile], Awaitable[bool]] | None = None
        self._seq = itertools.count()
        self._lot = trio.lowlevel.ParkingLot()
        # staging name -> writes in flight holding a descriptor of it (``let_go``)
        self._holding: collections.Counter[str] = collections.Counter()
        self.nursery: trio.Nursery | None = None   # set by WriteLayer.run

    async def admit(self, lf: LocalFile, off: int, end: int) -> None:
        """Until ``[off, end)`` overlaps no write in flight on ``lf`` and there is room."""
        while (any(o < end and off < e for o, e in lf.inflight.values())
               or (self.bytes and self.bytes + end - off > self.max_bytes)):
            await self._lot.park()

    async def submit(self, lf: LocalFile, off: int, data: bytes, kick: bool,
                     landed: Callable[[LocalFile, int], None]) -> None:
        """Land ``data`` at ``off``: in the background once ``WriteLayer.run`` is
        running, else (tests without a daemon) before returning.  The caller holds
        ``lf``'s gate shared and passes that hold on: the landing releases it."""
        try:
            fd = os.dup(lf.fd)
        except OSError as exc:          # out of descriptors
            lf.gate.release_shared()
            raise journal_error(exc, "writing to the journal") from None
        token = next(self._seq)
        lf.inflight[token] = (off, off + len(data))
        self.bytes += len(data)
        staging = lf.staging      # the gate, held until it lands, keeps it the same
        self._holding[staging] += 1
        if self.nursery is not None:
            self.nursery.start_soon(self._land, lf, staging, token, fd, off, data, kick,
                                    landed)
        else:
            await self._land(lf, staging, token, fd, off, data, kick, landed)

    async def _land(self, lf: LocalFile, staging: str, token: int, fd: int, off: int,
                    data: bytes, kick: bool, landed: Callable[[LocalFile, int], None]
                    ) -> None:
        waited = False
        try:
            while True:
                try:
                    await trio.to_thread.run_sync(_pwrite_own, fd, data, off, kick,
                                                  limiter=self._disk)
                    break
                except JournalFull:
                    # the file's descriptor stays while this write holds the gate,
                    # unless the file was unlinked and closed (dropped: then there is
                    # no file to wait for), which can happen during the wait too
                    if self.room is None or lf.fd is None or not await self.room(lf) \
                            or lf.fd is None:
                        raise
                    if not waited:                   # counted once per write
                        self.full_waits += 1
                        waited = True
                    try:
                        fd = os.dup(lf.fd)        # _pwrite_own closed the last one
                    except OSError as exc:
                        raise journal_error(exc, "writing to the journal") from None
        except BaseException as exc:    # JournalError, FileTooBig (past the journal
            self.failures += 1          # filesystem's largest file); anything else (a
            known = isinstance(exc, (JournalError, FileTooBig))   # bug, the daemon
            if lf.error is None or off < lf.error_at:             # stopping) marks
                lf.error = exc if known else \
                    JournalError(f"{lf.key}: a write did not reach the journal")
                lf.error_at = off       # the file the same way
            if not isinstance(exc, Exception):
                raise                   # cancelled: the daemon is stopping
            if not known:               # a bug fails this file, never the daemon
                log.error("%s: a write did not reach the journal", lf.key, exc_info=exc)
            return
        finally:
            del lf.inflight[token]
            self.bytes -= len(data)
            self._holding[staging] -= 1
            if self._holding[staging] <= 0:
                del self._holding[staging]
            lf.gate.release_shared()
            self._lot.unpark_all()
        landed(lf, off)       # no await since the release: nothing ran in between

    async def drained(self, lf: LocalFile) -> None:
        """Until every write in flight on ``lf`` now has landed (later ones may still be
        in flight: a reader is not held up by a writer that keeps writing)."""
        if lf.inflight:
            mark = max(lf.inflight)
            while lf.inflight and min(lf.inflight) <= mark:
                await self._lot.park()

    async def let_go(self, staging: str) -> None:
        """Until no write in flight holds a descriptor of ``staging``.  Deleting a
        staging file frees its space only at its last close: CI's create right after
        the unlink of the file that filled the journal got ENOSPC while that file's
        writes still waited to land through their duplicates."""
        while self._holding.get(staging):
            await self._lot.park()

    @staticmethod
    def landed_upto(lf: LocalFile) -> int:
        """Bytes of ``lf`` from its start that are all in the staging file."""
        return min([lf.size] + [o for o, _ in lf.inflight.values()])

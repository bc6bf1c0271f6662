"""Uploads that start while a new file is still being written: once a file created
empty (create, or O_TRUNC) passes ``START_PARTS`` parts, a multipart upload begins
and the parts the writer has moved past are sent, ``STREAM_IN_FLIGHT`` at a time, so
that part of a checkpoint is on the remote by the time it is closed without taking
the cores its writer needs.

Only the publication is ordered: the parts are invisible until the upload completes,
and the put operation that completes it runs in queue order (opqueue.py) like any
other.  The stream hands its upload to that operation when the file is sealed; the
uploader then sends what is missing and completes it.

The bet is that writers go forward.  A write into a part already sent, a truncate, a
copy on write, a rename, an unlink or a discard kills the stream: its upload is
aborted and the file is uploaded after close as usual.  A stream's upload id is not
journaled: after a crash the file is uploaded again from the journal (README, limits).
"""
from __future__ import annotations

import logging
import os
import time

import trio

from ..backends.posix import pread_exact

log = logging.getLogger(__name__)

# A stream starts once a file holds this many parts: files up to one part go in one
# PUT anyway, and a file that stops just past one part gains little from streaming.
START_PARTS = 2
# Parts one stream sends at once while its file is still open; the rest go at the
# uploader's full width once the file is closed (uploader.py _multipart).  The writer,
# its FUSE requests and the parts' reads and HTTP share the node's cores: sending every
# part passed at once (up to the uploader's 16 requests) made a 1 GiB checkpoint's
# close() 1.73-2.80x local's close here; 2 at once 1.28-2.17x, 1 at once 1.22-1.59x,
# with the time until the remote held it the same (bench/RESULTS.md, thirteenth
# sitting: 15 runs of `python -m bench run --scenario checkpoint`).
STREAM_IN_FLIGHT = 1


class Stream:
    def __init__(self, key: str, staging: str, part: int):
        self.key, self.staging, self.part = key, staging, part
        self.upload_id: str | None = None
        self.tags: dict[int, str] = {}
        self.next = 1                 # next part number to send
        self.fed = 0                  # bytes landed (behind.py landed_upto) at the last feed
        self.inflight = 0
        self.dead = False
        self.handed_over = False
        self.idle = trio.Event()      # no part in flight (replaced when one starts)
        self.idle.set()
        self.ready = trio.Event()     # the upload was created (or could not be)

    @property
    def sent_upto(self) -> int:
        """Bytes [0, sent_upto) are sent or being sent: writes there kill the stream."""
        return (self.next - 1) * self.part

    def state(self, size: int) -> dict:
        """The uploader's multipart state for a file of ``size`` bytes."""
        return {"id": self.upload_id, "part": self.part, "size": size,
                "tags": dict(self.tags)}


class Streams:
    """Starts, feeds and kills streams; part uploads share the uploader's requests
    limiter and run in its nursery."""

    def __init__(self, uploader, journal):
        self.uploader = uploader
        self.journal = journal
        self.streamed_bytes = 0       # bytes sent while their file was being written
        self.started = 0
        self.killed = 0

    def start(self, key: str, staging: str, part: int) -> Stream | None:
        n = self.uploader.nursery
        if n is None:
            return None
        s = Stream(key, staging, part)
        n.start_soon(self._create, s)
        self.started += 1
        return s

    async def _create(self, s: Stream) -> None:
        try:
            s.upload_id = await trio.to_thread.run_sync(
                self.uploader.backend.create_multipart, s.key, limiter=self.uploader.requests)
        except Exception as exc:  # the file is uploaded after close instead
            log.info("streaming upload of %s not started: %s", s.key, exc)
            s.dead = True
        s.ready.set()
        if s.dead and s.upload_id is not None:
            await self.abort(s)

    def feed(self, s: Stream, size: int) -> None:
        """The file now holds ``size`` bytes: send the parts the writer has passed, up
        to STREAM_IN_FLIGHT at once (a part that finishes feeds the next)."""
        s.fed = size
        n = self.uploader.nursery
        while (not s.dead and not s.handed_over and n is not None
               and s.inflight < STREAM_IN_FLIGHT and s.fed >= s.next * s.part):
            if s.idle.is_set():
                s.idle = trio.Event()
            s.inflight += 1
            n.start_soon(self._send, s, s.next)
            s.next += 1

    async def _send(self, s: Stream, number: int) -> None:
        try:
            await s.ready.wait()
            if s.dead:
                return
            off = (number - 1) * s.part
            path = self.journal.staging_path(s.staging)

            def one() -> tuple[str, float]:
                t0 = time.monotonic()
                fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
                try:
                    data = pread_exact(fd, s.part, off)
                finally:
                    os.close(fd)
                tag = self.uploader.backend.upload_part(s.key, s.upload_id, number, off, data)
                return tag, time.monotonic() - t0

            tag, seconds = await trio.to_thread.run_sync(one, limiter=self.uploader.requests)
            if not s.dead:
                s.tags[number] = tag
                self.streamed_bytes += s.part
                self.uploader.observe(seconds)
        except Exception as exc:  # the uploader sends what is missing after close
            self.uploader.errors += 1
            log.info("streamed part %d of %s failed (sent again after close): %s",
                     number, s.key, exc)
        finally:
            s.inflight -= 1
            self.feed(s, s.fed)
            if s.inflight == 0:
                s.idle.set()

    def kill(self, s: Stream | None, why: str) -> None:
        """Stop a stream that the file no longer matches; abort its upload."""
        if s is None or s.dead or s.handed_over:
            return
        s.dead = True
        self.killed += 1
        log.debug("streaming upload of %s stopped: %s", s.key, why)
        if self.uploader.nursery is not None:
            self.uploader.nursery.start_soon(self.abort, s)

    async def abort(self, s: Stream) -> None:
        """Abort the stream's upload once nothing of it is in flight."""
        s.dead = True
        await s.ready.wait()
        await s.idle.wait()
        if s.upload_id is not None:
            await trio.to_thread.run_sync(self.uploader.backend.abort_multipart, s.key,
                                          s.upload_id)

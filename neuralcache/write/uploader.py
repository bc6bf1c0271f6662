"""Background uploads: runs the operation queue (opqueue.py) against the backend.

A put of a file up to ``PART_SIZE`` is one PUT; a larger one is a multipart upload
whose parts are read from the sealed staging file and sent in parallel, as many at
once as Little's law asks for.  A failed attempt keeps the parts already sent, and
the next attempt sends only the rest (an upload the remote forgot starts over).  A
move is a server-side copy then a delete of the source; a delete is one request.

Every attempt already retried transient errors inside the backend
(backends/retry.py); an attempt that still fails is tried again after a backoff,
forever: the data stays in the journal until it is uploaded or the user discards
it.  Barriers (opqueue.OpQueue.wait) decide when to give up waiting.

When an operation succeeds its "done" record is made durable before anyone is told
(so a staging file is deleted only once the journal no longer needs it).
"""
from __future__ import annotations

import collections
import logging
import math
import os
import time
from typing import Callable

import trio

from ..backends.base import FileWindow, ObjectInfo
from ..backends.posix import pread_exact
from ..errors import BackendError, NotFound, Unavailable
from .journal import Committer, Journal
from .opqueue import Op, OpQueue
from .stream import Stream, Streams

log = logging.getLogger(__name__)

MIB = 1 << 20
# Multipart part size: 8 MiB, the read side's block size (AWS guidance: 8-16 MB per
# request).  S3 wants at least 5 MiB for every part but the last and at most 10,000
# parts, so an object over 78 GiB gets parts of ceil(size / 10,000), rounded up to a
# MiB.  Files up to one part go in a single PUT.
PART_SIZE = 8 * MIB
MAX_PARTS = 10_000
# Requests in flight (parts, PUTs, copies, deletes), by Little's law as for reads
# (ahead/readahead.py, store/blocks.py): in flight = throughput x time per request.
# Throughput: 300 MB/s, the link rate the read side is sized for (blocks.py
# DEFAULT_CONCURRENCY).  Time per request: the shortest of the last PART_WINDOW parts,
# a part's time without queueing (the median grows with the queue when the link or
# the server is the bottleneck), DEFAULT_PART_SECONDS until measured: an 8 MiB part at
# ~60 MB/s per connection plus a 60 ms round trip is 0.2 s, so 300e6 x 0.2 / 8 MiB = 8
# parts in flight.  Bounds: 2 keeps one part sending while the next is read from disk;
# 16 is twice what the law gives for that link: where the server or the CPU is the
# bottleneck even the shortest part is slow, the law asks for more, and more only
# makes every part slower (1 GiB, local SeaweedFS, 2 shared cores: 35 s to finish
# after close with the median and up to 32 in flight, 4-7 s with this rule).
UPLOAD_TARGET_BPS = 300e6
DEFAULT_PART_SECONDS = 0.2
MIN_REQUESTS = 2
MAX_REQUESTS = 16
PART_WINDOW = 32
# Memory: the staged bytes uploads hold at once are at most UPLOAD_MEMORY, whatever the
# file's size.  A part of at most UPLOAD_MEMORY / MAX_REQUESTS (16 MiB) is read whole
# (one pread, the fast path; every part of a file up to 156 GiB), a larger one (S3's
# 10,000-part limit makes parts of up to 525 MiB for a 5 TiB object) is sent from the
# staging file through a FileWindow, 1 MiB at a time.  256 MiB is ~0.1-0.2% of a GPU
# node's memory; before this a truncate() to 6 TiB made 16 parts of 630 MiB in flight
# and grew the daemon to 17 GB.
UPLOAD_MEMORY = 256 * MIB
# Backoff between failed attempts of one operation: 1 s doubling to 30 s (an attempt
# itself takes ~3 s of backend retries), so a 20 s outage costs at most ~30 s more.
RETRY_BASE_S = 1.0
RETRY_MAX_S = 30.0


def part_size_for(size: int) -> int:
    return max(PART_SIZE, math.ceil(size / MAX_PARTS / MIB) * MIB)


def requests_for(part_seconds: float, part_size: int = PART_SIZE) -> int:
    """Little's law: requests in flight to move UPLOAD_TARGET_BPS."""
    n = math.ceil(UPLOAD_TARGET_BPS * part_seconds / part_size)
    return max(MIN_REQUESTS, min(MAX_REQUESTS, n))


def part_body(fd: int, length: int, offset: int) -> bytes | FileWindow:
    """A part's body: its bytes, or a window on the staging file for a large part."""
    if length > UPLOAD_MEMORY // MAX_REQUESTS:
        return FileWindow(fd, offset, length)
    return _pread_all(fd, length, offset)


def _pread_all(fd: int, length: int, offset: int) -> bytes:
    data = pread_exact(fd, length, offset)
    if len(data) != length:
        raise Unavailable(f"staging file shorter than expected ({len(data)} of {length})")
    return data


class Uploader:
    def __init__(self, backend, journal: Journal, committer: Committer, queue: OpQueue, *,
                 sealed: Callable[[str], bool],
                 on_done: Callable[[Op, ObjectInfo | None], None],
                 on_copied: Callable[[Op, ObjectInfo | None], None] | None = None):
        self.backend = backend
        self.journal = journal
        self.committer = committer
        self.queue = queue
        self.sealed = sealed
        self.on_done = on_done
        self.on_copied = on_copied    # a move's copy is done, its source not yet deleted
        self.requests = trio.CapacityLimiter(requests_for(DEFAULT_PART_SECONDS))
        self._part_seconds: collections.deque[float] = collections.deque(maxlen=PART_WINDOW)
        self._running = 0
        self.nursery: trio.Nursery | None = None
        self.streams = Streams(self, journal)   # uploads started while writing
        # counters (stats.json / metrics)
        self.uploaded_bytes = 0
        self.uploaded_files = 0
        self.errors = 0

    async def run(self, task_status=trio.TASK_STATUS_IGNORED) -> None:
        async with trio.open_nursery() as n:
            self.nursery = n
            task_status.started()
            while True:
                for op in self.queue.runnable(self.sealed):
                    if self._running >= MAX_REQUESTS:
                        break
                    op.running = True
                    self._running += 1
                    n.start_soon(self._run, op)
                await self.queue.changed(self.queue.next_retry())

    def abort_later(self, op: Op) -> None:
        """A cancelled upload's multipart upload (if any) is aborted in the background."""
        st, op.upload = op.upload, None
        if isinstance(st, Stream):
            if self.nursery is not None:
                self.nursery.start_soon(self.streams.abort, st)
        elif st is not None and self.nursery is not None:
            self.nursery.start_soon(trio.to_thread.run_sync, self.backend.abort_multipart,
                                     op.key, st["id"])

    # -- one operation ----------------------------------------------------------------
    async def _run(self, op: Op) -> None:
        try:
            try:
                info = await self._execute(op)
            finally:
                self._running -= 1
        except BackendError as exc:
            self._failed(op, exc)
            return
        except Exception as exc:  # a bug must not stop the other uploads
            log.exception("unexpected error in %s of %s", op.kind, op.key)
            self._failed(op, Unavailable(f"internal error: {type(exc).__name__}: {exc}"))
            return
        op.error, op.failures, op.failing_since = None, 0, None
        act = {"a": "done", "id": op.id}
        if info is not None:
            act["etag"] = info.version
        what = {"put": "uploaded", "move": "renamed", "delete": "deleted"}[op.kind]
        await self.committer.submit(what, [act]).durable.wait()
        op.result = info
        self.queue.finish(op)
        self.on_done(op, info)

    def _failed(self, op: Op, exc: BaseException) -> None:
        now = time.monotonic()
        op.running = False
        op.failures += 1
        op.error = exc
        op.failed_at = now
        if op.failing_since is None:
            op.failing_since = now
        delay = min(RETRY_MAX_S, RETRY_BASE_S * 2 ** (op.failures - 1))
        op.not_before = now + delay
        self.errors += 1
        log.warning("%s of %s failed (attempt %d): %s; trying again in %.0f s",
                    op.kind, op.key, op.failures, exc, delay)
        self.queue.notify()

    async def _execute(self, op: Op) -> ObjectInfo | None:
        if op.kind == "put":
            return await self._put(op)
        if op.kind == "move":
            return await self._move(op)
        await trio.to_thread.run_sync(self.backend.delete, op.key, limiter=self.requests)
        return None

    async def _put(self, op: Op) -> ObjectInfo:
        path = self.journal.staging_path(op.staging)

        def open_staging() -> tuple[int, int]:
            fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
            return fd, os.fstat(fd).st_size

        try:
            fd, size = await trio.to_thread.run_sync(open_staging)
        except FileNotFoundError:
            raise NotFound(f"staging file {op.staging} of {op.key} is missing from the "
                           "journal") from None
        except OSError as exc:
            raise Unavailable(f"cannot read staging file of {op.key}: {exc}") from None
        try:
            if size <= PART_SIZE:
                if isinstance(op.upload, Stream):     # truncated since: not needed
                    self.abort_later(op)

                def single() -> ObjectInfo:
                    t0 = time.monotonic()
                    info = self.backend.put(op.key, _pread_all(fd, size, 0))
                    if size > PART_SIZE // 2:
                        self.observe(time.monotonic() - t0)
                    return info

                info = await trio.to_thread.run_sync(single, limiter=self.requests)
            else:
                info = await self._multipart(op, fd, size)
        finally:
            os.close(fd)
        self.uploaded_bytes += size
        self.uploaded_files += 1
        return info

    async def _multipart(self, op: Op, fd: int, size: int) -> ObjectInfo:
        part = part_size_for(size)
        st = op.upload
        if isinstance(st, Stream):       # started while the file was written
            stream = st
            await stream.ready.wait()
            await stream.idle.wait()
            st = op.upload = stream.state(size) if stream.upload_id else None
            if st is not None and st["part"] != part:
                await self.streams.abort(stream)
                st = op.upload = None
        if not st or st["part"] != part or st["size"] != size:
            upload_id = await trio.to_thread.run_sync(self.backend.create_multipart, op.key,
                                                      limiter=self.requests)
            st = op.upload = {"id": upload_id, "part": part, "size": size, "tags": {}}
        first_error: list[BaseException] = []

        async def send(number: int, nursery: trio.Nursery) -> None:
            off = (number - 1) * part
            length = min(part, size - off)

            def one() -> tuple[str, float]:
                t0 = time.monotonic()
                tag = self.backend.upload_part(op.key, st["id"], number, off,
                                               part_body(fd, length, off))
                return tag, time.monotonic() - t0

            try:
                tag, seconds = await trio.to_thread.run_sync(one, limiter=self.requests)
            except Exception as exc:
                if not first_error:
                    first_error.append(exc if isinstance(exc, BackendError)
                                       else Unavailable(f"part {number} of {op.key}: {exc}"))
                nursery.cancel_scope.cancel()
                return
            st["tags"][number] = tag
            if length == part:
                self.observe(seconds)

        async with trio.open_nursery() as nursery:
            for number in range(1, math.ceil(size / part) + 1):
                if number not in st["tags"]:
                    nursery.start_soon(send, number, nursery)
        try:
            if first_error:
                raise first_error[0]
            info = await trio.to_thread.run_sync(
                self.backend.complete_multipart, op.key, st["id"],
                sorted(st["tags"].items()), size, limiter=self.requests)
        except NotFound:
            op.upload = None      # the remote forgot the upload: start over next time
            raise
        op.upload = None
        return info

    async def _move(self, op: Op) -> ObjectInfo | None:
        try:
            info = await trio.to_thread.run_sync(self.backend.copy, op.src, op.key,
                                                 limiter=self.requests)
        except NotFound:
            # Replayed after a crash that came after the copy and the delete, or the
            # source was removed behind our back: the destination says which.
            try:
                info = await trio.to_thread.run_sync(self.backend.stat, op.key,
                                                     limiter=self.requests)
            except NotFound:
                log.warning("rename of %s to %s: neither exists on the remote; nothing "
                            "to rename", op.src, op.key)
                return None
        if self.on_copied is not None:     # readers switch to the copy before the delete
            self.on_copied(op, info)
        await trio.to_thread.run_sync(self.backend.delete, op.src, limiter=self.requests)
        return info

    def observe(self, seconds: float) -> None:
        self._part_seconds.append(seconds)
        self.requests.total_tokens = requests_for(min(self._part_seconds))

    def stats(self) -> dict:
        return {"uploaded_bytes": self.uploaded_bytes,
                "uploaded_files": self.uploaded_files,
                "upload_errors": self.errors,
                "upload_streamed_bytes": self.streams.streamed_bytes,
                "upload_requests_limit": self.requests.total_tokens,
                "upload_requests_in_flight": self.requests.borrowed_tokens}

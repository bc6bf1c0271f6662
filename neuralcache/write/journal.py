"""The write journal: where written data lives until the remote has it.

Layout under the mount's cache sub-directory (``daemon.cache_subdir``), next to the
read cache's ``blocks/`` and never touched by its eviction::

    journal/staging/<name>   one file per version of a file being written
    journal/intent.log       append-only intent log: JSON lines, fsynced
    journal/log.reserve      LOG_RESERVE_BYTES kept for the log on a full disk

Each line is ``{"rec": {...}, "xxh": "<xxh64 of rec>"}`` where rec is
``{"t": <unix time>, "what": "<why>", "acts": [...]}``.  The acts of one record are
one unit (a rename of a pending file cancels its upload and queues another in one
line).  Acts::

    {"a": "put", "id": 7, "key": "ckpt/x.pt", "staging": "5f3a..", "size": 1234}
        file X (staging S) closed with size N: pending upload
    {"a": "move", "id": 8, "src": "a", "dst": "b"}   an uploaded object renamed:
        copy on the remote, then delete the source
    {"a": "delete", "id": 9, "key": "a"}              unlinked: delete on the remote
    {"a": "done", "id": 7, "etag": ".."}              the remote has it
    {"a": "cancel", "id": 7}                          superseded before it ran
    {"a": "discard", "id": 7}                         dropped by the user (sync --discard)

Replay keeps every put/move/delete without a later done/cancel/discard, in id order
(ids are given out in the order the operations happened, and the committer writes
records in that order).  A line whose checksum fails is skipped: at the end of the
file it is a torn write that was never acknowledged; elsewhere it is logged.

``Journal`` is blocking and thread-safe (callers run it in worker threads);
``Committer`` is the one trio task that writes the log, batching the records that
arrive while a write+fsync is in flight into the next one (group commit).
"""
from __future__ import annotations

import errno
import json
import logging
import os
import threading
import time
import uuid
from typing import Callable

import trio
import xxhash

from ..backends.posix import fsync_dir, fsync_up
from ..errors import FileTooBig, JournalError, JournalFull

log = logging.getLogger(__name__)

JOURNAL_DIR = "journal"
STAGING_DIR = "staging"
LOG_NAME = "intent.log"
# Acts that queue a remote operation, and acts that end one.
OP_ACTS = ("put", "move", "delete")
END_ACTS = ("done", "cancel", "discard")
# The log is rewritten with only the pending operations once it is this large and
# they would take less than half of it: 16 MiB is ~100k records, read at mount in
# well under a second.
COMPACT_BYTES = 16 << 20
# Disk space set aside for the intent log (a preallocated file, given up when an
# append finds the disk full and made again once a staging file is deleted): on a disk
# that written data filled, the "done" record an upload must write before it deletes
# its staging file still lands, so waiting writers get that space back (layer.py
# ``_journal_room``).  A record is ~200 bytes: 4 MiB is ~20,000 records.
LOG_RESERVE_BYTES = 4 << 20
RESERVE_NAME = "log.reserve"
# After a failed log write the committer tries again this often; the records stay
# queued, in order, and the operations they describe do not start until written.
RETRY_S = 1.0


def _encode(rec: dict) -> bytes:
    body = json.dumps(rec, separators=(",", ":"), sort_keys=True, ensure_ascii=False)
    line = '{"rec":' + body + ',"xxh":"' + xxhash.xxh64_hexdigest(body.encode()) + '"}\n'
    return line.encode()


def _decode(line: bytes) -> dict | None:
    try:
        doc = json.loads(line)
        rec = doc["rec"]
        body = json.dumps(rec, separators=(",", ":"), sort_keys=True, ensure_ascii=False)
        if xxhash.xxh64_hexdigest(body.encode()) != doc["xxh"]:
            return None
        if not isinstance(rec.get("acts"), list):
            return None
        return rec
    except (ValueError, KeyError, TypeError, AttributeError):
        return None


def journal_error(exc: OSError, what: str) -> JournalError:
    if exc.errno in (errno.ENOSPC, errno.EDQUOT):
        return JournalFull(f"{what}: no space left for the write journal")
    if exc.errno == errno.EFBIG:
        return FileTooBig(f"{what}: larger than the journal's filesystem allows")
    return JournalError(f"{what}: {exc.strerror or exc}")


class Journal:
    def __init__(self, root: str):
        self.root = root
        self.staging_dir = os.path.join(root, STAGING_DIR)
        self.log_path = os.path.join(root, LOG_NAME)
        self._lock = threading.Lock()
        self._fd: int | None = None
        self._good = 0          # bytes of the log known to be whole lines
        self._torn = False      # a failed write may have left a partial line
        self.reserve_path = os.path.join(root, RESERVE_NAME)
        self._reserved = False  # the reserve file is in place
        self.last_id = 0

    # -- start-up ------------------------------------------------------------------
    def open(self) -> list[dict]:
        """Create the directories, read the log; the pending operation acts in order."""
        os.makedirs(self.staging_dir, mode=0o700, exist_ok=True)
        pending = self._replay()
        created = not os.path.exists(self.log_path)
        self._fd = os.open(self.log_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC,
                           0o600)
        if created:   # the entries of the log, its directories and --cache-dir itself
            fsync_dir(self.staging_dir)
            fsync_up(self.root)
        self._good = os.fstat(self._fd).st_size
        self._torn = self._good > 0 and not self._ends_with_newline()
        self.keep_reserve()
        return pending

    def keep_reserve(self) -> None:
        """Put the log's reserve back if it was given up (blocking); quietly nothing if
        the disk has no room for it yet."""
        if self._reserved:
            return
        tmp = self.reserve_path + ".tmp"
        with self._lock:               # deletions call this from several threads
            if self._reserved:
                return
            try:
                fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC,
                             0o600)
                try:
                    os.posix_fallocate(fd, 0, LOG_RESERVE_BYTES)
                finally:
                    os.close(fd)
                os.replace(tmp, self.reserve_path)
                self._reserved = True
            except OSError:
                try:
                    os.unlink(tmp)
                except OSError:
                    pass

    def _give_up_reserve(self) -> bool:
        """The disk is full: free the reserve for the log.  False if there was none."""
        if not self._reserved:
            return False
        self._reserved = False
        try:
            os.unlink(self.reserve_path)
        except FileNotFoundError:
            pass
        log.warning("journal: the disk is full; the intent log uses its %d MiB reserve",
                    LOG_RESERVE_BYTES >> 20)
        return True

    def _ends_with_newline(self) -> bool:
        with open(self.log_path, "rb") as f:
            f.seek(-1, os.SEEK_END)
            return f.read(1) == b"\n"

    def _replay(self) -> list[dict]:
        try:
            with open(self.log_path, "rb") as f:
                data = f.read()
        except FileNotFoundError:
            return []
        ops: dict[int, dict] = {}
        lines = data.split(b"\n")
        for i, line in enumerate(lines):
            if not line.strip():
                continue
            rec = _decode(line)
            if rec is None:
                if i == len(lines) - 1:
                    log.info("journal: ignoring a torn last record (never acknowledged)")
                else:
                    log.error("journal: skipping a damaged record at line %d of %s", i + 1,
                              self.log_path)
                continue
            for act in rec["acts"]:
                a, op_id = act.get("a"), act.get("id")
                if not isinstance(op_id, int):
                    continue
                self.last_id = max(self.last_id, op_id)
                if a in OP_ACTS:
                    ops[op_id] = act
                elif a in END_ACTS:
                    ops.pop(op_id, None)
        return [ops[i] for i in sorted(ops)]

    # -- the log ---------------------------------------------------------------------
    def append(self, recs: list[dict]) -> None:
        """Write ``recs`` and fsync (blocking).  On failure the log is cut back to its
        last whole line (or the next write starts on a new line) and JournalError /
        JournalFull is raised."""
        data = b"".join(_encode(r) for r in recs)
        with self._lock:
            assert self._fd is not None, "journal not open"
            while True:
                line = b"\n" + data if self._torn else data
                try:
                    view = memoryview(line)
                    while view:
                        view = view[os.write(self._fd, view):]
                    os.fsync(self._fd)
                    break
                except OSError as exc:
                    try:
                        os.ftruncate(self._fd, self._good)
                        self._torn = False
                    except OSError:
                        self._torn = True
                    if exc.errno in (errno.ENOSPC, errno.EDQUOT) and self._give_up_reserve():
                        continue
                    raise journal_error(exc, "writing the intent log") from None
            self._good += len(line)
            self._torn = False

    def size(self) -> int:
        return self._good

    def compact(self, pending: list[dict]) -> None:
        """Rewrite the log as one record of the ``pending`` operation acts (blocking):
        a temp file, fsync, rename over the log, fsync the directory."""
        tmp = self.log_path + ".tmp"
        with self._lock:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
            try:
                data = _encode({"t": time.time(), "what": "compact", "acts": pending}) \
                    if pending else b""
                view = memoryview(data)
                while view:
                    view = view[os.write(fd, view):]
                os.fsync(fd)
            finally:
                os.close(fd)
            os.replace(tmp, self.log_path)
            fsync_dir(self.root)
            if self._fd is not None:
                os.close(self._fd)
            self._fd = os.open(self.log_path, os.O_WRONLY | os.O_APPEND | os.O_CLOEXEC)
            self._good = len(data)
            self._torn = False

    def close(self) -> None:
        with self._lock:
            if self._fd is not None:
                os.close(self._fd)
                self._fd = None

    # -- staging files ---------------------------------------------------------------
    def create_staging(self) -> tuple[str, int]:
        """A new empty staging file: (name, descriptor open read-write)."""
        name = uuid.uuid4().hex
        try:
            fd = os.open(self.staging_path(name),
                         os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
        except OSError as exc:
            raise journal_error(exc, "creating a staging file") from None
        return name, fd

    def staging_path(self, name: str) -> str:
        return os.path.join(self.staging_dir, name)

    def remove_staging(self, name: str) -> None:
        try:
            os.unlink(self.staging_path(name))
        except FileNotFoundError:
            pass
        except OSError as exc:
            log.warning("journal: cannot remove staging file %s: %s", name, exc)
        self.keep_reserve()

    def sync_staging_dir(self) -> None:
        try:
            fsync_dir(self.staging_dir)
        except OSError as exc:
            raise journal_error(exc, "syncing the staging directory") from None

    def staging_names(self) -> list[str]:
        return [n for n in os.listdir(self.staging_dir) if not n.startswith(".")]

    def staging_bytes(self) -> int:
        total = 0
        for n in self.staging_names():
            try:
                total += os.stat(self.staging_path(n)).st_blocks * 512
            except OSError:
                pass
        return total

    def free_bytes(self) -> tuple[int, int]:
        """(total, available) bytes of the filesystem holding the journal."""
        st = os.statvfs(self.root)
        return st.f_blocks * st.f_frsize, st.f_bavail * st.f_frsize


class Pending:
    """One submitted record: ``settled`` fires when it is written or its first write
    failed (``error``); ``durable`` only once it is written."""

    __slots__ = ("rec", "settled", "durable", "error", "on_durable")

    def __init__(self, rec: dict, on_durable: Callable[[], None] | None):
        self.rec = rec
        self.settled = trio.Event()
        self.durable = trio.Event()
        self.error: JournalError | None = None
        self.on_durable = on_durable

    async def wait(self) -> None:
        """Until written; raises the first write's error (the record stays queued and
        is written later, but its caller is told it failed)."""
        await self.settled.wait()
        if self.error is not None and not self.durable.is_set():
            raise self.error


class Committer:
    """The one writer of the intent log (group commit, records in submit order)."""

    def __init__(self, journal: Journal, pending_acts: Callable[[], list[dict]],
                 limiter: trio.CapacityLimiter | None = None):
        self.journal = journal
        self._pending_acts = pending_acts
        self._limiter = limiter
        self._queue: list[Pending] = []
        self._wake = trio.Event()
        self.write_errors = 0
        self.records = 0

    def submit(self, what: str, acts: list[dict],
               on_durable: Callable[[], None] | None = None) -> Pending:
        """Queue a record now (its place in the log is fixed here)."""
        p = Pending({"t": round(time.time(), 3), "what": what, "acts": acts}, on_durable)
        self._queue.append(p)
        self._wake.set()
        return p

    async def commit(self, what: str, acts: list[dict],
                     on_durable: Callable[[], None] | None = None) -> None:
        await self.submit(what, acts, on_durable).wait()

    def queued(self) -> int:
        return len(self._queue)

    async def run(self, task_status=trio.TASK_STATUS_IGNORED) -> None:
        task_status.started()
        while True:
            if not self._queue:
                await self._wake.wait()
                self._wake = trio.Event()
                continue
            batch = list(self._queue)
            try:
                await trio.to_thread.run_sync(self.journal.append, [p.rec for p in batch],
                                              limiter=self._limiter)
            except JournalError as exc:
                self.write_errors += 1
                log.warning("journal: %s (%d records wait; retrying)", exc, len(batch))
                for p in batch:
                    if not p.settled.is_set():
                        p.error = exc
                        p.settled.set()
                await trio.sleep(RETRY_S)
                continue
            del self._queue[:len(batch)]
            self.records += len(batch)
            for p in batch:
                p.durable.set()
                p.settled.set()
                if p.on_durable is not None:
                    p.on_durable()
            await self._maybe_compact()

    async def _maybe_compact(self) -> None:
        j = self.journal
        if j.size() < COMPACT_BYTES or self._queue:
            return
        acts = self._pending_acts()
        if len(_encode({"t": 0, "what": "compact", "acts": acts})) * 2 > j.size():
            return
        try:
            await trio.to_thread.run_sync(j.compact, acts, limiter=self._limiter)
            log.info("journal: compacted the intent log to %d pending operations", len(acts))
        except OSError as exc:
            log.warning("journal: compaction failed (%s); the log keeps growing", exc)

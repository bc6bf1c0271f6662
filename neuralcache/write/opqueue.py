"""The queue of remote operations a writable mount owes the remote: uploads (put),
renames of uploaded objects (move = copy + delete) and deletes.

Order: operations run in the order they happened (their ids), except that two that
touch unrelated keys may run at the same time.  Keys are related when equal or when
one is a directory of the other ("a" and "a/b": on a POSIX source the file "a" must
be gone before the directory "a" can be made).  An operation starts only once the
journal record that queued it is durable, and an upload only once its staging file
is sealed (no writer can change it any more).

A delete of a file unlinked while open for reading here is held until its last
reader closes (``Op.hold``), as NFS keeps such a file under a hidden name: the remote
still has the bytes those readers have not read yet.  The intent is journaled at
unlink as any other, so an unmount or, after a crash, the next mount runs it; so does
any later operation on a related key (a new file of that name: its upload comes after
the delete).  A barrier (fsync, `neuralcache sync`, the one before unmount) does not
wait for it: it is as durable as the journal, and running it would take the bytes
from under the readers (review: `neuralcache umount` refused as busy had deleted them).

Pure bookkeeping on the trio thread; the uploader (uploader.py) runs operations.
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Callable, Iterable, Iterator

import trio

from ..backends.base import ObjectInfo
from ..errors import NotFound, PermissionDenied, Unavailable

# A barrier (fsync, `neuralcache sync`, --sync-close) gives up on an operation that has
# kept failing for this long with a transient error (the remote is down): the same
# bound as a demand read (store/blocks.py DEMAND_DEADLINE_S), so a caller learns about
# an outage in half a minute instead of hanging.  The operation itself keeps retrying.
BARRIER_GIVE_UP_S = 30.0
# Permanent errors (access denied, bucket gone) fail a barrier at once.
PERMANENT = (PermissionDenied, NotFound)


@dataclass(eq=False)
class Op:
    id: int
    kind: str                     # "put" | "move" | "delete"
    key: str                      # what it creates or deletes (a move's destination)
    src: str | None = None        # a move's source
    staging: str | None = None    # a put's staging file
    size: int = 0                 # a put's bytes
    queued_at: float = field(default_factory=time.time)
    durable: bool = False         # its journal record is written
    running: bool = False
    finished: bool = False        # done (or cancelled / discarded)
    failures: int = 0             # failed attempts in a row
    failing_since: float | None = None   # time.monotonic() of the first of them
    failed_at: float = 0.0        # time.monotonic() of the last failure
    error: BaseException | None = None
    not_before: float = 0.0       # time.monotonic() of the next attempt
    discard: bool = False         # the user dropped it while it was running
    upload: object = None         # multipart state kept between attempts (uploader)
    result: ObjectInfo | None = None
    hold: int | None = None       # a delete: the inode whose open readers hold it back

    @property
    def keys(self) -> tuple[str, ...]:
        return (self.key,) if self.src is None else (self.src, self.key)

    def act(self) -> dict:
        """The journal act that queues this operation."""
        if self.kind == "put":
            return {"a": "put", "id": self.id, "key": self.key, "staging": self.staging,
                    "size": self.size}
        if self.kind == "move":
            return {"a": "move", "id": self.id, "src": self.src, "dst": self.key}
        return {"a": "delete", "id": self.id, "key": self.key}

    def stuck(self, since: float, now: float | None = None) -> BaseException | None:
        """The error a barrier that began at ``since`` should give up with: from an
        attempt made after it began, and permanent or failing for BARRIER_GIVE_UP_S."""
        if self.error is None or self.failing_since is None or self.failed_at < since:
            return None
        now = time.monotonic() if now is None else now
        if isinstance(self.error, PERMANENT) or now - self.failing_since >= BARRIER_GIVE_UP_S:
            return self.error
        return None


def op_from_act(act: dict) -> Op:
    a = act["a"]
    if a == "put":
        return Op(act["id"], "put", act["key"], staging=act["staging"],
                  size=int(act.get("size", 0)), durable=True)
    if a == "move":
        return Op(act["id"], "move", act["dst"], src=act["src"], durable=True)
    return Op(act["id"], "delete", act["key"], durable=True)


def ancestors(key: str) -> Iterator[str]:
    while "/" in key:
        key = key.rpartition("/")[0]
        yield key


def related(a: str, b: str) -> bool:
    """Equal, or one is a directory of the other (the module docstring's order)."""
    return under(a, b) or under(b, a)


def under(key: str, prefix: str) -> bool:
    """``key`` is ``prefix`` or inside the directory ``prefix`` ("" is the root)."""
    return not prefix or key == prefix or key.startswith(prefix + "/")


class OpQueue:
    def __init__(self, last_id: int = 0):
        self.ops: dict[int, Op] = {}       # unfinished, in id order
        self._next = last_id + 1
        self._changed = trio.Event()
        self._held: dict[int, Op] = {}     # deletes held for readers (module docstring)
        # open read-only descriptors of an inode (fs/operations.py sets it)
        self.reading: Callable[[int], int] = lambda inode: 0

    # -- building ------------------------------------------------------------------
    def new(self, kind: str, key: str, **kw) -> Op:
        op = Op(self._next, kind, key, **kw)
        self._next += 1
        for held in list(self._held.values()):     # a later operation goes after it
            if any(related(k, held.key) for k in op.keys):
                self.unhold(held)
        self.ops[op.id] = op
        if op.hold is not None:
            self._held[op.id] = op
        return op

    def unhold(self, op: Op) -> None:
        """``op`` may run now (if it was held for readers); its age counts from now
        (upload_oldest_pending_s: the time it was held is not lateness)."""
        if self._held.pop(op.id, None) is not None:
            op.hold = None
            op.queued_at = time.time()
            self.notify()

    def unhold_all(self) -> None:
        for op in list(self._held.values()):
            self.unhold(op)

    def readers_closed(self, inode: int) -> None:
        """A reader of ``inode`` closed: if it was the last, its held delete may run."""
        if self.reading(inode):
            return
        for op in list(self._held.values()):
            if op.hold == inode:
                self.unhold(op)

    def _holding(self, op: Op) -> bool:
        if op.hold is None:
            return False
        if self.reading(op.hold):
            return True
        self.unhold(op)
        return False

    def restore(self, acts: Iterable[dict], last_id: int) -> None:
        """Pending operations replayed from the journal; new ids follow ``last_id``."""
        for act in acts:
            op = op_from_act(act)
            self.ops[op.id] = op
        self._next = max([self._next, last_id + 1] + [op.id + 1 for op in self.ops.values()])

    def finish(self, op: Op) -> None:
        op.finished = True
        op.running = False
        self.ops.pop(op.id, None)
        self._held.pop(op.id, None)
        self.notify()

    def notify(self) -> None:
        """Something changed: wake the uploader and every barrier."""
        self._changed.set()
        self._changed = trio.Event()

    async def changed(self, deadline: float = math.inf) -> None:
        """Until the next notify() or ``deadline`` (a time.monotonic() value: trio's own
        clock has another origin, so the wait is made relative here)."""
        with trio.move_on_after(max(0.0, deadline - time.monotonic())):
            await self._changed.wait()

    # -- queries -------------------------------------------------------------------
    def runnable(self, sealed: Callable[[str], bool]) -> Iterator[Op]:
        """Operations that may start now, in order (see the module docstring)."""
        now = time.monotonic()
        busy: set[str] = set()       # keys of earlier unfinished operations
        busy_dirs: set[str] = set()  # their directories
        for op in list(self.ops.values()):
            keys = op.keys
            clash = any(k in busy or k in busy_dirs or any(a in busy for a in ancestors(k))
                        for k in keys)
            if (not clash and not op.running and op.durable and now >= op.not_before
                    and (op.kind != "put" or sealed(op.staging)) and not self._holding(op)):
                yield op
            busy.update(keys)
            for k in keys:
                busy_dirs.update(ancestors(k))

    def next_retry(self) -> float:
        waiting = [op.not_before for op in self.ops.values() if not op.running
                   and op.not_before > time.monotonic()]
        return min(waiting, default=math.inf)

    def ops_on(self, key: str) -> list[Op]:
        """Unfinished operations that read or write exactly ``key``."""
        return [op for op in self.ops.values() if key in op.keys]

    def remote_bound(self, key: str) -> bool:
        """Some unfinished operation will write or delete exactly ``key`` on the remote:
        the remote may hold it, or will (a delete held for an unlinked file's readers
        is that file's, not a copy of a new file of that name: review)."""
        return any(op.hold is None for op in self.ops_on(key))

    def last_on(self, key: str) -> Op | None:
        for op in reversed(list(self.ops.values())):
            if key in op.keys:
                return op
        return None

    def puts_of(self, staging: str) -> list[Op]:
        return [op for op in self.ops.values() if op.kind == "put" and op.staging == staging]

    def touching(self, prefix: str) -> list[Op]:
        """Unfinished operations on ``prefix`` or anything under it."""
        return [op for op in self.ops.values() if any(under(k, prefix) for k in op.keys)]

    def stats(self) -> dict:
        puts = [op for op in self.ops.values() if op.kind == "put"]
        # a delete held for its readers is not late: it waits for them by design
        oldest = min((op.queued_at for op in self.ops.values() if op.hold is None),
                     default=None)
        return {"upload_pending_bytes": sum(op.size for op in puts),
                "upload_pending_files": len(puts),
                "upload_pending_ops": len(self.ops),
                "upload_held_deletes": len(self._held),
                "upload_oldest_pending_s": round(time.time() - oldest, 3) if oldest else 0.0,
                "upload_failing_ops": sum(1 for op in self.ops.values() if op.error)}

    # -- barriers ------------------------------------------------------------------
    async def wait(self, ops: Iterable[Op]) -> None:
        """Until every one of ``ops`` is finished but deletes held for readers (the
        module docstring); raises the error of one that is stuck (BARRIER_GIVE_UP_S, or
        a permanent error).  Operations waiting for a retry are tried again now: the
        remote may have been fixed meanwhile."""
        since = time.monotonic()
        waiting = [op for op in ops if not op.finished and op.hold is None]
        for op in waiting:
            if op.error is not None and not op.running:
                op.not_before = since
        if waiting:
            self.notify()
        while waiting:
            for op in waiting:
                err = op.stuck(since)
                if err is not None:
                    raise _for_caller(op, err)
            retry_in = min((op.failing_since + BARRIER_GIVE_UP_S for op in waiting
                            if op.failing_since is not None), default=math.inf)
            await self.changed(retry_in)
            waiting = [op for op in waiting if not op.finished]


def _for_caller(op: Op, err: BaseException) -> BaseException:
    what = {"put": f"upload of {op.key}", "move": f"rename of {op.src} to {op.key}",
            "delete": f"delete of {op.key}"}[op.kind]
    return Unavailable(f"{what} failed {op.failures} times: {err}")

"""The journal's records and staging files of a writable mount (a mix-in of
layer.WriteLayer): cancelling uploads a newer change supersedes, committing a change's
acts to the intent log, deleting a staging file once nothing needs it, and what an
upload that finished changes.
"""
from __future__ import annotations

import math
import time

import trio

from ..backends.base import ObjectInfo
from .opqueue import Op

# How long a write that found the journal's disk full waits for the uploads in flight
# to delete a staging file before it fails with ENOSPC.  A pending upload of 1 GiB over
# the 60 ms link takes ~10 s (bench checkpoint scenario), so 60 s lets several finish;
# a remote that is down retries for ever, and the writer gets its ENOSPC after this.
JOURNAL_FULL_STALL_S = 60.0
# A file unlinked while open frees its staging file only when its last descriptor
# closes, and close() returns before the kernel's RELEASE reaches the daemon: right
# after ``close(); unlink()`` that RELEASE may still be on its way (milliseconds).  A
# write that found the journal full waits this long for such a file; one that a
# program keeps open frees nothing until it closes, so the write then fails after
# this, not after JOURNAL_FULL_STALL_S.
UNLINKED_RELEASE_WAIT_S = 2.0
# A deleted staging file's space can come back a little after its unlink returned
# (seen here on tmpfs, kernel 6.18: 40 ms, no descriptor of it open anywhere; the
# disk-full tests' CI failures).  A write that still finds the disk full right after a
# deletion tries again every FREED_POLL_S for FREED_LAG_S before it gives up.
FREED_LAG_S = 1.0
FREED_POLL_S = 0.02


class Records:
    def _cancel_tail_puts(self, key: str) -> list[Op]:
        """Cancel uploads to ``key`` that have not started and that nothing after them
        needs (a newer version, a rename or an unlink supersedes them); newest first.
        Their staging files stay until the cancel record is durable (``_commit``)."""
        cancelled = []
        while (op := self.queue.last_on(key)) is not None and op.kind == "put" \
                and op.key == key and not op.running:
            self.queue.finish(op)
            self.uploader.abort_later(op)
            self._cancelling[op.staging] += 1
            cancelled.append(op)
        return cancelled

    async def _commit(self, what: str, acts: list[dict], new_ops: list[Op],
                      released: list[str], **info) -> None:
        if not acts:
            return

        def durable() -> None:
            for op in new_ops:
                op.durable = True
            for name in released:
                self._cancelling[name] -= 1
                if self._cancelling[name] <= 0:
                    del self._cancelling[name]
                self._release_staging(name)
            self.queue.notify()

        p = self.committer.submit(what, acts, durable)
        p.rec.update(info)
        await p.wait()

    def _release_staging(self, name: str) -> None:
        """Delete a staging file once nothing needs it (no file's current data, no
        upload, no cancel record still to be written)."""
        if name in self._current or name in self._cancelling or self.queue.puts_of(name):
            return
        if self._nursery is not None:
            done = trio.Event()
            self._removals.add(done)
            self._nursery.start_soon(self._remove_staging, name, done)

    async def _remove_staging(self, name: str, done: trio.Event) -> None:
        try:
            await self.behind.let_go(name)
            await trio.to_thread.run_sync(self.journal.remove_staging, name)
        finally:
            self._freed_at = trio.current_time()
            self._removals.discard(done)
            done.set()
            freed, self._freed = self._freed, trio.Event()
            freed.set()

    async def _journal_room(self, lf) -> bool:
        """A write to ``lf`` found the journal's disk full (write/behind.py): wait for
        the next staging file to be deleted while something can still free one (a
        deletion under way, an upload of another, sealed file: each deletes its
        staging file when it ends; for FREED_LAG_S after a deletion, whose space may
        come back late; or, for UNLINKED_RELEASE_WAIT_S, another file unlinked while
        open, whose RELEASE may still be on its way; first, readers give up the
        deleted staging files they hold: readers.py ``_let_readers_go``).  False, and
        the write fails with ENOSPC, when nothing can, when ``lf`` itself was dropped,
        or when none is deleted for JOURNAL_FULL_STALL_S (the remote down: the uploads
        retry forever)."""
        async def first(wait, scope: trio.CancelScope) -> None:
            await wait()
            scope.cancel()

        if self._let_readers_go():        # readers held deleted staging files
            self._freed_at = trio.current_time()
        late = trio.current_time() + UNLINKED_RELEASE_WAIT_S
        with trio.move_on_after(JOURNAL_FULL_STALL_S):
            while True:
                if lf.fd is None:                 # the file is gone: nothing to land
                    return False
                if trio.current_time() < self._freed_at + FREED_LAG_S:
                    await trio.sleep(FREED_POLL_S)      # its space may still come back
                    return lf.fd is not None
                if self._removals or any(
                        op.kind == "put" and op.staging != lf.staging
                        and self._sealed(op.staging) for op in self.queue.ops.values()):
                    until = math.inf
                elif trio.current_time() < late and any(
                        f.unlinked and f is not lf for f in self._current.values()):
                    until = late
                else:
                    return False
                freed = self._freed
                with trio.move_on_at(until):
                    async with trio.open_nursery() as n:  # a deletion, or the queue moved
                        n.start_soon(first, freed.wait, n.cancel_scope)
                        n.start_soon(first, self.queue.changed, n.cancel_scope)
                if freed.is_set():
                    return lf.fd is not None
        return False

    async def staging_removed(self) -> None:
        """Until the staging files released so far are deleted (not those released
        while it waits).  An unlink or a rename over a file returns only then, so the
        space it frees is free when the call returns, as on a local disk (CI: a create
        right after the unlink of the file that filled the journal got ENOSPC while the
        deletion was still queued)."""
        for done in list(self._removals):
            await done.wait()

    def _on_done(self, op: Op, info: ObjectInfo | None) -> None:
        """The uploader finished ``op`` (its done record is durable)."""
        self._recent.append((time.monotonic(), op))
        if op.kind == "put":
            if info is not None:
                # The remote now holds an object at op.key, whichever version of the
                # file there it was: an older one (copied on write since) too, so an
                # unlink or a rename over it must delete it (fsmodel seed 8).
                node = self.ns.by_path(op.key)
                held = self.files.get(node.inode) if node is not None else None
                if held is not None and held.key == op.key:
                    held.remote_base = True
            lf = self._current.get(op.staging)
            if lf is not None and lf.key == op.key and info is not None:
                lf.remote_base = True
                if lf.sealed and not lf.dirty and not self.queue.puts_of(op.staging):
                    lf.uploaded = info
                    if lf.writers == 0:
                        self._uploaded(lf, info)
            else:
                self._release_staging(op.staging)

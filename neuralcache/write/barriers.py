"""Barriers and the control file of a writable mount (a mix-in of layer.WriteLayer):
the mount finishes what the journal holds before it serves (``recover``),
``neuralcache sync`` waits for everything written so far, unmount waits for pending
uploads (``drain``), ``sync --discard PATH`` drops a pending upload, ``umount
--force`` skips the wait at unmount.  The CLI talks
to them through ``MOUNT/.neuralcache/sync`` (fs/control.py): it writes a command and
reads a one-line answer, "ok ..." or "error: ...".
"""
from __future__ import annotations

import logging
import time

import trio

from ..errors import BackendError, JournalError, NotFound, PathError, UserError

log = logging.getLogger(__name__)

# Unmount logs its progress this often while it waits for uploads.
DRAIN_LOG_S = 5.0


class Barriers:
    async def recover(self) -> int:
        """Open the journal and finish every operation a previous run left (before the
        mount serves).  Returns how many there were; UserError if they cannot be."""
        try:
            acts = await trio.to_thread.run_sync(self.journal.open)
        except OSError as exc:
            raise UserError(f"cannot open the write journal in {self.journal.root}: "
                            f"{exc.strerror}") from None
        self.queue.restore(acts, self.journal.last_id)
        keep = {a["staging"] for a in acts if a["a"] == "put"}
        await trio.to_thread.run_sync(self._collect_garbage, keep)
        pending = list(self.queue.ops.values())
        if pending:
            log.info("journal: finishing %d operations (%d bytes to upload) left by the last "
                     "run before serving", len(pending), sum(op.size for op in pending))
            t0 = time.monotonic()
            async with trio.open_nursery() as n:
                await n.start(self.run)
                try:
                    await self.queue.wait(pending)
                except BackendError as exc:
                    raise UserError(f"cannot finish {len(self.queue.ops)} pending operations "
                                    f"from the write journal ({exc}); the data stays in "
                                    f"{self.journal.root}: mount again once the remote "
                                    "accepts writes") from None
                finally:
                    n.cancel_scope.cancel()
            log.info("journal: finished %d operations in %.1f s", len(pending),
                     time.monotonic() - t0)
        if self.journal.size():
            await trio.to_thread.run_sync(self.journal.compact, [])
        return len(pending)

    def _collect_garbage(self, keep: set[str]) -> None:
        for name in self.journal.staging_names():
            if name not in keep:
                log.info("journal: removing staging file %s (a write never closed)", name)
                self.journal.remove_staging(name)

    async def barrier(self) -> int:
        """`neuralcache sync`: until everything written so far is on the remote."""
        for lf in list(self.files.values()):
            await self._commit_file(lf, seal=True)
        ops = list(self.queue.ops.values())
        await self.queue.wait(ops)
        return len(ops)

    async def drain(self) -> None:
        """At unmount: wait for every pending operation, logging progress (unless
        ``skip_drain``: they stay in the journal for the next mount)."""
        for lf in list(self.files.values()):
            try:
                await self._commit_file(lf, seal=True)
            except JournalError as exc:
                log.error("%s: data written but not journaled: %s", lf.key, exc)
        self.queue.unhold_all()       # no reader is left once the mount is gone
        last = 0.0
        while self.queue.ops and not self.skip_drain:
            now = time.monotonic()
            if now - last >= DRAIN_LOG_S:
                s = self.queue.stats()
                log.info("unmount: waiting for %d remote operations (%d files, %d bytes to "
                         "upload; oldest %.0f s)", s["upload_pending_ops"],
                         s["upload_pending_files"], s["upload_pending_bytes"],
                         s["upload_oldest_pending_s"])
                last = now
            await self.queue.changed(now + DRAIN_LOG_S)
        if self.queue.ops:
            log.warning("unmount forced: %d operations stay in the journal and are finished "
                        "by the next mount of this source and cache", len(self.queue.ops))

    async def discard(self, path: str) -> int:
        """Drop the pending upload of ``path`` (relative to the mount) from the journal;
        the name then shows what the remote has.  Returns the bytes dropped."""
        key = path.strip("/")
        node = self.ns.by_path(key)
        lf = self.files.get(node.inode) if node is not None else None
        if lf is not None and lf.writers:
            raise UserError(f"{path} is open for writing; close it first")
        while any(op.running for op in self.queue.ops_on(key) if op.kind == "put"):
            await self.queue.changed()
        puts = [op for op in self.queue.ops_on(key) if op.kind == "put" and op.key == key]
        if not puts and lf is None:
            raise UserError(f"{path} has no data waiting for upload")
        for op in puts:
            self.queue.finish(op)
            self.uploader.abort_later(op)
            self._cancelling[op.staging] += 1
        if lf is not None:
            self._forget_local(lf)
        await self._commit("discard", [{"a": "discard", "id": op.id} for op in puts], [],
                           [op.staging for op in puts], path=key)
        try:
            info = await trio.to_thread.run_sync(self.backend.stat, key)
            self.ns.put_file(key, info.size, info.version, info.mtime)
        except NotFound:
            if (n := self.ns.by_path(key)) is not None and not n.is_dir:
                self.ns.remove(n)
        if node is not None and self.invalidate_entry is not None:
            self.invalidate_entry(node.parent, node.name)
        log.warning("discarded the pending upload of %s (%d bytes)", key,
                    sum(op.size for op in puts))
        return sum(op.size for op in puts)

    async def _answer(self, command: bytes) -> bytes:
        verb, _, arg = command.decode("utf-8", "replace").strip().partition(" ")
        try:
            if verb in ("", "sync"):
                return f"ok {await self.barrier()} operations\n".encode()
            if verb == "discard":
                return f"ok discarded {await self.discard(arg)} bytes\n".encode()
            if verb == "force":
                self.skip_drain = True
                return b"ok\n"
            return f"error: unknown command {verb!r}\n".encode()
        except (BackendError, JournalError, PathError, UserError) as exc:
            return ("error: " + " ".join(str(exc).split()) + "\n").encode()

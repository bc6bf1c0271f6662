"""Read-only opens of files the journal holds (a mix-in of layer.WriteLayer).

A read-only descriptor reads what the file holds now, as on a local disk: the bytes
another descriptor wrote since, through a copy on write (a new staging file) or a new
journal copy after an upload, are what it reads next (fsmodel seed 979: a descriptor
opened before another one wrote and extended the file read 0 bytes where the file
held 1,990).  A ``ReadHandle`` keeps its own descriptor on the staging file it reads:
one the upload's end or an unlink deletes stays readable, and one it moves off stays
open (``spent``) until no read of the handle is in flight, so a read still in a worker
thread never sees its descriptor closed or reused.  When the journal's disk is full,
readers give up the deleted files nothing needs them to hold (``_let_readers_go``).
"""
from __future__ import annotations

import os

import trio

from ..errors import JournalError, NotFound
from ..namespace import Node
from ..store.pinned import Pinned, read_following
from .files import LocalFile, ReadHandle, pread


class Readers:
    def holds(self, inode: int) -> bool:
        """The journal holds this file's data now (a read of the remote would be old)."""
        return inode in self.files

    async def open_reader(self, node: Node) -> ReadHandle | None:
        """A read-only descriptor on the staging file that holds ``node``'s data now,
        or None once the remote has it.  The upload can finish (and its staging file
        go) or a copy on write replace the staging file while the open runs in its
        thread: then look again rather than fail the open."""
        while (lf := self.files.get(node.inode)) is not None:
            fd = await self._open_current(lf)
            if fd is not None:
                h = ReadHandle(lf, lf.staging, fd)
                self.readers.add(h)
                return h
        return None

    async def _open_current(self, lf: LocalFile) -> int | None:
        """A descriptor on ``lf``'s staging file of the moment, or None if ``lf``
        moved on (a copy on write, its upload's end) while the open ran."""
        staging = lf.staging
        try:
            fd = await trio.to_thread.run_sync(
                os.open, self.journal.staging_path(staging), os.O_RDONLY | os.O_CLOEXEC)
        except FileNotFoundError:
            if lf.staging == staging and (self.files.get(lf.inode) is lf or lf.unlinked):
                raise JournalError(f"{lf.key}: staging file {staging} is missing") from None
            return None
        if lf.staging != staging:
            os.close(fd)
            return None
        return fd

    async def follow_remote(self, h, off: int, size: int) -> bytes | None:
        """A read-only open of a remote file (fs/operations.py FileHandle) once this
        mount wrote the file: the journal's copy while the journal holds it (a reader
        of it made once, ``h.journal``).  None: read the remote as pinned (an upload
        from here re-pinned the handle, ``_uploaded``; a change made elsewhere keeps
        the pinned version: old bytes or ESTALE)."""
        inode = h.node.inode
        if h.journal is None and self.holds(inode):
            rh = await self.open_reader(h.node)
            if h.journal is None:
                h.journal = rh
            elif rh is not None:          # a read beside this one made one meanwhile
                self._close_reader(rh)
        if h.journal is not None:
            return await self._read_staging(h.journal, off, size)
        return None

    def _holder(self, h: ReadHandle) -> LocalFile | None:
        """The LocalFile holding ``h``'s file now: the journal's copy, or the unlinked
        file its writers still write; None once the remote has the file."""
        lf = self.files.get(h.lf.inode)
        if lf is None and h.lf.unlinked and h.lf.fd is not None:
            lf = h.lf
        return lf

    async def _read_staging(self, h: ReadHandle, off: int, size: int) -> bytes:
        h.reading += 1
        try:
            return await self._read_current(h, off, size)
        finally:
            h.reading -= 1
            if not h.reading:       # no read in a worker thread on a spent descriptor
                self._close_spent(h)

    async def _read_current(self, h: ReadHandle, off: int, size: int) -> bytes:
        while (lf := self._holder(h)) is not None:
            if lf is not h.lf or lf.staging != h.staging:     # changed since: follow
                fd = await self._open_current(lf)
                if fd is not None:
                    if h.fd is not None:
                        h.spent.append(h.fd)
                    h.lf, h.staging, h.fd = lf, lf.staging, fd
                continue
            await self.behind.drained(lf)           # read-after-write (behind.py)
            async with lf.gate.held_shared():       # not during a copy from the remote
                # still the file's data (a copy from the remote that failed while this
                # waited dropped ``lf``: its staging file is partly filled)
                if lf.staging == h.staging and self._holder(h) is lf:
                    return await self._pread(h, off, size)
        node = self.ns.get(h.lf.inode)
        if node is None or node.removed:          # unlinked: what it held last
            if h.fd is None:      # given up under a full journal: the remote's copy,
                if h.pin is None:     # whose delete waits for this reader (``counting``)
                    raise NotFound(f"{h.lf.key}: deleted before its reader read it")
                return await read_following(self.store, lambda: self._pin_for(h), off, size)
            return await self._pread(h, off, size)
        up = h.lf.uploaded
        if h.fd is not None and h.staging == h.lf.staging and up is not None \
                and up.version == node.version:   # exactly what the remote has
            return await self._pread(h, off, size)
        # changed and uploaded again, discarded, or a failed copy: the remote has it
        return await read_following(self.store, lambda: self._pin_for(h), off, size)

    def _pin_for(self, h: ReadHandle):
        """The remote object ``h`` reads: the file's, or once it is unlinked the one
        ``_pin_readers`` pinned then (its delete is held for ``h``: ``counting``)."""
        p = self._remote_pin_of(h.lf.inode)
        if h.fd is not None:
            return p
        if p is not None:
            h.pin = p
        return h.pin

    def counting(self, edge: dict):
        """The write queue's count of an inode's readers (opqueue.py ``reading``: a
        delete waits for them): the FUSE edge's read-only opens of the remote's copy
        (``edge``: inode -> count) and the journal readers that gave their copy up
        under a full journal (``_let_readers_go``) and read the remote's (``pin``)."""
        return lambda inode: edge.get(inode, 0) + sum(
            1 for h in self.readers
            if h.fd is None and h.pin is not None and h.lf.inode == inode)

    def _pin_readers(self, inode: int, remote_current: bool) -> None:
        """An unlink of ``inode``: its readers that gave their copy up read from now on
        the remote's copy as it is now, if that is the file's data (``counting`` holds
        its delete for them), or nothing (NotFound: the journal held newer data, which
        they had not read yet and which goes with the file)."""
        pin = self._remote_pin_of(inode) if remote_current else None
        for h in self.readers:
            if h.fd is None and h.lf.inode == inode:
                h.pin = pin

    def _follow_move(self, src: str, info) -> None:
        """A move's copy of ``src`` is on the remote (the source goes next): readers
        that gave their copy up and read ``src`` read the copy."""
        for h in self.readers:
            if h.fd is None and h.pin is not None and h.pin.key == src:
                h.pin = Pinned(info.key, info.version, info.size)

    def _remote_pin_of(self, inode: int):
        node = self.ns.get(inode)
        return None if node is None or node.removed else self.remote_pin(node)

    async def _pread(self, h: ReadHandle, off: int, size: int) -> bytes:
        return await trio.to_thread.run_sync(pread, h.fd, size, off, limiter=self._disk)

    @staticmethod
    def _close_spent(h: ReadHandle) -> None:
        """Close the descriptors ``h`` moved off: each holds a staging file that may be
        deleted, whose space comes back only then (a reader of a file saved again and
        again would otherwise keep every version's space until it closes)."""
        for fd in h.spent:
            os.close(fd)
        h.spent.clear()

    def _let_readers_go(self) -> bool:
        """The journal's disk is full (records.py ``_journal_room``): readers give up
        the deleted staging files nothing needs them to hold, so that space comes back:
        one a copy on write replaced (the next read opens the current one) and one of
        a file the journal dropped, uploaded or discarded (the next read reads the
        remote's copy).  Not the last copy of a file unlinked while open: as on a local
        disk, that one keeps its space until closed.  Until then a reader keeps its
        descriptor, so a file unlinked after its upload stays readable.  True if any
        descriptor was given up (closed now, or once the reads in flight end)."""
        let = False
        for h in self.readers:
            if h.fd is None:
                continue
            lf = self._holder(h)
            if lf is h.lf and lf.staging == h.staging:
                continue                          # the file's current data
            if lf is None:
                node = self.ns.get(h.lf.inode)
                if node is None or node.removed:
                    continue                      # unlinked: its only copy
            h.spent.append(h.fd)
            h.fd = None
            # what it reads if unlinked now: the remote's copy (a copy on write's
            # reader opens the current journal copy at its next read instead)
            h.pin = self._remote_pin_of(h.lf.inode) if lf is None else None
            let = True
            if not h.reading:
                self._close_spent(h)
        return let

    def _close_reader(self, h: ReadHandle) -> None:
        self.readers.discard(h)
        self._close_spent(h)
        if h.fd is not None:
            os.close(h.fd)
        elif h.pin is not None:      # it read the remote: a held delete may run now
            self.queue.readers_closed(h.lf.inode)

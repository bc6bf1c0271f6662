"""The write layer of a ``--writable`` mount: what the FUSE edge (fs/operations.py)
calls to create, open, write, read, close and sync files (this module), to change
names (names.py, mixed in) and the journal records behind them (records.py).  Runs on
the trio thread; blocking I/O goes to worker threads (``DISK_THREADS``), remote work
to the uploader.

Durability (the README's contract):
* close() (FUSE flush) of a changed file fsyncs its staging file and commits a
  journal record "closed, pending upload" before it returns;
* the upload starts once the last writer released the file (or at fsync), in the
  background;
* fsync() commits and then waits until the remote has the file;
* ``barrier()`` (``neuralcache sync``) does that for every file and operation;
* ``recover()`` (at mount, before serving) finishes what a previous run left.
"""
from __future__ import annotations

import collections
import logging
import math
import os
import time

import trio

from ..backends.base import ObjectInfo
from ..errors import JournalError, NotFound, NotSupported
from ..namespace import Namespace, Node
from ..store.blocks import Pinned
from .files import (LOCAL_VERSION, WRITEBACK_STEP, LocalFile, ReadHandle, SyncHandle,
                    WriteHandle, copy_prefix, fsync, pread, pwrite_all, truncate)
from .journal import JOURNAL_DIR, Committer, Journal
from .limits import check_key, check_name, check_size, largest_file
from .stream import START_PARTS
from .barriers import Barriers
from .behind import WriteBehind
from .names import NameOps
from .readers import Readers
from .records import Records
from .opqueue import OpQueue
from .uploader import PART_SIZE, Uploader

log = logging.getLogger(__name__)

# Worker threads for journal I/O (staging writes, fsyncs, the log): as many as the
# disk tier's (store/blocks.py DISK_THREADS), a local NVMe's useful queue depth for
# buffered I/O from Python.
DISK_THREADS = 8
# Blocks read ahead while a file is copied from the remote into the journal (an
# existing file opened for writing without O_TRUNC): 4 x 8 MiB keeps the link busy
# (the same depth as read-ahead's first windows).
FILL_AHEAD = 4
# Send the parts of a new file while it is being written (stream.py).
STREAM_UPLOADS = True


class WriteLayer(NameOps, Records, Readers, Barriers):
    def __init__(self, ns: Namespace, store, backend, cache_subdir: str, *,
                 sync_close: bool = False):
        self.ns = ns
        self.store = store
        self.backend = backend
        self.sync_close = sync_close
        self.journal = Journal(os.path.join(cache_subdir, JOURNAL_DIR))
        self.queue = OpQueue()
        self._disk = trio.CapacityLimiter(DISK_THREADS)
        self.committer = Committer(self.journal, self._pending_acts, self._disk)
        self.behind = WriteBehind(self._disk)        # writes answered before they land
        self.behind.room = self._journal_room
        self.uploader = Uploader(backend, self.journal, self.committer, self.queue,
                                 sealed=self._sealed, on_done=self._on_done,
                                 on_copied=self._moved)
        # the journal filesystem's largest file (``measure_limits``; None: unchecked)
        self.journal_max: int | None = None
        self.files: dict[int, LocalFile] = {}          # inode -> journal state
        # inode -> its write handles that have not written yet (no LocalFile attached)
        self._lazy: dict[int, set[WriteHandle]] = {}
        self._current: dict[str, LocalFile] = {}       # staging -> file it is current for
        self._unsealed: set[str] = set()
        self._cancelling: collections.Counter = collections.Counter()  # not yet durable
        self._removals: set[trio.Event] = set()   # staging files being deleted
        self._freed = trio.Event()       # set (and replaced) at each deletion
        self._freed_at = -math.inf       # trio time the last deletion ended
        self.moved: dict[str, str] = {}   # key -> remote key holding its data (pending moves)
        self.local_dirs: set[str] = set()  # directories kept by this mount (mkdir, emptied)
        self.lister = None     # meta/lister.py's Lister: lists a directory before a change
        self._recent: collections.deque = collections.deque()   # (monotonic, finished Op)
        # Set by the FUSE edge: open handles follow a move's copy or an upload
        # (ObjectInfo, key= the old key | inode=); the kernel forgets a name changed
        # behind its back (parent inode, name).
        self.repin = None
        self.invalidate_entry = None
        self.readers: set[ReadHandle] = set()   # open read-only journal handles (readers.py)
        self.skip_drain = False    # `neuralcache umount --force`
        self.written_bytes = 0
        self.journal_errors = 0
        self._nursery: trio.Nursery | None = None

    # -- background ------------------------------------------------------------------
    async def measure_limits(self) -> None:
        """The largest file the journal's filesystem (and a POSIX source's: the
        backend's ``measure_limits``) can hold, so that a write past it is refused
        (EFBIG) instead of failing after it was answered."""
        try:
            self.journal_max = await trio.to_thread.run_sync(largest_file,
                                                             self.journal.staging_dir)
        except OSError as exc:        # (unchecked then: a write past it fails its file)
            log.warning("journal: cannot measure the largest file it holds (%s)", exc)
        measure = getattr(self.backend, "measure_limits", None)
        if measure is not None:
            await trio.to_thread.run_sync(measure)

    async def run(self, task_status=trio.TASK_STATUS_IGNORED) -> None:
        """The committer and the uploader; runs until cancelled."""
        async with trio.open_nursery() as n:
            self._nursery = n
            self.behind.nursery = n
            await n.start(self.committer.run)
            await n.start(self.uploader.run)
            task_status.started()
            await trio.sleep_forever()

    # -- queries ------------------------------------------------------------------------
    def owns(self, h: object) -> bool:
        return isinstance(h, (WriteHandle, ReadHandle, SyncHandle))

    def is_local(self, node: Node) -> bool:
        """Its data or name is still the journal's: do not revalidate with the remote."""
        return node.inode in self.files or node.key in self.moved

    def remote_key(self, node: Node) -> str:
        """Where the remote holds ``node``'s data now (the source of a pending rename)."""
        return self.moved.get(node.key, node.key)

    def remote_pin(self, node: Node) -> Pinned:
        """``node``'s data on the remote now: its key there, version and size."""
        return Pinned(self.remote_key(node), node.version, node.size)

    def _sealed(self, staging: str) -> bool:
        return staging not in self._unsealed

    def _pending_acts(self) -> list[dict]:
        return [op.act() for op in self.queue.ops.values() if op.durable]

    def stats(self) -> dict:
        return {"writable": True, "sync_close": self.sync_close,
                "written_bytes": self.written_bytes,
                "files_open_for_write": sum(1 for lf in self.files.values() if lf.writers),
                "journal_errors": (self.journal_errors + self.committer.write_errors
                                   + self.behind.failures),
                "journal_full_waits": self.behind.full_waits,
                "write_behind_bytes": self.behind.bytes,
                **self.queue.stats(), **self.uploader.stats()}

    def free_bytes(self) -> tuple[int, int]:
        return self.journal.free_bytes()

    def sync_handle(self) -> SyncHandle:
        return SyncHandle()

    # -- opening ------------------------------------------------------------------------
    async def create(self, parent_inode: int, name: str, flags: int, pid: int
                     ) -> tuple[WriteHandle, Node]:
        parent = await self._listed_dir(parent_inode)
        existing = self.ns.child(parent_inode, name)
        if existing is not None:
            self._check_create_over(existing, flags)
            h = await self.open(existing, flags | os.O_WRONLY, pid)
            return h, self.ns.get(existing.inode) or existing
        key = f"{parent.key}/{name}" if parent.key else name
        check_name(name)
        check_key(self.backend, key)
        lf = await self._new_local(key, None, 0)
        h = WriteHandle(lf.inode, None, None, pid, bool(flags & os.O_APPEND))
        self._attach(h, lf)
        self._touch(parent)
        return h, self.ns.get(lf.inode)

    async def open(self, node: Node, flags: int, pid: int) -> object | None:
        """A handle for an open of ``node``, or None: a plain read of remote data."""
        if node.is_dir:
            raise NotSupported(f"{node.key} is a directory")
        lf = self.files.get(node.inode)
        writing = (flags & os.O_ACCMODE) != os.O_RDONLY or bool(flags & os.O_TRUNC)
        if not writing:
            return await self.open_reader(node)
        pinned = self.remote_pin(node)
        h = WriteHandle(node.inode, None, pinned, pid, bool(flags & os.O_APPEND))
        if flags & os.O_TRUNC:
            lf = lf or await self._new_local(node.key, node, 0)
        if lf is not None:
            self._attach(h, lf)
        else:
            self._lazy.setdefault(node.inode, set()).add(h)
        if flags & os.O_TRUNC:
            await self._truncate(lf, 0)
        return h

    def _attach(self, h: WriteHandle, lf: LocalFile) -> None:
        h.lf = lf
        lf.writers += 1
        self._drop_lazy(h)

    def _drop_lazy(self, h: WriteHandle) -> None:
        lazy = self._lazy.get(h.inode)
        if lazy is not None:
            lazy.discard(h)
            if not lazy:
                del self._lazy[h.inode]

    def _current_lf(self, h: WriteHandle) -> LocalFile | None:
        """The handle's LocalFile, attaching one another handle made meanwhile."""
        if h.lf is None and (lf := self.files.get(h.inode)) is not None:
            self._attach(h, lf)
        return h.lf

    async def _local(self, h: WriteHandle) -> LocalFile:
        """The handle's LocalFile, copying the file from the remote on first use."""
        lf = self._current_lf(h)
        if lf is None:
            node = self.ns.get(h.inode)
            if node is None or node.removed:
                raise NotFound("the file was removed")
            lf = self.files.get(h.inode) or await self._new_local(node.key, node, node.size)
            if h.lf is None:
                self._attach(h, lf)
        return lf

    async def _new_local(self, key: str, node: Node | None, keep: int) -> LocalFile:
        """Register a LocalFile for ``node`` (None: a new file at ``key``) holding its
        first ``keep`` bytes, copied from the remote."""
        name, fd = await trio.to_thread.run_sync(self.journal.create_staging,
                                                 limiter=self._disk)
        other = self.files.get(node.inode) if node is not None else None
        if other is not None:            # another request made one meanwhile
            os.close(fd)
            await trio.to_thread.run_sync(self.journal.remove_staging, name)
            return other
        remote = node is not None and not node.version.startswith(LOCAL_VERSION)
        if node is None:
            node = self.ns.put_file(key, 0, LOCAL_VERSION + name, time.time())
        lf = LocalFile(node.inode, key, name, fd, size=keep, mtime=node.mtime,
                       remote_base=remote, dirty=True, fresh=keep == 0)
        self.files[lf.inode] = lf
        self._current[name] = lf
        self._unsealed.add(name)
        if keep:
            await lf.gate.acquire_exclusive()     # free: first, before any reader
            try:
                await self._fill_from_remote(node, fd, keep)
            except BaseException:
                self._forget_local(lf)
                raise
            finally:
                lf.gate.release_exclusive()
        self._sync_node(lf)
        return lf

    async def _fill_from_remote(self, node: Node, fd: int, length: int) -> None:
        p = self.remote_pin(node)
        bs = self.store.block_size
        off = 0
        while off < length:
            for j in range(off // bs + 1, off // bs + 1 + FILL_AHEAD):
                self.store.prefetch(p, j)
            data = await self.store.read(p, off, min(bs, length - off))
            if not data:
                raise NotFound(f"{node.key}: shorter on the remote than listed")
            # a block each (8 MiB by default): start its writeback (files.py)
            await trio.to_thread.run_sync(pwrite_all, fd, data, off, WRITEBACK_STEP > 0,
                                          limiter=self._disk)
            off += len(data)

    # -- data ------------------------------------------------------------------------
    async def read(self, h: object, off: int, size: int) -> bytes:
        if isinstance(h, SyncHandle):
            if h.answer is None:
                h.answer = await self._answer(bytes(h.command))
            return h.answer[off:off + size]
        if isinstance(h, ReadHandle):
            return await self._read_staging(h, off, size)
        assert isinstance(h, WriteHandle)
        lf = self._current_lf(h)
        if lf is None:
            return await self.store.read(h.pinned, off, size)
        await self.behind.drained(lf)               # read-after-write (behind.py)
        async with lf.gate.held_shared():
            fd = lf.fd if lf.fd is not None else await self._reopen(lf)
            return await trio.to_thread.run_sync(pread, fd, size, off, limiter=self._disk)

    async def _reopen(self, lf: LocalFile) -> int:
        """A descriptor on ``lf``'s staging file after the last writer closed it (a file
        closed, then opened for writing again, and read before any write).  It is
        sealed, so read-only is enough: the first write copies it (``_unseal``).  The
        caller holds the gate shared, so the staging file cannot change meanwhile."""
        staging = lf.staging
        fd = await trio.to_thread.run_sync(os.open, self.journal.staging_path(staging),
                                           os.O_RDONLY | os.O_CLOEXEC, limiter=self._disk)
        if lf.fd is None and lf.staging == staging:
            lf.fd = fd
        else:                  # another reader reopened it meanwhile
            os.close(fd)
        return lf.fd

    async def write(self, h: object, off: int, buf: bytes) -> int:
        if isinstance(h, SyncHandle):
            h.command += buf
            return len(buf)
        if not isinstance(h, WriteHandle):
            raise NotSupported("not open for writing")
        lf = await self._local(h)
        check_size(self.backend, (lf.size if h.append else off) + len(buf), self.journal_max)
        while True:
            if lf.sealed:
                async with lf.gate.held_exclusive():
                    if lf.sealed:
                        await self._unseal(lf, lf.size)
            await lf.gate.acquire_shared()
            if not lf.sealed:
                break
            lf.gate.release_shared()            # sealed (fsync) while we waited
        try:
            if lf.error is not None:            # an earlier write did not land
                raise lf.error
            if h.append:
                off = lf.size
            end = off + len(buf)
            lf.size = max(lf.size, end)         # reserved now: appenders do not overlap
            await self.behind.admit(lf, off, end)
            kick = WRITEBACK_STEP > 0 and lf.unkicked + len(buf) >= WRITEBACK_STEP
            lf.unkicked = 0 if kick else lf.unkicked + len(buf)
            lf.dirty = True
            lf.mtime = time.time()
            self.written_bytes += len(buf)
            self._sync_node(lf)
        except BaseException:
            lf.gate.release_shared()
            raise
        # answered now; it lands in the background, and the gate's hold goes with it
        await self.behind.submit(lf, off, buf, kick, self._stream)
        return len(buf)

    def _stream(self, lf: LocalFile, off: int) -> None:
        """A write at ``off`` landed: start, feed or stop the file's streaming upload
        (with the bytes up to the first write still in flight: behind.py)."""
        streams = self.uploader.streams
        upto = self.behind.landed_upto(lf)
        if lf.stream is not None:
            if off < lf.stream.sent_upto:
                self._stop_stream(lf, "a write into a part already sent")
            else:
                streams.feed(lf.stream, upto)
        elif STREAM_UPLOADS and lf.fresh and upto >= START_PARTS * PART_SIZE \
                and self.files.get(lf.inode) is lf and not lf.unlinked:
            lf.stream = streams.start(lf.key, lf.staging, PART_SIZE)
            if lf.stream is not None:
                streams.feed(lf.stream, upto)

    def _stop_stream(self, lf: LocalFile, why: str) -> None:
        s, lf.stream = lf.stream, None
        lf.fresh = False
        self.uploader.streams.kill(s, why)

    async def setattr(self, node: Node, size: int | None, mtime: float | None,
                      h: object | None) -> Node:
        """truncate / utimes; chmod and chown are accepted and ignored (README)."""
        if size is not None:
            if node.is_dir:
                raise NotSupported(f"{node.key} is a directory")
            check_size(self.backend, size, self.journal_max)
            lf = self._current_lf(h) if isinstance(h, WriteHandle) else None
            lf = lf or self.files.get(node.inode) or \
                await self._new_local(node.key, node, min(size, node.size))
            if isinstance(h, WriteHandle) and h.lf is None:
                self._attach(h, lf)
            # Held like a writer while the gate is awaited: an upload that finishes
            # meanwhile must not drop the LocalFile and its staging file under the
            # copy on write (pjdfstest truncate/00.t: EIO, one truncate in ~60).
            lf.writers += 1
            try:
                await self._truncate(lf, size)
            finally:
                lf.writers -= 1
            if lf.writers == 0:    # truncate(2) by path: no close() will follow
                await self._commit_file(lf, seal=True)
                await self._settle(lf)
        if mtime is not None:
            node.mtime = mtime
            if (lf := self.files.get(node.inode)) is not None:
                lf.mtime = mtime
        node = self.ns.get(node.inode) or node
        node.ctime = time.time()      # chmod and chown too, though they keep nothing
        return node

    async def _truncate(self, lf: LocalFile, size: int) -> None:
        async with lf.gate.held_exclusive():
            self._stop_stream(lf, "truncated")
            if lf.sealed:
                await self._unseal(lf, min(size, lf.size))
            if size != lf.size:
                await trio.to_thread.run_sync(truncate, lf.fd, size, limiter=self._disk)
                lf.size = size
            if lf.error is not None and size <= lf.error_at:
                lf.error = None             # the range that failed to land is gone
            lf.dirty = True
            lf.fresh = size == 0          # empty again: it may stream
            lf.mtime = time.time()
        self._sync_node(lf)

    async def _unseal(self, lf: LocalFile, keep: int) -> None:
        """Copy on write: a new staging file with the first ``keep`` bytes (gate held)."""
        self._stop_stream(lf, "copy on write")
        name, fd = await trio.to_thread.run_sync(self.journal.create_staging,
                                                 limiter=self._disk)
        try:
            await trio.to_thread.run_sync(copy_prefix, self.journal.staging_path(lf.staging),
                                          fd, keep, limiter=self._disk)
        except BaseException:
            os.close(fd)
            await trio.to_thread.run_sync(self.journal.remove_staging, name)
            raise
        old, old_fd = lf.staging, lf.fd
        lf.staging, lf.fd, lf.size = name, fd, keep
        lf.sealed, lf.dir_synced, lf.uploaded = False, False, None
        self._current.pop(old, None)
        self._current[name] = lf
        self._unsealed.add(name)
        if old_fd is not None:
            os.close(old_fd)
        self._release_staging(old)
        self._sync_node(lf)

    def _sync_node(self, lf: LocalFile) -> None:
        node = self.ns.get(lf.inode)
        if node is None or node.is_dir:
            return
        now = time.time()    # (the row written later: meta/rows.py PENDING_SETS_MAX)
        if lf.unlinked:      # still open: fstat() shows what its descriptors wrote
            node.assign_soon(size=lf.size, mtime=lf.mtime, ctime=now)
        else:
            self.ns.total_bytes += lf.size - node.size
            node.assign_soon(size=lf.size, version=lf.version, mtime=lf.mtime, ctime=now)

    # -- close, fsync -----------------------------------------------------------------
    async def flush(self, h: object) -> None:
        if not isinstance(h, WriteHandle) or h.lf is None or h.lf.unlinked:
            return
        lf = h.lf
        # Journal now (the contract of close()), but seal only at release: a close()
        # of one of several descriptors (dup, fork) must not start an upload that the
        # next write would supersede.  --sync-close waits for the remote here, so it
        # seals when this is the last writer.
        await self._commit_file(lf, seal=self.sync_close and lf.writers <= 1)
        if self.sync_close and lf.sealed:
            await self.queue.wait(self.queue.ops_on(lf.key))

    async def _commit_file(self, lf: LocalFile, seal: bool) -> None:
        """Journal the file's data if changed (fsync + record); seal it if asked."""
        if lf.unlinked:
            return
        if lf.dirty:
            async with lf.gate.held_exclusive():
                if lf.error is not None:    # a write did not land (behind.py)
                    raise lf.error
                if lf.dirty:
                    await self._record(lf, seal)
                    return
        if seal and not lf.sealed and not lf.dirty:
            self._seal(lf)

    async def _record(self, lf: LocalFile, seal: bool) -> None:
        try:
            await trio.to_thread.run_sync(fsync, lf.fd, limiter=self._disk)
            if not lf.dir_synced:
                await trio.to_thread.run_sync(self.journal.sync_staging_dir, limiter=self._disk)
                lf.dir_synced = True
        except JournalError:
            self.journal_errors += 1
            raise
        cancelled = self._cancel_tail_puts(lf.key)
        acts = [{"a": "cancel", "id": c.id} for c in cancelled]
        released = [c.staging for c in cancelled]
        op = self.queue.new("put", lf.key, staging=lf.staging, size=lf.size)
        acts.append(op.act())
        lf.dirty = False
        lf.uploaded = None
        if seal:
            self._seal(lf)
        await self._commit("closed", acts, [op], released)

    def _seal(self, lf: LocalFile) -> None:
        s, lf.stream = lf.stream, None
        lf.fresh = False
        if s is not None:        # its upload goes to the put that uploads this version
            puts = [op for op in self.queue.puts_of(lf.staging) if not op.running]
            if puts and not s.dead and not lf.dirty and s.key == puts[-1].key:
                s.handed_over = True
                puts[-1].upload = s
            else:
                self.uploader.streams.kill(s, "not the version being uploaded")
        lf.sealed = True
        self._unsealed.discard(lf.staging)
        self.queue.notify()

    async def fsync(self, h: object) -> None:
        """Until the remote has this file (EIO if it cannot get it).  A file unlinked
        or replaced by a rename has nothing to wait for: its name's operations are
        another file's now, whose writer may keep it open (fsmodel seed 30: an fsync of
        the replaced file waited for the new one's close)."""
        if isinstance(h, WriteHandle):
            lf, inode = self._current_lf(h), h.inode
        elif isinstance(h, ReadHandle):
            lf, inode = h.lf, h.lf.inode
        else:
            return
        if lf is not None:
            if lf.unlinked:
                return
            await self._commit_file(lf, seal=True)
            key = lf.key
        else:
            node = self.ns.get(inode)
            if node is None or node.removed:
                return
            key = node.key
        await self.queue.wait(self.queue.ops_on(key))

    async def fsync_key(self, key: str, tree: bool = False) -> None:
        """Until the remote has every operation on ``key`` (a directory: under it)
        that does not wait for a writer to close."""
        ops = self.queue.touching(key) if tree else self.queue.ops_on(key)
        await self.queue.wait([op for op in ops if op.kind != "put" or self._sealed(op.staging)])

    async def release(self, h: object) -> None:
        if isinstance(h, ReadHandle):
            self._close_reader(h)
            return
        if not isinstance(h, WriteHandle):
            return
        if h.lf is None:
            self._drop_lazy(h)
            return
        lf, h.lf = h.lf, None
        lf.writers -= 1
        if lf.writers > 0:
            return
        if lf.unlinked:
            self._forget_local(lf)
            return
        try:
            await self._commit_file(lf, seal=True)
        except JournalError as exc:   # close() already reported it; the data stays local
            log.error("%s: written data could not be journaled: %s", lf.key, exc)
            return
        await self._settle(lf)

    async def _settle(self, lf: LocalFile) -> None:
        """No writer left: close the descriptor; drop the LocalFile once uploaded."""
        if lf.writers or not lf.sealed or lf.dirty:
            return
        if lf.fd is not None:
            os.close(lf.fd)
            lf.fd = None
        if lf.uploaded is not None:
            self._uploaded(lf, lf.uploaded)

    def _uploaded(self, lf: LocalFile, info: ObjectInfo) -> None:
        """The remote has exactly this file: serve it from the read cache from now on.
        Not if it was renamed since that upload (``info`` names its old key): the
        journal copy serves it until the rename's copy on the remote ends (``_moved``
        then calls this again); a read pinned to the old upload would get ESTALE
        (fsmodel seed 226 at 300 calls)."""
        node = self.ns.get(lf.inode)
        if node is not None and not node.removed and node.key != info.key:
            lf.uploaded = None
            return
        self._forget_local(lf)
        if node is not None and not node.removed:
            self.ns.total_bytes += info.size - node.size
            node.size, node.version, node.mtime = info.size, info.version, info.mtime
            node.checked = time.monotonic()
            # opens that read the remote file (not the journal) read the upload now
            pin = self.remote_pin(node)
            for h in self._lazy.get(node.inode, ()):    # O_RDWR ones that never wrote
                h.pinned = pin
            if self.repin is not None:                  # the FUSE edge's read-only ones
                self.repin(info, inode=node.inode)

    def _forget_local(self, lf: LocalFile) -> None:
        self._stop_stream(lf, "dropped")
        if self.files.get(lf.inode) is lf:
            del self.files[lf.inode]
        if self._current.get(lf.staging) is lf:
            del self._current[lf.staging]
        self._unsealed.discard(lf.staging)
        if lf.fd is not None:
            os.close(lf.fd)
            lf.fd = None
        self._release_staging(lf.staging)
        self.queue.notify()      # its writes waiting for journal room give up

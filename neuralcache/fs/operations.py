"""The FUSE edge: a pyfuse3.Operations subclass over Namespace + BlockStore.

The one errno table of NeuralCache is here (``ERRNO``); ``_edge`` wraps every handler
so that nothing but FUSEError escapes (pyfuse3 would take the mount down).  Read-only
but for the control directory's hints file, unless ``--writable``: then writes go to
neuralcache/write/ (``self.writes``), and so do files with journal data."""
from __future__ import annotations

import errno
import functools
import logging
import os
import stat
import time
from dataclasses import dataclass, field

import pyfuse3
import trio

from .. import cpuacct
from . import control
from ..store.blocks import BlockStore
from ..store.pinned import Pinned, read_following
from ..errors import (AlreadyExists, DirectoryNotEmpty, FileTooBig, InvalidChange,
                      IsADirectory, JournalError, JournalFull, NameTooLong, NotADirectory,
                      NotFound, NotSupported, PermissionDenied, Unavailable, UserError,
                      VersionChanged, first_error)
from ..backends.base import NAME_MAX
from ..meta.rows import Row
from ..namespace import ROOT_INODE, Namespace, Node
from ..ahead.readahead import ReadAhead
from ..stats import Stats
from .pagedrop import KernelVersions, PageDropper
from .push import Pusher
from .trace import TraceRing

log = logging.getLogger(__name__)

# The one errno table: domain error -> errno returned to the reader.
ERRNO: dict[type, int] = {
    NotFound: errno.ENOENT,
    PermissionDenied: errno.EACCES,
    Unavailable: errno.EIO,
    VersionChanged: errno.ESTALE,   # the object changed under an open handle
    UserError: errno.EINVAL,        # e.g. a malformed hint
    # a --writable mount (neuralcache/write/)
    JournalFull: errno.ENOSPC,      # no space left for the write journal
    JournalError: errno.EIO,        # the journal's disk failed
    AlreadyExists: errno.EEXIST,
    IsADirectory: errno.EISDIR,
    NotADirectory: errno.ENOTDIR,
    DirectoryNotEmpty: errno.ENOTEMPTY,
    InvalidChange: errno.EINVAL,
    NotSupported: errno.EOPNOTSUPP,  # links, device nodes, xattrs
    NameTooLong: errno.ENAMETOOLONG,  # a name or key the remote cannot hold
    FileTooBig: errno.EFBIG,         # a length past the remote's largest object
}

# The kernel's timeouts when entries never expire (--metadata-ttl 0, a manifest): a day.
NEVER_S = 86400.0
# Entries read from the table per step of readdir (the kernel takes ~100-200 per
# 4 KiB reply page, so one step fills several replies; ~1 ms of the trio thread).
READDIR_PAGE = 512
# Reported block size (st_blksize): tools size their reads by it.  1 MiB is large
# enough for throughput and a multiple of the kernel's 128 KiB FUSE request size.
ST_BLKSIZE = 1 << 20


def _errno_for(exc: BaseException) -> int:
    for cls, code in ERRNO.items():
        if isinstance(exc, cls):
            return code
    return errno.EIO


def _edge(fn):
    """Translate every exception from a handler into FUSEError (logged if unexpected)."""
    name = fn.__name__

    @functools.wraps(fn)
    async def wrapper(self, *args, **kwargs):
        self.stats.fuse_requests[name] += 1
        try:
            return await fn(self, *args, **kwargs)
        except (pyfuse3.FUSEError, trio.Cancelled, KeyboardInterrupt):
            raise
        except Exception as exc:  # the edge: translate, never let it escape
            if isinstance(exc, BaseExceptionGroup):     # a nursery's: its first error
                exc = first_error(exc)
            code = _errno_for(exc)
            if code == errno.EIO and not isinstance(exc, Unavailable):
                log.exception("unexpected error in %s", fn.__name__)
            else:
                log.info("%s: %s", fn.__name__, exc)
            raise pyfuse3.FUSEError(code) from None

    return wrapper


@dataclass(slots=True)
class FileHandle:
    node: Node
    pinned: Pinned
    readahead: ReadAhead | None
    pid: int
    # a writable mount: the file was written here after this open; reads follow the
    # journal's copy from then on (write/readers.py), as on a local disk
    journal: object = None
    direct: bool = False     # O_DIRECT: its reads leave nothing in the page cache


@dataclass(slots=True)
class DirHandle:
    entries: list = field(default_factory=list)   # the control directory's (name, attrs)
    node: Node | None = None     # the directory (None: the control directory)


class Operations(pyfuse3.Operations):
    supports_dot_lookup = True
    enable_writeback_cache = False
    enable_acl = False

    def __init__(self, ns: Namespace, lister, store: BlockStore, backend, stats: Stats, *,
                 metadata_ttl: float, readahead_bytes: int, trace: TraceRing,
                 controls: "control.Control", prefetcher=None,
                 uid: int | None = None, gid: int | None = None, writes=None):
        super().__init__()
        self.ns = ns
        self.lister = lister          # meta/lister.py: lists directories as they are used
        lister.invalidate_entry = lambda parent, name: pyfuse3.invalidate_entry_async(
            parent, os.fsencode(name), ignore_enoent=True)
        lister.invalidate_inode = self._invalidate_inode
        self.store = store
        self.backend = backend
        self.stats = stats
        # Kernel entry/attribute timeouts and the revalidation age of an open: the
        # metadata TTL, or a day when entries never expire (--metadata-ttl 0).
        self.ttl = metadata_ttl if metadata_ttl > 0 else NEVER_S
        self.revalidate = metadata_ttl > 0
        self.readahead_bytes = readahead_bytes
        self.trace = trace
        self.controls = controls
        self.prefetcher = prefetcher
        self.uid = os.getuid() if uid is None else uid
        self.gid = os.getgid() if gid is None else gid
        self._handles: dict[int, object] = {}
        self._next_fh = 1
        self._kernel_version = KernelVersions()    # inode -> version last opened
        self._reading: dict[int, int] = {}          # inode -> open FileHandles
        self.pusher = Pusher(store, stats, trace, prefetcher, self._reading.get)
        self.pages = PageDropper()      # daemon.py runs it in the mount's nursery
        # A --writable mount: neuralcache.write.layer.WriteLayer, else None (EROFS).
        self.writes = writes
        self.file_mode, self.dir_mode = (0o644, 0o755) if writes else (0o444, 0o555)
        if writes is not None:
            writes.repin = self._repin
            writes.queue.reading = writes.counting(self._reading)
            writes.invalidate_entry = lambda parent, name: pyfuse3.invalidate_entry_async(
                parent, os.fsencode(name), ignore_enoent=True)

    # -- attributes ------------------------------------------------------------------
    def _attrs(self, node: Node | Row) -> pyfuse3.EntryAttributes:
        """Attributes of a Node, or of a table row (readdir builds no Node)."""
        if isinstance(node, Row):
            ino, is_dir, size, mtime, ctime, removed = (node.ino, node.dir, node.size,
                                                        node.mtime, node.ctime, node.removed)
        else:
            ino, is_dir, size, mtime, ctime, removed = (node.inode, node.is_dir, node.size,
                                                        node.mtime, node.ctime, node.removed)
        a = pyfuse3.EntryAttributes()
        a.st_ino = ino
        a.generation = 0
        a.entry_timeout = self.ttl
        a.attr_timeout = self.ttl
        if is_dir:
            a.st_mode = stat.S_IFDIR | self.dir_mode
            a.st_nlink = 2 + self.ns.subdirs(ino)
            a.st_size = 0
        else:
            a.st_mode = stat.S_IFREG | self.file_mode
            a.st_nlink = 0 if removed else 1     # unlinked but still open: 0
            a.st_size = size
        a.st_atime_ns = a.st_mtime_ns = int(mtime * 1e9)
        a.st_ctime_ns = int((ctime or mtime) * 1e9)
        a.st_uid, a.st_gid = self.uid, self.gid
        a.st_blksize = ST_BLKSIZE
        a.st_blocks = (a.st_size + 511) // 512
        return a

    def _new_fh(self, h: object) -> int:
        fh = self._next_fh
        self._next_fh += 1
        self._handles[fh] = h
        return fh

    def _invalidate_inode(self, inode: int) -> None:
        """The object changed on the remote: the kernel drops its cached pages (in a
        worker thread: fs/pagedrop.py), and the next open gets keep_cache=False."""
        self._kernel_version.forget(inode)
        self.pages.drop(inode)

    # -- lookups -------------------------------------------------------------------
    @_edge
    async def lookup(self, parent_inode, name, ctx=None):
        sname = os.fsdecode(name)
        if control.is_control_inode(parent_inode) or (
                parent_inode == ROOT_INODE and sname == control.DIRNAME):
            return self.controls.lookup(parent_inode, sname)
        parent = self.ns.get(parent_inode)
        if parent is None:
            raise pyfuse3.FUSEError(errno.ENOENT)
        if len(name) > NAME_MAX:       # no entry can have it (what ext4 answers)
            raise pyfuse3.FUSEError(errno.ENAMETOOLONG)
        if not parent.is_dir:
            raise pyfuse3.FUSEError(errno.ENOTDIR)
        if sname == ".":
            node = parent
        elif sname == "..":
            node = self.ns.get(parent.parent) or parent
        else:
            node = await self.lister.lookup(parent, sname)
        if node is None:
            a = pyfuse3.EntryAttributes()   # negative entry, cached for the TTL
            a.st_ino = 0
            a.entry_timeout = self.ttl
            return a
        self.ns.remember(node)
        return self._attrs(node)

    @_edge
    async def forget(self, inode_list):
        for inode, n in inode_list:
            self.ns.forget(inode, n)

    @_edge
    async def getattr(self, inode, ctx=None):
        if control.is_control_inode(inode):
            return self.controls.getattr(inode)
        node = self.ns.get(inode)
        if node is None:
            raise pyfuse3.FUSEError(errno.ENOENT)
        return self._attrs(node)

    @_edge
    async def setattr(self, inode, attr, fields, fh, ctx):
        if control.is_control_inode(inode):  # O_TRUNC on the hints or sync file
            return self.controls.getattr(inode)
        if self.writes is None:
            raise pyfuse3.FUSEError(errno.EROFS)
        node = self.ns.get(inode)
        if node is None:
            raise pyfuse3.FUSEError(errno.ENOENT)
        size = attr.st_size if fields.update_size else None
        mtime = attr.st_mtime_ns / 1e9 if fields.update_mtime else None
        h = self._handles.get(fh) if fh is not None else None
        return self._attrs(await self.writes.setattr(node, size, mtime, h))

    @_edge
    async def statfs(self, ctx):
        s = pyfuse3.StatvfsData()
        s.f_bsize = ST_BLKSIZE
        s.f_frsize = ST_BLKSIZE
        s.f_blocks = (self.ns.total_bytes + ST_BLKSIZE - 1) // ST_BLKSIZE
        s.f_bfree = s.f_bavail = 0
        if self.writes is not None:     # what the journal's disk can still take
            total, free = await trio.to_thread.run_sync(self.writes.free_bytes)
            s.f_blocks += total // ST_BLKSIZE
            s.f_bfree = s.f_bavail = free // ST_BLKSIZE
        s.f_files = self.ns.files + 1
        s.f_ffree = s.f_favail = 0
        s.f_namemax = 255
        return s

    # -- directories -------------------------------------------------------------------
    @_edge
    async def opendir(self, inode, ctx):
        if control.is_control_inode(inode):
            return self._new_fh(DirHandle(self.controls.entries(inode)))
        node = self.ns.get(inode)
        if node is None:
            raise pyfuse3.FUSEError(errno.ENOENT)
        if not node.is_dir:
            raise pyfuse3.FUSEError(errno.ENOTDIR)
        return self._new_fh(DirHandle(node=node))

    @_edge
    async def readdir(self, fh, start_id, token):
        """Streams: the entries listed so far from offset ``start_id`` (an entry's
        ``seq``: stable while the directory is re-listed), then waits only for the
        listing's next page.  With readdirplus the kernel keeps each entry it takes."""
        h = self._handles.get(fh)
        if not isinstance(h, DirHandle):
            raise pyfuse3.FUSEError(errno.EBADF)
        if h.node is None:                     # the control directory: (name, attrs)
            for i in range(start_id, len(h.entries)):
                name, attrs = h.entries[i]
                if not pyfuse3.readdir_reply(token, os.fsencode(name), attrs, i + 1):
                    break
                self.controls.remember(attrs.st_ino)
            return
        ino, seq, taken = h.node.inode, start_id, []
        if seq == 0:
            self.lister.crawl(ino)
        try:
            while True:
                rows = self.ns.page(ino, seq, READDIR_PAGE)
                if not rows:
                    if taken:                   # the kernel comes back for the rest
                        return
                    if not await self.lister.more(ino, seq):
                        self.lister.crawl(ino)  # listed now: its subdirectories next
                        return
                    continue
                for r in rows:
                    if not pyfuse3.readdir_reply(token, os.fsencode(r.name),
                                                 self._attrs(r), r.seq + 1):
                        return
                    taken.append(r.ino)
                    seq = r.seq + 1
        finally:
            self.ns.remember_inodes(taken)      # one statement per reply, not per entry

    @_edge
    async def releasedir(self, fh):
        self._handles.pop(fh, None)

    # -- files ---------------------------------------------------------------------------
    @_edge
    async def open(self, inode, flags, ctx):
        if control.is_control_inode(inode):
            h = self.controls.open(inode, flags, ctx)
            return pyfuse3.FileInfo(fh=self._new_fh(h), direct_io=True)
        if (flags & os.O_ACCMODE != os.O_RDONLY or flags & os.O_TRUNC) and self.writes is None:
            raise pyfuse3.FUSEError(errno.EROFS)
        node = self.ns.get(inode)
        if node is None or node.is_dir:
            raise pyfuse3.FUSEError(errno.ENOENT if node is None else errno.EISDIR)
        if node.removed:
            raise pyfuse3.FUSEError(errno.ENOENT)
        if self.writes is not None:
            wh = await self.writes.open(node, flags, ctx.pid)
            if wh is not None:          # writing, or data in the journal
                self._kernel_version.forget(inode)
                return pyfuse3.FileInfo(fh=self._new_fh(wh))
            if self.writes.is_local(node):
                node.checked = time.monotonic()   # renamed here: the remote lags
        if self.revalidate and time.monotonic() - node.checked > self.ttl:
            await self._revalidate(node)
        key = self.writes.remote_key(node) if self.writes is not None else node.key
        pinned = Pinned(key, node.version, node.size)
        kv = self._kernel_version.get_same(inode, node.version)
        keep = kv is True
        if kv is None and self.pages.waiting(inode):   # changed, pages not dropped yet:
            # the old size would cut this handle's new version short (CI under load);
            # attributes only take no page lock, so this is safe on the request thread
            try:
                pyfuse3.invalidate_inode(inode, attr_only=True)
            except OSError:
                pass
        self._kernel_version.set(inode, node.version)
        busy = self._reading.get(inode, 0)
        self._reading[inode] = busy + 1
        ra = ReadAhead(self.store.block_size, self.readahead_bytes) \
            if self.readahead_bytes > 0 else None
        fh = self._new_fh(FileHandle(node, pinned, ra, ctx.pid,
                                     direct=bool(flags & os.O_DIRECT)))
        self.stats.opens += 1
        self.trace.record("open", node.key, 0, 0, ctx.pid, node.size)
        if self.prefetcher is not None:
            t0 = cpuacct.clock()
            self.prefetcher.on_open(node.key, node.size, ctx.pid, node.parent, warm=keep)
            cpuacct.charge("ahead", t0)
        if kv is None and not busy and self.writes is None and not flags & os.O_DIRECT:
            try:
                keep = await self.pusher.push(inode, pinned, ctx.pid)
            except BaseException:     # the load failed (or the daemon stops): no open
                self._handles.pop(fh, None)
                self._unread(inode)
                self._kernel_version.forget(inode)
                raise
        return pyfuse3.FileInfo(fh=fh, keep_cache=keep)

    async def _revalidate(self, node: Node) -> None:
        """The entry is older than the TTL: ask the remote (one HEAD) before opening."""
        try:
            info = await trio.to_thread.run_sync(self.backend.stat, node.key)
        except NotFound:
            self.ns.mark_removed(node)
            raise
        if self.ns.update_object(node, info):
            log.info("%s changed on the remote (new version %s)", node.key, info.version)
            # The lookup just before this open gave the kernel the old size, and the
            # handle reads the new version: without this the kernel would read the
            # new bytes only up to the old length.  Attributes only (no page locks, so
            # safe inside a request); pages go by keep_cache=False below.
            try:
                pyfuse3.invalidate_inode(node.inode, attr_only=True)
            except OSError:
                pass

    @_edge
    async def read(self, fh, off, size):
        h = self._handles.get(fh)
        if self.writes is not None and self.writes.owns(h):
            return await self.writes.read(h, off, size)
        if isinstance(h, FileHandle) and self.writes is not None:
            data = await self.writes.follow_remote(h, off, size)   # written here since
            if data is not None:
                return data
        if not isinstance(h, FileHandle):
            if h is not None and hasattr(h, "read"):
                return h.read(off, size)
            raise pyfuse3.FUSEError(errno.EBADF)
        st = self.stats
        st.reads += 1
        st.count_read_size(size)
        p = h.pinned
        if self.prefetcher is not None:    # before the load stores it (Prefetcher.reading)
            self.prefetcher.reading()
        t0 = time.monotonic()
        try:
            # a rename here may finish while this waits: the read follows it
            data = await read_following(self.store, lambda: h.pinned, off, size)
            p = h.pinned
        except Exception as exc:
            st.read_errors += 1
            if isinstance(exc, NotFound) and h.pinned is p:
                log.warning("%s: listed, but the remote has no such object now (deleted "
                            "since it was listed, or a manifest out of date)", p.key)
            elif isinstance(exc, VersionChanged):
                p = h.pinned        # (the one read last, if a rename moved it meanwhile)
                log.warning("%s: changed on the remote since it was opened (version %s): "
                            "ESTALE; open it again for the new version", p.key, p.version)
            raise
        if st.read_hist is not None:
            st.read_hist.observe(time.monotonic() - t0)
        st.bytes_served += len(data)
        self.trace.record("read", p.key, off, len(data), h.pid, p.size)
        t0 = cpuacct.clock()
        if h.readahead is not None:
            ahead = h.readahead.on_read(off, len(data), self.store.nblocks(p),
                                        self.store.latency_estimate())
            for i in ahead:
                self.store.prefetch(p, i)
            for i in h.readahead.behind():
                self.store.consumed(p, i)
        if self.prefetcher is not None:
            self.prefetcher.on_read(p.key, off, len(data), p.size, h.pid)
        cpuacct.charge("ahead", t0)
        return data

    @_edge
    async def write(self, fh, off, buf):
        h = self._handles.get(fh)
        if self.writes is not None and self.writes.owns(h):
            return await self.writes.write(h, off, buf)
        if h is not None and hasattr(h, "write"):
            if getattr(h, "threaded_write", False):     # the hints file: parsed as it comes
                return await trio.to_thread.run_sync(h.write, off, buf)
            return h.write(off, buf)
        raise pyfuse3.FUSEError(errno.EROFS)

    @_edge
    async def flush(self, fh):
        """close(): a writable mount journals the file here.  A read-only mount has
        nothing to do on close(), so it answers ENOSYS once and the kernel stops
        sending FLUSH for the whole mount (fc->no_flush): one request less per file.
        The hints file is installed at fsync() or release instead."""
        h = self._handles.get(fh)
        if self.writes is None:
            raise pyfuse3.FUSEError(errno.ENOSYS)
        if self.writes.owns(h):
            await self.writes.flush(h)   # close() returns once the journal has it
        elif h is not None and hasattr(h, "finish"):
            await self._install_hints(h)   # (a bad hint failed the write that carried it)

    def _unread(self, ino: int) -> None:
        if n := self._reading.pop(ino, 1) - 1:
            self._reading[ino] = n
        elif self.writes is not None:    # a delete held for its readers may run
            self.writes.queue.readers_closed(ino)

    @_edge
    async def release(self, fh):
        h = self._handles.pop(fh, None)
        if isinstance(h, FileHandle):
            self._unread(h.node.inode)
            if h.readahead is not None and not h.direct:   # read whole: in the page cache
                for i in h.readahead.finished(self.store.nblocks(h.pinned), h.pinned.size):
                    self.store.consumed(h.pinned, i)
            if h.journal is not None:
                await self.writes.release(h.journal)
        elif self.writes is not None and self.writes.owns(h):
            await self.writes.release(h)
        elif h is not None and hasattr(h, "finish"):
            try:
                await self._install_hints(h)   # the hints, if no fsync() installed them
            except UserError as exc:     # nobody to tell but the log: close() returned
                log.warning("hints written and closed, but refused: %s", exc)

    async def _install_hints(self, h) -> None:
        """The hints file's close or fsync: its order is sealed in a worker thread and
        installed here (the prefetcher lives on this thread)."""
        h.install(await trio.to_thread.run_sync(h.finish))

    # -- a --writable mount: the handlers delegate to neuralcache/write/ ----------------
    def _writable(self):
        if self.writes is None:
            raise pyfuse3.FUSEError(errno.EROFS)
        return self.writes

    @_edge
    async def create(self, parent_inode, name, mode, flags, ctx):
        w = self._writable()
        if control.is_control_inode(parent_inode):
            raise pyfuse3.FUSEError(errno.EACCES)
        h, node = await w.create(parent_inode, os.fsdecode(name), flags, ctx.pid)
        self.ns.remember(node)
        self.stats.opens += 1
        return pyfuse3.FileInfo(fh=self._new_fh(h)), self._attrs(node)

    @_edge
    async def mkdir(self, parent_inode, name, mode, ctx):
        w = self._writable()
        if control.is_control_inode(parent_inode):
            raise pyfuse3.FUSEError(errno.EACCES)
        node = await w.mkdir(parent_inode, os.fsdecode(name))
        self.ns.remember(node)
        return self._attrs(node)

    @_edge
    async def unlink(self, parent_inode, name, ctx):
        await self._writable().unlink(parent_inode, os.fsdecode(name))

    @_edge
    async def rmdir(self, parent_inode, name, ctx):
        await self._writable().rmdir(parent_inode, os.fsdecode(name))

    @_edge
    async def rename(self, parent_inode_old, name_old, parent_inode_new, name_new, flags,
                     ctx):
        if control.is_control_inode(parent_inode_old) or \
                control.is_control_inode(parent_inode_new):
            raise pyfuse3.FUSEError(errno.EACCES)
        await self._writable().rename(parent_inode_old, os.fsdecode(name_old),
                                      parent_inode_new, os.fsdecode(name_new), flags)

    @_edge
    async def fsync(self, fh, datasync):
        """Returns once the remote has the file (EIO if it cannot get it); the hints
        file: installs what was written (publish_order's barrier)."""
        h = self._handles.get(fh)
        if h is not None and not isinstance(h, FileHandle) and hasattr(h, "finish"):
            await self._install_hints(h)
            return
        if self.writes is None:
            return
        if self.writes.owns(h):
            await self.writes.fsync(h)
        elif isinstance(h, FileHandle) and not h.node.removed:   # (its delete waits)
            await self.writes.fsync_key(h.node.key)

    @_edge
    async def fsyncdir(self, fh, datasync):
        h = self._handles.get(fh)
        if self.writes is not None and isinstance(h, DirHandle) and h.node is not None:
            await self.writes.fsyncdir(h.node)

    def _repin(self, info, *, key: str | None = None, inode: int | None = None) -> None:
        """Open handles read ``info``'s object from now on: those pinned to ``key`` once
        a rename's copy is on the remote (the old key goes next), the read-only ones of
        ``inode`` once this mount uploaded it (the write layer re-pins its own); not
        those of a file unlinked since (review), unless it is the file this move
        renamed (unlinked after the rename: its delete waits for its readers)."""
        if key is None and not self._reading.get(inode):
            return                      # no read-only open of it: nothing to scan
        for h in self._handles.values():
            p = getattr(h, "pinned", None)
            if p is None:
                continue
            node = h.node if (ro := isinstance(h, FileHandle)) else self.ns.get(h.inode)
            if node is None or (node.removed and node.key != info.key):   # (docstring)
                continue
            if p.key == key or (ro and node.inode == inode):
                h.pinned = Pinned(info.key, info.version, info.size)

    # -- everything else is read-only ---------------------------------------------------
    # getxattr, listxattr: not implemented; pyfuse3's ENOSYS stops the kernel asking
    # (fc->no_getxattr): `ls -l` of 100k files made 200k of them (security.selinux...).

    async def _erofs(self, *args, **kwargs):
        """Read-only: EROFS; writable: links, device nodes and xattrs are not kept."""
        raise pyfuse3.FUSEError(errno.EROFS if self.writes is None else errno.EOPNOTSUPP)

    mknod = symlink = link = _erofs
    setxattr = removexattr = _erofs

    def open_handles(self) -> int:
        return len(self._handles)

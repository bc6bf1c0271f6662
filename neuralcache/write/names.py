"""Name changes of a writable mount: unlink, mkdir, rmdir, rename, and keeping them
visible across a re-listing of the remote (a mix-in of layer.WriteLayer).

The namespace changes at once, in one trio step (so a directory rename is atomic for
readers on this node); the remote follows through the operation queue:

* a file still in the journal is renamed in the journal: its pending upload is
  cancelled and queued again under the new name (never uploaded twice);
* an uploaded file is copied on the remote and its source deleted (``move``), with
  the intent record first, so a crash in between finishes the job at the next mount;
  until then reads of the new name read the old key (``moved``);
* a directory rename does that for every file under it; S3 has no directories, so
  directories exist as parents of files, or in this mount's namespace only when made
  by mkdir (or emptied by unlink) here: an empty directory does not outlive the mount.
"""
from __future__ import annotations

import logging
import os
import time

from ..errors import (AlreadyExists, DirectoryNotEmpty, InvalidChange, IsADirectory,
                      NeuralCacheError, NotADirectory, NotFound)
from ..namespace import Node
from .files import LOCAL_VERSION
from .limits import check_key, check_name
from .opqueue import Op, under

log = logging.getLogger(__name__)

RENAME_NOREPLACE = 1     # linux/fs.h
# Finished operations are kept this long for ``claimed_keys``: longer than any listing
# of one directory takes (a page per round trip: 100 pages of a 100k-entry directory
# at 60 ms is 6 s).
RECENT_KEEP_S = 600.0
RENAME_EXCHANGE = 2


def _join(parent: str, name: str) -> str:
    return f"{parent}/{name}" if parent else name


class NameOps:
    # -- lookups ------------------------------------------------------------------
    def _dir(self, inode: int) -> Node:
        node = self.ns.get(inode)
        if node is None or node.removed:
            raise NotFound("the directory was removed")
        if not node.is_dir:
            raise NotADirectory(f"{node.key} is not a directory")
        return node

    async def _listed_dir(self, inode: int) -> Node:
        """The directory, with all its entries listed (a change needs all of them)."""
        node = self._dir(inode)
        await self.lister.ready(node)
        return node

    def _child(self, parent_inode: int, name: str) -> Node:
        self._dir(parent_inode)
        node = self.ns.child(parent_inode, name)
        if node is None:
            raise NotFound(f"{name}: no such file or directory")
        return node

    def _check_create_over(self, existing: Node, flags: int) -> None:
        if flags & os.O_EXCL:
            raise AlreadyExists(f"{existing.key} exists")
        if existing.is_dir:
            raise IsADirectory(f"{existing.key} is a directory")

    def _touch(self, *dirs: Node) -> None:
        """An entry of each of ``dirs`` was added, removed or renamed: its mtime and
        ctime are now (POSIX; S3 keeps no directory times, so they last until the next
        listing)."""
        now = time.time()
        for d in dirs:
            d.mtime = d.ctime = now

    def keep_dir(self, key: str) -> None:
        """Keep directory ``key`` while this mount runs, even with nothing under it on
        the remote (a listing leaves it as it is: ``claimed_keys``)."""
        self.local_dirs.add(key)

    def _keep_parent(self, node: Node) -> None:
        """POSIX keeps a directory whose last entry goes; S3 would not: remember it."""
        parent = self.ns.get(node.parent)
        if parent is not None and parent.key and len(self.ns.page(parent.inode, 0, 2)) <= 1:
            self.keep_dir(parent.key)

    # -- unlink, mkdir, rmdir -----------------------------------------------------
    async def unlink(self, parent_inode: int, name: str) -> None:
        await self._listed_dir(parent_inode)
        node = self._child(parent_inode, name)
        if node.is_dir:
            raise IsADirectory(f"{node.key} is a directory")
        if await self._hold_for_writers(node):
            return await self.unlink(parent_inode, name)       # awaited: look again
        acts, released, new_ops, _ = self._forget_file(node, delete_remote=True)
        self._keep_parent(node)
        self.ns.remove(node)
        node.ctime = time.time()
        self._touch(self._dir(parent_inode))
        await self._commit("unlink", acts, new_ops, released, path=node.key)
        await self.staging_removed()

    def _forget_file(self, node: Node, delete_remote: bool
                     ) -> tuple[list[dict], list[str], list[Op], bool]:
        """Drop ``node``'s journal state; queue a delete if the remote may hold it.
        Returns (acts, released stagings, new ops, the remote may hold it)."""
        key = node.key
        lf = self.files.get(node.inode)
        cancelled = self._cancel_tail_puts(key)
        acts = [{"a": "cancel", "id": c.id} for c in cancelled]
        released = [c.staging for c in cancelled]
        may_hold = self.queue.remote_bound(key) or (
            lf.remote_base if lf is not None else not node.version.startswith(LOCAL_VERSION))
        if delete_remote:      # (readers.py; before the pending rename is forgotten)
            self._pin_readers(node.inode, may_hold and lf is None)
        self.moved.pop(key, None)
        new_ops = []
        if delete_remote and may_hold:
            # open for reading here: the remote keeps it for them (opqueue.py)
            readers = self.queue.reading(node.inode)
            op = self.queue.new("delete", key, hold=node.inode if readers else None)
            acts.append(op.act())
            new_ops.append(op)
        if lf is not None:
            self._stop_stream(lf, "unlinked")
            lf.unlinked = True
            if lf.writers == 0:
                self._forget_local(lf)
            elif self.files.get(lf.inode) is lf:
                del self.files[lf.inode]       # its writers write into the void
        return acts, released, new_ops, may_hold

    async def _hold_for_writers(self, node: Node) -> bool:
        """Before ``node`` is unlinked or replaced by a rename: if write handles that
        have not written yet hold it open, copy its data into the journal for them
        (POSIX lets them go on writing and reading the unlinked file; the remote copy
        they would otherwise read is about to be deleted or overwritten).  True if this
        awaited: the caller looks its names up again.  It copies the whole file, paid
        only when such a descriptor exists.  A copy that fails is logged and the removal
        goes ahead: those handles then get ENOENT, as they would without it.  When
        another descriptor already wrote (the journal holds the file), they join its
        copy now, while it is still reachable by inode."""
        if node.is_dir or not self._lazy.get(node.inode):
            return False
        if (lf := self.files.get(node.inode)) is not None:
            for h in list(self._lazy.get(node.inode, ())):
                self._attach(h, lf)
            return False
        if node.version.startswith(LOCAL_VERSION):
            return False
        try:
            lf = await self._new_local(node.key, node, node.size)
        except NeuralCacheError as exc:
            log.warning("%s: removed while open for writing; its data could not be kept "
                        "for the open descriptors: %s", node.key, exc)
            return False
        for h in list(self._lazy.get(node.inode, ())):
            self._attach(h, lf)
        return True

    async def mkdir(self, parent_inode: int, name: str) -> Node:
        parent = await self._listed_dir(parent_inode)
        if self.ns.child(parent_inode, name) is not None:
            raise AlreadyExists(f"{_join(parent.key, name)} exists")
        check_name(name)
        check_key(self.backend, _join(parent.key, name), 2)   # room for "/x" below it
        node = self.ns.make_dirs(_join(parent.key, name))
        self.keep_dir(node.key)
        self._touch(parent)
        return node

    async def rmdir(self, parent_inode: int, name: str) -> None:
        await self._listed_dir(parent_inode)
        node = self._child(parent_inode, name)
        if not node.is_dir:
            raise NotADirectory(f"{node.key} is not a directory")
        await self.lister.ready(node)
        if self.ns.has_children(node):
            raise DirectoryNotEmpty(f"{node.key} is not empty")
        self._keep_parent(node)
        self.local_dirs.discard(node.key)
        self.ns.remove(node)
        self._touch(self._dir(parent_inode))

    # -- rename ---------------------------------------------------------------------
    async def rename(self, old_parent: int, old_name: str, new_parent_inode: int,
                     new_name: str, flags: int) -> None:
        if flags & RENAME_EXCHANGE:
            raise InvalidChange("RENAME_EXCHANGE is not supported")
        await self._listed_dir(old_parent)
        node = self._child(old_parent, old_name)
        new_parent = await self._listed_dir(new_parent_inode)
        if node.is_dir:
            await self.lister.ready_tree(node)      # every file under it moves
        target = self.ns.child(new_parent_inode, new_name)
        if target is not None and target.is_dir:
            await self.lister.ready(target)
        if target is node:
            return
        if target is not None and flags & RENAME_NOREPLACE:
            raise AlreadyExists(f"{target.key} exists")
        src, dst = node.key, _join(new_parent.key, new_name)
        check_name(new_name)
        check_key(self.backend, dst, max((len(f.key.encode("utf-8", "surrogateescape"))
                                          - len(src.encode("utf-8", "surrogateescape"))
                                          for f in self.ns.subtree(node)), default=0))
        if node.is_dir:
            if under(dst, src):
                raise InvalidChange(f"cannot move {src} into itself")
            if target is not None and not target.is_dir:
                raise NotADirectory(f"{dst} is not a directory")
            if target is not None and self.ns.has_children(target):
                raise DirectoryNotEmpty(f"{dst} is not empty")
        elif target is not None and target.is_dir:
            raise IsADirectory(f"{dst} is a directory")
        if target is not None and await self._hold_for_writers(target):
            return await self.rename(old_parent, old_name, new_parent_inode, new_name,
                                     flags)                    # awaited: look again
        acts: list[dict] = []
        released: list[str] = []
        new_ops: list[Op] = []
        target_held = False
        if target is not None:
            if target.is_dir:
                self.local_dirs.discard(target.key)
            else:
                acts, released, new_ops, target_held = self._forget_file(target, False)
            self.ns.remove(target)
        moving = [n for n in self.ns.subtree(node) if not n.is_dir]
        for f in moving:
            k2 = dst + f.key[len(src):]
            a, r, o = self._move_file(f, f.key, k2, target_held and f is node)
            acts += a
            released += r
            new_ops += o
        self._keep_parent(node)
        self.ns.move(node, new_parent, new_name)
        for f in moving:
            if (lf := self.files.get(f.inode)) is not None:
                lf.key = f.key
        for d in [d for d in self.local_dirs if under(d, src)]:
            self.local_dirs.discard(d)
            self.local_dirs.add(dst + d[len(src):])
        self._touch(self._dir(old_parent), new_parent)
        node.ctime = time.time()
        await self._commit("rename", acts, new_ops, released, src=src, dst=dst)
        await self.staging_removed()

    def _move_file(self, f: Node, k: str, k2: str, target_held: bool
                   ) -> tuple[list[dict], list[str], list[Op]]:
        lf = self.files.get(f.inode)
        if lf is None:            # only on the remote: copy there, then delete the source
            op = self.queue.new("move", k2, src=k)
            self.moved[k2] = self.moved.pop(k, k)
            return [op.act()], [], [op]
        self._stop_stream(lf, "renamed")
        cancelled = self._cancel_tail_puts(k)
        acts = [{"a": "cancel", "id": c.id} for c in cancelled]
        released = [c.staging for c in cancelled]
        new_ops: list[Op] = []
        remote_has = self.queue.remote_bound(k) or lf.remote_base
        if cancelled:         # the newest cancelled upload goes to the new name instead
            op = self.queue.new("put", k2, staging=cancelled[0].staging,
                                size=cancelled[0].size)
            acts.append(op.act())
            new_ops.append(op)
            if remote_has:
                d = self.queue.new("delete", k)
                acts.append(d.act())
                new_ops.append(d)
            lf.remote_base = target_held
        elif remote_has:      # uploaded (or uploading): the remote renames it
            op = self.queue.new("move", k2, src=k)
            acts.append(op.act())
            new_ops.append(op)
            lf.remote_base = True
        else:                 # nothing recorded yet: its close() uploads to the new name
            lf.remote_base = target_held
        return acts, released, new_ops

    def _moved(self, op: Op, info) -> None:
        """A move's copy is on the remote (its source is deleted next): reads of names
        that pointed at its source now read its destination, and open handles follow
        (the copy holds what the source held: later writes to the source's name
        queue after this move)."""
        for k, src in list(self.moved.items()):
            if src == op.src:
                if k == op.key:
                    del self.moved[k]
                else:
                    self.moved[k] = op.key
        if info is None:
            return
        if self.repin is not None:
            self.repin(info, key=op.src)
        self._follow_move(op.src, info)            # (readers.py)
        node = self.ns.by_path(op.key)
        if node is None or node.is_dir or op.key in self.moved:
            return
        lf = self.files.get(node.inode)
        if lf is not None:
            # renamed while its upload ran: the copy is that upload, so the remote
            # now has exactly this file unless it changed since
            if lf.sealed and not lf.dirty and not self.queue.puts_of(lf.staging):
                lf.remote_base = True
                lf.uploaded = info
                if lf.writers == 0:
                    self._uploaded(lf, info)
            return
        node.version, node.size, node.checked = info.version, info.size, time.monotonic()

    # -- directories and re-listing -------------------------------------------------
    async def fsyncdir(self, node: Node) -> None:
        await self.fsync_key(node.key, tree=True)

    def claimed_keys(self, since: float) -> set[str]:
        """Keys a listing begun at ``since`` (time.monotonic()) may show wrong: this
        mount's files not yet uploaded, its pending and just finished operations, its
        own directories, and every directory above one of them.  meta/lister.py leaves
        them as they are when it applies a listing."""
        keys = set(self.local_dirs) | set(self.moved) | set(self.moved.values())
        keys.update(lf.key for lf in self.files.values())
        now = time.monotonic()
        while self._recent and self._recent[0][0] < now - RECENT_KEEP_S:
            self._recent.popleft()
        # Finished operations count whatever ``since`` says: a listing begun after one
        # may still show what it changed (a store's deletes that lag, or SeaweedFS's
        # directory entries that outlive their last object).
        ops = list(self.queue.ops.values()) + [op for _, op in self._recent]
        for op in ops:
            keys.add(op.key)
            if op.src:
                keys.add(op.src)
        for k in list(keys):
            while "/" in k:
                k = k.rpartition("/")[0]
                if k in keys:
                    break
                keys.add(k)
        return keys

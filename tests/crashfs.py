"""A disk that loses power: an in-memory FUSE filesystem that keeps only what was made
durable (test-only; tests/test_power_loss.py puts the write journal on it).

Each file keeps two contents: what readers see now, and what it held at its last
fsync/fdatasync.  Each directory keeps two entry tables: its entries now, and its
entries at its last fsync (of the directory).  That is stricter than LazyFS, which
keeps directory entries: here a file created, written and fsynced but whose directory
was never fsynced is gone after the crash, as it may be on ext4 or XFS.

On SIGUSR1 the process writes the durable state (and nothing else) to ``--image`` and
exits, unmounting: that is the power cut.  Started again with the same ``--image``,
it serves that state, as a rebooted machine would.  The kernel's caches go with the
unmount, so nothing it held survives either.

    python tests/crashfs.py MOUNTPOINT --image FILE

Writes "ready" on stdout once mounted.  Modes, owners, links and xattrs are not
needed by the journal and are not kept (files 0644, directories 0755, root owns).
"""
from __future__ import annotations

import argparse
import errno
import os
import pickle
import signal
import stat
import sys
import time

import pyfuse3
import trio

ROOT = pyfuse3.ROOT_INODE


class Node:
    __slots__ = ("ino", "is_dir", "data", "synced", "entries", "synced_entries", "mtime",
                 "opens")

    def __init__(self, ino: int, is_dir: bool):
        self.ino, self.is_dir = ino, is_dir
        self.data = bytearray()
        self.synced = b""
        self.entries: dict[bytes, int] = {}
        self.synced_entries: dict[bytes, int] = {}
        self.mtime = time.time()
        self.opens = 0


class CrashFS(pyfuse3.Operations):
    supports_dot_lookup = False
    enable_writeback_cache = False

    def __init__(self, image: str):
        super().__init__()
        self.image = image
        self.nodes: dict[int, Node] = {}
        self.parent: dict[int, int] = {}
        self.next_ino = ROOT + 1
        if os.path.exists(image):
            with open(image, "rb") as f:
                durable = pickle.load(f)
            self._load(durable)
        else:
            self.nodes[ROOT] = Node(ROOT, True)
            self.parent[ROOT] = ROOT

    # -- the power cut -----------------------------------------------------------------
    def durable(self) -> dict:
        """What survives: the nodes reachable from the root through synced entries,
        each with its synced content."""
        out, todo = {}, [ROOT]
        while todo:
            ino = todo.pop()
            n = self.nodes[ino]
            if n.is_dir:
                out[ino] = ("d", dict(n.synced_entries))
                todo.extend(i for i in n.synced_entries.values() if i in self.nodes)
            else:
                out[ino] = ("f", bytes(n.synced))
        return {"nodes": out, "next": self.next_ino, "dropped": self.dropped()}

    def dropped(self) -> dict:
        """What the power cut loses: bytes of file data, directory entries."""
        data = sum(len(n.data) for n in self.nodes.values()
                   if not n.is_dir and bytes(n.data) != n.synced)
        entries = sum(len(set(n.entries.items()) ^ set(n.synced_entries.items()))
                      for n in self.nodes.values() if n.is_dir)
        return {"files_changed_since_fsync": data, "entries_changed_since_fsync": entries}

    def _load(self, durable: dict) -> None:
        for ino, (kind, content) in durable["nodes"].items():
            n = Node(ino, kind == "d")
            if n.is_dir:
                n.entries = {k: v for k, v in content.items() if v in durable["nodes"]}
                n.synced_entries = dict(n.entries)
                for child in n.entries.values():
                    self.parent[child] = ino
            else:
                n.data, n.synced = bytearray(content), content
            self.nodes[ino] = n
        self.parent[ROOT] = ROOT
        self.next_ino = durable["next"]

    # -- helpers -----------------------------------------------------------------------
    def _node(self, ino: int) -> Node:
        n = self.nodes.get(ino)
        if n is None:
            raise pyfuse3.FUSEError(errno.ENOENT)
        return n

    def _dir(self, ino: int) -> Node:
        n = self._node(ino)
        if not n.is_dir:
            raise pyfuse3.FUSEError(errno.ENOTDIR)
        return n

    def _attrs(self, n: Node) -> pyfuse3.EntryAttributes:
        a = pyfuse3.EntryAttributes()
        a.st_ino = n.ino
        a.st_mode = (stat.S_IFDIR | 0o755) if n.is_dir else (stat.S_IFREG | 0o644)
        a.st_nlink = 2 if n.is_dir else 1
        a.st_size = 0 if n.is_dir else len(n.data)
        a.st_atime_ns = a.st_mtime_ns = a.st_ctime_ns = int(n.mtime * 1e9)
        a.st_uid, a.st_gid = os.getuid(), os.getgid()
        a.st_blksize = 4096
        a.st_blocks = (a.st_size + 511) // 512
        a.entry_timeout = a.attr_timeout = 0
        return a

    def _new(self, parent: Node, name: bytes, is_dir: bool) -> Node:
        if name in parent.entries:
            raise pyfuse3.FUSEError(errno.EEXIST)
        n = Node(self.next_ino, is_dir)
        self.next_ino += 1
        self.nodes[n.ino] = n
        self.parent[n.ino] = parent.ino
        parent.entries[name] = n.ino
        parent.mtime = time.time()
        return n

    def _maybe_free(self, ino: int) -> None:
        n = self.nodes.get(ino)
        if n is None or n.opens or ino == ROOT:
            return
        if any(ino in d.entries.values() or ino in d.synced_entries.values()
               for d in self.nodes.values() if d.is_dir):
            return
        del self.nodes[ino]

    # -- operations --------------------------------------------------------------------
    async def lookup(self, parent_inode, name, ctx=None):
        p = self._dir(parent_inode)
        if name == b".":
            return self._attrs(p)
        if name == b"..":
            return self._attrs(self._node(self.parent.get(p.ino, ROOT)))
        ino = p.entries.get(name)
        if ino is None:
            raise pyfuse3.FUSEError(errno.ENOENT)
        return self._attrs(self._node(ino))

    async def getattr(self, inode, ctx=None):
        return self._attrs(self._node(inode))

    async def setattr(self, inode, attr, fields, fh, ctx):
        n = self._node(inode)
        if fields.update_size:
            if n.is_dir:
                raise pyfuse3.FUSEError(errno.EISDIR)
            size = attr.st_size
            if size < len(n.data):
                del n.data[size:]
            else:
                n.data.extend(bytes(size - len(n.data)))
        if fields.update_mtime:
            n.mtime = attr.st_mtime_ns / 1e9
        elif fields.update_size:
            n.mtime = time.time()
        return self._attrs(n)

    async def statfs(self, ctx):
        s = pyfuse3.StatvfsData()
        s.f_bsize = s.f_frsize = 4096
        s.f_blocks = s.f_bfree = s.f_bavail = 1 << 20     # 4 GiB, all free
        s.f_files = s.f_ffree = s.f_favail = 1 << 20
        s.f_namemax = 255
        return s

    async def opendir(self, inode, ctx):
        self._dir(inode)
        return inode

    async def readdir(self, fh, start_id, token):
        d = self._dir(fh)
        items = sorted(d.entries.items())
        for i in range(start_id, len(items)):
            name, ino = items[i]
            if not pyfuse3.readdir_reply(token, name, self._attrs(self.nodes[ino]), i + 1):
                break

    async def releasedir(self, fh):
        pass

    async def fsyncdir(self, fh, datasync):
        d = self._dir(fh)
        d.synced_entries = dict(d.entries)
        for ino in list(self.nodes):
            self._maybe_free(ino)

    async def mkdir(self, parent_inode, name, mode, ctx):
        return self._attrs(self._new(self._dir(parent_inode), name, True))

    async def create(self, parent_inode, name, mode, flags, ctx):
        n = self._new(self._dir(parent_inode), name, False)
        n.opens += 1
        return pyfuse3.FileInfo(fh=n.ino), self._attrs(n)

    async def open(self, inode, flags, ctx):
        n = self._node(inode)
        if n.is_dir:
            raise pyfuse3.FUSEError(errno.EISDIR)
        if flags & os.O_TRUNC:
            del n.data[:]
        n.opens += 1
        return pyfuse3.FileInfo(fh=inode)

    async def read(self, fh, off, size):
        return bytes(self._node(fh).data[off:off + size])

    async def write(self, fh, off, buf):
        n = self._node(fh)
        if off > len(n.data):
            n.data.extend(bytes(off - len(n.data)))
        n.data[off:off + len(buf)] = buf
        n.mtime = time.time()
        return len(buf)

    async def fsync(self, fh, datasync):
        n = self._node(fh)
        n.synced = bytes(n.data)

    async def flush(self, fh):
        pass

    async def release(self, fh):
        n = self.nodes.get(fh)
        if n is not None:
            n.opens -= 1
            self._maybe_free(fh)

    async def unlink(self, parent_inode, name, ctx):
        p = self._dir(parent_inode)
        ino = p.entries.get(name)
        if ino is None:
            raise pyfuse3.FUSEError(errno.ENOENT)
        if self.nodes[ino].is_dir:
            raise pyfuse3.FUSEError(errno.EISDIR)
        del p.entries[name]
        p.mtime = time.time()
        self._maybe_free(ino)

    async def rmdir(self, parent_inode, name, ctx):
        p = self._dir(parent_inode)
        ino = p.entries.get(name)
        if ino is None:
            raise pyfuse3.FUSEError(errno.ENOENT)
        d = self._dir(ino)
        if d.entries:
            raise pyfuse3.FUSEError(errno.ENOTEMPTY)
        del p.entries[name]
        p.mtime = time.time()
        self._maybe_free(ino)

    async def rename(self, parent_inode_old, name_old, parent_inode_new, name_new, flags,
                     ctx):
        if flags:
            raise pyfuse3.FUSEError(errno.EINVAL)
        old, new = self._dir(parent_inode_old), self._dir(parent_inode_new)
        ino = old.entries.get(name_old)
        if ino is None:
            raise pyfuse3.FUSEError(errno.ENOENT)
        target = new.entries.get(name_new)
        if target is not None and self.nodes[target].is_dir:
            if self.nodes[target].entries:
                raise pyfuse3.FUSEError(errno.ENOTEMPTY)
        del old.entries[name_old]
        new.entries[name_new] = ino
        self.parent[ino] = new.ino
        old.mtime = new.mtime = time.time()
        if target is not None and target != ino:
            self._maybe_free(target)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("mountpoint")
    ap.add_argument("--image", required=True, help="where the durable state is kept")
    args = ap.parse_args(argv)
    fs = CrashFS(args.image)

    async def run():
        async def on_power_cut():
            with trio.open_signal_receiver(signal.SIGUSR1) as sigs:
                async for _ in sigs:
                    state = fs.durable()
                    with open(args.image + ".tmp", "wb") as f:
                        pickle.dump(state, f)
                    os.replace(args.image + ".tmp", args.image)
                    print("power cut: dropped", state["dropped"], flush=True)
                    pyfuse3.terminate()
                    return

        async with trio.open_nursery() as n:
            n.start_soon(on_power_cut)
            print("ready", flush=True)
            await pyfuse3.main()
            n.cancel_scope.cancel()

    opts = set(pyfuse3.default_options) | {"fsname=crashfs"}
    opts.discard("default_permissions")
    pyfuse3.init(fs, args.mountpoint, opts)
    try:
        trio.run(run)
    finally:
        pyfuse3.close(unmount=True)


if __name__ == "__main__":
    sys.exit(main())

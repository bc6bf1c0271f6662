"""The namespace: the entries of the directories listed so far, and the inode table.

Entries are rows of a SQLite table on local disk (meta/rows.py says why), filled a
directory at a time by meta/lister.py as the job looks into directories, never all
at mount.  In memory there are only:

* ``dirs``: a small state per known directory (its key, whether and when it was
  listed, how many subdirectories it has, readdir's next offset);
* ``Node`` objects for the entries someone holds right now (an open file, the write
  layer): one canonical object per inode while referenced (a weak map), gone with the
  last reference.  Setting a Node's size, version, times, name or parent writes the
  row; reading it reads the object.

Inode numbers are given out in order and stay with their entry for the life of the
mount; lookup counts follow the FUSE protocol (``remember`` adds, ``forget``
subtracts) and are kept in the row (additions wait in memory a while: Rows.add_lookups),
so an entry removed from the remote stays resolvable by inode until the kernel forgets
it.

Directories come from key prefixes.  A key that is both an object and a prefix of
other keys (S3 allows "a" and "a/b") shows as a directory; the object is hidden and
logged.  A prefix with no object under it (a store's leftover directory entry) does not
count: the lister drops it first (meta/lister.py ``objects_win``).  No I/O but the table's, no trio.
"""
from __future__ import annotations

import logging
import os
import sys
import tempfile
import time
import weakref
from typing import Iterable

import lru

from .backends.base import ObjectInfo
from .meta.rows import DEFAULT_CACHE_BYTES, DB_NAME, Row, Rows

log = logging.getLogger(__name__)

ROOT_INODE = 1
# Inodes below this are reserved for the control directory and its files.
FIRST_FREE_INODE = 16
# Nodes kept in memory after their last use, by inode and by (parent, name)
# (``_Identity``: LRUs of strong references beside its weak map of live Nodes): a cold
# small file's lookup, open and the prefetcher's resolve of it, and resolve's
# directory, found each Node by a table query on the trio thread (py-spy of
# bench.breakdown's cold files: Namespace.get 7.7 % of its samples, then
# Namespace.child 9.5 %, nearly all sqlite).
# ~200 bytes each: 4,096 cost ~1 MB.  Only what the table already says is kept: every
# change of a row goes through its Node, and the rows a listing eviction deletes are
# dropped here too (evict_listing).  bench/RESULTS.md "Round 2, seventh sitting".
RECENT_NODES = 4096
# Directory paths ``resolve`` remembers (path -> inode, ~150 bytes each): ImageNet's
# train/ has 1,000 class directories; past this, paths are walked from the root.
DIR_INOS_MAX = 65536


class _Column:
    """A Node attribute kept in its row: setting it writes the row."""

    def __set_name__(self, owner, name):
        self.col, self.slot = name, "_" + name

    def __get__(self, obj, owner=None):
        return self if obj is None else getattr(obj, self.slot)

    def __set__(self, obj, value):
        setattr(obj, self.slot, value)
        obj._ns.rows.set(obj.inode, self.col, value)


class Node:
    __slots__ = ("_ns", "inode", "is_dir", "_name", "_parent", "_size", "_version",
                 "_mtime", "_checked", "_ctime", "_removed", "__weakref__")
    name = _Column()
    parent = _Column()
    size = _Column()
    version = _Column()
    mtime = _Column()
    checked = _Column()          # time.monotonic() when last confirmed by the remote
    ctime = _Column()            # last change made here (a --writable mount); 0: mtime
    removed = _Column()          # gone from the tree, kept until forgotten

    # What assign() may set: attributes with a slot and no bookkeeping of their own
    # (a name or parent changes through Namespace.move).
    _ASSIGNABLE = frozenset({"size", "version", "mtime", "checked", "ctime", "removed"})

    def assign(self, **values) -> None:
        """Set several columns at once: one row write (each statement is a GIL retake
        on the trio thread, which waits behind busy worker threads: a --writable
        mount's every WRITE sets four)."""
        assert values.keys() <= Node._ASSIGNABLE, values
        self._ns.rows.set_many(self.inode, **values)
        for col, value in values.items():
            setattr(self, "_" + col, value)

    def assign_soon(self, **values) -> None:
        """``assign``, the row written later (meta/rows.py ``set_soon``): for what
        changes on every WRITE of a --writable mount."""
        assert values.keys() <= Node._ASSIGNABLE, values
        for col, value in values.items():       # (first: the bound's write may fail)
            setattr(self, "_" + col, value)
        self._ns.rows.set_soon(self.inode, **values)

    def __init__(self, ns: "Namespace", row: Row):
        self._ns = ns
        self.inode, self.is_dir = row.ino, bool(row.dir)
        self._name, self._parent, self._size, self._version = (row.name, row.parent,
                                                                 row.size, row.version)
        self._mtime, self._checked, self._ctime = row.mtime, row.checked, row.ctime
        self._removed = bool(row.removed)

    @property
    def key(self) -> str:
        """The object key (path under the mount), interned: every open asks for it,
        and the one str is what the predictors' tracker, the access trace and the
        disk tier keep per file, not a copy each (~85 B for an ImageNet path).  An
        interned str leaves the table with its last reference on CPython 3.11 (the
        Debian 12 this runs on); 3.12.0-3.12.5 kept them for good."""
        if self.inode == ROOT_INODE:
            return ""
        d = self._ns.dirs.get(self._parent)
        base = d.key if d is not None else ""
        return sys.intern(f"{base}/{self._name}" if base else self._name)

    def __repr__(self) -> str:
        return f"Node({self.inode}, {self.key!r}{', dir' if self.is_dir else ''})"


class _Identity:
    """The one owner of Node identity: one Node per inode while anything holds it (a
    weak map), and the RECENT_NODES last used kept alive by inode and by (parent, name)
    (LRUs of strong references), so a hot path finds them without a table query."""

    def __init__(self, keep: int):
        self._live: weakref.WeakValueDictionary[int, Node] = weakref.WeakValueDictionary()
        self._by_ino = lru.LRU(keep)
        self._by_name = lru.LRU(keep)

    def adopt(self, ns: "Namespace", row: Row) -> Node:
        """The Node of ``row``: the live one if there is one, else a new one."""
        n = self._live.get(row.ino)
        if n is None:
            n = Node(ns, row)
            self._live[row.ino] = n
        self._by_ino[row.ino] = n
        self._by_name[(row.parent, row.name)] = n
        return n

    def by_inode(self, inode: int) -> Node | None:
        n = self._by_ino.get(inode)
        if n is None:
            n = self._live.get(inode)
            if n is not None:
                self._by_ino[inode] = n
        return n

    def by_name(self, parent: int, name: str) -> Node | None:
        n = self._by_name.get((parent, name))
        # a remembered name is only believed while its Node still says so: a move, a
        # removal or a new entry of that name each change or replace the Node
        if n is not None and n._parent == parent and n._name == name and not n._removed:
            return n
        return None

    def drop(self, inode: int) -> None:
        """The row of ``inode`` is gone."""
        n = self._live.pop(inode, None)
        self._by_ino.pop(inode, None)
        if n is not None:
            self._by_name.pop((n._parent, n._name), None)

    def clear(self) -> None:
        """Keep nothing alive (the Nodes someone holds stay theirs)."""
        self._by_ino.clear()
        self._by_name.clear()

    def forget_unless(self, keep) -> None:
        """Stop keeping alive the remembered Nodes ``keep(node)`` rejects (their rows were
        deleted); a Node someone holds stays that inode's Node."""
        for cache in (self._by_ino, self._by_name):
            for k, node in cache.items():
                if not keep(node):
                    del cache[k]


class DirState:
    """What the namespace knows of one directory (kept for every directory row)."""

    __slots__ = ("key", "listed_at", "complete", "used_at", "nsub", "next_seq", "foreign",
                 "listing", "fingerprint")

    def __init__(self, key: str, complete: bool = False):
        self.key = key
        self.listed_at = 0.0       # monotonic start of the listing its entries come from
        self.complete = complete   # every entry of the listing is in the table
        self.used_at = 0.0         # monotonic time of the last lookup or readdir in it
        self.nsub = 0              # subdirectories (st_nlink = 2 + nsub)
        self.next_seq = 1          # readdir offset of the next entry added
        self.foreign = 0           # entries added while it was not completely listed
        self.listing = None        # meta/lister.py: the listing in progress, if any
        self.fingerprint = None    # of the last listing applied whole (lister.fingerprint)


class Namespace:
    def __init__(self, db_path: str | None = None, cache_bytes: int = DEFAULT_CACHE_BYTES):
        if db_path is None:
            self._tmp = tempfile.TemporaryDirectory(prefix="nc-meta-")
            db_path = os.path.join(self._tmp.name, DB_NAME)
        self.rows = Rows(db_path, cache_bytes)
        self._nodes = _Identity(RECENT_NODES)
        now = time.time()
        self.rows.insert([(ROOT_INODE, 0, "", 1, 0, now, "", 0.0, 0.0, 0)])   # parent 0: none
        self.dirs: dict[int, DirState] = {ROOT_INODE: DirState("")}
        self._dir_inos: dict[str, int] = {}   # resolve's directories, by path
        self._next = FIRST_FREE_INODE
        self.files = 0             # files in the table (listed so far)
        self.total_bytes = 0       # their bytes

    def close(self) -> None:
        self.rows.close()

    # -- nodes ---------------------------------------------------------------------
    def _node(self, row: Row) -> Node:
        return self._nodes.adopt(self, row)

    def get(self, inode: int) -> Node | None:
        n = self._nodes.by_inode(inode)
        if n is not None:
            return n
        row = self.rows.get(inode)
        return self._node(row) if row else None

    @property
    def root(self) -> Node:
        return self.get(ROOT_INODE)

    def child(self, parent: int, name: str) -> Node | None:
        n = self._nodes.by_name(parent, name)
        if n is not None:
            return n
        row = self.rows.child(parent, name)
        return self._node(row) if row else None

    def children(self, node: Node) -> list[Node]:
        """Every entry of a directory, in readdir order (for small directories; readdir
        itself goes through ``page``)."""
        return [self._node(r) for r in self.rows.names(node.inode)] if node.is_dir else []

    def page(self, dir_inode: int, from_seq: int, limit: int) -> list[Row]:
        return self.rows.page(dir_inode, from_seq, limit)

    def has_children(self, node: Node) -> bool:
        return self.rows.has_children(node.inode)

    def subdirs(self, dir_inode: int) -> int:
        d = self.dirs.get(dir_inode)
        return d.nsub if d is not None else 0

    def dir_state(self, node: Node) -> DirState | None:
        return self.dirs.get(node.inode) if node.is_dir else None

    def by_path(self, path: str) -> Node | None:
        return self.resolve(path)[0]

    def resolve(self, path: str) -> tuple[Node | None, int | None]:
        """(the node at ``path``, None) or (None, the inode of the first directory on
        the way whose listing is incomplete: the path may be there once it is listed).
        A directory found on the way is remembered (``_dir_inos``), so the next path in
        it costs one table query, not one per component (the prefetcher resolves every
        predicted file)."""
        parts = path.split("/")
        node = None
        if len(parts) > 1 and all(parts) and (ino := self._dir_inos.get(
                path[:-len(parts[-1]) - 1])) is not None:
            node, parts = self.get(ino), parts[-1:]
        if node is None:
            node, parts = self.get(ROOT_INODE), path.split("/")
        for part in parts:
            if not part:
                continue
            if not node.is_dir:
                return None, None
            child = self.child(node.inode, part)
            if child is None:
                d = self.dirs.get(node.inode)
                return None, (node.inode if d is not None and not d.complete else None)
            if child.is_dir and len(self._dir_inos) < DIR_INOS_MAX and \
                    (d := self.dirs.get(child.inode)) is not None:
                self._dir_inos[d.key] = child.inode
            node = child
        return node, None

    def _dirs_changed(self) -> None:
        """A directory went or moved: the paths ``resolve`` remembers may be wrong."""
        self._dir_inos.clear()

    def children_dirs(self, dir_inode: int) -> list[int]:
        return [r[0] for r in self.rows.db.execute(
            "SELECT ino FROM e WHERE parent = ? AND dir = 1 AND removed = 0", (dir_inode,))]

    def names_in_dir(self, dir_inode: int) -> tuple[str, list[tuple[str, int]]]:
        """The key prefix of a listed directory ("a/b/", "" for the root) and its files'
        (name, size), unordered (predictors/packed.py packs them)."""
        key = self.dirs[dir_inode].key if dir_inode in self.dirs else ""
        self.rows.write_soon()
        rows = self.rows.db.execute(
            "SELECT name, size FROM e WHERE parent = ? AND dir = 0 AND removed = 0",
            (dir_inode,)).fetchall()
        return (f"{key}/" if key else ""), rows

    # -- building (meta/lister.py) -------------------------------------------------------
    def _new_ino(self) -> int:
        ino = self._next
        self._next += 1
        return ino

    def add_listing(self, dir_inode: int, files: Iterable[ObjectInfo], subdirs: Iterable[str],
                    now: float | None = None) -> int:
        """Add what a listing page of a directory shows (``subdirs`` are names) to its
        entries, keeping those it has; returns how many were added."""
        d = self.dirs[dir_inode]
        now = time.monotonic() if now is None else now
        entries: dict[str, ObjectInfo | None] = {}     # name -> object, None: a directory
        for o in files:
            entries[o.key.rpartition("/")[2]] = o
        for name in subdirs:
            if name in entries:
                log.warning("%r is both an object and a prefix; showing the directory",
                            entries[name].key)
            entries[name] = None
        dir_rows, file_rows, file_bytes = [], [], 0
        wall = time.time()
        names = sorted(entries)                        # readdir shows a page by name
        known = self.rows.present(dir_inode, names) if d.foreign else ()
        for name in names:
            if name in known:
                continue
            o = entries[name]
            if o is None:
                dir_rows.append((self._new_ino(), dir_inode, name, 1, 0, wall, "", now, 0.0,
                                 d.next_seq))
            else:
                file_rows.append((self._new_ino(), dir_inode, name, 0, o.size, o.mtime,
                                  o.version, now, 0.0, d.next_seq))
                file_bytes += o.size
            d.next_seq += 1
        self.rows.insert(dir_rows + file_rows)
        for r in dir_rows:
            self.dirs[r[0]] = DirState(f"{d.key}/{r[2]}" if d.key else r[2])
        d.nsub += len(dir_rows)
        self.files += len(file_rows)
        self.total_bytes += file_bytes
        return len(dir_rows) + len(file_rows)

    def _insert_one(self, parent: DirState, parent_ino: int, name: str, is_dir: bool,
                    size: int = 0, version: str = "", mtime: float | None = None,
                    checked: float | None = None) -> Node:
        """One new entry (a probe's answer, a file or directory made here)."""
        ino = self._new_ino()
        mtime = time.time() if mtime is None else mtime
        checked = time.monotonic() if checked is None else checked
        self.rows.insert([(ino, parent_ino, name, int(is_dir), size, mtime, version, checked,
                           0.0, parent.next_seq)])
        parent.next_seq += 1
        if not parent.complete:
            parent.foreign += 1
        if is_dir:
            self.dirs[ino] = DirState(f"{parent.key}/{name}" if parent.key else name,
                                      complete=True)
            parent.nsub += 1
        else:
            self.files += 1
            self.total_bytes += size
        return self.get(ino)

    def add_found(self, dir_inode: int, name: str, info: ObjectInfo | None,
                  is_dir: bool) -> Node:
        """A lookup's probe found ``name`` in a directory still being listed."""
        d = self.dirs[dir_inode]
        if is_dir:
            n = self._insert_one(d, dir_inode, name, True)
            self.dirs[n.inode].complete = False     # its entries are the remote's
            return n
        return self._insert_one(d, dir_inode, name, False, info.size, info.version,
                                info.mtime)

    def evict_listing(self, dir_inode: int) -> None:
        """Forget a directory's entries (none held by the kernel, no subdirectory
        listed): the next look lists it again."""
        d = self.dirs[dir_inode]
        db = self.rows.db
        self.rows.write_soon()
        n, nbytes = db.execute("SELECT count(*), total(size) FROM e WHERE parent = ? AND "
                               "dir = 0 AND removed = 0", (dir_inode,)).fetchone()
        for sub in self.children_dirs(dir_inode):
            self.dirs.pop(sub, None)
        self._dirs_changed()
        held = self.rows.delete_unheld_children(dir_inode)
        self._nodes.forget_unless(      # their Nodes must not outlive the rows
            lambda node: node._parent != dir_inode or node.inode in held)
        self.files -= n
        self.total_bytes -= int(nbytes)
        d.complete, d.listed_at, d.nsub, d.foreign = False, 0.0, 0, 0
        d.fingerprint = None

    # -- changes (a listing that differs, or a --writable mount: neuralcache/write/) -----
    def make_dirs(self, path: str) -> Node:
        """The directory node at ``path``, created with its parents if missing (made
        here: complete, nothing to list).  ValueError if a file is in the way."""
        node = self.get(ROOT_INODE)
        for part in [p for p in path.split("/") if p]:
            child = self.child(node.inode, part)
            if child is None:
                child = self._insert_one(self.dirs[node.inode], node.inode, part, True)
            elif not child.is_dir:
                raise ValueError(f"{child.key} is a file")
            node = child
        return node

    def put_file(self, key: str, size: int, version: str, mtime: float) -> Node:
        """Create or update the file node at ``key`` (parents as needed); ValueError
        if a directory is there."""
        parent_path, _, name = key.rpartition("/")
        parent = self.make_dirs(parent_path)
        node = self.child(parent.inode, name)
        if node is not None and node.is_dir:
            raise ValueError(f"{key} is a directory")
        if node is None:
            return self._insert_one(self.dirs[parent.inode], parent.inode, name, False, size,
                                    version, mtime)
        self.total_bytes += size - node.size
        node.assign(size=size, version=version, mtime=mtime, checked=time.monotonic(),
                    removed=False)
        return node

    def update_object(self, node: Node, info: ObjectInfo, now: float | None = None) -> bool:
        """Record a fresh stat of one object; True if its version changed."""
        changed = info.version != node.version
        if not node.removed:
            self.total_bytes += info.size - node.size
        now = time.monotonic() if now is None else now
        node.assign(size=info.size, version=info.version, mtime=info.mtime, checked=now)
        return changed

    def remove(self, node: Node) -> None:
        """Unlink ``node`` (and, for a directory, everything listed under it): its name
        is free for a new inode; what the kernel holds resolves by inode until
        forgotten."""
        for n in reversed(self.subtree(node)):
            self._drop(n)

    mark_removed = remove

    def _drop(self, n: Node) -> None:
        if n.removed:
            return
        parent = self.dirs.get(n.parent)
        if n.is_dir:
            self._dirs_changed()
            if parent is not None:
                parent.nsub -= 1
        else:
            self.files -= 1
            self.total_bytes -= n.size
        if self.rows.lookups(n.inode) > 0:
            n.removed = True
        else:
            self._delete(n.inode, n.is_dir)
            n._removed = True

    def _delete(self, inode: int, is_dir: bool) -> None:
        self.rows.delete(inode)
        self._nodes.drop(inode)
        if is_dir:
            self.dirs.pop(inode, None)
            self._dirs_changed()

    def move(self, node: Node, new_parent: Node, new_name: str) -> None:
        """Rename ``node`` (a file or a whole directory) to ``new_name`` in
        ``new_parent``, keeping inode numbers; the caller removed any target first."""
        old_parent = self.dirs.get(node.parent)
        np = self.dirs[new_parent.inode]
        # One UPDATE for parent and name: in between, (new parent, old name) may be
        # another live entry's (rename a/x -> b/y beside b/x: the fsmodel found it).
        node._parent, node._name = new_parent.inode, new_name
        self.rows.set_many(node.inode, parent=new_parent.inode, name=new_name,
                           seq=np.next_seq)
        node.checked = time.monotonic()        # a listing begun before must not undo it
        np.next_seq += 1
        if not np.complete:
            np.foreign += 1
        if node.is_dir:
            self._dirs_changed()
            if old_parent is not None:
                old_parent.nsub -= 1
            np.nsub += 1
            old = self.dirs[node.inode].key
            new = f"{np.key}/{new_name}" if np.key else new_name
            for d in self.dirs.values():
                if d.key == old or d.key.startswith(old + "/"):
                    d.key = new + d.key[len(old):]

    def subtree(self, node: Node) -> list[Node]:
        """``node`` and everything listed under it, parents before children."""
        out, todo = [], [node]
        while todo:
            n = todo.pop()
            out.append(n)
            if n.is_dir:
                todo.extend(self.children(n))
        return out

    # -- lookup counts -----------------------------------------------------------------
    def remember(self, node: Node) -> None:
        self.rows.add_lookups(node.inode, 1)

    def remember_inodes(self, inodes: list[int]) -> None:
        self.rows.add_lookup_each(inodes)

    def lookups(self, inode: int) -> int:
        return self.rows.lookups(inode)

    def forget(self, inode: int, n: int) -> None:
        if inode == ROOT_INODE:
            return
        is_dir = self.rows.forget(inode, n)
        if is_dir is not None:          # removed, and the kernel holds it no more
            self._delete(inode, is_dir)

    def __len__(self) -> int:
        return self.rows.count()

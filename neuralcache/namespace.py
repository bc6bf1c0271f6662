"""The namespace: a local snapshot of the remote listing, as an inode tree.

Built from one parallel listing at mount time (no round trip per lookup) and rebuilt by
``apply_listing`` on TTL expiry.  Inode numbers are stable per path for the life of the
mount; lookup counts follow the FUSE protocol (``lookup`` adds, ``forget`` subtracts)
and an entry removed from the remote stays resolvable by inode until forgotten.

Directories come from key prefixes.  A key that is both an object and a prefix of
other keys (S3 allows "a" and "a/b") shows as a directory; the object is hidden and
logged.  Pure data structure: no I/O, no trio.
"""
from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import Iterable

from .backends.base import ObjectInfo

log = logging.getLogger(__name__)

ROOT_INODE = 1
# Inodes below this are reserved for the control directory and its files.
FIRST_FREE_INODE = 16


@dataclass(eq=False)
class Node:
    inode: int
    name: str
    parent: int
    is_dir: bool
    size: int = 0
    version: str = ""
    mtime: float = 0.0
    checked: float = 0.0            # time.monotonic() when last confirmed by the remote
    children: dict[str, "Node"] | None = None
    lookups: int = 0
    removed: bool = False           # gone from the remote, kept until forgotten
    ctime: float = 0.0              # last change here (a --writable mount); 0: mtime

    @property
    def key(self) -> str:
        return self._key

    _key: str = field(default="", repr=False)


class Namespace:
    def __init__(self) -> None:
        now = time.time()
        self.root = Node(ROOT_INODE, "", ROOT_INODE, True, mtime=now, children={})
        self._by_inode: dict[int, Node] = {ROOT_INODE: self.root}
        self._inode_of: dict[str, int] = {"": ROOT_INODE}
        self._next = FIRST_FREE_INODE
        self.listed_at = 0.0       # monotonic time of the last complete listing
        self.files = 0
        self.total_bytes = 0

    # -- building ------------------------------------------------------------------
    def _inode_for(self, key: str, is_dir: bool) -> int:
        tag = key + ("/" if is_dir else "")
        ino = self._inode_of.get(tag)
        if ino is None:
            ino = self._next
            self._next += 1
            self._inode_of[tag] = ino
        return ino

    def apply_listing(self, objects: Iterable[ObjectInfo], now: float | None = None
                      ) -> list[Node]:
        """Replace the tree with ``objects``; returns nodes whose version changed."""
        now = time.monotonic() if now is None else now
        objs = {o.key: o for o in objects}
        dirs: set[str] = set()
        for k in objs:
            parts = k.split("/")
            for i in range(1, len(parts)):
                dirs.add("/".join(parts[:i]))
        for k in [k for k in objs if k in dirs]:
            log.warning("%r is both an object and a prefix; showing the directory", k)
            del objs[k]
        old_nodes = {n.key: n for n in self._by_inode.values()
                     if not n.is_dir and not n.removed}
        changed: list[Node] = []
        new_root = Node(ROOT_INODE, "", ROOT_INODE, True, mtime=self.root.mtime, children={})
        new_root._key = ""
        by_inode: dict[int, Node] = {ROOT_INODE: new_root}
        dir_nodes: dict[str, Node] = {"": new_root}

        def ensure_dir(path: str) -> Node:
            node = dir_nodes.get(path)
            if node is not None:
                return node
            parent_path, _, name = path.rpartition("/")
            parent = ensure_dir(parent_path)
            ino = self._inode_for(path, True)
            prev = self._by_inode.get(ino)
            node = Node(ino, name, parent.inode, True, mtime=new_root.mtime, children={},
                        lookups=prev.lookups if prev else 0, checked=now)
            node._key = path
            parent.children[name] = node
            dir_nodes[path] = node
            by_inode[ino] = node
            return node

        total = 0
        for key in sorted(objs):
            o = objs[key]
            parent_path, _, name = key.rpartition("/")
            parent = ensure_dir(parent_path)
            ino = self._inode_for(key, False)
            prev = old_nodes.pop(key, None)
            node = Node(ino, name, parent.inode, False, o.size, o.version, o.mtime,
                        checked=now, lookups=prev.lookups if prev else 0)
            node._key = key
            if prev is not None and prev.version != o.version:
                changed.append(node)
            parent.children[name] = node
            by_inode[ino] = node
            total += o.size
        # Keep removed-but-still-looked-up nodes resolvable by inode until forget().
        for n in self._by_inode.values():
            if n.inode not in by_inode and n.lookups > 0:
                n.removed = True
                by_inode[n.inode] = n
        self.root = new_root
        self._by_inode = by_inode
        self.listed_at = now
        self.files = len(objs)
        self.total_bytes = total
        return changed

    def update_object(self, node: Node, info: ObjectInfo, now: float | None = None) -> bool:
        """Record a fresh stat of one object; True if its version changed."""
        node.checked = time.monotonic() if now is None else now
        changed = info.version != node.version
        node.size, node.version, node.mtime = info.size, info.version, info.mtime
        return changed

    def mark_removed(self, node: Node) -> None:
        parent = self._by_inode.get(node.parent)
        if parent and parent.children and parent.children.get(node.name) is node:
            del parent.children[node.name]
        node.removed = True
        if node.lookups <= 0:
            self._by_inode.pop(node.inode, None)

    # -- changes made through a writable mount (neuralcache/write/) -------------------
    def make_dirs(self, path: str) -> Node:
        """The directory node at ``path``, created with its parents if missing.
        ValueError if a file is in the way."""
        node = self.root
        walked = []
        for part in [p for p in path.split("/") if p]:
            walked.append(part)
            child = node.children.get(part)
            if child is None:
                key = "/".join(walked)
                ino = self._inode_for(key, True)
                prev = self._by_inode.get(ino)
                child = Node(ino, part, node.inode, True, mtime=time.time(), children={},
                             checked=time.monotonic(), lookups=prev.lookups if prev else 0)
                child._key = key
                node.children[part] = child
                self._by_inode[ino] = child
            elif not child.is_dir:
                raise ValueError(f"{'/'.join(walked)} is a file")
            node = child
        return node

    def put_file(self, key: str, size: int, version: str, mtime: float) -> Node:
        """Create or update the file node at ``key`` (parents as needed); ValueError
        if a directory is there."""
        parent_path, _, name = key.rpartition("/")
        parent = self.make_dirs(parent_path)
        node = parent.children.get(name)
        if node is not None and node.is_dir:
            raise ValueError(f"{key} is a directory")
        if node is None:
            ino = self._inode_for(key, False)
            prev = self._by_inode.get(ino)
            node = Node(ino, name, parent.inode, False, lookups=prev.lookups if prev else 0)
            node._key = key
            parent.children[name] = node
            self._by_inode[ino] = node
            self.files += 1
        else:
            self.total_bytes -= node.size
        node.size, node.version, node.mtime = size, version, mtime
        node.checked = time.monotonic()
        node.removed = False
        self.total_bytes += size
        return node

    def remove(self, node: Node) -> None:
        """Unlink ``node`` (and, for a directory, everything under it): its path is
        free for a new inode; the node resolves by inode until forgotten."""
        for n in self._subtree(node):
            self._inode_of.pop(n.key + ("/" if n.is_dir else ""), None)
            if not n.is_dir:
                self.files -= 1
                self.total_bytes -= n.size
            if n is not node:
                n.removed = True
                if n.lookups <= 0:
                    self._by_inode.pop(n.inode, None)
        self.mark_removed(node)

    def move(self, node: Node, new_parent: Node, new_name: str) -> None:
        """Rename ``node`` (a file or a whole directory) to ``new_name`` in
        ``new_parent``, keeping inode numbers; the caller removed any target first."""
        old = self._by_inode.get(node.parent)
        if old is not None and old.children and old.children.get(node.name) is node:
            del old.children[node.name]
        for n in self._subtree(node):
            self._inode_of.pop(n.key + ("/" if n.is_dir else ""), None)
        node.name, node.parent = new_name, new_parent.inode
        new_parent.children[new_name] = node
        base = f"{new_parent.key}/{new_name}" if new_parent.key else new_name

        def rekey(n: Node, key: str) -> None:
            n._key = key
            self._inode_of[key + ("/" if n.is_dir else "")] = n.inode
            for name, c in (n.children or {}).items():
                rekey(c, f"{key}/{name}")

        rekey(node, base)

    def _subtree(self, node: Node) -> list[Node]:
        out, todo = [], [node]
        while todo:
            n = todo.pop()
            out.append(n)
            todo.extend((n.children or {}).values())
        return out

    # -- queries ------------------------------------------------------------------------
    def get(self, inode: int) -> Node | None:
        return self._by_inode.get(inode)

    def child(self, parent: int, name: str) -> Node | None:
        p = self._by_inode.get(parent)
        if p is None or not p.is_dir or p.children is None:
            return None
        return p.children.get(name)

    def by_path(self, path: str) -> Node | None:
        node = self.root
        for part in [p for p in path.split("/") if p]:
            if node.children is None:
                return None
            node = node.children.get(part)
            if node is None:
                return None
        return node

    def files_in_order(self) -> list[tuple[str, int]]:
        """(key, size) of every file in listing (sorted key) order, for predictors."""
        out: list[tuple[str, int]] = []

        def walk(n: Node) -> None:
            for name in sorted(n.children or {}):
                c = n.children[name]
                if c.is_dir:
                    walk(c)
                else:
                    out.append((c.key, c.size))

        walk(self.root)
        out.sort()
        return out

    # -- lookup counts -----------------------------------------------------------------
    def remember(self, node: Node) -> None:
        node.lookups += 1

    def forget(self, inode: int, n: int) -> None:
        node = self._by_inode.get(inode)
        if node is None or inode == ROOT_INODE:
            return
        node.lookups = max(0, node.lookups - n)
        if node.lookups == 0 and node.removed:
            del self._by_inode[inode]

    def __len__(self) -> int:
        return len(self._by_inode)

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

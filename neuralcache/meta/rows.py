"""The namespace's entries as rows of one SQLite table on local disk.

Why a table and not one Python object per entry: a Python object per file cost 1.3-2.2
KB of daemon memory (1.0 GB for an ImageNet-shaped tree of 1.28 M files).  A row costs
~135 bytes on disk (`python /tmp/sqlbench.py` in issue 19's note: 1.28 M rows, 174 MB)
and the daemon's memory holds only SQLite's page cache, bounded by
``--metadata-cache-size`` whatever the entry count; the rest of the file stays in the
kernel's page cache or on disk.  A point query costs 5-30 us (hot / cold pages), less
than the FUSE round trip it answers.  S3QL and Mountpoint-s3's manifest mode keep their
metadata the same way.

The file is the mount's own (``CACHE_SUBDIR/meta.db``): created empty at mount, never
reused, so no crash consistency is needed (``synchronous=OFF``).  It is used from the
trio thread only (point queries, and bulk changes in chunks small enough not to stall
requests: meta/lister.py).

Schema::

    e(ino INTEGER PRIMARY KEY,   -- the inode number, given out in order, stable while
                                 -- the row lives (for the life of the mount)
      parent INTEGER, name TEXT, dir INTEGER (0/1),
      size INTEGER, mtime REAL, version TEXT, checked REAL, ctime REAL,
      seq INTEGER,               -- order in its directory: readdir offsets
      lookups INTEGER,           -- the kernel's lookup count (FUSE forget protocol),
                                 -- less what waits in memory (add_lookups)
      removed INTEGER)           -- gone from the tree, kept while the kernel holds it
    UNIQUE INDEX (parent, name) WHERE removed = 0
    INDEX (parent, seq)
"""
from __future__ import annotations

import logging
import os
import sqlite3
from typing import Iterable, NamedTuple

# SQLite's page cache: the metadata's memory.  32 MiB holds the hot rows of ~250k
# entries (a row and its index entries take ~135 bytes, so the pages of a 1.28 M-entry
# tree are 174 MB; a job touches a fraction at a time, and a miss is served from the
# kernel's page cache).  After `find` over an ImageNet-shaped tree of 1.28 M files the
# daemon held 122 MB with 32 MiB and 163 MB with 64 MiB (/work/posixfind.py in issue
# 19's note; the target is 150 MB).
DEFAULT_CACHE_BYTES = 32 << 20
DB_NAME = "meta.db"

log = logging.getLogger(__name__)

_COLS = "ino, parent, name, dir, size, mtime, version, checked, ctime, seq, removed"

# Rows per statement of a bulk change.  One statement of many rows, not executemany:
# Python's sqlite3 releases and retakes the GIL around every statement it steps, and
# with other threads busy in Python (the lister's scans) each retake waits a switch
# interval or more.  A 1,281-row page inserted with executemany took 3.5-6.6 ms alone
# and 14.6-18.8 s beside two busy threads; as one statement 3.7 ms alone and 21 ms
# beside them (`python -m bench.tools.gilinsert 2 3`, bench/RESULTS.md, eleventh
# sitting).  3,000 rows of 10 values fit SQLite's 32,766 values per statement, so a
# listing page (1,000 S3 keys, a POSIX directory up to 3,000 entries) is one
# statement, which needs no BEGIN/COMMIT either.
INSERT_ROWS = 3000
_INSERT = ("INSERT OR IGNORE INTO e(ino, parent, name, dir, size, mtime, version, checked, "
           "ctime, seq) VALUES ")
# Lookup counts added (each LOOKUP reply adds one) and not yet written.  A statement per
# LOOKUP is a GIL retake on the trio thread (above): on the 1.28 M-file tree 12 % of
# that thread's samples were in it (py-spy, bench/RESULTS.md twelfth sitting).  They
# are written together (one statement per distinct count) before anything reads or
# deletes by lookup count, and once this many inodes wait; a few KB of memory.
PENDING_LOOKUPS_MAX = 1000
# Attributes set "soon" (``set_soon``) and not yet written, by inode: a --writable
# mount's size, mtime, version and ctime after every FUSE WRITE.  A statement per
# WRITE was 15 % of the trio thread's samples while a 1 GiB file was written in 1 MiB
# writes (py-spy --native --idle, bench/RESULTS.md fortieth sitting): the GIL retake
# after each statement waits behind the worker threads landing the earlier writes.
# They are written before anything reads attributes from the table, and once this
# many inodes wait.
PENDING_SETS_MAX = 1000


class Row(NamedTuple):
    ino: int
    parent: int
    name: str
    dir: int
    size: int
    mtime: float
    version: str
    checked: float
    ctime: float
    seq: int
    removed: int


class Rows:
    def __init__(self, path: str, cache_bytes: int = DEFAULT_CACHE_BYTES):
        self.path = path
        for suffix in ("", "-wal", "-shm", "-journal"):
            try:
                os.unlink(path + suffix)
            except FileNotFoundError:
                pass
        self.db = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
        for pragma in ("journal_mode=OFF", "synchronous=OFF", "temp_store=MEMORY",
                       "locking_mode=EXCLUSIVE", f"cache_size=-{max(1, cache_bytes >> 10)}"):
            self.db.execute("PRAGMA " + pragma)
        self.db.executescript("""
            CREATE TABLE e(ino INTEGER PRIMARY KEY, parent INTEGER NOT NULL,
                           name TEXT NOT NULL, dir INTEGER NOT NULL,
                           size INTEGER NOT NULL DEFAULT 0, mtime REAL NOT NULL DEFAULT 0,
                           version TEXT NOT NULL DEFAULT '', checked REAL NOT NULL DEFAULT 0,
                           ctime REAL NOT NULL DEFAULT 0, seq INTEGER NOT NULL DEFAULT 0,
                           lookups INTEGER NOT NULL DEFAULT 0,
                           removed INTEGER NOT NULL DEFAULT 0);
            CREATE UNIQUE INDEX e_name ON e(parent, name) WHERE removed = 0;
            CREATE INDEX e_seq ON e(parent, seq);
        """)
        self.cache_bytes = cache_bytes
        self._pending: dict[int, int] = {}     # ino -> lookups to add (PENDING_LOOKUPS_MAX)
        self._soon: dict[int, dict] = {}       # ino -> columns to set (PENDING_SETS_MAX)

    def close(self) -> None:
        self.db.close()
        for suffix in ("", "-wal", "-shm", "-journal"):
            try:
                os.unlink(self.path + suffix)
            except FileNotFoundError:
                pass

    # -- reads -----------------------------------------------------------------------
    def get(self, ino: int) -> Row | None:
        if self._soon:
            self.write_soon()
        r = self.db.execute(f"SELECT {_COLS} FROM e WHERE ino = ?", (ino,)).fetchone()
        return Row(*r) if r else None

    def child(self, parent: int, name: str) -> Row | None:
        if self._soon:
            self.write_soon()
        r = self.db.execute(f"SELECT {_COLS} FROM e WHERE parent = ? AND name = ? "
                            "AND removed = 0", (parent, name)).fetchone()
        return Row(*r) if r else None

    def present(self, parent: int, names: list[str]) -> set[str]:
        """Which of ``names`` (at most a listing page's) ``parent`` has, in one query
        per INSERT_ROWS names (a point query each costs a GIL retake: see above)."""
        return {r[0] for _, cur in self._each_in(
            "SELECT name FROM e WHERE parent = ? AND removed = 0 AND name IN (%s)",
            names, parent) for r in cur}

    def _each_in(self, sql: str, values: list, *head):
        """``sql`` run once per INSERT_ROWS of ``values``, its ``IN (%s)`` holding
        them after the ``head`` parameters; yields (the values, the cursor) of each
        statement once it has run."""
        for i in range(0, len(values), INSERT_ROWS):
            part = values[i:i + INSERT_ROWS]
            yield part, self.db.execute(sql % ",".join("?" * len(part)), (*head, *part))

    def page(self, parent: int, from_seq: int, limit: int) -> list[Row]:
        """Entries of ``parent`` with seq >= ``from_seq``, in seq order."""
        if self._soon:
            self.write_soon()
        return [Row(*r) for r in self.db.execute(
            f"SELECT {_COLS} FROM e WHERE parent = ? AND seq >= ? AND removed = 0 "
            "ORDER BY seq LIMIT ?", (parent, from_seq, limit))]

    def names(self, parent: int) -> list[Row]:
        """Every entry of ``parent`` (callers use it on directories they know small, or
        in chunks through ``page``)."""
        return self.page(parent, 0, -1)

    def has_children(self, parent: int) -> bool:
        return self.db.execute("SELECT 1 FROM e WHERE parent = ? AND removed = 0 LIMIT 1",
                               (parent,)).fetchone() is not None

    def lookups(self, ino: int) -> int:
        r = self.db.execute("SELECT lookups FROM e WHERE ino = ?", (ino,)).fetchone()
        return r[0] + self._pending.get(ino, 0) if r else 0

    def held_below(self, parent: int) -> bool:
        """Does the kernel hold any entry of ``parent`` (or one removed from it)?"""
        self._write_lookups()
        return self.db.execute("SELECT 1 FROM e WHERE parent = ? AND lookups > 0 LIMIT 1",
                               (parent,)).fetchone() is not None

    def count(self) -> int:
        return self.db.execute("SELECT count(*) FROM e").fetchone()[0]

    def file_bytes(self) -> int:
        """Bytes of the database (pages in use), on disk."""
        n = self.db.execute("PRAGMA page_count").fetchone()[0]
        return n * self.db.execute("PRAGMA page_size").fetchone()[0]

    # -- writes ------------------------------------------------------------------------
    def insert(self, rows: Iterable[tuple]) -> int:
        """Insert (ino, parent, name, dir, size, mtime, version, checked, ctime, seq)
        tuples in one transaction, skipping names their directory already has (a
        lookup's probe, a file made here, a directory listed before an object of the
        same name); returns how many were inserted."""
        rows = rows if isinstance(rows, list) else list(rows)
        cur = self.db.cursor()

        def put(part: list[tuple]) -> int:
            cur.execute(_INSERT + ",".join(["(?,?,?,?,?,?,?,?,?,?)"] * len(part)),
                        [v for r in part for v in r])
            return max(cur.rowcount, 0)

        if len(rows) <= INSERT_ROWS:          # one statement: atomic by itself
            return put(rows) if rows else 0
        cur.execute("BEGIN")
        try:
            n = sum(put(rows[i:i + INSERT_ROWS]) for i in range(0, len(rows), INSERT_ROWS))
        except BaseException:
            cur.execute("ROLLBACK")
            raise
        cur.execute("COMMIT")
        return n

    def set(self, ino: int, column: str, value) -> None:
        self.set_many(ino, **{column: value})

    def set_many(self, ino: int, **values) -> None:
        assert set(values) <= _SETTABLE, values
        soon = self._soon.get(ino)
        if soon is not None:         # these values supersede the ones waiting
            for col in values:
                soon.pop(col, None)
            if not soon:
                del self._soon[ino]
        cols = ", ".join(f"{c} = ?" for c in values)
        self.db.execute(f"UPDATE e SET {cols} WHERE ino = ?", (*values.values(), ino))

    def set_soon(self, ino: int, **values) -> None:
        """``set_many``, written later (PENDING_SETS_MAX): a read of the table sees
        them, the file does not until then."""
        assert set(values) <= _SETTABLE, values
        soon = self._soon.get(ino)
        if soon is not None:
            soon.update(values)
            return
        self._soon[ino] = values
        if len(self._soon) >= PENDING_SETS_MAX:
            self.write_soon()

    def write_soon(self) -> None:
        """The values ``set_soon`` holds into the table, a statement per inode.  Queries
        of attributes made outside this class (namespace.py) call it first.  A
        statement that fails is logged and its values dropped (the Node keeps them):
        left waiting, it would fail every later read of the table."""
        while self._soon:
            ino, values = self._soon.popitem()
            cols = ", ".join(f"{c} = ?" for c in values)
            try:
                self.db.execute(f"UPDATE e SET {cols} WHERE ino = ?",
                                (*values.values(), ino))
            except (sqlite3.Error, OverflowError) as exc:
                log.error("metadata table: inode %d's %s not written: %s", ino,
                          ", ".join(values), exc)

    def add_lookup_each(self, inos: list[int]) -> None:
        """One more lookup for each of ``inos``, all distinct (readdirplus: the kernel
        keeps every entry of a reply it takes): they wait with the others and are
        written together (add_lookups)."""
        for ino in inos:
            self._pending[ino] = self._pending.get(ino, 0) + 1
        if len(self._pending) >= PENDING_LOOKUPS_MAX:
            self._write_lookups()

    def add_lookups(self, ino: int, n: int) -> None:
        """``n`` (> 0) more lookups of ``ino``: written later, with others
        (PENDING_LOOKUPS_MAX)."""
        self._pending[ino] = self._pending.get(ino, 0) + n
        if len(self._pending) >= PENDING_LOOKUPS_MAX:
            self._write_lookups()

    def forget(self, ino: int, n: int) -> bool | None:
        """A FORGET: ``n`` lookups fewer for ``ino``, netted with what waits (never
        below 0).  Returns None while the kernel still holds ``ino`` or its row is not
        removed; else whether it is a directory (the caller deletes the row).  At most
        one statement: none while waiting lookups outnumber ``n``."""
        left = self._pending.pop(ino, 0) - n
        if left > 0:
            self._pending[ino] = left
            return None
        r = self.db.execute("UPDATE e SET lookups = max(0, lookups + ?) WHERE ino = ? "
                            "RETURNING lookups, removed, dir", (left, ino)).fetchone()
        return bool(r[2]) if r is not None and r[0] == 0 and r[1] else None

    def _write_lookups(self) -> None:
        """The pending lookup counts into the table: one statement per distinct count.
        A count leaves memory only once its statement ran (a failed one keeps them)."""
        by_count: dict[int, list[int]] = {}
        for ino, n in self._pending.items():
            by_count.setdefault(n, []).append(ino)
        for n, inos in by_count.items():
            for part, _ in self._each_in(
                    "UPDATE e SET lookups = lookups + ? WHERE ino IN (%s)", inos, n):
                for ino in part:
                    del self._pending[ino]

    def delete(self, ino: int) -> None:
        self._pending.pop(ino, None)
        self._soon.pop(ino, None)
        self.db.execute("DELETE FROM e WHERE ino = ?", (ino,))

    def delete_unheld_children(self, parent: int) -> set[int]:
        """Drop the entries of ``parent`` the kernel does not hold (an evicted listing);
        returns the inodes of the entries left (held)."""
        self._write_lookups()
        self.db.execute("DELETE FROM e WHERE parent = ? AND lookups = 0", (parent,))
        return {r[0] for r in self.db.execute("SELECT ino FROM e WHERE parent = ?",
                                              (parent,))}


_SETTABLE = {"parent", "name", "dir", "size", "mtime", "version", "checked", "ctime", "seq",
             "removed"}

"""A listing you bring: ``neuralcache manifest export`` writes one, ``mount --manifest``
serves the namespace from it with no listing at all (a job of 100 M objects starts in
seconds on every node; each directory is read from the file when first used).

The file format (version 1), in order::

    b"NCMANIFEST 1\\n"
    a JSON line: {"source": "...", "entries": N, "created": <unix time>}
    blocks:  each zlib-compressed, of up to BLOCK_ENTRIES entries, one per line
             "KEY\\tSIZE\\tMTIME\\tVERSION\\n" with the keys in code point (= UTF-8
             byte) order, the order S3 lists them in; a backslash, tab or newline
             in a key or version is written \\\\, \\t, \\n
    index:   zlib-compressed JSON: [[first key, offset, length, entries], ...] per block
    trailer: u64 offset of the index, u32 its length, b"NCMF" (16 bytes)

SIZE is bytes, MTIME seconds since the epoch (a float), VERSION the ETag (S3) or
"size:mtime_ns" (a directory).  A directory's listing is the run of keys under
"DIR/": files are the keys with no further "/", subdirectories are the first
components of the rest, each skipped over with one search of the index.  Only the
index (one entry per block: ~60 bytes per 4,096 objects) and a few decompressed blocks
are held in memory.
"""
from __future__ import annotations

import bisect
import io
import json
import os
import struct
import threading
import time
import zlib
from typing import Iterable, Iterator

from ..backends.base import ObjectInfo
from ..errors import NotFound, UserError

MAGIC = b"NCMANIFEST 1\n"
TRAILER = struct.Struct("<QI4s")
TRAILER_MAGIC = b"NCMF"
# Entries per block: 4,096 keeps a block at ~60-250 KB before compression (one
# decompress per directory jump costs ~0.2 ms) and the index at one entry per block.
BLOCK_ENTRIES = 4096
# Decompressed blocks kept (a directory's listing walks forward through a few).
BLOCKS_KEPT = 16
# Entries per page of list_dir (what one ListObjectsV2 page holds).
PAGE = 1000
# The first character after "/": the key just past every key under "DIR/".
_PAST_SLASH = chr(ord("/") + 1)

_ESC = str.maketrans({"\\": "\\\\", "\t": "\\t", "\n": "\\n"})


def _unescape(s: str) -> str:
    if "\\" not in s:
        return s
    out, i = [], 0
    while i < len(s):
        c = s[i]
        if c == "\\" and i + 1 < len(s):
            out.append({"t": "\t", "n": "\n"}.get(s[i + 1], s[i + 1]))
            i += 2
        else:
            out.append(c)
            i += 1
    return "".join(out)


class Writer:
    """Write entries in key order: ``add`` each, then ``close``."""

    def __init__(self, path: str, source: str, entries: int = -1):
        self.path = path
        self._tmp = path + ".tmp"
        self._f = open(self._tmp, "wb")
        self._f.write(MAGIC)
        self._f.write((json.dumps({"source": source, "entries": entries,
                                   "created": time.time()}) + "\n").encode())
        self._lines: list[str] = []
        self._first = ""
        self._last: str | None = None
        self._index: list[list] = []
        self.count = 0

    def add(self, key: str, size: int, mtime: float, version: str) -> None:
        if self._last is not None and key <= self._last:
            raise ValueError(f"keys out of order: {key!r} after {self._last!r}")
        self._last = key
        if not self._lines:
            self._first = key
        self._lines.append(f"{key.translate(_ESC)}\t{size}\t{mtime!r}\t"
                           f"{version.translate(_ESC)}\n")
        self.count += 1
        if len(self._lines) >= BLOCK_ENTRIES:
            self._flush()

    def _flush(self) -> None:
        if not self._lines:
            return
        data = zlib.compress("".join(self._lines).encode("utf-8", "surrogateescape"), 6)
        self._index.append([self._first, self._f.tell(), len(data), len(self._lines)])
        self._f.write(data)
        self._lines = []

    def close(self) -> None:
        self._flush()
        off = self._f.tell()
        index = zlib.compress(json.dumps(self._index, ensure_ascii=False)
                              .encode("utf-8", "surrogateescape"), 6)
        self._f.write(index)
        self._f.write(TRAILER.pack(off, len(index), TRAILER_MAGIC))
        self._f.flush()
        os.fsync(self._f.fileno())
        self._f.close()
        os.replace(self._tmp, self.path)

    def abort(self) -> None:
        self._f.close()
        try:
            os.unlink(self._tmp)
        except FileNotFoundError:
            pass


class Manifest:
    """A manifest file open for lookups (thread-safe: listings run in threads)."""

    def __init__(self, path: str):
        self.path = path
        try:
            self._f = open(path, "rb")
            head = self._f.read(len(MAGIC))
            meta = json.loads(self._f.readline())
            self._f.seek(-TRAILER.size, io.SEEK_END)
            off, length, magic = TRAILER.unpack(self._f.read(TRAILER.size))
            if head != MAGIC or magic != TRAILER_MAGIC:
                raise ValueError("not a NeuralCache manifest")
            self._f.seek(off)
            index = json.loads(zlib.decompress(self._f.read(length)))
        except FileNotFoundError:
            raise UserError(f"manifest {path} does not exist") from None
        except (OSError, ValueError, zlib.error, struct.error) as exc:
            raise UserError(f"{path} is not a NeuralCache manifest ({exc}); write one "
                            "with `neuralcache manifest export`") from None
        self.source = meta.get("source", "")
        self.entries = sum(b[3] for b in index)
        self._first = [b[0] for b in index]
        self._blocks = [(b[1], b[2]) for b in index]
        self._lock = threading.Lock()
        self._cache: dict[int, tuple[list[str], list[str]]] = {}

    def close(self) -> None:
        self._f.close()

    def _block(self, i: int) -> tuple[list[str], list[str]]:
        """Block ``i``: (its keys, its lines)."""
        with self._lock:
            got = self._cache.get(i)
            if got is None:
                off, length = self._blocks[i]
                self._f.seek(off)
                lines = zlib.decompress(self._f.read(length)).decode(
                    "utf-8", "surrogateescape").split("\n")[:-1]
                got = ([_unescape(ln.split("\t", 1)[0]) for ln in lines], lines)
                if len(self._cache) >= BLOCKS_KEPT:
                    self._cache.pop(next(iter(self._cache)))
                self._cache[i] = got
            return got

    def _seek(self, key: str) -> tuple[int, int]:
        """(block, line) of the first entry >= ``key``."""
        b = max(0, bisect.bisect_right(self._first, key) - 1)
        while b < len(self._blocks):
            keys, _ = self._block(b)
            i = bisect.bisect_left(keys, key)
            if i < len(keys):
                return b, i
            b += 1
        return len(self._blocks), 0

    def _entries_from(self, key: str) -> Iterator[ObjectInfo]:
        b, i = self._seek(key)
        while b < len(self._blocks):
            _, lines = self._block(b)
            for ln in lines[i:]:
                k, size, mtime, version = ln.split("\t")
                yield ObjectInfo(_unescape(k), int(size), _unescape(version), float(mtime))
            b, i = b + 1, 0

    def all(self) -> Iterator[ObjectInfo]:
        return self._entries_from("")

    def list_dir(self, key: str) -> Iterator[tuple[list[ObjectInfo], list[str]]]:
        prefix = key + "/" if key else ""
        files: list[ObjectInfo] = []
        dirs: list[str] = []
        start = prefix
        while True:
            jumped = False
            for o in self._entries_from(start):
                if not o.key.startswith(prefix):
                    break
                rest = o.key[len(prefix):]
                if "/" in rest:
                    sub = rest.split("/", 1)[0]
                    dirs.append(sub)
                    start = prefix + sub + _PAST_SLASH      # past everything under it
                    jumped = True
                else:
                    files.append(o)
                if len(files) + len(dirs) >= PAGE:
                    yield files, dirs
                    files, dirs = [], []
                if jumped:
                    break
            if not jumped:
                break
        yield files, dirs

    def stat(self, key: str) -> ObjectInfo:
        for o in self._entries_from(key):
            if o.key == key:
                return o
            break
        raise NotFound(f"{key}: not in the manifest {self.path}")

    def probe(self, key: str) -> tuple[ObjectInfo | None, bool]:
        try:
            return self.stat(key), False
        except NotFound:
            pass
        for o in self._entries_from(key + "/"):
            return None, o.key.startswith(key + "/")
        return None, False


class ManifestBackend:
    """The origin for data, the manifest for names: ``list_dir``, ``probe``, ``stat``
    and ``list_all`` answer from the file; everything else goes to ``origin``."""

    def __init__(self, origin, manifest: Manifest):
        self._origin = origin
        self.manifest = manifest
        self.description = f"{origin.description} (names from {manifest.path})"

    def __getattr__(self, name):
        return getattr(self._origin, name)

    def list_dir(self, key: str):
        return self.manifest.list_dir(key)

    def probe(self, key: str):
        return self.manifest.probe(key)

    def stat(self, key: str) -> ObjectInfo:
        return self.manifest.stat(key)

    def list_all(self) -> Iterator[ObjectInfo]:
        return self.manifest.all()

    def close(self) -> None:
        self.manifest.close()
        self._origin.close()


# -- export ----------------------------------------------------------------------------------
def sorted_walk(list_dir, key: str = "", lookahead: int = 64) -> Iterator[ObjectInfo]:
    """Every object under ``key`` in key order, from per-directory listings
    (``list_dir(key)`` pages): a directory's entries in name order, a subdirectory
    sorting as NAME/ among them; up to ``lookahead`` subdirectories are listed ahead in
    threads."""
    from concurrent.futures import ThreadPoolExecutor

    def one(k):
        files, dirs = [], []
        for f, d in list_dir(k):
            files += f
            dirs += d
        return files, dirs

    with ThreadPoolExecutor(min(16, lookahead)) as pool:
        def walk(k, fut):
            files, dirs = fut.result()
            subs = {d: None for d in dirs}
            entries = [(o.key.rpartition("/")[2], o) for o in files
                       if o.key.rpartition("/")[2] not in subs]
            entries += [(d + "/", None) for d in subs]
            entries.sort(key=lambda e: e[0])
            futs = {}
            for name, o in entries:       # list the first subdirectories ahead
                if o is None and len(futs) < lookahead:
                    sk = f"{k}/{name[:-1]}" if k else name[:-1]
                    futs[name] = pool.submit(one, sk)
            for name, o in entries:
                if o is not None:
                    yield o
                else:
                    sk = f"{k}/{name[:-1]}" if k else name[:-1]
                    yield from walk(sk, futs.pop(name, None) or pool.submit(one, sk))

        yield from walk(key, pool.submit(one, key))


def export(objects: Iterable[ObjectInfo], path: str, source: str) -> int:
    """Write ``objects`` (in key order) as a manifest; returns how many."""
    w = Writer(path, source)
    try:
        for o in objects:
            w.add(o.key, o.size, o.mtime, o.version)
        w.close()
    except BaseException:
        w.abort()
        raise
    return w.count

"""A catalog of many directories, packed: each directory's file names in one bytes
object, found by binary search, instead of a Python string and a dict entry per file.

The daemon's catalog (neuralcache/ahead/prefetch.py) holds every file of the dataset a
job reads.  On the 1.28 M-file ImageNet tree the plain ``Catalog`` (a str per path, a
list of sizes and a path -> index dict) was ~200 B per file, and it was rebuilt whole,
from the metadata table, each time directories joined it: `python -m
bench.tools.scale` put that rebuild at two thirds of the trio thread's samples while the
crawl listed the tree, with stat() calls waiting up to 1.5 s and the daemon at 870 MB.

Here a directory is packed once, when it joins (``DirSegment``), and a catalog is its
segments in path order: rebuilding it costs a sort of the directories, not of the files.
The price is the lookup: a path's index is a dict lookup of its directory and a binary
search of its name (~5 us against ~0.1 us), which is why the daemon packs only a catalog
of CATALOG_CHEAP_FILES files or more (neuralcache/ahead/prefetch.py).
"""
from __future__ import annotations

import bisect
from array import array
from typing import Iterable

import numpy as np

from .base import Catalog


def _enc(name: str) -> bytes:
    return name.encode("utf-8", "surrogateescape")


class DirSegment:
    """One directory's files: ``prefix`` (its key and "/", "" for the root) and the
    names, sorted by their bytes, with their sizes."""

    __slots__ = ("prefix", "blob", "offs", "sizes", "hashes")

    def __init__(self, prefix: str, files: Iterable[tuple[str, int]]):
        items = sorted((_enc(n), int(s), n) for n, s in files)
        self.prefix = prefix
        self.blob = b"".join(b for b, _, _ in items)
        offs, pos = array("q", [0]), 0
        for b, _, _ in items:
            pos += len(b)
            offs.append(pos)
        self.offs = offs
        self.sizes = array("q", (s for _, s, _ in items))
        # hash() of each path (this process's str hash): ``PackedCatalog.indices``
        self.hashes = np.fromiter((hash(prefix + n) for _, _, n in items), np.int64,
                                  count=len(items))

    def __len__(self) -> int:
        return len(self.sizes)

    def name(self, i: int) -> str:
        return self.blob[self.offs[i]:self.offs[i + 1]].decode("utf-8", "surrogateescape")

    def find(self, name: str) -> int | None:
        """The position of ``name``, None if it is not here."""
        try:
            key = _enc(name)
        except UnicodeEncodeError:          # a lone surrogate no listing gives
            return None
        blob, offs = self.blob, self.offs
        lo, hi = 0, len(self.sizes)
        while lo < hi:
            mid = (lo + hi) // 2
            b = blob[offs[mid]:offs[mid + 1]]
            if b < key:
                lo = mid + 1
            elif b > key:
                hi = mid
            else:
                return mid
        return None


class _View:
    __slots__ = ("_c",)

    def __init__(self, c: "PackedCatalog"):
        self._c = c

    def __len__(self) -> int:
        return self._c._n

    def _at(self, i: int) -> tuple[DirSegment, int]:
        c = self._c
        if i < 0:
            i += c._n
        if not 0 <= i < c._n:
            raise IndexError(i)
        k = bisect.bisect_right(c._starts, i) - 1
        return c._segs[k], i - c._starts[k]


class _Paths(_View):
    __slots__ = ()

    def __getitem__(self, i: int) -> str:
        s, j = self._at(i)
        return s.prefix + s.name(j)


class _Sizes(_View):
    __slots__ = ()

    def __getitem__(self, i: int) -> int:
        s, j = self._at(i)
        return s.sizes[j]

    def __iter__(self):
        for s in self._c._segs:
            yield from s.sizes


class _Index:
    __slots__ = ("_c",)

    def __init__(self, c: "PackedCatalog"):
        self._c = c

    def get(self, path: str, default: int | None = None) -> int | None:
        c = self._c
        d, sep, name = path.rpartition("/")
        k = c._by_prefix.get(d + sep)
        if k is None:
            return default
        j = c._segs[k].find(name)
        return default if j is None else c._starts[k] + j

    def __contains__(self, path: object) -> bool:
        return isinstance(path, str) and self.get(path) is not None


class PackedCatalog(Catalog):
    """``Catalog``'s interface (``paths[i]``, ``sizes[i]``, ``index.get(path)``, ``len``,
    ``scope_range``, ``indices``) over directory segments ordered by their prefix, each
    by its names' bytes.  Not path order where a directory has both files and
    subdirectories in the catalog ("a/z" comes before "a/b/x"): a directory's paths are
    contiguous, and so are those under any prefix ("a/b/" sorts after "a/b-c/" and
    before "a/b/c/"), which is what ``scope_range`` needs."""

    __slots__ = ("_segs", "_starts", "_by_prefix", "_n", "_hsorted", "_hpos")

    def __init__(self, segments: Iterable[DirSegment]):   # (no Catalog.__init__)
        self._segs = sorted((s for s in segments if len(s)), key=lambda s: s.prefix)
        self._starts: list[int] = []
        self._by_prefix: dict[str, int] = {}
        n = 0
        for k, s in enumerate(self._segs):
            self._starts.append(n)
            self._by_prefix[s.prefix] = k
            n += len(s)
        self._n = n
        self._hsorted = self._hpos = None
        self.paths = _Paths(self)
        self.sizes = _Sizes(self)
        self.index = _Index(self)

    def __len__(self) -> int:
        return self._n

    def indices(self, paths: Iterable[str]) -> np.ndarray:
        """The indices of those of ``paths`` in the catalog, at once: an epoch's members
        at its boundary (1.28 M: ~6 s of binary searches; 0.6 s here, where the plain
        catalog's dict took 1.4 s, one scratch run).  By the paths' str hashes, sorted
        once per catalog: two paths of equal hash (~1e-7 for a million) may count as
        each other, which costs a prediction, never a wrong byte."""
        if self._hsorted is None:
            h = np.concatenate([s.hashes for s in self._segs]) if self._segs else \
                np.zeros(0, np.int64)
            self._hpos = np.argsort(h, kind="stable")
            self._hsorted = h[self._hpos]
        q = np.sort(np.fromiter(map(hash, paths), np.int64))   # (sorted: searched faster)
        if not len(self._hsorted) or not len(q):
            return np.zeros(0, np.int64)
        j = np.minimum(np.searchsorted(self._hsorted, q), len(self._hsorted) - 1)
        return self._hpos[j[self._hsorted[j] == q]]

    def entries(self):
        """(path, size) in order."""
        for s in self._segs:
            p = s.prefix
            for j in range(len(s)):
                yield p + s.name(j), s.sizes[j]

    def total_bytes(self) -> int:
        return sum(sum(s.sizes) for s in self._segs)

    def scope_range(self, prefix: str) -> tuple[int, int]:
        """Indices [lo, hi) of the paths under directory ``prefix`` ("a/b/"; "" = all)."""
        if not prefix:
            return 0, self._n
        ks = [k for k, s in enumerate(self._segs) if s.prefix.startswith(prefix)]
        if not ks:
            return 0, 0
        last = ks[-1]
        return self._starts[ks[0]], self._starts[last] + len(self._segs[last])

    def carry(self, old: "PackedCatalog", mask: np.ndarray,
              out: np.ndarray) -> list[tuple[int, DirSegment]]:
        """Copy into ``out`` (one flag per file of this catalog) the flags ``mask`` (one
        per file of ``old``) holds for the directory segments both catalogs share (the
        same object: the prefetcher keeps a directory's segment until it is listed
        again); returns (start, segment) of this catalog's other segments, whose flags
        the caller works out itself."""
        was = {id(seg): start for seg, start in zip(old._segs, old._starts)}
        fresh = []
        for seg, start in zip(self._segs, self._starts):
            o = was.get(id(seg))
            if o is None:                  # (both alive: one id, one object)
                fresh.append((start, seg))
            else:
                out[start:start + len(seg)] = mask[o:o + len(seg)]
        return fresh

"""Memory for blocks read from the remote and the disk cache.

A block read from the disk cache lands in memory the daemon has not touched, and the
kernel hands that memory over one 4 KiB page fault at a time: 262k faults per GiB
(``python -m bench.breakdown``'s ``faults`` column), ~0.8 CPU-s per GiB of ``disk_read``
on this 2-core VM.  ``fresh(n)`` returns a private anonymous mapping (``mmap``'s default
is a shared one, which costs more per fault: ``python -m bench.micro fresh-memory``).

Transparent huge pages would take 512 faults per GiB instead, and are opt-in
(``NEURALCACHE_HUGE_PAGES=1``) because what a fresh huge page costs depends on the
machine.  On this VM (a virtio balloon with free-page reporting: freed 2 MiB blocks go
back to the host) it ranged from 0.14 to 2.7 CPU-s/GiB (``bench.micro fresh-memory``,
three rounds, against 0.50-0.56 for 4 KiB pages), and the daemon's disk-cache reads
with huge pages won 6 of 6 ``bench.breakdown --size 1G`` pairs one hour (median 1.16 ->
0.61 CPU-s/GiB) and lost 2 of 2 the next (1.32 / 1.13 -> 2.42 / 1.46): bench/RESULTS.md
"Page faults".  On a host whose memory is not handed back it is the cheap case.

With huge pages on, ``fresh(n)`` maps ``n`` rounded up to whole huge pages (the kernel
places such a mapping on a huge-page boundary) and advises only the whole huge pages
inside ``n``, so a block of 8 MiB + its 4 KiB trailer is four huge pages and one small
one, never a huge page for 4 KiB.  A kernel with THP "never" ignores the advice.

``fresh`` buffers are never reused: each lives as long as the views of it.  Block-sized
read buffers come from a ``Recycler`` instead, which hands a buffer out again once the
memory tier let go of its block and no view of it is left (see there).
"""
from __future__ import annotations

import mmap
import os
import threading

# The x86-64 / arm64 (4 KiB base page) huge page.
HUGE_PAGE = 2 << 20
# A buffered (non-O_DIRECT) disk-cache read of at least this many bytes lands in a
# ``fresh`` buffer; below one huge page, bytes from the allocator are as cheap.  O_DIRECT
# reads always use ``fresh`` (they need page-aligned memory).
HUGE_MIN = HUGE_PAGE
# Off unless NEURALCACHE_HUGE_PAGES=1 (see above: the cost is the machine's).
HUGE_PAGES = (hasattr(mmap, "MADV_HUGEPAGE")
              and os.environ.get("NEURALCACHE_HUGE_PAGES", "0") == "1")


def fresh(nbytes: int, huge_pages: bool | None = None) -> mmap.mmap:
    """A zeroed private anonymous mapping of at least ``nbytes`` (see the module doc;
    ``len()`` may be larger: slice to what was filled); ``huge_pages`` overrides
    HUGE_PAGES."""
    size = max(nbytes, 1)
    on = HUGE_PAGES if huge_pages is None else huge_pages
    huge = nbytes // HUGE_PAGE * HUGE_PAGE if on else 0
    if huge:
        size = -(-nbytes // HUGE_PAGE) * HUGE_PAGE
    buf = mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    if huge:
        try:
            buf.madvise(mmap.MADV_HUGEPAGE, 0, huge)
        except OSError:      # a kernel without THP: 4 KiB pages
            pass
    return buf


def fresh_view(nbytes: int) -> memoryview:
    """A writable view of exactly ``nbytes`` of a ``fresh`` buffer (what a reader
    without a Recycler reads into)."""
    return memoryview(fresh(nbytes))[:nbytes]


def read_into(readinto, nbytes: int, huge_pages: bool | None = None,
              into: memoryview | None = None) -> memoryview:
    """Call ``readinto(view)`` until ``nbytes`` arrived or it returns 0 (end of
    data); the bytes read, as a view of ``into`` or else of a ``fresh`` buffer
    (shorter at the end)."""
    view = into if into is not None else memoryview(fresh(nbytes, huge_pages))
    done = 0
    while done < nbytes:
        n = readinto(view[done:nbytes])
        if not n:
            break
        done += n
    return view[:done]


# Block-sized read buffers a Recycler keeps for reuse, in bytes (16 blocks of 8 MiB): a
# sequential stream holds its read-ahead (up to 128 MiB, ahead/readahead.py), the
# blocks it left within SEQ_SLACK (32 MiB) and what waits in the disk write queue;
# buffers past this are left to the allocator.
RECYCLE_KEEP_BYTES = 128 << 20
# Reads of at least this many bytes take a recycled buffer (smaller ones: the allocator
# reuses its own memory for them; S3 GETs up to 1 MiB go through obstore anyway).
RECYCLE_MIN = (1 << 20) + 1


class _Slot(mmap.mmap):
    """A Recycler's buffer: the type is how ``give`` knows its own."""


def _unexported(buf: mmap.mmap) -> bool:
    """No view of ``buf`` is alive: mmap refuses to resize while one is (a resize to
    the same size moves nothing)."""
    try:
        buf.resize(len(buf))
    except BufferError:
        return False
    except (OSError, SystemError, TypeError, ValueError):   # no mremap here: never reuse
        return False
    return True


class Recycler:
    """Block-sized read buffers, reused: a block fetched or read from the disk cache
    lands in a buffer a block the memory tier let go of had, instead of fresh memory.

    Fresh memory costs a page fault and a zeroed page per 4 KiB (see the module doc);
    on this VM, where freed memory goes back to the host, ``clear_page`` of the GET
    buffers was 39 % of the daemon's CPU on a cold 1 GiB read (``perf record`` of
    ``bench run --scenario bigfile``; bench/RESULTS.md).  ``give`` is only a hint: a
    buffer is reused when no view of it is left anywhere (memory tier, FUSE reply,
    disk write queue, an abandoned hedged read), which ``take`` checks under the lock
    before it hands the buffer out, so a reused buffer can never change bytes that
    someone still reads.  Off (every buffer fresh) with ``NEURALCACHE_RECYCLE=0``."""

    def __init__(self, slot_bytes: int, keep_bytes: int = RECYCLE_KEEP_BYTES):
        self.slot = -(-slot_bytes // mmap.PAGESIZE) * mmap.PAGESIZE
        self.keep = max(1, keep_bytes // self.slot)
        self._back: list[_Slot] = []
        self._lock = threading.Lock()
        self.reused = 0        # buffers handed out again
        self.made = 0          # fresh buffers made

    def take(self, nbytes: int) -> memoryview:
        """A writable view of ``nbytes``: a handed-back buffer nobody views any more,
        else a fresh one (one of ours if ``nbytes`` fits a slot)."""
        if not RECYCLE_MIN <= nbytes <= self.slot:
            return fresh_view(nbytes)
        with self._lock:
            for i, buf in enumerate(self._back):
                if _unexported(buf):
                    del self._back[i]
                    self.reused += 1
                    return memoryview(buf)[:nbytes]
            self.made += 1
            buf = _Slot(-1, self.slot, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
            return memoryview(buf)[:nbytes]

    def give(self, data) -> None:
        """``data`` (a block's bytes) left the memory tier: its buffer, if it is one of
        ours, may be reused once no view of it is left."""
        buf = data.obj if isinstance(data, memoryview) else None
        if not isinstance(buf, _Slot):
            return
        with self._lock:
            if len(self._back) < self.keep and all(b is not buf for b in self._back):
                self._back.append(buf)

    def stats(self) -> dict:
        return {"buffers_reused": self.reused, "buffers_made": self.made}


def recycler(slot_bytes: int) -> Recycler | None:
    """A Recycler for blocks of ``slot_bytes`` (data and disk trailer), unless
    ``NEURALCACHE_RECYCLE=0``."""
    if os.environ.get("NEURALCACHE_RECYCLE", "1") == "0":
        return None
    return Recycler(slot_bytes)


def release_free_memory() -> None:
    """Hand memory malloc holds but no object uses back to the kernel (glibc
    ``malloc_trim``): after a burst that allocated and freed a lot, such as parsing an
    epoch's hints (~40 MB of transient strings for 1.28 M paths, of which 15 MB stay)."""
    try:
        import ctypes

        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass

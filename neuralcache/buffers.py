"""Fresh memory for blocks read from the disk cache.

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
one, never a huge page for 4 KiB.  Buffers are never reused: each lives as long as the
views of it (memory tier, FUSE replies).  A kernel with THP "never" ignores the advice.
"""
from __future__ import annotations

import mmap
import os

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


def read_into(readinto, nbytes: int, huge_pages: bool | None = None) -> memoryview:
    """Call ``readinto(view)`` until ``nbytes`` arrived or it returns 0 (end of
    data); the bytes read, as a view of a ``fresh`` buffer (shorter at the end)."""
    view = memoryview(fresh(nbytes, huge_pages))
    done = 0
    while done < nbytes:
        n = readinto(view[done:nbytes])
        if not n:
            break
        done += n
    return view[:done]


def release_free_memory() -> None:
    """Hand memory malloc holds but no object uses back to the kernel (glibc
    ``malloc_trim``): after a burst that allocated and freed a lot, such as parsing an
    epoch's hints (~40 MB of transient strings for 1.28 M paths, of which 15 MB stay)."""
    try:
        import ctypes

        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass

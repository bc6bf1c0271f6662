"""Fresh memory for block data: where a fetched or disk-cached block's bytes land.

Every block the daemon serves lands in memory it has not touched before, and the
kernel hands that memory over one 4 KiB page fault at a time.  On this 2-core VM that
was ~0.5 CPU-s per GiB (262k faults; ``python -m bench.breakdown``'s ``faults``
column, and ``/tmp`` micro-runs of ``preadv`` into fresh mappings): a third of the
daemon's CPU on a cold read and most of a read from the disk cache.  A private mapping
advised for transparent huge pages takes 512 faults per GiB instead, at ~0.07 CPU-s.

``fresh(n)`` maps ``n`` bytes rounded up to whole huge pages (the kernel places such a
mapping on a huge-page boundary) and advises only the whole huge pages inside ``n``,
so a block of 8 MiB + a 4 KiB trailer is four huge pages and one small one, never a
huge page for 4 KiB.  The unused rest is address space, not memory.  Buffers are
never reused: each lives as long as the bytes views of it (memory tier, replies).

Below HUGE_MIN the ordinary allocator is cheaper (it reuses freed memory), so callers
keep their plain paths for small reads.  A kernel with THP "never" ignores the advice
(still a private mapping, ~0.1 CPU-s/GiB cheaper than the shared one ``mmap`` makes by
default).  ``NEURALCACHE_HUGE_PAGES=0`` turns the advice off (a kernel whose
synchronous THP compaction stalls would show as slow first touches).
"""
from __future__ import annotations

import mmap
import os

# The x86-64 / arm64 (4 KiB base page) huge page.
HUGE_PAGE = 2 << 20
# Reads at least this long use ``fresh``: one huge page is the smallest that gains.
HUGE_MIN = HUGE_PAGE
HUGE_PAGES = (hasattr(mmap, "MADV_HUGEPAGE")
              and os.environ.get("NEURALCACHE_HUGE_PAGES", "1") != "0")


def fresh(nbytes: int) -> mmap.mmap:
    """A zeroed private anonymous mapping of at least ``nbytes`` (see the module doc;
    ``len()`` may be larger: slice to what was filled)."""
    size = max(nbytes, 1)
    huge = nbytes // HUGE_PAGE * HUGE_PAGE if HUGE_PAGES else 0
    if huge:
        size = -(-nbytes // HUGE_PAGE) * HUGE_PAGE
    buf = mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    if huge:
        try:
            buf.madvise(mmap.MADV_HUGEPAGE, 0, huge)
        except OSError:      # a kernel without THP: 4 KiB pages
            pass
    return buf


def read_into(readinto, nbytes: int) -> memoryview:
    """Call ``readinto(view)`` until ``nbytes`` arrived or it returns 0 (end of
    data); the bytes read, as a view of a ``fresh`` buffer (shorter at the end)."""
    view = memoryview(fresh(nbytes))
    done = 0
    while done < nbytes:
        n = readinto(view[done:nbytes])
        if not n:
            break
        done += n
    return view[:done]

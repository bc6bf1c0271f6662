"""Fresh memory for blocks read from the disk cache.

A block read from the disk cache lands in memory the daemon has not touched, and the
kernel hands that memory over one 4 KiB page fault at a time: 262k faults per GiB
(``python -m bench.breakdown``'s ``faults`` column), ~0.8 CPU-s per GiB of ``disk_read``
on this 2-core VM.  A private mapping advised for transparent huge pages takes ~730
faults per GiB instead; six before/after pairs of ``python -m bench.breakdown --size
1G`` (2026-12-01) gave ``disk_read`` 0.74-0.84 -> 0.23-0.49 CPU-s/GiB and 914-1,020 ->
1,058-1,584 MB/s from the disk cache.

``fresh(n)`` maps ``n`` bytes rounded up to whole huge pages (the kernel places such a
mapping on a huge-page boundary) and advises only the whole huge pages inside ``n``, so
a block of 8 MiB + its 4 KiB trailer is four huge pages and one small one, never a
huge page for 4 KiB.  The unused rest is address space, not memory.  Buffers are never
reused: each lives as long as the views of it (memory tier, FUSE replies).

Not used for blocks fetched from the remote: the same pairs showed no gain there
(cold ``fetch`` 0.73-0.92 before, 0.57-1.23 with the body read into a fresh huge-page
buffer).  Why: a huge page the kernel has to find afresh -- on this VM, memory the
guest has not touched since boot -- costs more than the 512 small faults it saves;
``python -m bench.micro fresh-memory`` (8 MiB blocks kept, as the memory tier keeps
them) gave 2.7, 0.23 and 0.81 CPU-s/GiB in three rounds for huge pages and 0.50-0.55
for 4 KiB pages or bytes.  The disk-cache read path still won 6 of 6 pairs (it runs
after the cold read freed memory); a node whose page cache has filled its RAM once
(every training node) is in the cheap case.  Below HUGE_MIN the ordinary allocator is
as cheap.  A kernel with THP "never" ignores the advice; ``NEURALCACHE_HUGE_PAGES=0``
turns it off.
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

"""Small files go into the kernel page cache at open (``pyfuse3.notify_store``), so
that reading them sends no READ request: a cold small file costs LOOKUP, OPEN and
RELEASE, a warm one OPEN and RELEASE (issue 20; bench.breakdown counts them).

Read-only mounts only (fs/operations.py decides when to ask): a --writable mount's
pages may hold written bytes.
"""
from __future__ import annotations

import logging
import os
from typing import Callable

import pyfuse3

from ..errors import BackendError, NotFound
from ..stats import Stats
from ..store.blocks import BlockStore, Pinned
from .trace import TraceRing

log = logging.getLogger(__name__)

# A file up to this size is pushed before its open is answered.  1 MiB is the largest
# READ the kernel sends here (daemon.py raises the read-ahead window): such a file
# costs exactly one READ, which the push replaces.  0 turns pushing off.
PUSH_MAX_BYTES = 1 << 20
# A small file not yet in memory at its first open (the prefetcher's GET still in
# flight, only in the disk tier, or not predicted) is loaded by the open itself and
# then pushed, so the READ request that followed goes (bench.breakdown "files cold":
# 3.13 -> 3.01 requests per file).  Off a stop ago: the samples scenario's cold epoch
# was slower with it in 8 of 9 alternating pairs.  On since: with the inline disk
# writes of store/blocks.py, five alternating pairs of `bench run --scenario samples
# --systems local,neuralcache` measured 544/531/528/533/525 (off) against
# 539/537/547/533/524 files/s (on), the same CPU, and three bench.breakdown pairs the
# same daemon CPU per cold file (bench/RESULTS.md).  NEURALCACHE_PUSH_LOADS=0 turns it
# off.
PUSH_LOADS = os.environ.get("NEURALCACHE_PUSH_LOADS", "1") == "1"


class Pusher:
    def __init__(self, store: BlockStore, stats: Stats, trace: TraceRing, prefetcher,
                 reading: Callable[[int], int | None]):
        self.store, self.stats, self.trace = store, stats, trace
        self.prefetcher = prefetcher
        self.reading = reading         # inode -> handles of it open (fs/operations.py)

    async def push(self, inode: int, pinned: Pinned, pid: int) -> bool:
        """Put a small file into the page cache; True: it is there, keep it.  Only
        when the kernel holds no page of the inode (never opened, or invalidated
        since) and no other handle has it open: no READ of it is then in flight, whose
        page lock this thread would wait for while the READ waits for this thread.  A
        file not in memory is loaded first (PUSH_LOADS), like the READ it replaces: its
        errors are the open's (ENOENT: gone from the remote; EIO: no answer)."""
        if not 0 < pinned.size <= PUSH_MAX_BYTES:
            return False
        data = self.store.resident(pinned)
        loaded = data is None
        if loaded:
            if not PUSH_LOADS:
                return False
            try:
                data = await self.store.load_whole(pinned)
            except NotFound:
                self.stats.read_errors += 1
                log.warning("%s: listed, but the remote has no such object now (deleted "
                            "since it was listed, or a manifest out of date)", pinned.key)
                raise
            except BackendError:
                self.stats.read_errors += 1
                raise
            # another open of it meanwhile: its READ may hold a page lock now
            if data is None or self.reading(inode) != 1:
                return False
        st = self.stats
        try:
            pyfuse3.notify_store(inode, 0, data)
        except OSError as exc:     # e.g. ENOENT: the kernel dropped the inode meanwhile
            st.push_errors += 1
            log.debug("notify_store of %s failed: %s", pinned.key, exc)
            return False
        if not loaded:          # load_whole counted its own hit or miss
            self.store.served(pinned, len(data))
        st.pushed_files += 1
        st.pushed_bytes += len(data)
        st.bytes_served += len(data)
        self.trace.record("read", pinned.key, 0, len(data), pid, pinned.size)
        if self.prefetcher is not None:
            self.prefetcher.on_read(pinned.key, 0, len(data), pinned.size, pid)
        return True

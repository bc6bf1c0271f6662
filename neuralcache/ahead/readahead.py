"""Per-open-file sequential read-ahead.

While reads stay sequential the window (blocks requested ahead of the reader) doubles
with each read, up to the Little's-law target: bytes in flight
= the reader's throughput x the link latency (x ``SAFETY``), never below ``MIN_BLOCKS``
and never above ``max_bytes``.  A seek resets the window.  Pure logic, no I/O: the
caller turns the returned block numbers into prefetches.
"""
from __future__ import annotations

import math
import time

# Default cap on read-ahead per open file: Little's law with the latency an 8 MiB GET
# actually has, not the bare round trip.  Over the 60 ms link a block took 125-135 ms
# (p50) at ~450 MB/s, so 64 MiB (8 blocks) capped a stream at ~500 MB/s; x SAFETY
# that is ~128 MiB (16 blocks).  `python -m bench.breakdown --size 1G --files 0
# --mount-args "--readahead-size 128M"` against 64M, order 64 128 128 64: a cold 1 GiB
# file 448 / 441 -> 491 / 493 MB/s at the same 1.27-1.30 CPU-s/GiB (bench/RESULTS.md).
# Per-stream windows stay below it unless the stream is that fast (Little's law in
# _target_blocks); all streams together are bounded by MAX_INFLIGHT_BYTES.
DEFAULT_MAX_BYTES = 128 << 20
# Blocks ahead from the first sequential read: one block ahead hides the first round
# trip of the next block while the current one is consumed.
MIN_BLOCKS = 1
# Headroom over Little's law for bursty readers and latency jitter.
SAFETY = 2.0
# How far a read may start from the furthest point read so far and still count as
# sequential: the kernel's own read-ahead (up to KERNEL_READAHEAD_KB in daemon.py,
# 16 MiB) is issued as parallel requests that arrive out of order, so a window twice
# that is still one sequential stream (measured: with 1 MiB of slack, 370 of 1025
# reads of a sequential dd looked like seeks).
SEQ_SLACK = 32 << 20
# ...but only once a stream is established: it starts with a read that begins exactly
# where the previous one ended (within this slack, the kernel's request size).  Random
# reads of a large file (fio randread 128 KiB over 1 GiB) fell inside the 32 MiB slack
# 6 % of the time and each such hit started read-ahead: precision 0.29 in bench/.
# Backwards, a young stream takes a read inside what it read or ending exactly where
# it began: the kernel's first READs of a file arrive in parallel, out of order (1, 0,
# 3, 2, 7, 6, 5, 4 MiB ...; a read() of 2 MiB or more, a first batch of 4-16), and
# each read behind the last one reset the stream until two arrived in order, so it
# began past the file's first byte: ``behind`` never gave back the blocks before that,
# nor ``finished`` any at close (22 of 37 blocks kept after a close in
# tests/test_e2e.py's sequential-window case), and the window started again from
# MIN_BLOCKS at each reset.  Exactly adjacent, not within this slack: 5,000 unaligned
# 1 MiB random reads started 13 false streams with the slack backwards too, 7 without
# (tests/test_readahead.py test_random_1mib_reads_do_not_start_read_ahead's count).
START_SLACK = 1 << 20
# How far behind the furthest read an established stream still takes a READ inside what
# it read: the kernel keeps up to daemon.py's FUSE_MAX_BACKGROUND (64) READs of up to
# 1 MiB in flight, and one answered late comes up to that far behind (one 33 MiB behind
# started a new stream at SEQ_SLACK alone, whose close then kept 9 of 25 blocks).  A
# read further back is a seek (a second pass over the file from its start).
LATE_MAX = 64 << 20
# Contiguous reads that establish a stream (a file's first read at offset 0 counts).
STREAK_MIN = 2


class ReadAhead:
    __slots__ = ("block_size", "max_blocks", "next_off", "window", "ahead_upto",
                 "streak_bytes", "streak_t0", "streak", "stream_start", "first_off",
                 "behind_upto", "touched")

    def __init__(self, block_size: int, max_bytes: int = DEFAULT_MAX_BYTES):
        self.block_size = block_size
        self.max_blocks = max(0, max_bytes // block_size)
        self.next_off = 0
        self.window = MIN_BLOCKS
        self.ahead_upto = 0          # highest block index already requested + 1
        self.streak_bytes = 0
        self.streak_t0: float | None = None   # set by the first read
        self.streak = 0              # contiguous reads so far in this stream
        self.stream_start = 0        # where the current stream began
        self.first_off = 0           # ... or a read carried into it (see on_read)
        self.behind_upto = 0         # blocks below this were reported by behind()
        # blocks this stream has read from, not yet reported by behind() (a handful:
        # behind() lets them go 32 MiB behind the furthest read)
        self.touched: set[int] = set()

    def on_read(self, off: int, size: int, nblocks: int, latency_s: float,
                now: float | None = None) -> range:
        """Record a read; return the block indexes to request ahead now."""
        if nblocks == 0:
            return range(0)
        now = time.monotonic() if now is None else now
        if self.streak_t0 is None:
            self.streak_t0 = now
        cur = off // self.block_size
        if self.streak >= STREAK_MIN:
            # (or a READ inside what the stream read, up to LATE_MAX behind: one of
            # those in flight, answered late)
            sequential = abs(off - self.next_off) <= SEQ_SLACK \
                or self.stream_start <= off < self.next_off <= off + LATE_MAX
        else:
            # a young stream: within START_SLACK of where it got to, inside what it
            # read, or ending exactly where it began (the kernel's READs of one
            # read-ahead batch arrive in any order)
            sequential = abs(off - self.next_off) <= START_SLACK \
                or self.stream_start <= off < self.next_off \
                or off + size == self.stream_start
        read = range(cur, (off + max(size, 1) - 1) // self.block_size + 1)
        if not sequential:
            # a stream of one read near this one (a batch's READs out of order, 3, 0,
            # 1, 2 or 0, 3, 1, 2): its bytes count for ``behind`` and ``finished`` in
            # the stream begun here, from ``first_off`` (the lowest such read); what
            # counts as sequential (``stream_start``) does not widen with it
            carry = self.streak == 1 and 0 < abs(self.stream_start - off) <= SEQ_SLACK
            self.touched = self.touched.union(read) if carry else set(read)
            self.streak_bytes = self.streak_bytes + size if carry else size
            self.first_off = min(self.first_off, off) if carry else off
            if not carry:            # a new stream: its blocks are reported anew
                self.behind_upto = 0
            self.next_off = off + size
            self.stream_start = off
            self.window = MIN_BLOCKS
            self.ahead_upto = cur + 1
            self.streak_t0 = now
            self.streak = 1
            return range(0)
        self.next_off = max(self.next_off, off + size)
        if off < self.stream_start:         # a READ of the batch that began the stream
            self.stream_start = off
        self.first_off = min(self.first_off, off)
        self.touched.update(read)
        self.streak += 1
        if self.streak < STREAK_MIN:
            self.streak_bytes += size
            return range(0)
        self.streak_bytes += size
        if self.max_blocks == 0:     # read-ahead off (below a block): tracked only
            return range(0)
        # every sequential read once the stream is established doubles the window (the
        # kernel reads 1 MiB at a time: a large file reaches full depth in a few MiB)
        self.window = min(self._target_blocks(latency_s, now), self.window * 2)
        start = max(self.ahead_upto, cur + 1)
        stop = min(nblocks, cur + 1 + self.window)
        if stop <= start:
            return range(0)
        self.ahead_upto = stop
        return range(start, stop)

    def behind(self) -> list[int]:
        """Blocks an established stream has read and left behind, each reported once:
        wholly inside the stream, more than SEQ_SLACK before its furthest read (where
        a read would count as a seek: the kernel's own read-ahead arrives out of order
        within its window), and read from by it (not one a stray read before the
        stream's start spanned).  The page cache holds their bytes now; the memory
        tier may let them go."""
        if self.streak < STREAK_MIN:
            return []
        first = max(self.behind_upto, -(-self.first_off // self.block_size))
        upto = (self.next_off - SEQ_SLACK) // self.block_size
        if upto <= first:
            return []
        self.behind_upto = upto
        out = [i for i in range(first, upto) if i in self.touched]
        self.touched.difference_update(out)
        return out

    def finished(self, nblocks: int, size: int) -> list[int]:
        """At close: the blocks not yet reported by ``behind`` of a file whose last
        stream read it from its first byte to its last (the page cache holds them
        now: as many bytes read as the file has, a gap within SEQ_SLACK counted as
        read, as in ``on_read``), each one the stream read from; nothing for a file
        read in part, or whose last stream began past its first byte."""
        if self.streak < STREAK_MIN or self.first_off != 0 or self.next_off < size \
                or self.streak_bytes < size:      # (a header, then the tail: review)
            return []
        first, self.behind_upto = self.behind_upto, max(self.behind_upto, nblocks)
        # (a part read twice then the tail counts as many bytes as the file has:
        # only the blocks read from go, not the ones skipped: review)
        return [i for i in range(first, nblocks) if i in self.touched]

    def _target_blocks(self, latency_s: float, now: float) -> int:
        t0 = now if self.streak_t0 is None else self.streak_t0
        elapsed = max(now - t0, 1e-3)
        rate = self.streak_bytes / elapsed
        want = math.ceil(rate * max(latency_s, 1e-3) * SAFETY / self.block_size)
        # Early in a streak the rate is unknown (tiny elapsed): let doubling decide.
        if elapsed < latency_s:
            want = self.max_blocks
        return max(MIN_BLOCKS, min(self.max_blocks, want))

"""Live counters of a mount: what `neuralcache stats` prints and the metrics exporter
reads.  The keys of ``Stats.snapshot()`` are a public contract (README, DEVELOPING.md)."""
from __future__ import annotations

import collections
import os
import time
from dataclasses import dataclass, field

# Backend latencies kept for percentiles: the last N requests (a few minutes of a busy
# mount at 32 requests in flight), so percentiles follow the link as it changes.
LATENCY_WINDOW = 4096
# The sorted window is rebuilt after this many new samples, not on every query: the
# read path asks for the median on every read (read-ahead sizing).
RESORT_EVERY = 64
# Read request sizes are counted in power-of-two buckets, bucket k holding sizes in
# (2^(k-1), 2^k]; the last also holds anything larger (the kernel sends at most 1 MiB,
# 2^20, per FUSE read).
READ_SIZE_BUCKETS = 22


def percentile(sorted_vals: list[float], q: float) -> float:
    if not sorted_vals:
        return 0.0
    i = min(len(sorted_vals) - 1, max(0, int(round(q * (len(sorted_vals) - 1)))))
    return sorted_vals[i]


def _human(n: int) -> str:
    for unit, shift in (("M", 20), ("K", 10)):
        if n >= 1 << shift and n % (1 << shift) == 0:
            return f"{n >> shift}{unit}"
    return str(n)


@dataclass
class Stats:
    started: float = field(default_factory=time.monotonic)
    bytes_served: int = 0
    bytes_fetched: int = 0
    reads: int = 0
    read_errors: int = 0
    opens: int = 0
    mem_hits: int = 0
    mem_misses: int = 0
    disk_hits: int = 0
    disk_misses: int = 0
    demand_hit_blocks: int = 0     # demand block lookups served from mem or disk
    demand_hit_bytes: int = 0      # bytes served to readers without waiting on the remote
    readahead_bytes_fetched: int = 0
    readahead_bytes_used: int = 0
    prefetch_bytes_fetched: int = 0
    prefetch_bytes_used: int = 0
    prefetch_bytes_staged: int = 0  # ... of the fetched, stored on disk, not in memory
    # read-ahead and prefetched bytes a tier let go unread: memory (the disk did not
    # take them) and the disk (store/speculative.py Ledger)
    ahead_lost_memory_bytes: int = 0
    ahead_lost_disk_bytes: int = 0
    backend_requests: int = 0
    backend_errors: int = 0
    singleflight_joins: int = 0
    hedged_requests: int = 0
    disk_writes_skipped: int = 0   # fetched blocks not written: disk write queue full
    disk_writes_late: int = 0      # memory-only blocks queued when the reader left
                                   # them, or as memory evicted them
    # small files handed to the kernel page cache at open (fs/operations.py _push):
    # each one is a READ request the kernel does not send
    pushed_files: int = 0
    pushed_bytes: int = 0
    push_errors: int = 0
    # FUSE requests by operation (lookup, getattr, open, read, flush, release, ...) and
    # read requests by size (READ_SIZE_BUCKETS): how many requests a
    # file costs and how the kernel splits reads (bench/breakdown.py reports both).
    fuse_requests: collections.Counter = field(default_factory=collections.Counter)
    read_sizes: list = field(default_factory=lambda: [0] * READ_SIZE_BUCKETS)
    latencies: collections.deque = field(
        default_factory=lambda: collections.deque(maxlen=LATENCY_WINDOW))
    # Optional histograms (admin/metrics.py), fed when the metrics endpoint is on.
    backend_hist: object = None
    read_hist: object = None
    _sorted: list = field(default_factory=list)
    _samples: int = 0           # latencies recorded ever
    _sorted_at: int = 0         # _samples when _sorted was built

    def record_backend(self, seconds: float, nbytes: int, ok: bool) -> None:
        self.backend_requests += 1
        if ok:
            self.bytes_fetched += nbytes
            self.latencies.append(seconds)
            self._samples += 1
            if self.backend_hist is not None:
                self.backend_hist.observe(seconds)
        else:
            self.backend_errors += 1

    def latency_quantile(self, q: float, default: float) -> float:
        """Quantile of recent backend latencies (seconds); ``default`` with < 20 samples."""
        new = self._samples - self._sorted_at
        if new and (new >= RESORT_EVERY or len(self._sorted) < RESORT_EVERY):
            self._sorted = sorted(self.latencies)
            self._sorted_at = self._samples
        if len(self._sorted) < 20:
            return default
        return percentile(self._sorted, q)

    def latency_ms(self) -> dict[str, float]:
        vals = sorted(self.latencies)
        return {f"p{int(q * 100)}": round(percentile(vals, q) * 1000, 2)
                for q in (0.5, 0.9, 0.99)}

    def count_read_size(self, size: int) -> None:
        self.read_sizes[min(max(0, size - 1).bit_length(), READ_SIZE_BUCKETS - 1)] += 1

    def read_size_histogram(self) -> dict[str, int]:
        """Non-empty buckets as {"<=4K": n, "<=128K": m, ...}."""
        return {"<=" + _human(1 << k): n for k, n in enumerate(self.read_sizes) if n}

    def snapshot(self, *, cache_disk_bytes: int = 0, cache_disk_blocks: int = 0,
                 cache_mem_bytes: int = 0, cache_disk_limit: int = 0,
                 cache_mem_limit: int = 0, backend_retries: int = 0,
                 extra: dict | None = None) -> dict:
        spec_fetched = self.readahead_bytes_fetched + self.prefetch_bytes_fetched
        spec_used = self.readahead_bytes_used + self.prefetch_bytes_used
        snap = {
            "bytes_served": self.bytes_served,
            "bytes_fetched": self.bytes_fetched,
            "reads": self.reads,
            "read_errors": self.read_errors,
            "opens": self.opens,
            "mem_hits": self.mem_hits,
            "mem_misses": self.mem_misses,
            "disk_hits": self.disk_hits,
            "disk_misses": self.disk_misses,
            "hit_rate": round(self.demand_hit_bytes / self.bytes_served, 4)
            if self.bytes_served else 0.0,
            "readahead_bytes_fetched": self.readahead_bytes_fetched,
            "readahead_bytes_used": self.readahead_bytes_used,
            "prefetch_bytes_fetched": self.prefetch_bytes_fetched,
            "prefetch_bytes_used": self.prefetch_bytes_used,
            "prefetch_bytes_staged": self.prefetch_bytes_staged,
            "ahead_lost_memory_bytes": self.ahead_lost_memory_bytes,
            "ahead_lost_disk_bytes": self.ahead_lost_disk_bytes,
            "prefetch_precision": round(min(1.0, spec_used / spec_fetched), 4)
            if spec_fetched else 0.0,
            "backend_requests": self.backend_requests,
            "backend_errors": self.backend_errors,
            "backend_retries": backend_retries,
            "backend_latency_ms": self.latency_ms(),
            "singleflight_joins": self.singleflight_joins,
            "hedged_requests": self.hedged_requests,
            "disk_writes_skipped": self.disk_writes_skipped,
            "disk_writes_late": self.disk_writes_late,
            "pushed_files": self.pushed_files,
            "pushed_bytes": self.pushed_bytes,
            "push_errors": self.push_errors,
            "demand_hit_bytes": self.demand_hit_bytes,
            "cache_disk_bytes": cache_disk_bytes,
            "cache_disk_blocks": cache_disk_blocks,
            "cache_mem_bytes": cache_mem_bytes,
            "cache_disk_limit": cache_disk_limit,
            "cache_mem_limit": cache_mem_limit,
            "fuse_requests": dict(self.fuse_requests),
            "fuse_read_sizes": self.read_size_histogram(),
            "uptime_s": round(time.monotonic() - self.started, 3),
            "pid": os.getpid(),
        }
        if extra:
            snap.update(extra)
        return snap

"""Opt-in CPU accounting by part of the read path: how many CPU seconds the daemon spent
fetching, checksumming, writing and reading the disk tier, in FUSE handlers, in the
block store, in read-ahead/prefetch, and in the FUSE loop itself.

Off unless the daemon starts with ``NEURALCACHE_CPU_ACCOUNTING=1`` (``python -m
bench.breakdown`` sets it): each measurement is a ``thread_time_ns()`` pair, ~0.6 us per
call here, too much to pay on every read when nobody is looking.  Per-thread CPU
clocks make the parts exact for the thread they run on (a fetch thread waiting for the
network is not charged).  Only code that runs without yielding is measured this way:
on the trio thread a handler that awaits lets other tasks run on the same clock, so
the trio thread is split into ``ahead`` (read-ahead and prefetch decisions, which never
await) and ``loop_other`` (FUSE handlers, the block store and memory tier, pyfuse3
reading requests and writing replies, trio's scheduling, and the small GETs made on
the trio thread, backends/s3trio.py: ``fetch`` counts only the thread paths').
``worker_other`` is worker threads' CPU outside fetch and disk (trio's thread cache,
listing, metrics).

    t0 = cpuacct.clock()
    ... work ...
    cpuacct.charge("fetch", t0)
"""
from __future__ import annotations

import collections
import os
import threading
import time

ENABLED = os.environ.get("NEURALCACHE_CPU_ACCOUNTING") == "1"

# Parts measured on worker threads (disk_write and disk_read include their checksum,
# which is also shown alone as "checksum") / on the trio thread.
WORKER_PARTS = ("fetch", "disk_write", "disk_read")
LOOP_PARTS = ("ahead",)

_ns: collections.Counter = collections.Counter()
_lock = threading.Lock()
_loop_tid: int | None = None


def clock() -> int:
    """This thread's CPU clock in ns (0 when accounting is off)."""
    return time.thread_time_ns() if ENABLED else 0


def charge(part: str, t0: int) -> None:
    """Add this thread's CPU since ``t0`` (from clock()) to ``part``."""
    if ENABLED:
        dt = time.thread_time_ns() - t0
        with _lock:
            _ns[part] += dt


def set_loop_thread() -> None:
    """Called on the trio thread at start: its CPU total is read from /proc."""
    global _loop_tid
    _loop_tid = threading.get_native_id()


def _thread_cpu_s(tid: int) -> float:
    try:
        with open(f"/proc/self/task/{tid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, IndexError, ValueError):
        return 0.0


def snapshot() -> dict | None:
    """CPU seconds by part since the daemon started, or None when accounting is off."""
    if not ENABLED:
        return None
    with _lock:
        parts = {k: v / 1e9 for k, v in _ns.items()}
    t = os.times()
    total = t.user + t.system
    loop = _thread_cpu_s(_loop_tid) if _loop_tid is not None else 0.0
    measured_loop = sum(parts.get(k, 0.0) for k in LOOP_PARTS)
    worker = sum(parts.get(k, 0.0) for k in WORKER_PARTS)
    out = {k: round(v, 4) for k, v in sorted(parts.items())}
    out.update(total=round(total, 4), loop_thread=round(loop, 4),
               loop_other=round(max(0.0, loop - measured_loop), 4),
               worker_other=round(max(0.0, total - loop - worker), 4))
    return out

"""The cyclic garbage collector's pauses.  A collection holds the GIL, so while it runs
every thread of the daemon waits: the trio thread (every FUSE request), the workers and
the lister.  Each pause is timed; the stats show the longest and the total, and a long
one is logged, so a stall seen by a reader can be told apart from a slow remote."""
from __future__ import annotations

import gc
import logging
import time

log = logging.getLogger(__name__)

# A pause this long is logged as a warning: every request of the mount waited for it.
# 200 ms is the slow-request line the bench tools count (bench.tools.scale
# "opens_over_200ms"), above the longest young collection of an epoch over 1.28 M
# files (26-76 ms at the daemon's gen0 threshold, daemon.py GC_GEN0_THRESHOLD:
# `python -m bench.tools.scale TREE DIR LABEL epoch`, its gc_pause_longest_ms).
LOG_PAUSE_S = 0.2


class GcWatch:
    """Times every collection through ``gc.callbacks`` (one call at its start and one
    at its end, on the thread that triggered it, with the GIL held)."""

    def __init__(self) -> None:
        self.collections = [0, 0, 0]     # by generation
        self.longest_s = 0.0
        self.longest_gen = -1
        self.total_s = 0.0
        self._t0 = 0.0

    def install(self) -> None:
        if self._callback not in gc.callbacks:
            gc.callbacks.append(self._callback)

    def uninstall(self) -> None:
        if self._callback in gc.callbacks:
            gc.callbacks.remove(self._callback)

    def _callback(self, phase: str, info: dict) -> None:
        if phase == "start":
            self._t0 = time.perf_counter()
            return
        dt = time.perf_counter() - self._t0
        gen = info.get("generation", 0)
        self.collections[gen] += 1
        self.total_s += dt
        if dt > self.longest_s:
            self.longest_s, self.longest_gen = dt, gen
        if dt >= LOG_PAUSE_S:
            # a warning logged from here runs inside the collector's callback: cheap,
            # and nothing of it allocates cycles
            log.warning("the garbage collector stopped the daemon for %.0f ms (generation "
                        "%d, %d objects freed)", dt * 1e3, gen, info.get("collected", 0))

    def stats(self) -> dict:
        return {"gc_collections": list(self.collections),
                "gc_pause_longest_ms": round(self.longest_s * 1e3, 1),
                "gc_pause_longest_generation": self.longest_gen,
                "gc_pause_total_s": round(self.total_s, 3)}

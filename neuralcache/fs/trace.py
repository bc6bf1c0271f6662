"""Access trace: a bounded ring of open/read events, dumped as JSON Lines in the format
of DEVELOPING.md ("Access trace format"), which predictors/ parses and replays."""
from __future__ import annotations

import collections
import json
import time

# Events kept: ~1M events x ~100 bytes = ~100 MB at most would be too much for a
# sidecar feature; 200k events (~20 MB) hold several epochs of a 10k-file dataset.
DEFAULT_TRACE_EVENTS = 200_000


class TraceRing:
    def __init__(self, capacity: int = DEFAULT_TRACE_EVENTS):
        self._ring: collections.deque = collections.deque(maxlen=capacity)
        self._t0 = time.monotonic()
        self.enabled = capacity > 0
        self.recorded = 0

    def record(self, op: str, path: str, off: int, length: int, pid: int, size: int) -> None:
        if self.enabled:
            self._ring.append((time.monotonic() - self._t0, op, path, off, length, pid, size))
            self.recorded += 1

    def dump(self) -> bytes:
        lines = [json.dumps({"t": round(t, 6), "op": op, "path": path, "off": off,
                             "len": ln, "pid": pid, "size": size},
                            ensure_ascii=False, separators=(", ", ": "))
                 for t, op, path, off, ln, pid, size in list(self._ring)]
        return ("\n".join(lines) + ("\n" if lines else "")).encode("utf-8", "surrogateescape")

    def __len__(self) -> int:
        return len(self._ring)

"""The access trace: a ring of the last opens and reads, dumped as the JSON lines format
of DEVELOPING.md ("Access trace format"), which predictors/ parses and replays."""
from __future__ import annotations

import json
import time
from array import array

# Events kept.  200k hold several epochs of a 10k-file dataset.  Each costs 37 bytes in
# the ring's columns and a reference to its path, whose str is the one the rest of the
# daemon holds (Node.key interns it): ~9 MB in all.  As a deque of tuples it was 56 MB
# (tracemalloc, 200k events with a new path str each): a sidecar feature costing more
# than the predictors' packed catalog of a million files.
DEFAULT_TRACE_EVENTS = 200_000


class TraceRing:
    """The last ``capacity`` events (opens and reads), in columns filled round the ring:
    event k of all time lives in slot k % capacity."""

    def __init__(self, capacity: int = DEFAULT_TRACE_EVENTS):
        self.capacity = max(0, capacity)
        self.enabled = capacity > 0
        self.recorded = 0
        self._t0 = time.monotonic()
        self._cols: tuple[array, ...] = ()     # at the first event: a mount that never
        self._paths: list[str] = []             # traces pays nothing

    def record(self, op: str, path: str, off: int, length: int, pid: int, size: int) -> None:
        """``op``: "open" or "read"."""
        if not self.enabled:
            return
        if not self._cols:
            n = self.capacity
            self._cols = (array("d", bytes(8 * n)), array("b", bytes(n)),
                          array("q", bytes(8 * n)), array("q", bytes(8 * n)),
                          array("i", bytes(4 * n)), array("q", bytes(8 * n)))
            self._paths = [""] * n
        i = self.recorded % self.capacity
        t, reads, offs, lens, pids, sizes = self._cols
        t[i] = time.monotonic() - self._t0
        reads[i] = op == "read"
        offs[i], lens[i], pids[i], sizes[i] = off, length, pid, size
        self._paths[i] = path
        self.recorded += 1

    def dump(self) -> bytes:
        lines = []
        if self._cols:
            t, reads, offs, lens, pids, sizes = self._cols
            for k in range(self.recorded - len(self), self.recorded):
                i = k % self.capacity
                lines.append(json.dumps(
                    {"t": round(t[i], 6), "op": "read" if reads[i] else "open",
                     "path": self._paths[i], "off": offs[i], "len": lens[i],
                     "pid": pids[i], "size": sizes[i]},
                    ensure_ascii=False, separators=(", ", ": ")))
        return ("\n".join(lines) + ("\n" if lines else "")).encode("utf-8", "surrogateescape")

    def __len__(self) -> int:
        return min(self.recorded, self.capacity)

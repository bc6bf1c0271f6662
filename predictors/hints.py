"""Explicit upcoming order handed over by the job (the NoPFS idea): takes precedence
over every learned predictor while it lasts.

The job writes one path per line to ``MOUNT/.neuralcache/hints``; the daemon passes the
list to ``set_hints``. A malformed list is refused with ValueError naming the bad
entry and changes nothing. Hints are consumed as the job opens the hinted paths, in
any order within a window (several DataLoader workers read interleaved)."""
from __future__ import annotations

from typing import Iterable, Sequence

from .base import Catalog, OpenRate, Prediction, whole_file
from .events import Event
from .order import OrderCursor

# Upper bound on one hint list: 10 M paths ~ 8 epochs of ImageNet (1.28 M files); more
# is almost surely a runaway writer, and the list is held in memory.
MAX_HINTS = 10_000_000
# prob of a hinted item: the job said so; 0.98 leaves room for a dropped last batch or
# an early stop.
HINT_PROB = 0.98


def validate_hints(paths: object, catalog: Catalog) -> list[str]:
    """Return the hints as a list or raise ValueError naming the first bad entry."""
    if isinstance(paths, (str, bytes)) or not isinstance(paths, Sequence):
        raise ValueError("hints must be a sequence of paths")
    if len(paths) == 0:
        raise ValueError("hints: empty list (use clear_hints to drop hints)")
    if len(paths) > MAX_HINTS:
        raise ValueError(f"hints: {len(paths)} entries, more than MAX_HINTS={MAX_HINTS}")
    out = []
    for i, p in enumerate(paths):
        if not isinstance(p, str):
            raise ValueError(f"hint {i}: not a string: {p!r}")
        if not p:
            raise ValueError(f"hint {i}: empty path")
        if "\0" in p:
            raise ValueError(f"hint {i}: path contains NUL: {p!r}")
        if p not in catalog:
            raise ValueError(f"hint {i}: not in the catalog: {p!r}")
        out.append(p)
    return out


def parse_hints(text: str) -> list[str]:
    """The control-file format: one path per line; blank lines are ignored, a trailing
    CR (CRLF files) is stripped. Validation happens in set_hints."""
    return [line[:-1] if line.endswith("\r") else line
            for line in text.split("\n") if line.strip()]


class HintPredictor:
    name = "hints"

    def __init__(self, catalog: Iterable[tuple[str, int]] | Catalog = ()):
        self.catalog = Catalog.of(catalog)
        self.cursor: OrderCursor | None = None
        self.rate = OpenRate()

    def set_catalog(self, entries: Iterable[tuple[str, int]] | Catalog) -> None:
        self.catalog = Catalog.of(entries)

    def set_hints(self, paths: Sequence[str]) -> None:
        hints = validate_hints(paths, self.catalog)   # raises before anything changes
        self.cursor = OrderCursor(hints)

    def clear_hints(self) -> None:
        self.cursor = None

    @property
    def active(self) -> bool:
        return self.cursor is not None and not self.cursor.done

    def remaining(self) -> int:
        c = self.cursor
        return 0 if c is None else int(len(c) - c.consumed.sum())

    def observe(self, ev: Event) -> None:
        if ev.op != "open":
            return
        self.rate.observe_open(ev.t)
        if self.cursor is not None:
            self.cursor.consume(ev.path)

    def predict(self, max_items: int, prob_scale: float = 1.0) -> list[Prediction]:
        c = self.cursor
        if c is None or c.done:
            return []
        order, cat, rate = c.order, self.catalog, self.rate
        return [whole_file(cat, order[p], rate.eta(j + 1), HINT_PROB * prob_scale,
                           self.name)
                for j, p in enumerate(c.upcoming(max_items))]

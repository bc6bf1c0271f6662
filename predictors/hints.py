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
from .order import OrderCursor, PackedOrder

# Upper bound on one hint list: 10 M paths ~ 8 epochs of ImageNet (1.28 M files); more
# is almost surely a runaway writer (a PackedOrder of 10 M paths is ~120 MB).
MAX_HINTS = 10_000_000
# prob of a hinted item: the job said so; 0.98 leaves room for a dropped last batch or
# an early stop.
HINT_PROB = 0.98


def check_hint(i: int, p: object) -> None:
    """ValueError naming hint ``i`` if it cannot be a path.  Whether it names a file is
    not checked here: the directories it is in may not be listed yet (a lazily listed
    mount), and a hint that names nothing is skipped when its turn comes."""
    if not isinstance(p, str):
        raise ValueError(f"hint {i}: not a string: {p!r}")
    if not p:
        raise ValueError(f"hint {i}: empty path")
    if "\0" in p:
        raise ValueError(f"hint {i}: path contains NUL: {p!r}")
    if p.startswith("/") or any(part in ("", ".", "..") for part in p.split("/")):
        raise ValueError(f"hint {i}: not a relative path inside the mount: {p!r}")


def validate_hints(paths: object) -> list[str] | PackedOrder:
    """Return the hints (a list, or a PackedOrder checked as it was built) or raise
    ValueError naming the first bad entry."""
    if isinstance(paths, PackedOrder):
        n = len(paths)
    elif isinstance(paths, (str, bytes)) or not isinstance(paths, Sequence):
        raise ValueError("hints must be a sequence of paths")
    else:
        n = len(paths)
    if n == 0:
        raise ValueError("hints: empty list (use clear_hints to drop hints)")
    if n > MAX_HINTS:
        raise ValueError(f"hints: {n} entries, more than MAX_HINTS={MAX_HINTS}")
    if isinstance(paths, PackedOrder):
        return paths
    for i, p in enumerate(paths):
        check_hint(i, p)
    return list(paths)


# Substrings of "\n" + chunk whose absence proves every line of the chunk a relative
# path with no empty, "." or ".." component and no NUL (each found at memchr speed);
# a chunk with one of them (a hidden file's "/." too) is checked line by line.
_SUSPECT = ("\x00", "\n/", "//", "/.", "\n.")


class HintStream:
    """The control file's text arriving in chunks (``feed``), checked and packed as
    it comes (one path per line; blank lines ignored, a trailing CR stripped), so that
    an epoch of a million paths costs well under a second and no single step more
    than a few milliseconds; ``finish`` returns the PackedOrder."""

    def __init__(self) -> None:
        self.order = PackedOrder()
        self._carry = b""
        self.count = 0

    def feed(self, data: bytes) -> None:
        data = self._carry + data
        cut = data.rfind(b"\n") + 1
        self._carry = data[cut:]
        if cut:
            self._add(data[:cut])

    def _add(self, data: bytes) -> None:
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise ValueError(f"hints are not UTF-8 text: {exc}") from None
        if "\r" in text:
            text = text.replace("\r\n", "\n")
        if "\n\n" in text or text.startswith("\n"):          # blank lines
            text = "\n".join(ln for ln in text.split("\n") if ln) + "\n"
        framed = "\n" + text
        if any(b in framed for b in _SUSPECT):
            lines = text.split("\n")
            for i, ln in enumerate(lines[:-1]):
                check_hint(self.count + i, ln)          # names the first bad line
        lines = text.split("\n")
        lines.pop()                                     # after the last "\n"
        if self.count + len(lines) > MAX_HINTS:
            raise ValueError(f"hints: more than MAX_HINTS={MAX_HINTS} entries")
        self.order.extend(lines)
        self.count += len(lines)

    def finish(self) -> PackedOrder:
        if self._carry.strip():
            self._add(self._carry + b"\n")
        self._carry = b""
        return self.order.seal()


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

    def set_hints(self, paths: Sequence[str] | PackedOrder) -> None:
        hints = validate_hints(paths)             # raises before anything changes
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

"""Shared types: Prediction, the Predictor protocol, the catalog and an open-rate estimate.

Semantics of a Prediction (what the daemon's prefetch scheduler may rely on):

* ``eta_s``  expected seconds from now until the range is first read;
* ``prob``   probability that the range is read at all before it would be evicted: for
  ordered predictors (hints, stride, successor), whose lookahead is a few dozen
  opens (ensemble.py sizes it by Little's law), their measured hit rate; for "one of the unread
  members of this epoch", the chance that the working set is right (every member is
  read this epoch; ``eta_s`` says when).  A scheduler cuts low-probability items;
* ``length`` the bytes the predictor means (a whole file, or only its head when it
  cannot say how much of a large file will be read);
* lists are ranked best first (soonest needed, then most probable).
"""
from __future__ import annotations

import bisect
from typing import Iterable, NamedTuple, Protocol, runtime_checkable

from .events import Event

# Weight of a new inter-open gap in the EWMA rate estimate; 1/32 averages over about
# one batch of opens of a typical 32-sample DataLoader batch.
RATE_EWMA_ALPHA = 1.0 / 32
# Prior inter-open gap before anything was seen: 10 ms (~100 samples/s, the order of
# the seed's 115-117 samples/s training loop).
DEFAULT_OPEN_GAP_S = 0.010


class Prediction(NamedTuple):
    """Immutable (a NamedTuple: ~5x cheaper to build than a frozen dataclass, and
    predict() builds dozens per call)."""
    path: str
    offset: int
    length: int
    eta_s: float    # expected seconds until needed
    prob: float     # 0..1, see module docstring
    source: str     # name of the predictor that made it


@runtime_checkable
class Predictor(Protocol):
    name: str

    def observe(self, ev: Event) -> None: ...

    def predict(self, max_items: int, prob_scale: float = 1.0) -> list[Prediction]: ...

    def set_catalog(self, entries: "Iterable[tuple[str, int]] | Catalog") -> None: ...


class Catalog:
    """Paths with sizes in listing order (sorted like an S3 listing) and a path->index map."""

    __slots__ = ("paths", "sizes", "index")

    def __init__(self, entries: Iterable[tuple[str, int]] = ()):
        self.paths: list[str] = []
        self.sizes: list[int] = []
        for p, s in entries:
            self.paths.append(p)
            self.sizes.append(int(s))
        self.index: dict[str, int] = {p: i for i, p in enumerate(self.paths)}

    @classmethod
    def of(cls, entries: "Iterable[tuple[str, int]] | Catalog") -> "Catalog":
        return entries if isinstance(entries, Catalog) else cls(entries)

    def __len__(self) -> int:
        return len(self.paths)

    def __contains__(self, path: object) -> bool:
        return path in self.index

    def size_of(self, path: str, default: int = 0) -> int:
        i = self.index.get(path)
        return self.sizes[i] if i is not None else default

    def total_bytes(self) -> int:
        return sum(self.sizes)

    def indices(self, paths: Iterable[str]) -> list[int]:
        """The indices of those of ``paths`` in the catalog."""
        get = self.index.get
        return [i for i in map(get, paths) if i is not None]

    def scope_range(self, prefix: str) -> tuple[int, int]:
        """Indices [lo, hi) of the paths under directory ``prefix`` ("a/b/"; "" = all)."""
        paths = self.paths
        lo = bisect.bisect_left(paths, prefix)
        hi = bisect.bisect_left(paths, prefix[:-1] + chr(ord("/") + 1)) if prefix else len(paths)
        return lo, hi


class OpenRate:
    """EWMA of the gap between consecutive opens; eta of the j-th next open = j * gap."""

    __slots__ = ("gap", "last_t")

    def __init__(self) -> None:
        self.gap = DEFAULT_OPEN_GAP_S
        self.last_t: float | None = None

    def observe_open(self, t: float) -> None:
        if self.last_t is not None:
            dt = t - self.last_t
            if dt >= 0:
                self.gap += RATE_EWMA_ALPHA * (dt - self.gap)
        self.last_t = t

    def eta(self, j: int) -> float:
        return j * self.gap


def whole_file(cat: Catalog, path: str, eta: float, prob: float, source: str,
               size: int | None = None) -> Prediction:
    """A prediction for a whole object (cross-file predictors prefetch whole files; the
    scheduler fetches their first blocks first)."""
    return Prediction(path, 0, cat.size_of(path) if size is None else size, eta,
                      1.0 if prob > 1.0 else (prob if prob > 0.0 else 0.0), source)

"""Within-file sequential reads (a shard read in chunks, a large weights file): predict
the continuation of each file being read sequentially, with a window that doubles per
sequential read (the peers' readahead rule, applied to the most recent files)."""
from __future__ import annotations

from collections import OrderedDict
from typing import Iterable

from .base import Catalog, Prediction
from .events import Event

# Files tracked at once: 64 ~ 8 workers x a few files each, plus slack.
SEQ_MAX_FILES = 64
# Reads in a row that continue the previous one before predicting.
SEQ_MIN_RUN = 2
# Window cap: 8 MiB ~ what a 300 MB/s stream consumes per 60 ms RTT / 2 (Little's law).
SEQ_MAX_WINDOW = 8 << 20
# prob of a continuation: within-file sequential reads rarely stop early; 0.9 accounts for
# the end of a tar member and early exits.
SEQ_PROB = 0.9


class _File:
    __slots__ = ("end", "run", "size", "last_len")

    def __init__(self, size: int):
        self.end = 0
        self.run = 0
        self.size = size
        self.last_len = 0


class SeqReadPredictor:
    name = "seqread"

    def __init__(self, catalog: Iterable[tuple[str, int]] | Catalog = ()):
        self.files: OrderedDict[str, _File] = OrderedDict()
        self.set_catalog(catalog)

    def set_catalog(self, entries: Iterable[tuple[str, int]] | Catalog) -> None:
        self.catalog = Catalog.of(entries)

    def observe(self, ev: Event) -> None:
        f = self.files.get(ev.path)
        if f is None:
            f = self.files[ev.path] = _File(ev.size)
            if len(self.files) > SEQ_MAX_FILES:
                self.files.popitem(last=False)
        else:
            self.files.move_to_end(ev.path)
        if ev.op != "read":
            return
        f.run = f.run + 1 if ev.off == f.end else (1 if ev.off == 0 else 0)
        f.end = ev.off + ev.len
        f.last_len = ev.len
        f.size = max(f.size, ev.size)

    def predict(self, max_items: int, prob_scale: float = 1.0) -> list[Prediction]:
        out: list[Prediction] = []
        for path in reversed(self.files):
            if len(out) >= max_items:
                break
            f = self.files[path]
            if f.run >= SEQ_MIN_RUN and f.end < f.size:
                win = min(SEQ_MAX_WINDOW, f.last_len << min(f.run, 16))
                out.append(Prediction(path, f.end, min(win, f.size - f.end), 0.0,
                                      SEQ_PROB * prob_scale, self.name))
        return out

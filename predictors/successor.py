"""Successor model: an order repeated across epochs.

Learns each epoch's order of first accesses; from the second epoch on, predicts that
the job follows the previous epoch's order (a "next-after" table generalised to any
depth: the successors of the cursor position in last epoch's sequence). Covers a fixed
shuffle (a sampler seeded identically every epoch, e.g. DistributedSampler without
set_epoch) and any repeated scan order, interleaved by several workers.
"""
from __future__ import annotations

from typing import Iterable

from .base import Catalog, OpenRate, Prediction, whole_file
from .epoch import EpochTracker
from .events import Event
from .order import OrderCursor

# An open counts as "following last epoch's order" if it was among the first this-many
# predicted (unconsumed) positions: 8 workers x batch 8 in flight.
SUCC_HIT_WINDOW = 64
# With W positions left a random open lands in the top k with chance k/W: the window
# shrinks to W/8 so that a reshuffled epoch scores ~1/8 at most, never "confident".
SUCC_CHANCE_INV = 8
# EWMA weight of one open in the confidence: 1/16 ~ two batches of 8 workers.
SUCC_CONF_ALPHA = 1.0 / 16


class SuccessorPredictor:
    name = "successor"

    def __init__(self, catalog: Iterable[tuple[str, int]] | Catalog = (),
                 tracker: EpochTracker | None = None):
        self.tracker = EpochTracker() if tracker is None else tracker   # shared: see()
        self.rate = OpenRate()
        self.cursor: OrderCursor | None = None
        self.conf = 0.0
        self.set_catalog(catalog)

    def set_catalog(self, entries: Iterable[tuple[str, int]] | Catalog) -> None:
        self.catalog = Catalog.of(entries)
        self.tracker.set_catalog(self.catalog)

    def observe(self, ev: Event) -> None:
        is_open = ev.op == "open"
        if is_open:
            self.rate.observe_open(ev.t)
        started, was, _, _ = self.tracker.see(ev)
        if started:     # by an open, or by a read that completed last epoch's members
            # (a path once per epoch: its place is the tracker's record, of this epoch)
            self.cursor = OrderCursor(self.tracker.prev_order, self.tracker.prev_position)
            for p in self.tracker.current_members():    # carried into the new epoch
                self.cursor.consume(p)
            return
        if not is_open:
            return
        if self.cursor is None or was or not self.tracker.consumed(ev.path):
            return          # re-read within the epoch
        window = min(SUCC_HIT_WINDOW, self.cursor.left // SUCC_CHANCE_INV)
        r = self.cursor.consume(ev.path)
        if window < 1:
            return      # near the end of the order any guess is in the top few
        hit = r is not None and r[1] < window
        self.conf += SUCC_CONF_ALPHA * ((1.0 if hit else 0.0) - self.conf)

    def confidence(self) -> float:
        return self.conf if self.cursor is not None and not self.cursor.done else 0.0

    def predict(self, max_items: int, prob_scale: float = 1.0) -> list[Prediction]:
        c = self.cursor
        if c is None or c.done or self.conf <= 0.0:
            return []
        order, cat, rate, conf = c.order, self.catalog, self.rate, self.conf * prob_scale
        return [whole_file(cat, order[p], rate.eta(j + 1), conf, self.name)
                for j, p in enumerate(c.upcoming(max_items))]

"""The default predictor: hints first; otherwise the learned classifier picks which
predictor to trust and how deep to look ahead.

    p = make_default_predictor(catalog)          # [(path, size), ...] in listing order
    p.observe(ev); ...; p.predict(64)            # ranked list[Prediction]
    p.set_hints(paths) / p.clear_hints()

Policy per pattern class (see predictors/classifier.py for the classes):

    sequential, strided -> StridePredictor        depth = Little's law (below)
    repeated            -> SuccessorPredictor     depth = Little's law
    shuffled            -> EpochSetPredictor      depth = max_items (no order to exploit;
                                                  every member is read this epoch, the
                                                  byte budgets bound what is fetched)
    random              -> no cross-file prefetch
Within-file continuations (SeqReadPredictor) come first in every case. Each prediction's
prob is the sub-predictor's prob times the classifier's probability for the class.
"""
from __future__ import annotations

import math
from typing import Iterable, Sequence

from .base import Catalog, OpenRate, Prediction
from .classifier import PatternClassifier, default_classifier
from .epoch import EpochTracker
from .epochset import EpochSetPredictor
from .events import Event
from .features import WINDOW, PatternFeatures
from .hints import HintPredictor
from .seqread import SeqReadPredictor
from .stride import StridePredictor
from .successor import SuccessorPredictor

# Fetch latency the lookahead must cover: the design's 60 ms WAN round trip.
FETCH_LATENCY_S = 0.060
# Little's law gives items in flight = latency / inter-open gap; x4 covers transfer time,
# queueing behind other fetches and jitter (a fetch of a 100 KB file at 60 ms RTT is
# ~2x RTT once the link is busy).
DEPTH_SAFETY = 4.0
MIN_DEPTH = 4        # never look less than a few files ahead
MAX_DEPTH = 1024     # nor more than ~8 workers x 128 samples
# Re-classify every 16 opens: features + forest cost ~100-150 us, ~8 us per open
# amortized; a pattern change is still picked up within a quarter of the feature window.
CLASSIFY_EVERY = 16
# Classify once half a feature window has been seen; before that trust only a stride
# predictor that has already proven itself.
CLASSIFY_AFTER = WINDOW // 2
# Ordered predictors used as fallback when the class's own predictor has nothing, if
# their measured depth-1 hit rate is at least this.
FALLBACK_MIN_CONF = 0.6
# Opens before unclassified, unordered access falls back to the epoch-set guess: a few
# opens tell an ordered scan (stride confidence rises at once) from a shuffled one.
EARLY_EPOCHSET_AFTER = 4
# While the class says "shuffled", a successor whose depth-1 hit rate reached this is
# trusted anyway (a repeated order shows in its hit rate after ~16 opens, in the feature
# window only after ~64).
ORDERED_OVERRIDE_CONF = 0.8
# Within-file continuations listed at most (one per file being read sequentially).
SEQ_ITEMS = 8


class EnsemblePredictor:
    name = "ensemble"

    def __init__(self, catalog: Iterable[tuple[str, int]] | Catalog = (),
                 classifier: PatternClassifier | None = None,
                 latency_s: float = FETCH_LATENCY_S):
        self.classifier = classifier or default_classifier()
        self.latency_s = latency_s
        self.hints = HintPredictor()
        self.stride = StridePredictor()
        tracker = EpochTracker()     # one for the three that follow epochs (its see())
        self.successor = SuccessorPredictor(tracker=tracker)
        self.epochset = EpochSetPredictor(tracker=tracker)
        self.seqread = SeqReadPredictor()
        self.features = PatternFeatures(tracker=tracker)
        self.rate = OpenRate()
        self.opens = 0
        self.pattern: str | None = None   # current class, None until classified
        self.pattern_prob = 0.0
        self.set_catalog(catalog)

    def _parts(self):
        return (self.hints, self.stride, self.successor, self.epochset, self.seqread,
                self.features)

    def set_catalog(self, entries: Iterable[tuple[str, int]] | Catalog) -> None:
        self.catalog = Catalog.of(entries)
        for p in self._parts():
            p.set_catalog(self.catalog)

    def set_hints(self, paths: Sequence[str]) -> None:
        """Validate and install an explicit upcoming order (ValueError, nothing changed,
        if any entry is bad)."""
        self.hints.set_hints(paths)
        self.epochset.clear_planned()     # a new order is planned afresh

    def clear_hints(self) -> None:
        self.hints.clear_hints()
        self.epochset.clear_planned()

    # The record of whole files the caller (the daemon's scheduler) has cached or on
    # their way: kept once, by the epoch-set predictor, which also clears it at every
    # epoch boundary (files evicted since may be wanted again) and skips them.
    def note_planned(self, path: str) -> None:
        """The daemon has ``path`` cached or on its way: candidate lists skip it."""
        self.epochset.note_planned(path)

    def is_planned(self, path: str) -> bool:
        return self.epochset.is_planned(path)

    def observe(self, ev: Event) -> None:
        for p in self._parts():
            p.observe(ev)
        if ev.op == "open":
            self.rate.observe_open(ev.t)
            self.opens += 1
            if self.opens >= CLASSIFY_AFTER and self.opens % CLASSIFY_EVERY == 0:
                self.pattern, self.pattern_prob = self.classifier.classify(
                    self.features.vector())

    def depth(self) -> int:
        """Little's law lookahead, scaled by how sure the classifier is."""
        d = DEPTH_SAFETY * self.latency_s / max(self.rate.gap, 1e-6)
        d *= max(self.pattern_prob, 0.5) if self.pattern else 1.0
        return int(min(MAX_DEPTH, max(MIN_DEPTH, math.ceil(d))))

    def _cross_file(self, max_items: int) -> list[Prediction]:
        if self.hints.active:
            return self.hints.predict(max_items)
        pat, pp = self.pattern, self.pattern_prob
        if pat is None:
            if self.stride.confidence() >= FALLBACK_MIN_CONF:
                return self.stride.predict(min(max_items, self.depth()))
            # Not classified yet (the first CLASSIFY_AFTER opens of a job): if the opens
            # so far are not an ordered scan, the unread files of the directory being
            # read are the best guess (a shuffled first epoch); the daemon's byte budget
            # bounds what this costs when the guess is wrong.
            if self.opens >= EARLY_EPOCHSET_AFTER and self.stride.confidence() < 0.3:
                return self.epochset.predict(max_items)
            return []
        if pat == "random":
            return []
        depth = min(max_items, self.depth())
        if pat == "shuffled":
            # the classifier needs a window to notice that a new epoch repeats the last
            # one; the successor's own hit rate notices within a few opens
            if self.successor.confidence() >= ORDERED_OVERRIDE_CONF:
                return self.successor.predict(depth, pp)
            return self.epochset.predict(max_items, pp)
        primary = self.successor if pat == "repeated" else self.stride
        preds = primary.predict(depth, pp)
        if not preds:
            best = max((self.stride, self.successor), key=lambda p: p.confidence())
            if best.confidence() >= FALLBACK_MIN_CONF:
                preds = best.predict(depth, pp)
        return preds

    def predict(self, max_items: int, prob_scale: float = 1.0) -> list[Prediction]:
        if max_items <= 0:
            return []
        out = self.seqread.predict(min(SEQ_ITEMS, max_items))
        seen = {p.path for p in out}
        cross = self._cross_file(max_items)
        if prob_scale != 1.0:
            cross = [p._replace(prob=p.prob * prob_scale) for p in cross]
            out = [p._replace(prob=p.prob * prob_scale) for p in out]
        if not seen:
            return cross[:max_items]
        for p in cross:
            if len(out) >= max_items:
                break
            if p.path not in seen:
                seen.add(p.path)
                out.append(p)
        return out

    def stats(self) -> dict:
        """For the daemon's stats/metrics: which pattern is in force and how deep."""
        return {"pattern": self.pattern or "unknown", "pattern_prob": round(self.pattern_prob, 3),
                "lookahead": self.depth(), "hints_remaining": self.hints.remaining(),
                "epoch": self.epochset.tracker.epoch}


def make_default_predictor(catalog: Iterable[tuple[str, int]] | Catalog = (),
                           latency_s: float = FETCH_LATENCY_S) -> EnsemblePredictor:
    return EnsemblePredictor(catalog, latency_s=latency_s)

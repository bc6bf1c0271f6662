"""Stride across files in listing order, per reader stream (pid).

Covers a sequential scan (stride 1), rank r of w of a distributed job reading every
w-th file or shard (stride w), reverse scans, and several DataLoader workers each
working through its own batches (one stream per worker pid; the streams' predictions
are merged round-robin, so every worker's next file comes first).
"""
from __future__ import annotations

from typing import Iterable

from .base import Catalog, OpenRate, Prediction, whole_file
from .events import Event

# A stream's stride is the majority delta of its recent opens (Boyer-Moore vote, capped
# so a stride change is picked up after a few opens): trust it after 2 agreeing deltas.
STRIDE_MIN_AGREE = 2
STRIDE_AGREE_CAP = 4
# EWMA weight of one hit/miss of the depth-1 guess in a stream's confidence: 1/8 ~
# memory of a few batches.
STRIDE_CONF_ALPHA = 1.0 / 8
# Probability decays with depth: errors compound (a batch boundary of a worker or the end
# of a shard list); 0.99/step keeps depth 64 at ~0.5 of the stream's confidence.
STRIDE_DEPTH_DECAY = 0.99
# Streams silent for this many opens are dropped (a finished worker).
STREAM_IDLE_OPENS = 512
# An index opened within this many opens is not predicted again (another worker already
# took it): 256 = 8 workers x batch 32 in flight. Capped at half the observed re-read
# distance so that the next epoch of a scan is not mistaken for "already read".
RECENT_READ_OPENS = 256
# Re-opens closer than this are a reader re-opening a file, not a new pass over the data.
REOPEN_OPENS = 32
# Predictions that wrap past the end of the listing (next epoch) are less certain: the job
# may stop after this epoch.
WRAP_PROB_SCALE = 0.5


class _Stream:
    __slots__ = ("last", "stride", "agree", "conf", "seen")

    def __init__(self, idx: int, seq: int):
        self.last = idx
        self.stride = 0
        self.agree = 0
        self.conf = 0.0
        self.seen = seq


class StridePredictor:
    name = "stride"

    def __init__(self, catalog: Iterable[tuple[str, int]] | Catalog = ()):
        self.streams: dict[int, _Stream] = {}
        self.rate = OpenRate()
        self.seq = 0
        self.set_catalog(catalog)

    def set_catalog(self, entries: Iterable[tuple[str, int]] | Catalog) -> None:
        self.catalog = Catalog.of(entries)
        self.last_open = [-1 << 40] * len(self.catalog)
        self.streams.clear()
        self.regap = 1 << 40       # shortest distance (in opens) between two opens of a file

    def observe(self, ev: Event) -> None:
        if ev.op != "open":
            return
        idx = self.catalog.index.get(ev.path)
        if idx is None:
            return
        self.rate.observe_open(ev.t)
        self.seq += 1
        gap = self.seq - self.last_open[idx]
        if REOPEN_OPENS < gap < self.regap:
            self.regap = gap
        self.last_open[idx] = self.seq
        st = self.streams.get(ev.pid)
        if st is None:
            self.streams[ev.pid] = _Stream(idx, self.seq)
            return
        n = len(self.catalog)
        d = idx - st.last
        if d == 0:
            return                       # re-open of the same file
        if st.agree >= STRIDE_MIN_AGREE:
            hit = (st.last + st.stride) % n == idx
            st.conf += STRIDE_CONF_ALPHA * ((1.0 if hit else 0.0) - st.conf)
        if d == st.stride:
            st.agree = min(st.agree + 1, STRIDE_AGREE_CAP)
        else:
            st.agree -= 1
            if st.agree <= 0:
                st.stride, st.agree = d, 1
        st.last = idx
        st.seen = self.seq

    def confidence(self) -> float:
        """Best confidence among the live strided streams (for the ensemble)."""
        live = [s.conf for s in self.streams.values()
                if self.seq - s.seen < STREAM_IDLE_OPENS and s.agree >= STRIDE_MIN_AGREE]
        return max(live, default=0.0)

    def predict(self, max_items: int, prob_scale: float = 1.0) -> list[Prediction]:
        n = len(self.catalog)
        if n == 0 or max_items <= 0:
            return []
        seq = self.seq
        for pid in [p for p, s in self.streams.items() if seq - s.seen >= STREAM_IDLE_OPENS]:
            del self.streams[pid]
        live = sorted((s for s in self.streams.values()
                       if s.agree >= STRIDE_MIN_AGREE and s.conf > 0.0),
                      key=lambda s: -s.seen)
        if not live:
            return []
        recent = seq - min(RECENT_READ_OPENS, n // 2, self.regap // 2)
        last_open, paths, sizes = self.last_open, self.catalog.paths, self.catalog.sizes
        out: list[Prediction] = []
        emitted: set[int] = set()
        for d in range(1, max_items + 1):
            decay = STRIDE_DEPTH_DECAY ** (d - 1)
            for s in live:
                raw = s.last + d * s.stride
                idx = raw % n
                if idx in emitted or last_open[idx] > recent:
                    continue
                emitted.add(idx)
                prob = s.conf * decay * prob_scale * (WRAP_PROB_SCALE if raw != idx else 1.0)
                out.append(whole_file(self.catalog, paths[idx], self.rate.eta(len(out) + 1),
                                      prob, self.name, sizes[idx]))
                if len(out) >= max_items:
                    return out
        return out

"""Windowed features of the access stream, for the pattern classifier.

One ``PatternFeatures`` object observes events (O(1) per event: a few dict and deque
operations) and on demand summarises the last WINDOW opens into a fixed-length
vector (O(WINDOW)). The same class produces training data (predictors.train) and live
features (predictors.ensemble), so the two cannot drift apart.
"""
from __future__ import annotations

import math
from collections import Counter, OrderedDict, deque
from typing import Iterable

from .base import Catalog
from .epoch import EpochTracker
from .events import Event

# Opens summarised per vector: 64 ~ 8 workers x 8 samples, long enough to see a batch
# boundary of every worker and short enough to follow a change of pattern in one batch.
WINDOW = 64
# Files whose read offsets are remembered for the within-file sequential ratio.
SEQ_FILES = 64

FEATURES = (
    "seq_frac",        # per-reader listing-index delta == +1
    "stride_frac",     # per-reader delta == the window's most common delta
    "stride_log",      # log2(1 + |most common delta|)
    "gap_mode_frac",   # gaps between sorted distinct indices of the window == their mode
    "gap_mode_log",    # log2(1 + that mode gap): 1 for a scan by many workers, w for rank r of w
    "repeat_frac",     # per-reader steps in last epoch's order == their (positive) mode:
                       # +1 (batches) or +W (batch 1, W workers) when the order repeats
    "in_prev_frac",    # opens of members of last epoch's working set
    "reread_frac",     # opens of files already read this epoch
    "has_prev",        # an epoch boundary has been seen
    "coverage",        # fraction of the (expected) working set read this epoch
    "file_seq_frac",   # reads continuing the previous read of the same file
    "reads_per_open",  # log2(1 + reads / opens) in the window
    "dt_cv",           # coefficient of variation of inter-open times
    "seen_frac",       # opens of paths opened before (ever): 0 in a first shuffled epoch
    "short_repeat",    # re-opens after fewer than half as many opens as distinct paths
                       # seen (shuffled epochs ~0.125 of re-opens, random ~0.39)
)


class PatternFeatures:
    def __init__(self, catalog: Iterable[tuple[str, int]] | Catalog = (),
                 tracker: EpochTracker | None = None):
        self.tracker = EpochTracker() if tracker is None else tracker   # shared: see()
        self.last_by_pid: dict[int, tuple[int, int]] = {}   # pid -> (index, prev_pos)
        # per open: (index, delta or None, step in last epoch's order or None, in_prev, reread, dt)
        self.opens: deque = deque(maxlen=WINDOW)
        self.reads: deque = deque(maxlen=4 * WINDOW)         # sequential-read flags
        self.read_seq_sum = 0                                # sum of those flags
        self.n_reads = 0                                     # reads ever
        self.read_end: OrderedDict[str, int] = OrderedDict()
        self.last_t: float | None = None
        self.set_catalog(catalog)

    def set_catalog(self, entries: Iterable[tuple[str, int]] | Catalog) -> None:
        self.catalog = Catalog.of(entries)
        self.tracker.set_catalog(self.catalog)

    def observe(self, ev: Event) -> None:
        if ev.op == "read":
            end = self.read_end.get(ev.path)
            flag = end is not None and ev.off == end and ev.off > 0
            if len(self.reads) == self.reads.maxlen:
                self.read_seq_sum -= self.reads[0]
            self.reads.append(flag)
            self.read_seq_sum += flag
            self.n_reads += 1
            self.read_end[ev.path] = ev.off + ev.len
            self.read_end.move_to_end(ev.path)
            if len(self.read_end) > SEQ_FILES:
                self.read_end.popitem(last=False)
            self.tracker.see(ev)
            return
        idx = self.catalog.index.get(ev.path, -1)
        tracker = self.tracker
        _, was, active, ls = tracker.see(ev)
        reread = was and not active
        pp = tracker.prev_position(ev.path)
        last = self.last_by_pid.get(ev.pid)
        delta = rep = None
        if last is not None:
            if idx >= 0 and last[0] >= 0:
                delta = idx - last[0]
            if pp >= 0 and last[1] >= 0:
                rep = pp - last[1]
        self.last_by_pid[ev.pid] = (idx, pp)
        dt = 0.0 if self.last_t is None else max(0.0, ev.t - self.last_t)
        self.last_t = ev.t
        seen = ls > 0                   # ls: the tracker's count of opens at its last
        short = seen and (tracker.opens - ls) < 0.5 * tracker.opened_paths
        self.opens.append((idx, delta, rep, pp >= 0, reread, dt, seen, short, self.n_reads))

    def vector(self) -> list[float]:
        ops = self.opens
        n = len(ops)
        if n == 0:
            return [0.0] * len(FEATURES)
        deltas = [o[1] for o in ops if o[1] is not None and o[1] != 0]
        nd = len(deltas) or 1
        seq = sum(1 for d in deltas if d == 1) / nd
        mode, mcount = Counter(deltas).most_common(1)[0] if deltas else (0, 0)
        idxs = sorted({o[0] for o in ops if o[0] >= 0})
        gaps = [b - a for a, b in zip(idxs, idxs[1:])]
        gval, gcount = Counter(gaps).most_common(1)[0] if gaps else (0, 0)
        gmode = gcount / len(gaps) if gaps else 0.0
        reps = [o[2] for o in ops if o[2] is not None]
        rmode, rcount = Counter(reps).most_common(1)[0] if reps else (0, 0)
        rep = rcount / len(reps) if reps and rmode > 0 else 0.0
        in_prev = sum(o[3] for o in ops) / n
        reread = sum(o[4] for o in ops) / n
        fs = self.read_seq_sum / len(self.reads) if self.reads else 0.0
        dts = [o[5] for o in list(ops)[1:]]
        if dts:
            m = sum(dts) / len(dts)
            sd = math.sqrt(sum((d - m) ** 2 for d in dts) / len(dts))
            cv = sd / m if m > 0 else 0.0
        else:
            cv = 0.0
        reads_in = self.n_reads - ops[0][8]       # reads since the window's first open
        return [seq, mcount / nd, math.log2(1 + abs(mode)), gmode, math.log2(1 + gval), rep, in_prev, reread,
                1.0 if self.tracker.epoch > 0 else 0.0, min(1.0, self.tracker.coverage()),
                fs, math.log2(1 + reads_in / n), min(cv, 10.0),
                sum(o[6] for o in ops) / n, sum(o[7] for o in ops) / n]

"""Cache simulator: replays a trace through a predictor and a block cache.

Model (all tunables in SimConfig, defaults from the design notes):
* the consumer replays the trace's own timing; a demand miss stalls it for the fetch
  (demand fetches go straight to the backend, ahead of prefetches);
* prefetches run on ``concurrency`` slots, each fetch costs ``rtt_s + bytes/(bandwidth /
  concurrency)``; a prefetch is issued only when a slot is idle (no queueing), its
  prob >= ``min_prob``, prefetched-but-unused bytes stay under ``prefetch_budget`` of the
  capacity, and (epoch eviction) it only displaces data already consumed this epoch;
* eviction is LRU or epoch-aware (consumed-this-epoch first, newest consumed first, the
  files being read protected; then LRU), using predictors.epoch.EpochTracker.

The predictor observes every event; predict() is called after every open and every
read that continues a file (a first read right after its open changes nothing), and
its ranked list is walked in order.

Metrics: hit rate (demand block lookups served from cache, data already arrived),
prefetch precision (used prefetched bytes / prefetched bytes), coverage (demand misses,
late prefetches included, whose file a prediction had named), timeliness (used
prefetched bytes that arrived before they were needed / used prefetched bytes).
"""
from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Callable, Sequence

from .base import Prediction
from .epoch import EpochTracker
from .events import Event

# 1 MiB blocks: the usual ranged-GET size of S3 clients (Mountpoint-s3 parts are 8 MiB,
# rclone's chunks 128 MiB; 1 MiB keeps a 100 KB sample to one request).
BLOCK = 1 << 20
RTT_S = 0.060             # the design's WAN round trip
BANDWIDTH = 300e6         # bytes/s across all streams (the design's Little's-law example)
CONCURRENCY = 16          # ~ 18 MB in flight at 300 MB/s x 60 ms, in 1 MiB blocks
MAX_ITEMS = 64            # predictions asked for per event
MIN_PROB = 0.05           # scheduler cut: predictions below this are not fetched
PREFETCH_BUDGET = 0.5     # prefetched-but-unused bytes may hold at most half the cache


@dataclass
class SimConfig:
    capacity: int
    eviction: str = "epoch"            # "lru" | "epoch"
    block: int = BLOCK
    rtt_s: float = RTT_S
    bandwidth: float = BANDWIDTH
    concurrency: int = CONCURRENCY
    max_items: int = MAX_ITEMS
    min_prob: float = MIN_PROB
    prefetch_budget: float = PREFETCH_BUDGET


@dataclass
class SimResult:
    lookups: int = 0
    hits: int = 0
    late: int = 0
    misses: int = 0
    covered: int = 0
    prefetched_bytes: int = 0
    used_prefetched_bytes: int = 0
    timely_bytes: int = 0
    demand_bytes: int = 0
    stall_s: float = 0.0
    per_epoch: dict = field(default_factory=dict)   # epoch -> [lookups, hits]

    @property
    def hit_rate(self) -> float:
        return self.hits / self.lookups if self.lookups else 0.0

    @property
    def precision(self) -> float:
        return self.used_prefetched_bytes / self.prefetched_bytes if self.prefetched_bytes else 0.0

    @property
    def coverage(self) -> float:
        m = self.misses + self.late
        return self.covered / m if m else 1.0

    @property
    def timeliness(self) -> float:
        u = self.used_prefetched_bytes
        return self.timely_bytes / u if u else 0.0

    def epoch_hit_rate(self, epochs: Sequence[int]) -> float:
        lk = sum(self.per_epoch.get(e, [0, 0])[0] for e in epochs)
        h = sum(self.per_epoch.get(e, [0, 0])[1] for e in epochs)
        return h / lk if lk else 0.0


class _Block:
    __slots__ = ("size", "arrive", "prefetched", "used")

    def __init__(self, size: int, arrive: float, prefetched: bool):
        self.size, self.arrive, self.prefetched, self.used = size, arrive, prefetched, False


class _Cache:
    def __init__(self, cfg: SimConfig):
        self.cfg = cfg
        self.blocks: dict[tuple[str, int], _Block] = {}
        self.used = 0
        self.unused_prefetch = 0
        self.tracker = EpochTracker()
        self.epoch = 0
        self.cons: OrderedDict = OrderedDict()   # consumed this epoch (epoch policy)
        self.rest: OrderedDict = OrderedDict()   # LRU order

    def observe(self, ev: Event) -> None:
        if self.cfg.eviction != "epoch":
            return
        self.tracker.observe(ev)
        if self.tracker.epoch != self.epoch:       # new epoch: nothing is consumed
            self.epoch = self.tracker.epoch
            self.rest.update(self.cons)
            self.cons.clear()

    def touch(self, key) -> None:
        if self.cfg.eviction == "epoch" and self.tracker.consumed(key[0]):
            self.rest.pop(key, None)
            self.cons[key] = None
            self.cons.move_to_end(key)
        else:
            self.cons.pop(key, None)
            self.rest[key] = None
            self.rest.move_to_end(key)

    def _victim(self, for_prefetch: bool):
        if self.cfg.eviction == "epoch":
            # blocks already read this epoch: newest first among files no longer being
            # read, then the oldest of the files still active (EpochTracker.evict_rank)
            for key in reversed(self.cons):
                if not self.tracker.active(key[0]):
                    return key
            if self.cons:
                return next(iter(self.cons))
            if for_prefetch:
                return None     # never evict data not yet consumed this epoch for a guess
        return next(iter(self.rest), None) or next(iter(self.cons), None)

    def make_room(self, size: int, for_prefetch: bool) -> bool:
        cap = self.cfg.capacity
        if size > cap:
            return False
        while self.used + size > cap:
            key = self._victim(for_prefetch)
            if key is None:
                return False
            self.remove(key)
        return True

    def remove(self, key) -> None:
        b = self.blocks.pop(key)
        self.used -= b.size
        if b.prefetched and not b.used:
            self.unused_prefetch -= b.size
        self.cons.pop(key, None)
        self.rest.pop(key, None)

    def insert(self, key, size: int, arrive: float, prefetched: bool) -> None:
        self.blocks[key] = _Block(size, arrive, prefetched)
        self.used += size
        if prefetched:
            self.unused_prefetch += size
        self.rest[key] = None


def _blocks(off: int, length: int, size: int, bs: int):
    end = min(off + length, size) if size else off + length
    for b in range(off // bs, (max(end, off + 1) - 1) // bs + 1):
        yield b, min(bs, (size or end) - b * bs)


def simulate(events: Sequence[Event], predictor, cfg: SimConfig,
             epoch_of: Sequence[int] | None = None,
             sizes: dict[str, int] | None = None) -> SimResult:
    """Replay events; predictor may be None (no prefetch). Returns the metrics."""
    res = SimResult()
    cache = _Cache(cfg)
    slots = [0.0] * cfg.concurrency
    per_stream_bw = cfg.bandwidth / cfg.concurrency
    predicted: set[str] = set()
    cover_now: dict[str, bool] = {}
    budget = cfg.prefetch_budget * cfg.capacity
    for i, ev in enumerate(events):
        now = ev.t + res.stall_s
        cache.observe(ev)
        if ev.op == "open":
            cover_now[ev.path] = ev.path in predicted
            predicted.discard(ev.path)
        else:
            ep = epoch_of[i] if epoch_of is not None else 0
            pe = res.per_epoch.setdefault(ep, [0, 0])
            stall = 0.0
            for b, bsize in _blocks(ev.off, ev.len, ev.size, cfg.block):
                key = (ev.path, b)
                res.lookups += 1
                pe[0] += 1
                blk = cache.blocks.get(key)
                if blk is not None:
                    first_use = blk.prefetched and not blk.used
                    if first_use:
                        blk.used = True
                        cache.unused_prefetch -= blk.size
                        res.used_prefetched_bytes += blk.size
                    if blk.arrive <= now:
                        res.hits += 1
                        pe[1] += 1
                        if first_use:
                            res.timely_bytes += blk.size
                    else:
                        res.late += 1
                        res.covered += cover_now.get(ev.path, False) or ev.path in predicted
                        stall = max(stall, blk.arrive - now)
                    cache.touch(key)
                    continue
                res.misses += 1
                res.covered += cover_now.get(ev.path, False) or ev.path in predicted
                res.demand_bytes += bsize
                stall = max(stall, cfg.rtt_s + bsize / per_stream_bw)
                if cache.make_room(bsize, False):
                    cache.insert(key, bsize, now, False)
                    cache.touch(key)
            res.stall_s += stall
            now += stall
        if predictor is None:
            continue
        predictor.observe(ev)
        if ev.op == "read" and ev.off == 0:
            continue    # the read right after an open changes no cross-file prediction
        preds: list[Prediction] = predictor.predict(cfg.max_items)
        for p in preds:
            predicted.add(p.path)
        free = [k for k in range(len(slots)) if slots[k] <= now]
        if not free:
            continue
        for p in preds:
            if not free or cache.unused_prefetch >= budget:
                break
            if p.prob < cfg.min_prob:
                continue
            osize = sizes.get(p.path, p.offset + p.length) if sizes else p.offset + p.length
            for b, bsize in _blocks(p.offset, max(p.length, 1), osize, cfg.block):
                key = (p.path, b)
                if key in cache.blocks:
                    continue
                if not free or cache.unused_prefetch + bsize > budget \
                        or not cache.make_room(bsize, True):
                    break
                k = free.pop()
                slots[k] = now + cfg.rtt_s + bsize / per_stream_bw
                cache.insert(key, bsize, slots[k], True)
                res.prefetched_bytes += bsize
    return res


def touched_bytes(events: Sequence[Event]) -> int:
    """Bytes of the distinct files a trace reads (its working set)."""
    sizes = {}
    for ev in events:
        sizes[ev.path] = ev.size
    return sum(sizes.values())


def run(trace, make_predictor: Callable | None, cfg: SimConfig, hints: bool = False) -> SimResult:
    """Simulate a tracegen.Trace (or anything with .events/.catalog/.order/.epoch_of)."""
    pred = make_predictor(trace.catalog) if make_predictor else None
    if hints and pred is not None:
        pred.set_hints(trace.order)
    return simulate(trace.events, pred, cfg, getattr(trace, "epoch_of", None),
                    dict(trace.catalog))

"""Offline evaluation: replay generated trace families (and JSONL traces) through every
predictor and through no prefetch, with epoch-aware and LRU eviction.

    python -m predictors.evaluate [--quick] [--trace FILE ...] [--cache-frac 0.5]
                                  [--family NAME ...] [--rtt-ms 60] [--concurrency 16]

Prints one markdown table per trace (rows: predictor x eviction; columns: hit rate,
prefetch precision, coverage, timeliness, stall seconds) and the overflow case: a
dataset twice the cache, 3 shuffled epochs, no prefetch, LRU vs epoch-aware hit rate in
epochs 2-3 (theory: 0.15 vs 0.50).
"""
from __future__ import annotations

import argparse
import sys
import time
from dataclasses import dataclass, field

from .ensemble import make_default_predictor
from .epochset import EpochSetPredictor
from .events import Event, read_jsonl
from .simulate import SimConfig, SimResult, run, touched_bytes
from .stride import StridePredictor
from .successor import SuccessorPredictor
from .tracegen import FAMILIES, family_spec, generate

# Quick mode shrinks the traces (~1/3 of the files) so the whole run takes a few seconds.
QUICK_FILES = 150
QUICK_SHARDS = 24

PREDICTORS = {
    "none": None,
    "stride": StridePredictor,
    "successor": SuccessorPredictor,
    "epochset": EpochSetPredictor,
    "ensemble": make_default_predictor,
    "ensemble+hints": make_default_predictor,
}
# (predictor, eviction) rows per trace: every predictor with epoch-aware eviction, and
# the baseline and the default predictor with LRU for comparison.
ROWS = [(p, "epoch") for p in PREDICTORS] + [("none", "lru"), ("ensemble", "lru")]


@dataclass
class FileTrace:
    """A recorded JSONL trace in the shape the simulator runs (catalog = the paths it
    touches, sorted like a listing; hints = its own open order, i.e. an oracle job)."""
    events: list[Event]
    catalog: list = field(default_factory=list)
    order: list = field(default_factory=list)
    epoch_of: None = None

    @classmethod
    def load(cls, path: str) -> "FileTrace":
        evs = read_jsonl(path)
        sizes: dict[str, int] = {}
        for e in evs:
            sizes[e.path] = max(sizes.get(e.path, 0), e.size)
        return cls(evs, sorted(sizes.items()), [e.path for e in evs if e.op == "open"])


def _fmt(name: str, ev: str, r: SimResult) -> str:
    return (f"| {name:15s} | {ev:5s} | {r.hit_rate:5.2f} | {r.precision:5.2f} | "
            f"{r.coverage:5.2f} | {r.timeliness:5.2f} | {r.stall_s:7.1f} |")


def evaluate_trace(label: str, trace, cfg: SimConfig, out=None) -> dict:
    out = out or sys.stdout
    print(f"\n### {label}  ({len(trace.events)} events, cache "
          f"{cfg.capacity / 1e6:.1f} MB)\n", file=out)
    print("| predictor       | evict | hit   | prec  | cover | timely| stall_s |", file=out)
    print("|-----------------|-------|-------|-------|-------|-------|---------|", file=out)
    results = {}
    for name, ev in ROWS:
        c = SimConfig(**{**cfg.__dict__, "eviction": ev})
        r = run(trace, PREDICTORS[name], c, hints=name.endswith("+hints"))
        results[(name, ev)] = r
        print(_fmt(name, ev, r), file=out)
    return results


def overflow(quick: bool, seed: int, out=None) -> dict:
    out = out or sys.stdout
    n = QUICK_FILES * 2 if quick else 800
    tr = generate(family_spec("shuffled", seed=seed, n_files=n, epochs=3))
    cap = touched_bytes(tr.events) // 2
    print(f"\n### overflow: shuffled, {n} files, cache = half the dataset, no prefetch\n",
          file=out)
    print("| eviction | epoch 1 | epoch 2 | epoch 3 | epochs 2-3 | theory 2-3 |", file=out)
    print("|----------|---------|---------|---------|------------|------------|", file=out)
    res = {}
    for ev, theory in (("lru", 0.153), ("epoch", 0.5)):
        r = run(tr, None, SimConfig(capacity=cap, eviction=ev))
        res[ev] = r.epoch_hit_rate([1, 2])
        print(f"| {ev:8s} | {r.epoch_hit_rate([0]):7.2f} | {r.epoch_hit_rate([1]):7.2f} | "
              f"{r.epoch_hit_rate([2]):7.2f} | {res[ev]:10.2f} | {theory:10.2f} |", file=out)
    return res


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m predictors.evaluate",
                                 description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="small traces (< 10 s)")
    ap.add_argument("--trace", action="append", default=[], metavar="FILE",
                    help="also replay this JSONL access trace (repeatable)")
    ap.add_argument("--family", action="append", choices=FAMILIES,
                    help="only these generated families (default: all)")
    ap.add_argument("--no-generated", action="store_true", help="only the --trace files")
    ap.add_argument("--cache-frac", type=float, default=0.5,
                    help="cache capacity as a fraction of the bytes each trace touches")
    ap.add_argument("--rtt-ms", type=float, default=60.0)
    ap.add_argument("--concurrency", type=int, default=16)
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args(argv)
    t0 = time.perf_counter()
    traces = []
    if not a.no_generated:
        for fam in a.family or FAMILIES:
            kw = {}
            if a.quick:
                kw["n_files"] = QUICK_SHARDS if fam == "webdataset" else (
                    QUICK_FILES * 4 if fam == "strided" else QUICK_FILES)
            traces.append((f"{fam} (generated, seed {a.seed})",
                           generate(family_spec(fam, seed=a.seed, **kw))))
    for path in a.trace:
        try:
            traces.append((path, FileTrace.load(path)))
        except (OSError, ValueError) as e:
            print(f"evaluate: {path}: {e}", file=sys.stderr)
            return 1
    for label, tr in traces:
        cap = max(1, int(a.cache_frac * touched_bytes(tr.events)))
        evaluate_trace(label, tr, SimConfig(capacity=cap, rtt_s=a.rtt_ms / 1000,
                                            concurrency=a.concurrency))
    if not a.no_generated:
        overflow(a.quick, a.seed)
    print(f"\n(evaluated in {time.perf_counter() - t0:.1f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())

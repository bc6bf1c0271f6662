"""Micro-benchmark of the default predictor on a large catalog.

    python -m predictors.speed [--files 100000] [--events 20000]

Reports microseconds per observe() and per predict(64) for a scan by 8 workers, a
shuffled epoch (after one full epoch, so the epoch-set predictor is in force) and with
hints installed.
"""
from __future__ import annotations

import argparse
import random
import sys
import time

from .ensemble import make_default_predictor
from .events import Event


def _events(paths, order, size, workers=8):
    t = 0.0
    for k, i in enumerate(order):
        pid = 100 + k % workers
        yield Event(t, "open", paths[i], 0, 0, pid, size)
        yield Event(t + 0.0001, "read", paths[i], 0, size, pid, size)
        t += 0.001


def bench(name, p, evs, n_predict=500):
    t0 = time.perf_counter()
    for ev in evs:
        p.observe(ev)
    obs = (time.perf_counter() - t0) / len(evs) * 1e6
    t0 = time.perf_counter()
    for _ in range(n_predict):
        preds = p.predict(64)
    pr = (time.perf_counter() - t0) / n_predict * 1e6
    print(f"{name:30s} observe {obs:6.1f} us/event   predict(64) {pr:7.1f} us "
          f"({len(preds)} items, pattern={p.pattern})")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m predictors.speed")
    ap.add_argument("--files", type=int, default=100_000)
    ap.add_argument("--events", type=int, default=20_000)
    a = ap.parse_args(argv)
    n, size = a.files, 110_000
    paths = [f"train/{i:07d}.jpg" for i in range(n)]
    cat = [(p, size) for p in paths]
    t0 = time.perf_counter()
    p = make_default_predictor(cat)
    print(f"make_default_predictor({n} files): {(time.perf_counter() - t0) * 1e3:.0f} ms")
    m = a.events // 2
    # sequential: batches of 32 handed round-robin to 8 workers
    bench("sequential scan, 8 workers", p, list(_events(paths, range(m), size)))
    # shuffled epochs over a 20k-file working set (2 epochs, then measure)
    ws = random.Random(0).sample(range(n), min(n, 20_000))
    p = make_default_predictor(cat)
    for ev in _events(paths, ws, size):
        p.observe(ev)
    random.Random(1).shuffle(ws)
    bench("shuffled epoch 2 (20k set)", p, list(_events(paths, ws[:m], size)))
    p = make_default_predictor(cat)
    p.set_hints(paths[::-1])
    bench("hints (100k hinted paths)", p, list(_events(paths, range(n - 1, n - 1 - m, -1), size)))
    return 0


if __name__ == "__main__":
    sys.exit(main())

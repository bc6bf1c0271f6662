"""``shards``: WebDataset tar shards read in a shuffled shard order, each shard sequentially
in 1 MiB reads; a cold epoch, then warm ones (each a new order; ``warm_epochs``).
``shards_epoch`` is also the overflow scenario's epoch.
"""
from __future__ import annotations

import time
from pathlib import Path

from bench.systems.reads import publish_hints, read_verify, shuffled


def shards_epoch(root: Path, ds_name: str, manifest: dict, seed: int,
                 hints: bool = False) -> dict:
    files = manifest["files"]
    t0 = time.monotonic()
    nbytes = bad = 0
    order = shuffled(list(files), seed)
    if hints:
        publish_hints(root, ds_name, order)
    for rel in order:
        n, ok = read_verify(root / ds_name / rel, files[rel]["xxh3"])
        nbytes += n
        bad += (not ok) or n != files[rel]["size"]
    dt = time.monotonic() - t0
    return {"seconds": dt, "bytes": nbytes, "files": len(files), "verify_errors": bad,
            "value": nbytes / dt / 1e6, "unit": "MB/s"}


# The warm row: epochs (each a new order) until this much time has passed, at most
# WARM_EPOCHS_MAX, their bytes over their time.  One warm epoch of the full dataset
# (1 GB) from the page cache lasts 0.14-0.35 s, and single ones put neuralcache at 0.57x,
# 0.58x, 0.83x and 0.69x local in four runs of the same code (bench/RESULTS.md, thirty-
# seventh sitting); a system that takes a second or more per warm epoch still runs one.
WARM_MIN_S = 1.0
WARM_EPOCHS_MAX = 10


def warm_epochs(epoch, min_s: float = WARM_MIN_S, most: int = WARM_EPOCHS_MAX) -> dict:
    """``epoch(seed)`` for seeds 2, 3, ... until ``min_s`` seconds or ``most`` epochs;
    one result: the sums, the rate over them, ``epochs`` how many ran."""
    runs = []
    while not runs or (sum(r["seconds"] for r in runs) < min_s and len(runs) < most):
        runs.append(epoch(2 + len(runs)))
    out = dict(runs[0])
    for k in ("seconds", "bytes", "files", "verify_errors"):
        out[k] = sum(r[k] for r in runs)
    out["value"] = out["bytes"] / out["seconds"] / 1e6
    out["epochs"] = len(runs)
    return out


def scenario(ctx):
    """WebDataset shards: shuffled shard order, each shard sequential; a cold epoch,
    then warm ones (``warm_epochs``)."""
    man = ctx.dataset("shards")

    def body(ctx, m):
        if m.kind == "client":
            def epoch(seed):
                return m.client.shards_epoch("shards", man, seed)
        else:
            h = m.info.get("hints", False)

            def epoch(seed):
                return shards_epoch(m.root, "shards", man, seed, hints=h)
        return [ctx.measure(m, "cold", lambda: epoch(1)),
                ctx.measure(m, "warm", lambda: warm_epochs(epoch))]
    return ctx.run_systems("shards", "shards", man, body)

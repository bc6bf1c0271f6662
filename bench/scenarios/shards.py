"""``shards``: WebDataset tar shards read in a shuffled shard order, each shard sequentially
in 1 MiB reads; a cold epoch, then a warm one (a new order).  ``shards_epoch`` is also
the overflow scenario's epoch.
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


def scenario(ctx):
    """WebDataset shards: shuffled shard order, each shard sequential; cold then warm."""
    man = ctx.dataset("shards")

    def body(ctx, m):
        if m.kind == "client":
            return [ctx.measure(m, ph, lambda: m.client.shards_epoch("shards", man, seed))
                    for ph, seed in (("cold", 1), ("warm", 2))]
        h = m.info.get("hints", False)
        return [ctx.measure(m, "cold", lambda: shards_epoch(m.root, "shards", man, 1, hints=h)),
                ctx.measure(m, "warm", lambda: shards_epoch(m.root, "shards", man, 2, hints=h))]
    return ctx.run_systems("shards", "shards", man, body)

"""``samples``: a file per sample (ImageNet-like), read whole in a random order by 8
reader threads; a cold epoch, then a warm one.
"""
from __future__ import annotations

import concurrent.futures as cf
import time
from pathlib import Path

import xxhash

from bench.scenarios.harness import client_row
from bench.systems.reads import SAMPLE_THREADS, publish_hints, shuffled


def samples_epoch(root: Path, ds_name: str, manifest: dict, seed: int,
                  threads: int = SAMPLE_THREADS, hints: bool = False) -> dict:
    files = manifest["files"]
    order = shuffled(list(files), seed)

    def one(rel):
        with open(root / ds_name / rel, "rb", buffering=0) as f:
            data = f.read()
        return len(data), xxhash.xxh3_64_hexdigest(data) == files[rel]["xxh3"]

    t0 = time.monotonic()
    if hints:
        publish_hints(root, ds_name, order)
    with cf.ThreadPoolExecutor(threads) as ex:
        res = list(ex.map(one, order))
    dt = time.monotonic() - t0
    nbytes = sum(n for n, _ in res)
    return {"seconds": dt, "bytes": nbytes, "files": len(order),
            "verify_errors": sum(not ok for _, ok in res),
            "value": len(order) / dt, "unit": "files/s", "mbps": nbytes / dt / 1e6}


def scenario(ctx):
    """File per sample (ImageNet-like), random order, 8 parallel readers; cold then warm."""
    man = ctx.dataset("samples")

    def body(ctx, m):
        if m.kind == "client":
            m.client.prepare("samples", man)
            return [client_row(m, ctx.measure(m, ph, lambda: m.client.samples_epoch(
                "samples", man, 1, epoch))) for ph, epoch in (("cold", 1), ("warm", 2))]
        h = m.info.get("hints", False)
        return [ctx.measure(m, "cold", lambda: samples_epoch(m.root, "samples", man, 1,
                                                               hints=h)),
                ctx.measure(m, "warm", lambda: samples_epoch(m.root, "samples", man, 2,
                                                               hints=h))]
    return ctx.run_systems("samples", "samples", man, body,
                           link_value=lambda r: (r["files_per_s"], "files/s"))

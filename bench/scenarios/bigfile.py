"""``bigfile``: one large file read sequentially in 1 MiB reads, cold (model weights).
"""
from __future__ import annotations

import time
from pathlib import Path

from bench.systems.reads import read_verify


def bigfile_read(root: Path, ds_name: str, manifest: dict) -> dict:
    (rel, m), = manifest["files"].items()
    t0 = time.monotonic()
    n, ok = read_verify(root / ds_name / rel, m["xxh3"])
    dt = time.monotonic() - t0
    return {"seconds": dt, "bytes": n, "files": 1, "verify_errors": int(not ok or n != m["size"]),
            "value": n / dt / 1e6, "unit": "MB/s"}


def scenario(ctx):
    """One large file read sequentially, cold (the model-weights cold start)."""
    man = ctx.dataset("bigfile")

    def body(ctx, m):
        if m.kind == "client":
            return [ctx.measure(m, "cold", lambda: m.client.bigfile_read("bigfile", man))]
        return [ctx.measure(m, "cold", lambda: bigfile_read(m.root, "bigfile", man))]
    return ctx.run_systems("bigfile", "bigfile", man, body)

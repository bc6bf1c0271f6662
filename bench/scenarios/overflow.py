"""``overflow``: three shuffled epochs of tar shards over a dataset twice the cache size,
the page cache dropped before each (the cache limit set per system).
"""
from __future__ import annotations

from bench.scenarios.shards import shards_epoch
from bench.systems.base import MountOptions
from bench.systems.mounts import S3FS_MIN_CACHE_MB


def scenario(ctx):
    """Three shuffled epochs over a dataset twice the cache size (cache set per system)."""
    cache_mb = 16 if ctx.quick else 256
    man = ctx.dataset("overflow", cache_mb=cache_mb)
    opts = MountOptions(cache_mb=cache_mb, memory_cache_mb=max(cache_mb // 4, 8))
    ctx.notes.append(f"overflow: cache {cache_mb} MiB (neuralcache disk {cache_mb} MiB + "
                     f"memory {opts.memory_cache_mb} MiB; rclone --vfs-cache-max-size "
                     f"{cache_mb}M; s3fs: cache dir on a tmpfs of max(cache, {S3FS_MIN_CACHE_MB} MiB) "
                     "+ 8 MiB with ensure_diskfree=8), dataset "
                     f"{sum(m['size'] for m in man['files'].values()) / 2**20:.0f} MiB; "
                     "kernel page cache dropped before every epoch")

    def body(ctx, m):
        rows = []
        for epoch in (1, 2, 3):
            method = ctx.drop_caches(m, "overflow", level=1)
            r = ctx.measure(m, f"epoch{epoch}",
                            lambda: shards_epoch(m.root, "overflow", man, 10 + epoch))
            r["page_cache_drop"] = method
            rows.append(r)
        return rows
    return ctx.run_systems("overflow", "overflow", man, body, opts=opts)

"""The ``link`` system: not a filesystem but the link itself, the best any client could do.

``link_fetch`` reads a dataset's objects straight through the WAN proxy with boto3
ranged GETs (``LINK_RANGE`` each, ``LINK_CONCURRENCY`` in flight, connections opened
before the clock): each scenario's ``link`` row, the emulator's ceiling for its objects.
"""
from __future__ import annotations

import concurrent.futures as cf
import threading
import time

import xxhash

LINK_CONCURRENCY = 64    # link ceiling: GETs in flight (best of 16/32/64 measured here)
LINK_RANGE = 8 << 20     # link ceiling: ranged GET size for big objects


def link_fetch(s3, bucket: str, ds_name: str, manifest: dict,
               concurrency: int = LINK_CONCURRENCY, rng: int = LINK_RANGE) -> dict:
    """Fetch every object of the dataset through the proxy (ranged GETs, ``concurrency``
    in flight); the emulator's ceiling for this scenario's object sizes."""
    files = manifest["files"]
    tasks = []
    for rel, m in files.items():
        for off in range(0, max(m["size"], 1), rng):
            tasks.append((rel, off, min(off + rng, m["size"]) - 1))
    parts: dict[str, dict[int, bytes]] = {}
    lock = threading.Lock()

    def get(t):
        rel, a, b = t
        body = s3.get_object(Bucket=bucket, Key=f"{ds_name}/{rel}",
                             Range=f"bytes={a}-{b}")["Body"].read()
        with lock:
            parts.setdefault(rel, {})[a] = body
        return len(body)

    with cf.ThreadPoolExecutor(concurrency) as ex:
        # Ideal conditions: the connection pool is open before the clock starts.
        list(ex.map(lambda _: s3.head_bucket(Bucket=bucket), range(concurrency)))
        t0 = time.monotonic()
        nbytes = sum(ex.map(get, tasks))
    dt = time.monotonic() - t0
    bad = 0
    for rel, m in files.items():
        data = b"".join(parts.get(rel, {})[k] for k in sorted(parts.get(rel, {})))
        bad += xxhash.xxh3_64_hexdigest(data) != m["xxh3"]
    return {"seconds": dt, "bytes": nbytes, "files": len(files), "requests": len(tasks),
            "verify_errors": bad, "mbps": nbytes / dt / 1e6, "files_per_s": len(files) / dt}

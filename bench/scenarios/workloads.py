"""Workloads: each reads through a root directory (local dir or a mount) and verifies bytes.

Every function takes the data root of one system (``root/<dataset>/...`` mirrors the
bucket keys) and the dataset's manifest, and returns a dict with at least ``seconds``,
``bytes`` and ``verify_errors`` (files whose xxh3-64 did not match the generated source).
``link_fetch`` is the odd one out: it reads the same objects straight through the WAN
proxy with boto3 ranged GETs at ideal concurrency -- the emulator's ceiling.
"""
from __future__ import annotations

import concurrent.futures as cf
import json
import os
import random
import shutil
import subprocess
import threading
import time
from pathlib import Path

import xxhash

READ_CHUNK = 1 << 20     # sequential readers read 1 MiB at a time
SAMPLE_THREADS = 8       # "8 parallel readers" of the file-per-sample workload
LINK_CONCURRENCY = 64    # link ceiling: GETs in flight (best of 16/32/64 measured here)
LINK_RANGE = 8 << 20     # link ceiling: ranged GET size for big objects


def read_hashed(path: Path, chunk: int = READ_CHUNK) -> tuple[int, str]:
    """Read ``path`` to the end in ``chunk`` reads; (bytes read, xxh3_64 hex digest)."""
    h = xxhash.xxh3_64()
    n = 0
    with open(path, "rb", buffering=0) as f:
        while b := f.read(chunk):
            h.update(b)
            n += len(b)
    return n, h.hexdigest()


def read_verify(path: Path, expect: str | None, chunk: int = READ_CHUNK) -> tuple[int, bool]:
    """Read ``path`` to the end; (bytes read, xxh3 matched or nothing to check)."""
    n, got = read_hashed(path, chunk)
    return n, (expect is None or got == expect)


def _order(files: list[str], seed: int) -> list[str]:
    out = sorted(files)
    random.Random(seed).shuffle(out)
    return out


# -- shards: shuffled shard order, each shard sequential -------------------------------------
def _publish(root: Path, ds_name: str, order: list[str]) -> None:
    """What a sampler wrapper does (neuralcache.torch.HintingSampler): hand the epoch's
    order to the mount before reading it.  Timed as part of the epoch."""
    from neuralcache.hints import publish_order

    publish_order(str(root), [f"{ds_name}/{rel}" for rel in order])


def shards_epoch(root: Path, ds_name: str, manifest: dict, seed: int,
                 hints: bool = False) -> dict:
    files = manifest["files"]
    t0 = time.monotonic()
    nbytes = bad = 0
    order = _order(list(files), seed)
    if hints:
        _publish(root, ds_name, order)
    for rel in order:
        n, ok = read_verify(root / ds_name / rel, files[rel]["xxh3"])
        nbytes += n
        bad += (not ok) or n != files[rel]["size"]
    dt = time.monotonic() - t0
    return {"seconds": dt, "bytes": nbytes, "files": len(files), "verify_errors": bad,
            "value": nbytes / dt / 1e6, "unit": "MB/s"}


# -- samples: file per sample, random order, parallel readers -----------------------------------
def samples_epoch(root: Path, ds_name: str, manifest: dict, seed: int,
                  threads: int = SAMPLE_THREADS, hints: bool = False) -> dict:
    files = manifest["files"]
    order = _order(list(files), seed)

    def one(rel):
        with open(root / ds_name / rel, "rb", buffering=0) as f:
            data = f.read()
        return len(data), xxhash.xxh3_64_hexdigest(data) == files[rel]["xxh3"]

    t0 = time.monotonic()
    if hints:
        _publish(root, ds_name, order)
    with cf.ThreadPoolExecutor(threads) as ex:
        res = list(ex.map(one, order))
    dt = time.monotonic() - t0
    nbytes = sum(n for n, _ in res)
    return {"seconds": dt, "bytes": nbytes, "files": len(order),
            "verify_errors": sum(not ok for _, ok in res),
            "value": len(order) / dt, "unit": "files/s", "mbps": nbytes / dt / 1e6}


# -- bigfile: one cold sequential read ---------------------------------------------------------
def bigfile_read(root: Path, ds_name: str, manifest: dict) -> dict:
    (rel, m), = manifest["files"].items()
    t0 = time.monotonic()
    n, ok = read_verify(root / ds_name / rel, m["xxh3"])
    dt = time.monotonic() - t0
    return {"seconds": dt, "bytes": n, "files": 1, "verify_errors": int(not ok or n != m["size"]),
            "value": n / dt / 1e6, "unit": "MB/s"}


# -- fio ------------------------------------------------------------------------------------------
FIO_DIR = Path(__file__).parent / "fio_jobs"


def fio_jobs() -> list[str]:
    return sorted(p.stem for p in FIO_DIR.glob("*.fio"))


def fio_run(root: Path, ds_name: str, manifest: dict, job: str, runtime_s: int) -> dict:
    """Run fio_jobs/JOB.fio against ``root/ds_name`` and parse its JSON output."""
    if not shutil.which("fio"):
        raise RuntimeError("fio not installed")
    sizes = {m["size"] for rel, m in manifest["files"].items() if rel.startswith(job + ".")}
    env = dict(os.environ, FIO_DIR=str(root / ds_name), FIO_SIZE=str(min(sizes)),
               FIO_RUNTIME=str(runtime_s))
    t0 = time.monotonic()
    r = subprocess.run(["fio", "--readonly", "--output-format=json", str(FIO_DIR / f"{job}.fio")],
                       env=env, capture_output=True, text=True, timeout=runtime_s * 4 + 120)
    dt = time.monotonic() - t0
    if r.returncode != 0:
        raise RuntimeError(f"fio {job} failed: {(r.stderr or r.stdout).strip()[-300:]}")
    out = json.loads(r.stdout[r.stdout.index("{"):])
    job0 = out["jobs"][0]
    rd = job0["read"]
    errors = sum(j.get("error", 0) for j in out["jobs"])
    clat = rd.get("clat_ns", {}).get("percentile", {})
    return {"seconds": dt, "bytes": rd["io_bytes"], "verify_errors": errors,
            "value": rd["bw_bytes"] / 1e6, "unit": "MB/s", "mbps": rd["bw_bytes"] / 1e6,
            "iops": rd["iops"],
            "fio_runtime_s": rd["runtime"] / 1000,
            "clat_p50_ms": clat.get("50.000000", 0) / 1e6,
            "clat_p99_ms": clat.get("99.000000", 0) / 1e6}


# -- link ceiling ---------------------------------------------------------------------------------
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

"""Workloads: each reads through a root directory (local dir or a mount) and verifies bytes.

Every function takes the data root of one system (``root/<dataset>/...`` mirrors the
bucket keys) and the dataset's manifest, and returns a dict with at least ``seconds``,
``bytes`` and ``verify_errors`` (files whose xxh3-64 did not match the generated source).
The reading and checking they share: bench/systems/reads.py; the link row's:
bench/systems/link.py.
"""
from __future__ import annotations

import concurrent.futures as cf
import json
import os
import shutil
import subprocess
import time
from pathlib import Path

import xxhash

from bench.systems.reads import SAMPLE_THREADS, publish_hints, read_verify, shuffled


# -- shards: shuffled shard order, each shard sequential -------------------------------------
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


# -- samples: file per sample, random order, parallel readers -----------------------------------
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

"""``fio``: the fio jobs in fio_jobs/ (sequential 1 MiB and random 128 KiB, 4 jobs each,
each job on its own files so each is cold), run against the mount, parsed from fio's
JSON.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
from pathlib import Path

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


def scenario(ctx):
    """fio jobs from scenarios/fio_jobs/*.fio (each job its own files, so each is cold); fio JSON."""
    man = ctx.dataset("fio")
    runtime = 3 if ctx.quick else 15

    def body(ctx, m):
        rows = []
        for job in fio_jobs():
            ctx.drop_caches(m, "fio", level=1)
            rows.append(ctx.measure(m, job, lambda: fio_run(m.root, "fio", man, job, runtime)))
        return rows
    return ctx.run_systems("fio", "fio", man, body)

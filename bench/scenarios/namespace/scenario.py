"""``namespace``: metadata at dataset scale (issue 19).

Trees (trees.py; full / --quick): an ImageNet-shaped tree on local disk (1,000 x 1,281
empty files / 100 x 128), the same shape in a bucket (80 x 1,281 = 102k objects / 20 x
128) beside a COCO-like flat directory (100k / 5k objects), all in a SeaweedFS of the
scenario's own behind its own 60 ms link (kept under --data-dir between runs), and a
manifest of 10 M entries (500k).

Rows, per system (neuralcache, rclone, s3fs; ``local`` for the POSIX tree's find):

* ``mount``          seconds until the mount serves;
* ``rss-mount``, ``rss-find``   the daemon's resident MB after mounting and after a
  full ``find``;
* ``ls-dir``         the first ``ls`` of one directory;
* ``ls-l-flat``      ``ls -l`` of the flat directory (100k entries);
* ``find``           ``find MNT/TREE -type f`` over everything (its count is checked);
* ``stat-refresh-max``, ``-p99``   stat() latency of files never looked at before, for
  ``REFRESH_S`` seconds on a mount whose metadata TTL is 2 s (the listings are
  refreshed meanwhile);
* neuralcache only: the manifest mount (``manifest-mount``, ``manifest-rss``,
  ``manifest-ls``), and ``publish_order`` of an epoch (1.28 M paths): its seconds, the
  daemon's growth, and the longest stat() that ran meanwhile.
"""
from __future__ import annotations

import contextlib
import json
import os
import random
import shutil
import statistics
import subprocess
import threading
import time
from pathlib import Path

from bench.scenarios.harness import Watchdog, plain_info
from bench.scenarios.namespace import trees
from bench.servers.seaweed import SeaweedServer
from bench.systems.base import MountOptions, SystemEnv
from bench.systems.mounts import neuralcache_binary
from bench.systems.registry import make_system
from bench.wan import WanProxyProcess

BUCKET = "namespace"   # S3 bucket names are 3-63 characters
SYSTEMS = ("neuralcache", "rclone", "s3fs")
# Seconds of stat() on never-seen files while the listings refresh (TTL REFRESH_TTL_S).
REFRESH_S = 12.0
REFRESH_TTL_S = 2.0


def rss_mb(pids: list[int]) -> float | None:
    total = 0
    for pid in pids:
        try:
            with open(f"/proc/{pid}/status") as f:
                total += next(int(ln.split()[1]) for ln in f if ln.startswith("VmRSS"))
        except (OSError, StopIteration):
            return None
    return total / 1024 if pids else None


def timed(fn):
    t0 = time.monotonic()
    out = fn()
    return time.monotonic() - t0, out


def find_files(root: Path) -> int:
    r = subprocess.run(["find", str(root), "-type", "f"], capture_output=True, text=True,
                       check=True)
    return r.stdout.count("\n")


def ls_l(path: Path) -> int:
    r = subprocess.run(["ls", "-l", str(path)], capture_output=True, text=True, check=True)
    return r.stdout.count("\n") - 1


def stat_storm(root: Path, paths: list[str], seconds: float) -> list[float]:
    """Latencies of stat() of ``paths`` (each once, in order) for ``seconds``."""
    lat, end = [], time.monotonic() + seconds
    for p in paths:
        t0 = time.monotonic()
        os.stat(root / p)
        lat.append(time.monotonic() - t0)
        if t0 > end:
            break
    return lat


def row(phase: str, value, unit: str, **extra) -> dict:
    return {"phase": phase, "value": value, "unit": unit, **extra}


def scenario(ctx):
    """Metadata at dataset scale: mount time, memory, ls/find, stat() during refreshes,
    a 10 M-entry manifest, an epoch's hints (issue 19)."""
    q = ctx.quick
    nd, nf = trees.size("s3_dirs", q), trees.size("s3_files", q)
    s3_keys = list(trees.imagenet_keys(nd, nf)) + list(trees.flat_keys(trees.size("flat", q)))
    root = ctx.data_dir / "namespace"
    root.mkdir(parents=True, exist_ok=True)
    rows: list[dict] = []
    t0 = time.monotonic()
    posix = trees.posix_tree(root / "posix", trees.size("posix_dirs", q),
                             trees.size("posix_files", q))
    n_posix = trees.size("posix_dirs", q) * trees.size("posix_files", q)
    ctx.log(f"namespace: POSIX tree of {n_posix} files ready in {time.monotonic() - t0:.0f} s")
    with SeaweedServer(root / "seaweed") as sw, \
            WanProxyProcess(f"127.0.0.1:{sw.s3_port}", rtt_ms=ctx.rtt_ms,
                            mbit=ctx.mbit) as link:
        t0 = time.monotonic()
        put = trees.fill_bucket(sw, BUCKET, s3_keys, root / "bucket.complete")
        ctx.log(f"namespace: bucket of {len(s3_keys)} objects ready ({put} put in "
                f"{time.monotonic() - t0:.0f} s)")
        env = SystemEnv(work_dir=ctx.work_dir / "ns-mnt", data_dir=posix, bucket=BUCKET,
                        endpoint=link.endpoint, access_key=sw.access_key,
                        secret_key=sw.secret_key, direct_endpoint=sw.endpoint)
        systems = [s for s in SYSTEMS if s in ctx.systems]
        for system in systems:
            rows += _guarded(ctx, system, "s3", lambda: _s3_rows(ctx, env, system, nd * nf,
                                                                len(s3_keys)))
            rows += _guarded(ctx, system, "refresh",
                             lambda: _refresh_rows(ctx, env, system, s3_keys[:nd * nf]))
        if "local" in ctx.systems:
            secs, n = timed(lambda: find_files(posix / "train"))
            rows.append({"scenario": "namespace", "system": "local",
                         **row("posix-find", secs, "s", files=n)})
        cli = [neuralcache_binary() or "neuralcache"]
        if "neuralcache" in ctx.systems:
            rows += _guarded(ctx, "neuralcache", "posix",
                             lambda: _posix_rows(ctx, cli, posix, n_posix))
            man = trees.manifest(root / "manifest.ncm", trees.size("manifest", q),
                                 f"s3://{BUCKET}", cli)
            rows += _guarded(ctx, "neuralcache", "manifest",
                             lambda: _manifest_rows(ctx, cli, env, man))
    for r in rows:
        r.setdefault("scenario", "namespace")
    return rows


def _guarded(ctx, system: str, what: str, fn) -> list[dict]:
    ctx.log(f"namespace: {what} on {system}")
    rows: list[dict] = []
    with ctx.failure_as_row(rows, {"scenario": "namespace", "system": system}, what):
        rows += [{"system": system, **r} for r in fn()]
    return rows


def _pids(m) -> list[int]:
    return m.daemon_pids()


def _s3_rows(ctx, env, system: str, n_tree: int, n_all: int) -> list[dict]:
    """Mount, memory, ls of one directory, ls -l of the flat one, find, memory."""
    with make_system(system, env).open(MountOptions(cache_mb=1024, memory_cache_mb=256)) as m, \
            Watchdog(m, ctx.timeout_s):
        out = [row("mount", m.info["mount_s"], "s"),
               row("rss-mount", rss_mb(_pids(m)), "MB")]
        first = sorted(os.listdir(m.root / "train"))[0]
        secs, n = timed(lambda: len(os.listdir(m.root / "train" / first)))
        out.append(row("ls-dir", secs, "s", entries=n))
        secs, n = timed(lambda: ls_l(m.root / "flat"))
        out.append(row("ls-l-flat", secs, "s", entries=n))
        secs, n = timed(lambda: find_files(m.root))
        if n != n_all:
            raise RuntimeError(f"find saw {n} files of {n_all}")
        out.append(row("find", secs, "s", files=n))
        out.append(row("rss-find", rss_mb(_pids(m)), "MB"))
        for r in out:
            r["mount"] = plain_info(m.info)
        return out


def _refresh_rows(ctx, env, system: str, keys: list[str]) -> list[dict]:
    """stat() of never-seen files while listings expire every REFRESH_TTL_S."""
    opts = MountOptions(cache_mb=1024, memory_cache_mb=256, metadata_ttl_s=REFRESH_TTL_S)
    with make_system(system, env).open(opts) as m, Watchdog(m, ctx.timeout_s):
        for d in os.listdir(m.root / "train"):          # every directory listed once
            os.listdir(m.root / "train" / d)
        order = list(keys)
        random.Random(ctx.seed).shuffle(order)
        lat = stat_storm(m.root, order, REFRESH_S)
        stats = m.stats() or {}
        lat.sort()
        extra = {"stats": len(lat), "refreshes": stats.get("metadata_refreshes")}
        return [row("stat-refresh-max", lat[-1] * 1e3, "ms", **extra),
                row("stat-refresh-p99", lat[int(len(lat) * 0.99)] * 1e3, "ms", **extra),
                row("stat-refresh-median", statistics.median(lat) * 1e3, "ms", **extra)]


def _nc(cli, *args, env=None) -> None:
    r = subprocess.run([*cli, *map(str, args)], capture_output=True, text=True, timeout=600,
                       env=env)
    if r.returncode != 0:
        raise RuntimeError(f"neuralcache {args[0]}: {r.stderr.strip()[-300:]}")


@contextlib.contextmanager
def _mounted_nc(cli, source, mnt: Path, *args, env: SystemEnv | None = None):
    """``neuralcache mount SOURCE MNT ARGS`` (seconds until it served, daemon pid)."""
    penv = dict(os.environ)
    if env is not None:
        penv.update(AWS_ACCESS_KEY_ID=env.access_key, AWS_SECRET_ACCESS_KEY=env.secret_key,
                    AWS_DEFAULT_REGION=env.region)
    mnt.mkdir(parents=True, exist_ok=True)
    cache = mnt.parent / (mnt.name + "-cache")
    t0 = time.monotonic()
    _nc(cli, "mount", source, mnt, "--cache-dir", cache, *args, env=penv)
    secs = time.monotonic() - t0
    try:
        pid = int(json.loads((mnt / ".neuralcache" / "stats.json").read_text())["pid"])
        yield secs, pid
    finally:
        subprocess.run([*cli, "umount", str(mnt)], capture_output=True, timeout=120)
        shutil.rmtree(cache, ignore_errors=True)


def _posix_rows(ctx, cli, posix: Path, n: int) -> list[dict]:
    """The POSIX tree: mount, memory, find, memory; then an epoch's order as hints
    with a stat() loop running beside it; then stat() during refreshes."""
    out = []
    mnt = ctx.work_dir / "ns-mnt" / "posix"
    with _mounted_nc(cli, posix, mnt) as (secs, pid):
        out += [row("posix-mount", secs, "s"), row("posix-rss-mount", rss_mb([pid]), "MB")]
        secs, got = timed(lambda: find_files(mnt / "train"))
        if got != n:
            raise RuntimeError(f"find saw {got} files of {n}")
        out += [row("posix-find", secs, "s", files=got),
                row("posix-rss-find", rss_mb([pid]), "MB")]
        from neuralcache.hints import publish_order    # the job-side API, as a job uses it

        order = [k for k in trees.imagenet_keys(trees.size("posix_dirs", ctx.quick),
                                                trees.size("posix_files", ctx.quick))]
        random.Random(ctx.seed).shuffle(order)
        before = rss_mb([pid])
        lat: list[float] = []
        stop = threading.Event()

        def stats_loop():
            i = 0
            while not stop.is_set():
                t0 = time.monotonic()
                os.stat(mnt / order[i % len(order)])
                lat.append(time.monotonic() - t0)
                i += 1
        t = threading.Thread(target=stats_loop, daemon=True)
        t.start()
        secs, sent = timed(lambda: publish_order(str(mnt), order))
        stop.set()
        t.join()
        out += [row("publish-order", secs, "s", paths=sent),
                row("publish-rss-growth", rss_mb([pid]) - before, "MB", paths=sent),
                row("publish-stat-max", max(lat) * 1e3, "ms", stats=len(lat))]
    with _mounted_nc(cli, posix, mnt, "--metadata-ttl", REFRESH_TTL_S) as (_, pid):
        for d in os.listdir(mnt / "train"):
            os.listdir(mnt / "train" / d)
        keys = list(trees.imagenet_keys(trees.size("posix_dirs", ctx.quick),
                                        trees.size("posix_files", ctx.quick)))
        random.Random(ctx.seed + 1).shuffle(keys)
        lat = sorted(stat_storm(mnt, keys, REFRESH_S))
        out += [row("posix-stat-refresh-max", lat[-1] * 1e3, "ms", stats=len(lat)),
                row("posix-stat-refresh-p99", lat[int(len(lat) * 0.99)] * 1e3, "ms",
                    stats=len(lat))]
    return out


def _manifest_rows(ctx, cli, env: SystemEnv, man: Path) -> list[dict]:
    mnt = ctx.work_dir / "ns-mnt" / "manifest"
    with _mounted_nc(cli, f"s3://{BUCKET}", mnt, "--manifest", man,
                     "--endpoint-url", env.endpoint, env=env) as (secs, pid):
        out = [row("manifest-mount", secs, "s"), row("manifest-rss", rss_mb([pid]), "MB")]
        first = sorted(os.listdir(mnt / "m"))[0]
        secs, n = timed(lambda: len(os.listdir(mnt / "m" / first)))
        out.append(row("manifest-ls", secs, "s", entries=n))
        out.append(row("manifest-rss-ls", rss_mb([pid]), "MB"))
    return out

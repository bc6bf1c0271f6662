"""Warm small files: a mount of a local directory against the directory itself, with
the daemon run under one or more environments, alternating.

    python -m bench.tools.warmfiles [--files 1000] [--size BYTES] [--seconds 8]
        [--rounds 2] [VARIANT ...]

VARIANT: LABEL:NAME=VALUE[,NAME=VALUE...] (environment for the daemon, e.g.
``plain:NEURALCACHE_FAST_LOOP=0``); none: ``default:``.  Each round runs the directory,
then every variant (in reverse order on odd rounds): mount, one cold epoch, then warm
epochs in a new order each for SECONDS, 8 reader threads (the samples scenario's), each
file opened, read whole and closed.  The warm rate of a mount is the daemon's two FUSE
requests per file (OPEN, RELEASE) plus what the directory costs; no WAN, no S3.

Unlike the ``samples`` scenario's warm row (bench/scenarios/samples.py), nothing is
hashed: with an xxh3 of every file, 8 threads of one Python process read the local
directory at ~9,500 files/s (fullrun-s20), so that row measures the reader as much as
the mount.  Only each read's length is checked; the scenario compares every byte.
"""
from __future__ import annotations

import argparse
import concurrent.futures as cf
import os
import random
import subprocess
import sys
import tempfile
import time

THREADS = 8


def _epochs(files: list[str], size: int, seconds: float) -> tuple[float, float]:
    def one(p):
        with open(p, "rb", buffering=0) as f:
            n = len(f.read())
        if n != size:
            raise SystemExit(f"{p}: read {n} bytes, the file has {size}")
        return n

    files = list(files)
    with cf.ThreadPoolExecutor(THREADS) as ex:
        t0 = time.monotonic()
        list(ex.map(one, files))
        cold = len(files) / (time.monotonic() - t0)
        n, t0 = 0, time.monotonic()
        while time.monotonic() - t0 < seconds:
            random.shuffle(files)
            list(ex.map(one, files))
            n += len(files)
        return cold, n / (time.monotonic() - t0)


def _mounted(src: str, mnt: str, cache: str, env: dict, names: list[str], size: int,
             seconds: float) -> tuple[float, float]:
    cmd = [sys.executable, "-m", "neuralcache"]
    r = subprocess.run(cmd + ["mount", src, mnt, "--cache-dir", cache],
                       env={**os.environ, **env}, capture_output=True, text=True)
    if r.returncode:
        sys.exit(f"mount failed: {r.stderr.strip()}")
    try:
        return _epochs([os.path.join(mnt, n) for n in names], size, seconds)
    finally:
        subprocess.run(cmd + ["umount", mnt], capture_output=True)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--files", type=int, default=1000)
    ap.add_argument("--size", type=int, default=100 * 1024, help="bytes per file")
    ap.add_argument("--seconds", type=float, default=8.0)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("variants", nargs="*", default=["default:"])
    a = ap.parse_args(argv)
    variants = []
    for v in a.variants:
        label, _, envs = v.partition(":")
        env = dict(kv.split("=", 1) for kv in envs.split(",") if kv)
        variants.append((label, env))
    with tempfile.TemporaryDirectory(prefix="warmfiles-") as tmp:
        src = os.path.join(tmp, "src")
        os.makedirs(os.path.join(src, "d"))
        names = [f"d/f{i:06d}" for i in range(a.files)]
        for n in names:
            with open(os.path.join(src, n), "wb") as f:
                f.write(os.urandom(a.size))
        mnt = os.path.join(tmp, "mnt")
        os.makedirs(mnt)
        for rnd in range(a.rounds):
            _, local = _epochs([os.path.join(src, n) for n in names], a.size, a.seconds)
            print(f"round {rnd + 1} directory: warm {local:,.0f} files/s", flush=True)
            for label, env in (variants if rnd % 2 == 0 else variants[::-1]):
                cache = os.path.join(tmp, f"cache-{label}-{rnd}")
                cold, warm = _mounted(src, mnt, cache, env, names, a.size, a.seconds)
                print(f"round {rnd + 1} {label}: cold {cold:,.0f} files/s, warm "
                      f"{warm:,.0f} files/s ({warm / local:.2f}x the directory)", flush=True)


if __name__ == "__main__":
    main()

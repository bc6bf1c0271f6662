"""A large file read back from the cache, two or more checkouts side by side: the FUSE
pipeline's own rate (the kernel's READs, the daemon, the disk tier), with a reader
that does no work per byte.

    python -m bench.tools.cachedpair [--size 1G] [--rounds 3] [--cache-root DIR]
                                     LABEL:CODE_DIR LABEL:CODE_DIR ...

One file of random bytes in a local directory is mounted as the source (no link, no
store).  For each read: a fresh cache under ``--cache-root``, a mount that reads the
file once (the disk cache fills), an unmount, the page cache dropped, a new mount, and
the timed read (1 MiB reads, nothing done with the bytes); then an untimed read on the
same mount checks every byte by xxh3 (from the page cache) and the mount goes.  Each
round runs the checkouts in the order A B .. Z Z .. B A.  ``--cache-root`` on a tmpfs
(/dev/shm) takes this VM's disk out of the result (its speed drifts from minute to
minute); on the disk, the disk tier's reads are in it.  CODE_DIR: a
checkout whose neuralcache/ the daemon runs (a "before" is `git worktree add DIR REV`).
Also printed: the FUSE connection's max_background and the mount's bdi read-ahead as
the daemon left them.
"""
from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import xxhash

from neuralcache.admin.sizes import parse_size
from neuralcache.daemon import kernel_knob_paths

from bench.systems.ncmount import mounted
from bench.systems.pagecache import drop_page_cache
from bench.systems.reads import read_hashed
from bench.tools.seqread import read_all


def _knobs(mnt: Path) -> str:
    bdi, conn = kernel_knob_paths(os.stat(mnt).st_dev)
    out = []
    for what, path in (("max_background", os.path.join(conn, "max_background")),
                       ("read_ahead_kb", bdi)):
        try:
            out.append(f"{what} {Path(path).read_text().strip()}")
        except OSError:
            out.append(f"{what} ?")
    return ", ".join(out)


def one(code: str, src: Path, cache_root: Path, digest: str, mnt: Path) -> tuple:
    # PYTHONSAFEPATH: `python -m` would put the working directory (this checkout)
    # ahead of PYTHONPATH
    env = dict(os.environ, PYTHONPATH=code, PYTHONSAFEPATH="1")
    cache = Path(tempfile.mkdtemp(prefix="cachedpair-", dir=cache_root))
    args = ("--cache-dir", cache, "--cache-size", "4G")
    try:
        with mounted(str(src), mnt, *args, env=env):
            read_all(mnt / "big.bin")                   # fills the disk cache
        drop_page_cache()
        with mounted(str(src), mnt, *args, env=env):
            time.sleep(1.0)     # the daemon tunes the kernel in a thread once it serves
            knobs = _knobs(mnt)
            secs, n = read_all(mnt / "big.bin")
            got = read_hashed(mnt / "big.bin")[1]
        if got != digest:
            raise SystemExit(f"{code}: the bytes read differ from the source's")
        return n / secs / 1e6, knobs
    finally:
        shutil.rmtree(cache, ignore_errors=True)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--size", default="1G", help="file size (default 1G)")
    ap.add_argument("--rounds", type=int, default=3, help="rounds (default 3)")
    ap.add_argument("--cache-root", default=None,
                    help="where the caches go (default: a temporary directory)")
    ap.add_argument("code", nargs="+", metavar="LABEL:CODE_DIR")
    a = ap.parse_args(argv)
    try:
        size = parse_size(a.size)
        systems = [(c.split(":", 1)[0], os.path.abspath(c.split(":", 1)[1]))
                   for c in a.code]
    except (ValueError, IndexError) as exc:
        ap.error(str(exc) or "give LABEL:CODE_DIR")
    work = Path(tempfile.mkdtemp(prefix="cachedpair-"))
    cache_root = Path(a.cache_root or work)
    cache_root.mkdir(parents=True, exist_ok=True)
    try:
        src, mnt = work / "src", work / "mnt"
        src.mkdir()
        h = xxhash.xxh3_64()
        with open(src / "big.bin", "wb") as f:
            left = size
            while left:
                b = os.urandom(min(left, 64 << 20))
                f.write(b)
                h.update(b)
                left -= len(b)
        results: dict[str, list[float]] = {label: [] for label, _ in systems}
        for rnd in range(a.rounds):
            for label, code in systems + systems[::-1]:
                mbs, knobs = one(code, src, cache_root, h.hexdigest(), mnt)
                results[label].append(mbs)
                print(f"round {rnd + 1} {label:12s} {mbs:7.0f} MB/s  ({knobs})",
                      flush=True)
        for label, r in results.items():
            print(f"{label:12s} MB/s: {', '.join(f'{x:.0f}' for x in r)}; "
                  f"median {statistics.median(r):.0f}")
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

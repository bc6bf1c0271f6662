"""Shuffled epochs over a dataset larger than the disk cache: what each epoch fetches
over the link, and how fast it reads.  The epoch-aware eviction's own measure, and the
read-ahead's and prefetch's: what they fetched, what of it was read, staged on disk,
and let go unread by memory or by the disk (the stats' ``ahead_lost_*_bytes``).

    python -m bench.tools.epochs [--files 3000] [--file-size 100K] [--cache-size 150M]
        [--memory-cache-size 16M] [--epochs 4] [--readers 8] [--rtt-ms 60]
        [--mount-args "..."] [--out bench/out]

One mount of an empty cache over a SeaweedFS bucket behind the WAN emulator; FILES
files of FILE_SIZE random bytes, read whole by READERS threads in a new shuffled order
each epoch, every byte checked (xxh3), the kernel page cache dropped before each epoch.
With a disk cache holding a fraction f of the dataset, LRU keeps about
f + (1 - f) ln(1 - f) of it from one epoch to the next (0.15 at f = 0.5) and an
eviction that drops what the epoch already read first keeps f (predictors/epoch.py).
The ``overflow`` scenario (bench/scenarios/overflow.py) shows the same with 2 MiB
shards and one reader; this one has many small files and 8 readers.  Per epoch: files/s, MiB fetched over the link, of it read ahead or
prefetched and of that read, the disk cache's hits, the daemon's CPU seconds.  Writes
epochs.json.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
from pathlib import Path

from neuralcache.admin.sizes import parse_size

from bench.servers.seaweed import SeaweedServer
from bench.systems.ncmount import mounted, stats
from bench.systems.pagecache import drop_page_cache
from bench.tools.breakdown import measure, put_files, read_files
from bench.wan import WanProxyProcess

MIB = 1 << 20


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--files", type=int, default=3000, help="files (default 3000)")
    ap.add_argument("--file-size", default="100K", help="file size (default 100K)")
    ap.add_argument("--cache-size", default="150M",
                    help="disk cache size (default 150M: half of 3000 x 100K)")
    ap.add_argument("--memory-cache-size", default="16M",
                    help="memory cache size (default 16M)")
    ap.add_argument("--epochs", type=int, default=4, help="epochs (default 4)")
    ap.add_argument("--readers", type=int, default=8, help="reader threads (default 8)")
    ap.add_argument("--rtt-ms", type=float, default=60.0, help="emulated round trip")
    ap.add_argument("--mount-args", default="", help="more `neuralcache mount` options")
    ap.add_argument("--out", default="bench/out", help="directory for epochs.json")
    a = ap.parse_args(argv)
    try:
        fsize = parse_size(a.file_size)
        parse_size(a.cache_size), parse_size(a.memory_cache_size)
    except ValueError as exc:
        ap.error(str(exc))
    work = Path(tempfile.mkdtemp(prefix="nc-epochs-"))
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    rows = []
    try:
        with SeaweedServer(work / "sw") as sw:
            s3 = sw.client()
            s3.create_bucket(Bucket="epochs")
            names = [f"train/c{i % 20:02d}/{i:05d}.jpg" for i in range(a.files)]
            digests = put_files(s3, "epochs", names, fsize)
            env = dict(os.environ, **sw.env())
            with WanProxyProcess(f"127.0.0.1:{sw.s3_port}", rtt_ms=a.rtt_ms) as proxy, \
                    mounted("s3://epochs", work / "mnt", "--endpoint-url", proxy.endpoint,
                            "--cache-dir", work / "cache", "--cache-size", a.cache_size,
                            "--memory-cache-size", a.memory_cache_size,
                            *a.mount_args.split(), env=env) as mnt:
                for epoch in range(1, a.epochs + 1):
                    drop_page_cache()
                    s0 = stats(mnt)
                    r = measure(mnt, proxy, lambda e=epoch: read_files(
                        mnt, names, digests, a.readers, seed=e))
                    s1 = stats(mnt)
                    rows.append({"epoch": epoch, "seconds": r["seconds"],
                                 "files_per_s": r["files"] / r["seconds"],
                                 "link_mib": r["bytes_fetched"] / MIB,
                                 "disk_hits": s1["disk_hits"] - s0["disk_hits"],
                                 "ahead_mib": sum(r["prefetch"][k] for k in (
                                     "prefetch_bytes_fetched", "readahead_bytes_fetched")) / MIB,
                                 "ahead_used_mib": sum(r["prefetch"][k] for k in (
                                     "prefetch_bytes_used", "readahead_bytes_used")) / MIB,
                                 "lost_memory_mib": (s1["ahead_lost_memory_bytes"] -
                                                     s0["ahead_lost_memory_bytes"]) / MIB,
                                 "lost_disk_mib": (s1["ahead_lost_disk_bytes"] -
                                                   s0["ahead_lost_disk_bytes"]) / MIB,
                                 "staged_mib": (s1["prefetch_bytes_staged"] -
                                                s0["prefetch_bytes_staged"]) / MIB,
                                 "cpu_s": r["cpu"].get("total", 0.0),
                                 "wrong": len(r["wrong"])})
    finally:
        shutil.rmtree(work, ignore_errors=True)
    (out / "epochs.json").write_text(json.dumps(rows, indent=1))
    print(f"{a.files} x {a.file_size} files, disk cache {a.cache_size}, memory "
          f"{a.memory_cache_size}, {a.readers} readers, {a.rtt_ms:g} ms")
    print(f"{'epoch':>5} {'files/s':>8} {'link MiB':>9} {'ahead MiB':>10} {'used':>6} "
          f"{'staged':>6} {'lost mem':>8} {'lost disk':>9} {'disk hits':>9} {'CPU s':>6} "
          "wrong")
    for r in rows:
        print(f"{r['epoch']:>5} {r['files_per_s']:>8.0f} {r['link_mib']:>9.1f} "
              f"{r['ahead_mib']:>10.1f} {r['ahead_used_mib']:>6.1f} {r['staged_mib']:>6.1f} "
              f"{r['lost_memory_mib']:>8.1f} {r['lost_disk_mib']:>9.1f} "
              f"{r['disk_hits']:>9} {r['cpu_s']:>6.1f} {r['wrong']}")
    return 1 if any(r["wrong"] for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())

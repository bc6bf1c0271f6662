"""Sequential read of one large file: local disk vs NeuralCache cold/warm, and the
daemon's CPU time per GiB served (the core read path's own cost).

    python -m bench.seqread [--size 1G] [--rtt-ms 60] [--out DIR]

Runs, in one process and one run: local (page cache dropped), NeuralCache cold (empty
cache, through the WAN emulator), NeuralCache warm (same mount, a second read: the
kernel page cache via keep_cache), NeuralCache warm-disk (remounted, memory and page
cache empty, blocks from the disk cache).  Prints a table and writes seqread.json.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

from neuralcache.admin.sizes import parse_size

from bench.servers.seaweed import SeaweedServer
from bench.systems.cpu import cpu_seconds
from bench.systems.ncmount import mounted, stats
from bench.systems.pagecache import drop_page_cache
from bench.wan import WanProxyProcess

CHUNK = 1 << 20


def read_all(path: Path) -> tuple[float, int]:
    t0 = time.perf_counter()
    n = 0
    with open(path, "rb", buffering=0) as f:
        while b := f.read(CHUNK):
            n += len(b)
    return time.perf_counter() - t0, n


def daemon_read(pid: int, path: Path) -> tuple[float, float, float]:
    """Read ``path`` through a mount: (MB/s, seconds, the daemon ``pid``'s CPU s per GiB)."""
    c0 = cpu_seconds(pid)
    t, n = read_all(path)
    return n / t / 1e6, t, (cpu_seconds(pid) - c0) / (n / 2**30)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--size", default="1G", help="file size (default 1G)")
    ap.add_argument("--rtt-ms", type=float, default=60.0)
    ap.add_argument("--out", default="bench/out")
    a = ap.parse_args(argv)
    size = parse_size(a.size)
    work = Path(tempfile.mkdtemp(prefix="nc-seqread-"))
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    rows = []
    try:
        local = work / "local" / "weights.bin"
        local.parent.mkdir(parents=True)
        with open(local, "wb") as f:
            rnd = os.urandom(CHUNK)
            for i in range(size // CHUNK):
                f.write(rnd[i % 7:] + rnd[:i % 7])
        with SeaweedServer(work / "sw") as sw:
            s3 = sw.client()
            s3.create_bucket(Bucket="seqread")
            s3.upload_file(str(local), "seqread", "weights.bin")
            method = drop_page_cache([local])
            t, n = read_all(local)
            rows.append(("local (cold)", n / t / 1e6, t, None))
            t, n = read_all(local)
            rows.append(("local (warm)", n / t / 1e6, t, None))
            env = dict(os.environ, **sw.env())
            with WanProxyProcess(f"127.0.0.1:{sw.s3_port}", rtt_ms=a.rtt_ms) as proxy:
                mnt = work / "mnt"
                mount_args = ["s3://seqread", mnt, "--endpoint-url", proxy.endpoint,
                              "--cache-dir", work / "cache", "--cache-size", f"{2 * size}",
                              "--memory-cache-size", "1G"]
                with mounted(*mount_args, env=env):
                    pid = stats(mnt)["pid"]
                    rows.append(("neuralcache cold", *daemon_read(pid, mnt / "weights.bin")))
                    rows.append(("neuralcache warm (page cache)",
                                 *daemon_read(pid, mnt / "weights.bin")))
                    time.sleep(1.0)   # background disk writes land
                drop_page_cache([local])
                with mounted(*mount_args, env=env):
                    pid = stats(mnt)["pid"]
                    rows.append(("neuralcache warm (disk cache)",
                                 *daemon_read(pid, mnt / "weights.bin")))
                    st = stats(mnt)
                link = proxy.stats()
    finally:
        shutil.rmtree(work, ignore_errors=True)
    local_cold = rows[0][1]
    print(f"sequential read of a {size / 2**30:.2f} GiB file, {a.rtt_ms:.0f} ms RTT "
          f"(page cache dropped with {method})")
    print(f"{'system':32} {'MB/s':>8} {'x local cold':>13} {'seconds':>8} {'CPU s/GiB':>10}")
    for name, mbps, secs, cpu in rows:
        cpu_s = f"{cpu:10.2f}" if cpu is not None else f"{'':10}"
        print(f"{name:32} {mbps:8.0f} {mbps / local_cold:13.2f} {secs:8.2f} {cpu_s}")
    print(f"warm-disk remount fetched {st['bytes_fetched']} bytes from the remote; "
          f"proxy carried {link.get('bytes_down', 0) / 1e6:.0f} MB down")
    (out / "seqread.json").write_text(json.dumps(
        {"size": size, "rtt_ms": a.rtt_ms, "rows": [dict(system=r[0], mb_s=r[1], seconds=r[2],
                                                         cpu_s_per_gib=r[3]) for r in rows]},
        indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())

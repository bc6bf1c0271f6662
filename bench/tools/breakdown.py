"""Where the daemon's CPU goes, per GiB and per file, through a real mount over the
emulated WAN: the measurement every data-plane change proves itself with.

    python -m bench.breakdown [--size 1G] [--files 2000] [--file-size 100K]
                              [--readers 8] [--rtt-ms 60] [--out bench/out]
                              [--mount-args "--readahead-size 128M"]
                              [--throttle-writes 100M] [--py-spy 100]

Three workloads, in one run, each on a fresh mount of an empty cache (except warm-disk):

* ``bigfile cold``   one file read sequentially in 1 MiB reads (model weights, shards);
* ``bigfile disk``   the same, remounted: memory and page cache empty, blocks from the
                     disk cache (every epoch of a dataset larger than RAM);
* ``files cold``     N small files read once each in random order by R reader threads
                     (the ImageNet case), no hints;
* ``files warm``, ``files warm 2``  the next two epochs (new orders) on the same mount,
                     page cache warm: what each open still costs the daemon;
* ``files disk``     another epoch, remounted: memory and page cache empty, the small
                     files' blocks from the disk cache (segment records).

The daemon runs with ``NEURALCACHE_CPU_ACCOUNTING=1`` (neuralcache/cpuacct.py): its
CPU is split into fetch (S3 GETs), disk write and read (with the checksum, also shown
alone), read-ahead/prefetch decisions, the rest of the trio thread (FUSE handlers, the
block store and memory tier, pyfuse3's request loop, trio) and the rest of the worker
threads (hand-offs); and, from /proc, by thread (the trio thread, trio's worker threads,
obstore's tokio runtime; /proc counts each thread's CPU in whole clock ticks, so the
many briefly busy fetch threads of a small-file workload show far less than they used,
and a thread that exited is missing: the line ends with what the groups leave of the
process total).  Also
reported: FUSE requests per file by operation (less the requests of reading the stats
file itself, measured in the same run), the kernel's read request sizes, and the WAN
emulator's own CPU (it must not be the bottleneck), the MiB each workload fetched over
the link (0 for a remount whose disk cache holds everything), the disk writes skipped
(queue full) and queued late, and how long the `neuralcache
umount` after it took (the daemon's write-back of memory to the disk cache included).
``--throttle-writes`` slows every disk write of the run to that many bytes/s
(bench/systems/throttle.py: a disk slower than the link); ``--py-spy HZ`` records each
workload with ``py-spy record --native`` (blocking: it slows the daemon, so read its
shares, not its rates) into OUT/<workload>.pyspy and prints the trio thread's heaviest
frames.  Writes breakdown.json.
"""
from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import xxhash

from neuralcache.admin.sizes import parse_size

from bench.servers.seaweed import SeaweedServer
from bench.systems.cpu import cpu_seconds, minor_faults, thread_cpu
from bench.systems.ncmount import mounted, stats
from bench.systems.pagecache import drop_page_cache
from bench.systems.reads import read_hashed
from bench.systems.throttle import throttled_writes
from bench.wan import WanProxyProcess

GIB = 1 << 30
# Parts of cpu_s shown, in order (neuralcache/cpuacct.py); disk parts include checksum.
PARTS = ("fetch", "disk_write", "disk_read", "checksum", "ahead", "loop_other",
         "worker_other")
# py-spy, from this interpreter's environment (pip's bench extra).
PY_SPY = shutil.which("py-spy") or os.path.join(os.path.dirname(sys.executable), "py-spy")
# Bytes the WAN emulator must carry in a workload for its CPU per GiB to be shown.
WAN_RATE_MIN_BYTES = 1 << 20
OPS = ("lookup", "getattr", "open", "read", "flush", "release")
# Disk writes skipped (queue full) and queued late (their reader left them, or memory
# evicted them), per workload (the daemon's stats; deltas).
DISK_WRITE_STATS = ("disk_writes_skipped", "disk_writes_late")
# What the prefetcher did in a workload (the daemon's stats; deltas).
PREFETCH_STATS = ("prefetch_bytes_fetched", "prefetch_bytes_used", "readahead_bytes_fetched",
                  "readahead_bytes_used", "demand_hit_bytes", "prefetch_plans",
                  "prefetch_plans_empty", "prefetch_bytes_staged")


def _delta(after: dict, before: dict) -> dict:
    return {k: v - before.get(k, 0) for k, v in after.items() if isinstance(v, (int, float))}


def snapshot_requests(mnt: Path) -> dict:
    """The FUSE requests one reading of the stats file itself costs (its lookup,
    getattrs, open, reads, release): two snapshots in a row, differenced.  ``measure``
    takes them off, so that requests per file count only the workload's."""
    a = stats(mnt)
    return _delta(stats(mnt).get("fuse_requests", {}), a.get("fuse_requests", {}))


def measure(mnt: Path, proxy: WanProxyProcess, work, spy: Path | None = None,
            spy_hz: int = 0) -> dict:
    """Run ``work()`` (returns (bytes, files, wrong)) against the mount; the deltas.
    ``spy``: py-spy records the daemon meanwhile into that file at ``spy_hz``."""
    own = snapshot_requests(mnt)
    s0 = stats(mnt)
    p0, d0 = cpu_seconds(proxy.proc.pid), cpu_seconds(s0["pid"])
    f0 = minor_faults(s0["pid"])
    th0 = thread_cpu(s0["pid"])
    rec = None
    if spy is not None:
        rec = subprocess.Popen([PY_SPY, "record", "--native", "-r", str(spy_hz), "-f",
                                "raw", "-o", str(spy), "-p", str(s0["pid"])],
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        time.sleep(1.0)                          # attached before the workload starts
    t0 = time.perf_counter()
    nbytes, nfiles, wrong = work()
    secs = time.perf_counter() - t0
    if rec is not None:
        rec.send_signal(signal.SIGINT)
        rec.wait(120)
    s1 = stats(mnt)
    # a daemon without cpu_s (older code, for a before/after): its process total only
    cpu = _delta(s1.get("cpu_s") or {}, s0.get("cpu_s") or {}) or \
        {"total": cpu_seconds(s1["pid"]) - d0}
    return {"seconds": secs, "bytes": nbytes, "files": nfiles, "wrong": wrong, "cpu": cpu,
            "fuse_requests": {k: max(0, v - own.get(k, 0)) for k, v in _delta(
                s1.get("fuse_requests", {}), s0.get("fuse_requests", {})).items()},
            "fuse_read_sizes": _delta(s1.get("fuse_read_sizes", {}),
                                      s0.get("fuse_read_sizes", {})),
            "bytes_fetched": s1["bytes_fetched"] - s0["bytes_fetched"],
            "prefetch": {k: s1.get(k, 0) - s0.get(k, 0) for k in PREFETCH_STATS},
            "disk_writes": {k: s1.get(k, 0) - s0.get(k, 0) for k in DISK_WRITE_STATS},
            "proxy_cpu": cpu_seconds(proxy.proc.pid) - p0,
            "threads": {k: round(v - th0.get(k, 0.0), 3)
                        for k, v in thread_cpu(s1["pid"]).items() if v - th0.get(k, 0.0) > 0},
            "minor_faults": minor_faults(s1["pid"]) - f0}


def put_files(s3, bucket: str, names: list[str], size: int) -> dict[str, str]:
    """Upload a file of ``size`` random bytes at each name; their xxh3_64 digests."""
    digests = {}

    def put(name):
        data = os.urandom(size)
        digests[name] = xxhash.xxh3_64_hexdigest(data)
        s3.put_object(Bucket=bucket, Key=name, Body=data)

    with ThreadPoolExecutor(16) as pool:
        list(pool.map(put, names))
    return digests


def read_files(root: Path, names: list[str], digests: dict, readers: int, seed: int):
    order = list(names)
    random.Random(seed).shuffle(order)
    wrong = []
    lock = threading.Lock()

    def one(name: str) -> int:
        data = (root / name).read_bytes()
        if xxhash.xxh3_64_hexdigest(data) != digests[name]:
            with lock:
                wrong.append(name)
        return len(data)

    with ThreadPoolExecutor(readers) as pool:
        nbytes = sum(pool.map(one, order))
    return nbytes, len(order), wrong


PLUMBING = ("__Pyx", "__pyx_gb", "Py_", "async_wrapper", "_edge", "0x")


def spy_summary(raw: Path, top: int = 12) -> list[str]:
    """The trio thread's heaviest frames (inclusive share of its samples) in a py-spy
    raw (collapsed stacks) file: the thread whose stacks hold trio's run loop."""
    stacks = []
    for line in raw.read_text().splitlines():
        stack, _, n = line.rpartition(" ")
        if "unrolled_run" in stack:
            stacks.append(([f.split(" (")[0] for f in stack.split(";")], int(n)))
    total = sum(n for _, n in stacks)
    incl: dict[str, int] = {}
    for frames, n in stacks:
        for f in set(frames):
            incl[f] = incl.get(f, 0) + n
    # frames every sample has (the loop's own outer frames) and pyfuse3's coroutine
    # plumbing (Cython generator frames around every handler) say nothing
    heavy = sorted((kv for kv in incl.items() if kv[1] < 0.9 * total
                    and not kv[0].startswith(PLUMBING)), key=lambda kv: -kv[1])
    return [f"{100 * n / total:5.1f} %  {f}" for f, n in heavy[:top]] if total else []


def report(rows: dict) -> str:
    lines = []
    head = (f"{'workload':14} {'rate':>14} {'CPU s':>7} {'per':>11}  " +
            " ".join(f"{p:>12}" for p in PARTS) + f" {'WAN emu':>9} {'faults':>9}")
    lines.append(head)
    for name, r in rows.items():
        big = r["files"] <= 1
        unit, per = ("GiB", r["bytes"] / GIB) if big else ("file", r["files"])
        scale = 1.0 if big else 1000.0           # CPU-s per GiB, or ms per file
        rate = (f"{r['bytes'] / r['seconds'] / 1e6:8.0f} MB/s" if big
                else f"{r['files'] / r['seconds']:7.0f} files/s")
        total = r["cpu"].get("total", 0.0)
        cells = " ".join(f"{r['cpu'].get(p, 0.0) / per * scale:12.3f}" for p in PARTS)
        # the emulator's CPU per GiB it carried; "-" when it carried next to nothing
        # (a workload served from the cache: its idle CPU over a few KiB is no rate)
        wan = (f"{r['proxy_cpu'] / r['bytes_fetched'] * GIB:6.2f}"
               if r["bytes_fetched"] >= WAN_RATE_MIN_BYTES else f"{'-':>6}")
        lines.append(f"{name:14} {rate:>14} {total:7.2f} "
                     f"{total / per * scale:7.3f} {'s/GiB' if big else 'ms/f':>3}  {cells}"
                     f" {wan} s/GiB {r.get('minor_faults', 0) / per:9.0f}")
    lines.append("parts: CPU-s per GiB (bigfile) or CPU-ms per file (files); disk_write/"
                 "disk_read include checksum; fetch = GETs in threads (those on the trio "
                 "thread, small ones, are in loop_other); WAN emu = the emulator's CPU per "
                 "GiB it carried; "
                 "faults = the daemon's minor page faults per GiB or per file")
    for name, r in rows.items():
        n = max(r["files"], 1)
        reqs = ", ".join(f"{op} {r['fuse_requests'].get(op, 0) / n:.1f}" for op in OPS)
        sizes = ", ".join(f"{k}: {v}" for k, v in r["fuse_read_sizes"].items() if v)
        lines.append(f"{name}: FUSE requests per file: {reqs}; read sizes: {sizes}")
        big = r["files"] <= 1
        per, unit = (r["bytes"] / GIB, "s/GiB") if big else (n / 1000.0, "ms/f")
        th = r.get("threads", {})
        threads = ", ".join(f"{k} {v / per:.3f}" for k, v in sorted(
            th.items(), key=lambda kv: -kv[1]))
        # threads: their schedstat run time (bench/systems/cpu.py); the process total
        # (os.times) also holds threads that exited, and is sampled per clock tick
        rest = r["cpu"].get("total", 0.0) - sum(th.values())
        if th and rest > 0:
            threads += f"; not in these (exited threads, the total's tick sampling) " \
                       f"{rest / per:.3f}"
        lines.append(f"{name}: CPU by thread ({unit}): {threads}")
        pf = r.get("prefetch", {})
        if pf.get("prefetch_plans"):
            lines.append(f"{name}: prefetch plans (the predictor asked) {pf['prefetch_plans']}"
                         f", with nothing to fetch {pf.get('prefetch_plans_empty', 0)}; "
                         f"prefetched {pf.get('prefetch_bytes_fetched', 0) / 2**20:.0f} MiB, "
                         f"of it read {pf.get('prefetch_bytes_used', 0) / 2**20:.0f}, "
                         f"staged on disk {pf.get('prefetch_bytes_staged', 0) / 2**20:.0f}")
        dw = r.get("disk_writes", {})
        skipped = f"disk writes skipped {dw['disk_writes_skipped']}, queued late " \
            f"{dw.get('disk_writes_late', 0)}; " if dw.get("disk_writes_skipped") else ""
        lines.append(f"{name}: fetched over the link {r['bytes_fetched'] / 2**20:.0f} MiB; "
                     f"{skipped}the umount after it {r.get('umount_s', float('nan')):.1f} s")
        if r.get("pyspy"):
            lines.append(f"{name}: py-spy, the trio thread's heaviest frames "
                         f"({r['pyspy']['file']}):")
            lines += [f"    {x}" for x in r["pyspy"]["top"]]
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--size", default="1G", help="big file size (default 1G)")
    ap.add_argument("--files", type=int, default=2000,
                    help="small files (default 2000; 0 skips that workload)")
    ap.add_argument("--file-size", default="100K", help="small file size (default 100K)")
    ap.add_argument("--readers", type=int, default=8, help="reader threads (default 8)")
    ap.add_argument("--rtt-ms", type=float, default=60.0, help="emulated round trip")
    ap.add_argument("--out", default="bench/out", help="directory for breakdown.json")
    ap.add_argument("--mount-args", default="",
                    help="extra `neuralcache mount` options, e.g. \"--readahead-size 128M\"")
    ap.add_argument("--throttle-writes", default=None, metavar="SIZE",
                    help="throttle every disk write of the run to SIZE per second, e.g. "
                         "100M (cgroup v1 blkio, root): a disk slower than the link")
    ap.add_argument("--py-spy", type=int, default=0, metavar="HZ",
                    help="record each workload with py-spy --native at HZ samples/s "
                         "(slows the daemon: shares, not rates)")
    a = ap.parse_args(argv)
    if a.py_spy and not os.path.exists(PY_SPY):
        raise SystemExit("--py-spy needs py-spy next to this Python: pip install py-spy "
                         "(the bench extra has it)")
    if a.throttle_writes:       # the disk the run's temporary directory is on
        with throttled_writes(tempfile.gettempdir(),
                              parse_size(a.throttle_writes)) as what:
            print(f"breakdown: {what}", flush=True)
            return _run(a)
    return _run(a)


def _run(a) -> int:
    size, fsize = parse_size(a.size), parse_size(a.file_size)
    work = Path(tempfile.mkdtemp(prefix="nc-breakdown-"))
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    rows: dict[str, dict] = {}
    try:
        with SeaweedServer(work / "sw") as sw:
            s3 = sw.client()
            s3.create_bucket(Bucket="breakdown")
            big = work / "big.bin"
            with open(big, "wb") as f:
                for _ in range(size // (64 << 20)):
                    f.write(os.urandom(64 << 20))
                f.write(os.urandom(size % (64 << 20)))
            s3.upload_file(str(big), "breakdown", "big.bin")
            big_digest = read_hashed(big)[1]
            big.unlink()
            names = [f"files/c{i % 20:02d}/{i:05d}.jpg" for i in range(a.files)]
            digests = put_files(s3, "breakdown", names, fsize)
            env = dict(os.environ, **sw.env(), NEURALCACHE_CPU_ACCOUNTING="1")
            with WanProxyProcess(f"127.0.0.1:{sw.s3_port}", rtt_ms=a.rtt_ms) as proxy:
                def mount(cache, timings=None):
                    return mounted("s3://breakdown", work / "mnt", "--endpoint-url",
                                   proxy.endpoint, "--cache-dir", work / cache,
                                   "--cache-size", str(2 * size + a.files * fsize),
                                   *a.mount_args.split(), env=env, timings=timings)

                def run(name, mnt, fn, t):
                    spy = out / f"{name.replace(' ', '-')}.pyspy" if a.py_spy else None
                    rows[name] = measure(mnt, proxy, fn, spy, a.py_spy)
                    rows[name]["umount"] = t
                    if spy is not None and spy.exists():
                        rows[name]["pyspy"] = {"file": str(spy), "top": spy_summary(spy)}

                def bigread(mnt):
                    def run():
                        n, digest = read_hashed(mnt / "big.bin")
                        return n, 1, [] if digest == big_digest else ["big.bin"]
                    return run

                drop_page_cache()
                t = {}
                with mount("c1", t) as mnt:
                    run("bigfile cold", mnt, bigread(mnt), t)
                    time.sleep(1.0)                  # background disk writes land
                drop_page_cache()
                t = {}
                with mount("c1", t) as mnt:
                    run("bigfile disk", mnt, bigread(mnt), t)
                if names:
                    drop_page_cache()
                    t = {}
                    with mount("c2", t) as mnt:
                        run("files cold", mnt,
                            lambda: read_files(mnt, names, digests, a.readers, 1), t)
                        # the next epochs, page cache warm (bench's "samples warm"): the
                        # first right after the cold one, the second after that
                        run("files warm", mnt,
                            lambda: read_files(mnt, names, digests, a.readers, 2), t)
                        run("files warm 2", mnt,
                            lambda: read_files(mnt, names, digests, a.readers, 3), t)
                        time.sleep(1.0)                  # background disk writes land
                    drop_page_cache()
                    t = {}
                    with mount("c2", t) as mnt:
                        run("files disk", mnt,
                            lambda: read_files(mnt, names, digests, a.readers, 4), t)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    for r in rows.values():         # the umount timing lands once its mount is gone
        r["umount_s"] = r.pop("umount").get("umount_s")
    print(f"CPU breakdown, {a.rtt_ms:.0f} ms RTT, {size / GIB:.2f} GiB file, {a.files} x "
          f"{fsize // 1024} KiB files, {a.readers} readers")
    print(report(rows))
    bad = {k: r["wrong"] for k, r in rows.items() if r["wrong"]}
    if bad:
        print(f"WRONG BYTES: {bad}")
    (out / "breakdown.json").write_text(json.dumps(
        {"size": size, "files": a.files, "file_size": fsize, "readers": a.readers,
         "rtt_ms": a.rtt_ms, "rows": rows}, indent=2))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())

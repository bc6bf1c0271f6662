"""Reliability runs (the long forms of tests/test_reliability.py):

    python -m bench.soak faults [--gib 2] [--rates 0,0.01,0.05,0.1] [--rtt-ms 60]
    python -m bench.soak soak [--minutes 10] [--readers 16]

``faults``: random verified reads (xxh3 of every read against the generated source)
through the WAN emulator with connection resets and stalls at each rate, until --gib of
verified bytes per rate; prints throughput against the fault-free rate, EIO count, wrong
bytes (must be 0), slowest read.  ``soak``: --readers threads of random verified reads
for --minutes on a dataset 4x the memory cache; prints peak RSS against the configured
memory cache, errors, open handles and descriptors at the end.
"""
from __future__ import annotations

import argparse
import errno
import json
import os
import random
import shutil
import sys
import tempfile
import threading
import time
from pathlib import Path

from bench.servers.seaweed import SeaweedServer
from bench.systems.ncmount import mounted, stats
from bench.wan import WanProxy

MB = 1 << 20


def dataset(n: int, size: int, seed: int) -> dict[str, bytes]:
    return {f"d/{i:04d}.bin": random.Random(seed * 7919 + i).randbytes(size) for i in range(n)}


def random_reads(mp: Path, files: dict[str, bytes], threads: int, *, seconds: float,
                 max_len: int, seed: int, max_bytes: int | None = None,
                 keep: int = 20) -> dict:
    """``threads`` threads of random preads of ``files`` (path under ``mp`` -> expected
    bytes), each read checked against the source, for ``seconds`` or until ``max_bytes``
    verified bytes (no limit: None).

    Returns counts -- ``bytes`` (verified), ``reads``, ``eio``, ``wrong`` (reads that
    returned other bytes), ``other`` (errors but EIO), ``slowest`` (s, any read),
    ``seconds`` -- and the first ``keep`` wrong reads as (path, offset, length) in
    ``wrong_reads`` and other errors as repr in ``errors``.
    """
    keys = sorted(files)
    limit = float("inf") if max_bytes is None else max_bytes
    out = {"bytes": 0, "reads": 0, "eio": 0, "wrong": 0, "other": 0, "slowest": 0.0,
           "wrong_reads": [], "errors": []}
    lock = threading.Lock()
    deadline = time.monotonic() + seconds

    def worker(i):
        rnd = random.Random(seed * 1000 + i)
        while time.monotonic() < deadline and out["bytes"] < limit:
            k = rnd.choice(keys)
            src = files[k]
            off = rnd.randrange(max(1, len(src)))
            ln = rnd.randrange(1, max_len)
            t0 = time.monotonic()
            try:
                fd = os.open(mp / k, os.O_RDONLY)
                try:
                    got = os.pread(fd, ln, off)
                finally:
                    os.close(fd)
                err = None
            except OSError as exc:
                err = exc
            dt = time.monotonic() - t0
            with lock:
                out["slowest"] = max(out["slowest"], dt)
                out["reads"] += 1
                if err is not None and err.errno == errno.EIO:
                    out["eio"] += 1
                elif err is not None:
                    out["other"] += 1
                    if len(out["errors"]) < keep:
                        out["errors"].append(repr(err))
                elif got != src[off:off + ln]:
                    out["wrong"] += 1
                    if len(out["wrong_reads"]) < keep:
                        out["wrong_reads"].append((k, off, ln))
                else:
                    out["bytes"] += len(got)

    ts = [threading.Thread(target=worker, args=(i,)) for i in range(threads)]
    t0 = time.monotonic()
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    out["seconds"] = time.monotonic() - t0
    return out


def upload(sw: SeaweedServer, bucket: str, files: dict[str, bytes]) -> None:
    from concurrent.futures import ThreadPoolExecutor

    s3 = sw.client()
    s3.create_bucket(Bucket=bucket)
    with ThreadPoolExecutor(16) as pool:
        list(pool.map(lambda kv: s3.put_object(Bucket=bucket, Key=kv[0], Body=kv[1]),
                      files.items()))


def run_faults(a) -> dict:
    work = Path(tempfile.mkdtemp(prefix="nc-faults-"))
    files = dataset(64, 4 * MB, 1)
    results = []
    try:
        with SeaweedServer(work / "sw") as sw:
            upload(sw, "faults", files)
            env = dict(os.environ, **sw.env())
            for rate in a.rates:
                with WanProxy(f"127.0.0.1:{sw.s3_port}", rtt_ms=a.rtt_ms, reset_rate=rate,
                              stall_rate=rate, stall_s=20.0, seed=3) as proxy:
                    # a small cache, so reads keep going over the faulty link
                    with mounted("s3://faults", work / f"mnt{rate}", "--endpoint-url",
                                 proxy.endpoint, "--cache-dir", work / f"cache{rate}",
                                 "--cache-size", "32M", "--memory-cache-size", "16M",
                                 "--block-size", "1M", env=env) as mnt:
                        r = random_reads(mnt, files, 8, seconds=a.max_minutes * 60,
                                         max_bytes=int(a.gib * 2**30), max_len=2 * MB, seed=5)
                        st = stats(mnt)
                    p = proxy.stats()
                r.update(rate=rate, mb_s=r["bytes"] / r["seconds"] / 1e6,
                         resets=p.get("resets", 0), stalls=p.get("stalls", 0),
                         retries=st["backend_retries"], hedged=st["hedged_requests"])
                results.append(r)
                print(f"rate {rate:5.2f}: {r['bytes'] / 2**30:.2f} GiB verified in "
                      f"{r['reads']} reads, {r['mb_s']:.0f} MB/s, EIO {r['eio']}, "
                      f"wrong {r['wrong']}, other errors {r['other']}, slowest "
                      f"{r['slowest']:.1f} s, link resets {r['resets']} stalls "
                      f"{r['stalls']}, retries {r['retries']}, hedged {r['hedged']}",
                      flush=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    base = results[0]["mb_s"] if results else 1
    print(f"\n{'fault rate':>10} {'GiB ok':>7} {'MB/s':>6} {'x fault-free':>12} {'EIO':>5} "
          f"{'wrong':>6} {'slowest s':>9}")
    for r in results:
        print(f"{r['rate']:10.2f} {r['bytes'] / 2**30:7.2f} {r['mb_s']:6.0f} "
              f"{r['mb_s'] / base:12.2f} {r['eio']:5d} {r['wrong']:6d} {r['slowest']:9.1f}")
    return {"faults": results}


def run_soak(a) -> dict:
    work = Path(tempfile.mkdtemp(prefix="nc-soak-"))
    mem_mb = 64
    files = dataset(64, 4 * MB, 2)            # 256 MiB = 4x the memory cache
    try:
        with SeaweedServer(work / "sw") as sw:
            upload(sw, "soak", files)
            env = dict(os.environ, **sw.env())
            with WanProxy(f"127.0.0.1:{sw.s3_port}", rtt_ms=a.rtt_ms) as proxy:
                with mounted("s3://soak", work / "mnt", "--endpoint-url", proxy.endpoint,
                             "--cache-dir", work / "cache", "--cache-size", "128M",
                             "--memory-cache-size", f"{mem_mb}M", "--block-size", "1M",
                             env=env) as mnt:
                    pid = stats(mnt)["pid"]
                    r = random_reads(mnt, files, a.readers, seconds=a.minutes * 60,
                                     max_bytes=1 << 62, max_len=512 << 10, seed=9)
                    # RELEASE is a background request: let a backlog of closes in
                    end = time.monotonic() + 30
                    while stats(mnt)["open_handles"] and time.monotonic() < end:
                        time.sleep(0.1)
                    st = stats(mnt)
                    status = open(f"/proc/{pid}/status").read()
                    hwm = int(status.split("VmHWM:")[1].split()[0]) // 1024
                    rss = int(status.split("VmRSS:")[1].split()[0]) // 1024
                    fds = len(os.listdir(f"/proc/{pid}/fd"))
                    threads = len(os.listdir(f"/proc/{pid}/task"))
    finally:
        shutil.rmtree(work, ignore_errors=True)
    out = {"minutes": a.minutes, "readers": a.readers, "reads": r["reads"],
           "verified_gib": r["bytes"] / 2**30, "eio": r["eio"], "wrong": r["wrong"],
           "other": r["other"], "peak_rss_mb": hwm, "rss_end_mb": rss,
           "memory_cache_mb": mem_mb, "open_handles_end": st["open_handles"],
           "fds_end": fds, "threads_end": threads, "read_errors": st["read_errors"]}
    print(json.dumps(out, indent=2))
    return {"soak": out}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.soak", description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="mode", required=True)
    f = sub.add_parser("faults")
    f.add_argument("--gib", type=float, default=2.0, help="verified GiB per fault rate")
    f.add_argument("--rates", type=lambda s: [float(x) for x in s.split(",")],
                   default=[0.0, 0.01, 0.05, 0.1])
    f.add_argument("--rtt-ms", type=float, default=60.0)
    f.add_argument("--max-minutes", type=float, default=10.0, help="per rate")
    s = sub.add_parser("soak")
    s.add_argument("--minutes", type=float, default=10.0)
    s.add_argument("--readers", type=int, default=16)
    s.add_argument("--rtt-ms", type=float, default=60.0)
    a = ap.parse_args(argv)
    res = run_faults(a) if a.mode == "faults" else run_soak(a)
    out = Path("bench/out")
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{a.mode}.json").write_text(json.dumps(res, indent=2))
    bad = sum(r["wrong"] for r in res.get("faults", [])) + res.get("soak", {}).get("wrong", 0)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())

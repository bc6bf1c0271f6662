"""Micro-measurements quoted in code comments, the README and issue notes.

    python -m bench.micro get-cpu [--n 500] [--size 100000]
        CPU per ranged GET: botocore GetObject vs NeuralCache's read path (SigV4-signed
        urllib3), against an embedded SeaweedFS (no WAN delay: CPU is the point).
    python -m bench.micro lru-leak [--n 300]
        RSS growth of evicting n 1 MiB values from lru-dict with popitem() vs
        peek_last_item() + del (the memory tier uses the latter).
"""
from __future__ import annotations

import argparse
import os
import resource
import sys
import tempfile

MB = 1 << 20


def _cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def _rss_mb() -> int:
    with open("/proc/self/status") as f:
        return int(f.read().split("VmRSS:")[1].split()[0]) // 1024


def get_cpu(n: int, size: int) -> None:
    from neuralcache.backends.s3 import S3Backend

    from .seaweed import SeaweedServer

    with SeaweedServer(tempfile.mkdtemp(prefix="nc-micro-")) as sw:
        c = sw.client()
        c.create_bucket(Bucket="micro")
        c.put_object(Bucket="micro", Key="x", Body=os.urandom(size))
        os.environ.update(sw.env())
        b = S3Backend("micro", endpoint_url=sw.endpoint)
        v = b.stat("x").version

        def boto():
            r = b._client.get_object(Bucket="micro", Key="x", Range=f"bytes=0-{size - 1}",
                                     IfMatch=f'"{v}"')
            return r["Body"].read()

        for name, fn in (("botocore GetObject", boto),
                         ("neuralcache read (urllib3 + SigV4)",
                          lambda: b.read("x", 0, size, v))):
            for _ in range(20):
                fn()
            c0 = _cpu()
            for _ in range(n):
                assert len(fn()) == size
            print(f"{name:38} {(_cpu() - c0) / n * 1000:6.2f} ms CPU per {size}-byte GET")


def lru_leak(n: int) -> None:
    import lru

    seed = os.urandom(MB)

    def run(evict) -> int:
        base = _rss_mb()
        cache = lru.LRU(1 << 20)
        for i in range(n):
            cache[i] = bytes(bytearray(seed))      # distinct, resident 1 MiB values
            if len(cache) > 4:
                evict(cache)
        return _rss_mb() - base

    def peek_del(c):
        del c[c.peek_last_item()[0]]

    print(f"lru-dict: {n} evictions of 1 MiB values")
    print(f"  peek_last_item + del: RSS +{run(peek_del)} MB")
    print(f"  popitem():            RSS +{run(lambda c: c.popitem(least_recent=True))} MB")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.micro")
    sub = ap.add_subparsers(dest="what", required=True)
    g = sub.add_parser("get-cpu")
    g.add_argument("--n", type=int, default=500)
    g.add_argument("--size", type=int, default=100_000)
    le = sub.add_parser("lru-leak")
    le.add_argument("--n", type=int, default=300)
    a = ap.parse_args(argv)
    if a.what == "get-cpu":
        get_cpu(a.n, a.size)
    else:
        lru_leak(a.n)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Micro-measurements quoted in code comments, the README and issue notes.

    python -m bench.micro get-cpu [--n 500] [--size 100000]
        CPU per ranged GET: botocore GetObject vs NeuralCache's read path (SigV4-signed
        urllib3) vs obstore (Rust object_store, when installed), against an embedded
        SeaweedFS (no WAN delay: CPU is the point).
    python -m bench.micro lru-leak [--n 300]
        RSS growth of evicting n 1 MiB values from lru-dict with popitem() vs
        peek_last_item() + del (the memory tier uses the latter).
    python -m bench.micro prefetch-cpu [--files 32768] [--opens 3000]
        CPU per file in the daemon's prefetch path (Prefetcher + default predictor +
        BlockStore + limiter, fake zero-latency backend) for the maze bench's pattern:
        250-byte files opened in a hinted shuffled order by 4 workers.
    python -m bench.micro fresh-memory [--gib 1] [--rounds 3]
        CPU of filling and keeping --gib of 8 MiB blocks read from a file (as the disk
        cache's blocks are kept by the memory tier) into fresh huge-page buffers
        (neuralcache/buffers.py with NEURALCACHE_HUGE_PAGES=1), fresh private 4 KiB-page
        mappings (its default), fresh shared mappings (mmap's default) and bytes.
    python -m bench.micro disk-put [--n 3000] [--size 100000] [--rounds 2] [--dir D]
        CPU and wall time per DiskTier put and get (one thread, a cache holding half
        the blocks, so every put evicts one) with blocks packed into segment files
        (whatever their size) against a file per block, rounds alternating, on D's
        filesystem.
"""
from __future__ import annotations

import argparse
import os
import resource
import sys
import tempfile
import time

MB = 1 << 20


def _cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def _rss_mb() -> int:
    with open("/proc/self/status") as f:
        return int(f.read().split("VmRSS:")[1].split()[0]) // 1024


def get_cpu(n: int, size: int) -> None:
    from neuralcache.backends.s3 import S3Backend

    from bench.servers.seaweed import SeaweedServer

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

        clients = [("botocore GetObject", boto),
                   ("neuralcache read (urllib3 + SigV4)", lambda: b.read("x", 0, size, v))]
        try:        # the Rust object_store client, for comparison (the peers extra has it)
            import obstore
            from obstore.store import S3Store
            env = sw.env()
            st = S3Store("micro", endpoint=sw.endpoint, region="us-east-1",
                         access_key_id=env["AWS_ACCESS_KEY_ID"],
                         secret_access_key=env["AWS_SECRET_ACCESS_KEY"],
                         client_options={"allow_http": True},
                         virtual_hosted_style_request=False)
            clients.append(("obstore get (range, if_match)", lambda: obstore.get(
                st, "x", options={"range": (0, size), "if_match": v}).bytes()))
        except ImportError:
            print("(obstore not installed: pip install -e '.[peers]' to compare it)")
        for name, fn in clients:
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


def prefetch_cpu(n_files: int, n_opens: int) -> None:
    import random
    import time

    import trio

    from neuralcache.backends.base import ObjectInfo
    from neuralcache.store.blocks import BlockStore
    from neuralcache.store.tiers import MemoryTier
    from neuralcache.namespace import Namespace
    from neuralcache.ahead.prefetch import Prefetcher
    from neuralcache.stats import Stats
    from predictors.ensemble import make_default_predictor

    class Backend:
        def read(self, key, off, length, version):
            return bytes(length)

    keys = [f"maze/mazes/{i // 1000:03d}/{i:06d}.bin" for i in range(n_files)]
    ns = Namespace()
    ns.apply_listing([ObjectInfo(k, 250, "v", 0.0) for k in keys])
    store = BlockStore(Backend(), MemoryTier(1 << 30), None, Stats(), block_size=8 << 20,
                       concurrency=64)
    pf = Prefetcher(ns, store, make_default_predictor(ns.files_in_order()),
                    budget_bytes=256 << 20)
    rng = random.Random(0)
    order: list[int] = []
    while len(order) < 2 * n_opens:
        o = list(range(n_files))
        rng.shuffle(o)
        order += o

    async def main():
        async with trio.open_nursery() as n:
            await n.start(store.run)
            pf.set_hints([keys[i] for i in order])
            c0 = time.process_time()
            for j, i in enumerate(order[:n_opens]):
                pf.on_open(keys[i], 250, 100 + j % 4)
                pf.on_read(keys[i], 0, 250, 250, 100 + j % 4)
                if j % 64 == 0:
                    await trio.sleep(0)      # let the loads run, as a batch boundary would
            cpu = time.process_time() - c0
            n.cancel_scope.cancel()
        print(f"prefetch path: {cpu / n_opens * 1e6:.0f} us of CPU per file (open + read) "
              f"over {n_opens} hinted opens of {n_files} 250-byte files")

    trio.run(main)


def fresh_memory(gib: float, rounds: int) -> None:
    import mmap

    from neuralcache import buffers

    block = 8 * MB
    n = max(1, int(gib * 1024 * MB) // block)
    with tempfile.NamedTemporaryFile(prefix="nc-micro-") as f:
        f.write(os.urandom(block))
        f.flush()
        fd = f.fileno()

        def small():
            b = mmap.mmap(-1, block, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
            os.preadv(fd, [b], 0)
            return b

        def shared():
            b = mmap.mmap(-1, block)
            os.preadv(fd, [b], 0)
            return b

        kinds = [("huge pages (buffers.fresh)",
                  lambda: buffers.read_into(lambda v: os.preadv(fd, [v], 0), block, True)),
                 ("4 KiB pages (private mmap)", small),
                 ("4 KiB pages (shared mmap)", shared),
                 ("bytes (os.pread)", lambda: os.pread(fd, block, 0))]
        print(f"{n} blocks of 8 MiB read from the page cache and kept, {rounds} rounds")
        for r in range(rounds):
            for name, fn in kinds:
                f0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
                c0 = _cpu()
                kept = [fn() for _ in range(n)]
                cpu = (_cpu() - c0) / (n * block / 2**30)
                faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - f0
                print(f"round {r + 1}  {name:28} {cpu:6.3f} CPU-s/GiB "
                      f"{faults / (n * block / 2**30):9.0f} faults/GiB")
                del kept


def disk_put(n: int, size: int, rounds: int, where: str | None) -> None:
    import shutil

    from neuralcache.store.tiers import BlockKey, DiskTier

    def cpu() -> float:
        return time.thread_time_ns() / 1e9

    data = [os.urandom(size) for _ in range(16)]
    print(f"{n} puts of {size}-byte blocks into a cache of {n // 2}, then {n // 2} gets "
          f"(the newest half), per operation:")
    for r in range(rounds):
        # segments whatever the size (pack_max = size: what packing would give blocks
        # over the tier's PACK_MAX too)
        for label, pack_max in (("segments", size), ("file per block", 0)):
            root = tempfile.mkdtemp(prefix="nc-micro-", dir=where)
            try:
                d = DiskTier(root, n // 2 * size, pack_max=pack_max)
                d.load()
                keys = [BlockKey(f"files/{i:06d}.jpg", "etag", 0) for i in range(n)]
                c0, t0 = cpu(), time.perf_counter()
                for i, k in enumerate(keys):
                    d.put(k, data[i % 16])
                c1, t1 = cpu(), time.perf_counter()
                hits = sum(d.get(k) is not None for k in keys[n // 2:])
                c2, t2 = cpu(), time.perf_counter()
            finally:
                shutil.rmtree(root, ignore_errors=True)
            g = max(1, n // 2)
            print(f"round {r + 1}  {label:15} put {1e3 * (c1 - c0) / n:6.3f} ms CPU "
                  f"{1e3 * (t1 - t0) / n:6.3f} ms wall   get {1e3 * (c2 - c1) / g:6.3f} ms "
                  f"CPU {1e3 * (t2 - t1) / g:6.3f} ms wall   ({hits}/{g} hits)")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.micro")
    sub = ap.add_subparsers(dest="what", required=True)
    g = sub.add_parser("get-cpu")
    g.add_argument("--n", type=int, default=500)
    g.add_argument("--size", type=int, default=100_000)
    le = sub.add_parser("lru-leak")
    le.add_argument("--n", type=int, default=300)
    pc = sub.add_parser("prefetch-cpu")
    pc.add_argument("--files", type=int, default=32_768)
    pc.add_argument("--opens", type=int, default=3000)
    fm = sub.add_parser("fresh-memory")
    fm.add_argument("--gib", type=float, default=1.0)
    fm.add_argument("--rounds", type=int, default=3)
    dp = sub.add_parser("disk-put")
    dp.add_argument("--n", type=int, default=3000)
    dp.add_argument("--size", type=int, default=100_000)
    dp.add_argument("--rounds", type=int, default=2)
    dp.add_argument("--dir", default=None, help="where the caches go (default: TMPDIR)")
    a = ap.parse_args(argv)
    if a.what == "disk-put":
        disk_put(a.n, a.size, a.rounds, a.dir)
    elif a.what == "fresh-memory":
        fresh_memory(a.gib, a.rounds)
    elif a.what == "get-cpu":
        get_cpu(a.n, a.size)
    elif a.what == "prefetch-cpu":
        prefetch_cpu(a.files, a.opens)
    else:
        lru_leak(a.n)
    return 0


if __name__ == "__main__":
    sys.exit(main())

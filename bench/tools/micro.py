"""Micro-measurements quoted in code comments, the README and issue notes.

    python -m bench.micro get-cpu [--n 500] [--size 100000]
        CPU per ranged GET: botocore GetObject vs NeuralCache's read path (SigV4-signed
        urllib3) vs obstore (Rust object_store, when installed), against an embedded
        SeaweedFS (no WAN delay: CPU is the point).
    python -m bench.micro get-big [--gib 1] [--inflight 1,8,32] [--rtt-ms 60] [--rounds 2]
                                  [--clients NAME,...]
        CPU-s per GiB received and MB/s of 8 MiB ranged GETs (the block size) with 1, 8
        and 32 in flight (one thread each, as the daemon's backend threads), through
        every client that could serve the block read path: NeuralCache's (urllib3 +
        SigV4), obstore (get with range + if_match, get_range; zero-copy Bytes or
        copied to bytes; get_ranges of one range is get_range), awscrt's S3Client
        (on_body) and the mountpoint-s3 client s3torchconnector ships (both hand over
        each 8 MiB part whole, kept as is); against an embedded SeaweedFS directly and
        through the WAN emulator, in the daemon's malloc setting (two arenas).  CPU is
        the whole process's (every thread of every client's runtime) per GiB; every
        block's xxh3 is checked, and the hashing's own CPU (measured alone) taken out.
        The last 32 blocks stay referenced (as the memory tier keeps them), so a
        buffer is not simply reused by the next GET.  Then the anatomy of the urllib3
        path: the request's CPU (1-byte GETs) and fresh memory + one copy.  awscrt is
        in the bench extra; obstore is a dependency, s3torchconnector a peer.
    python -m bench.micro small-gets [--n 2000] [--inflight 16,128] [--rounds 2]
        CPU per 100 KB GET over the WAN emulator: a worker thread per GET (obstore
        get), one asyncio thread beside trio (obstore get_async), and the daemon's
        GETs on the trio thread (backends/s3trio.py), with its receive calls per GET.
    python -m bench.micro lru-leak [--n 300]
        RSS growth of evicting n 1 MiB values from lru-dict with popitem() vs
        peek_last_item() + del (the memory tier uses the latter).
    python -m bench.micro prefetch-cpu [--files 32768] [--opens 3000]
        CPU per file in the daemon's prefetch path (Prefetcher + default predictor +
        BlockStore + limiter, fake zero-latency backend) for the maze bench's pattern:
        250-byte files opened in a hinted shuffled order by 4 workers.
    python -m bench.micro warm-opens [--files 3000] [--opens 30000]
        CPU per open the kernel serves from its page cache (``on_open(warm=True)``)
        in the prefetch path with the default predictor: deferred (the ring of
        WARM_DEFER_MAX, as the daemon does) against observed at once (each open
        handed to the predictor on the spot, as before).  No kernel, no backend.
    python -m bench.micro shared-requests [--n 400]
        The shared tier's requests (store/sharedobj.py SharedBucket) against an
        embedded single-process SeaweedFS: the client's CPU and the server's CPU per
        GET of a missing block, claim (create-only PUT: won, refused), GET of a claim,
        PUT and GET of a 1 MiB block -- what a cold block costs each side.
    python -m bench.micro fresh-memory [--gib 1] [--rounds 3]
        CPU of filling and keeping --gib of 8 MiB blocks read from a file (as the disk
        cache's blocks are kept by the memory tier) into fresh huge-page buffers
        (neuralcache/buffers.py with NEURALCACHE_HUGE_PAGES=1), fresh private 4 KiB-page
        mappings (its default), the same populated at mmap time (MAP_POPULATE: one
        call instead of 2,048 faults), fresh shared mappings (mmap's default) and bytes.
    python -m bench.micro disk-put [--n 3000] [--size 100000] [--rounds 2] [--dir D]
        CPU and wall time per DiskTier put and get (one thread, a cache holding half
        the blocks, so every put evicts one) with blocks packed into segment files
        (whatever their size) against a file per block, rounds alternating, on D's
        filesystem.
    python -m bench.micro writeback [--gib 1] [--rounds 2] [--dir D]
        A checkpoint's staging file written in 1 MiB pwrites, then fsynced (what a
        --writable mount's close() does), without and with the journal's early
        writeback (neuralcache/write/files.py start_writeback every WRITEBACK_STEP),
        rounds alternating, on D's filesystem: seconds of writes, of the fsync, and
        the process's CPU.
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


BLOCK = 8 * MB


def _big_clients(endpoint: str, env: dict, bucket: str, key: str) -> dict:
    """name -> (make, get): ``make()`` builds the client once, ``get(client, off, n,
    version)`` returns the bytes (any buffer) of one ranged GET, pinned to ``version``
    where the client can pin."""
    def urllib3_path():
        from neuralcache.backends.s3 import S3Backend
        return S3Backend(bucket, endpoint_url=endpoint, concurrency=64)

    def obstore_store():
        from .micro_gets import obstore_store as make
        return make(bucket, endpoint, env)

    def obstore_get(st, off, n, v):
        import obstore
        return obstore.get(st, key, options={"range": (off, off + n),
                                             "if_match": f'"{v}"'}).bytes()

    def obstore_range(st, off, n, v):
        import obstore
        return obstore.get_range(st, key, start=off, end=off + n)

    def crt_client():
        from awscrt import auth, io, s3
        elg = io.EventLoopGroup()
        bs = io.ClientBootstrap(elg, io.DefaultHostResolver(elg))
        cp = auth.AwsCredentialsProvider.new_static(env["AWS_ACCESS_KEY_ID"],
                                                    env["AWS_SECRET_ACCESS_KEY"])
        tls = (s3.S3RequestTlsMode.DISABLED if endpoint.startswith("http://")
               else s3.S3RequestTlsMode.ENABLED)
        return s3.S3Client(bootstrap=bs, region="us-east-1", credential_provider=cp,
                           tls_mode=tls, part_size=BLOCK, throughput_target_gbps=10.0)

    host = endpoint.split("//", 1)[1].rstrip("/")

    def crt_get(cl, off, n, v):
        from awscrt import http, s3
        chunks: list = []

        def on_body(chunk, offset, **kw):         # chunk: bytes, offset: in the object
            chunks.append((offset, chunk))

        req = http.HttpRequest("GET", f"/{bucket}/{key}", http.HttpHeaders(
            [("Host", host), ("Range", f"bytes={off}-{off + n - 1}"),
             ("If-Match", f'"{v}"')]))
        cl.make_request(type=s3.S3RequestType.GET_OBJECT, request=req,
                        on_body=on_body).finished_future.result(60)
        return _joined(chunks, off, n)

    def mountpoint_client():
        from s3torchconnectorclient._mountpoint_s3_client import MountpointS3Client
        return MountpointS3Client("us-east-1", endpoint=endpoint, force_path_style=True,
                                  part_size=BLOCK, max_attempts=1)

    def mountpoint_get(cl, off, n, v):      # no If-Match: the client cannot send one
        chunks, pos = [], off
        for chunk in cl.get_object(bucket, key, off, off + n):
            chunks.append((pos, chunk))
            pos += len(chunk)
        return _joined(chunks, off, n)

    return {
        "urllib3+sigv4 (now)": (urllib3_path, lambda b, off, n, v: b.read(key, off, n, v)),
        "obstore get if_match": (obstore_store, obstore_get),
        "obstore get -> bytes": (obstore_store, lambda st, off, n, v: bytes(
            obstore_get(st, off, n, v))),
        "obstore get_range": (obstore_store, obstore_range),
        "awscrt S3Client": (crt_client, crt_get),
        "mountpoint (s3torch)": (mountpoint_client, mountpoint_get),
    }


def _joined(chunks: list, off: int, n: int):
    """The body from (object offset, bytes) chunks: the one chunk itself when the
    client delivered it whole (no copy: these clients buffer a whole part), else the
    chunks copied into one buffer."""
    if len(chunks) == 1 and chunks[0][0] == off:
        return chunks[0][1]
    out = bytearray(n)
    for o, c in chunks:
        out[o - off:o - off + len(c)] = c
    return out


def _get_run(get, client, n_gets: int, inflight: int, version: str,
             digests: list[int]) -> tuple[float, float, int, int, int]:
    """(seconds, CPU-s, bytes, wrong blocks, minor page faults) of n_gets 8 MiB GETs,
    ``inflight`` at once."""
    import collections
    import time
    from concurrent.futures import ThreadPoolExecutor

    import xxhash

    kept: collections.deque = collections.deque(maxlen=32)
    nblocks = len(digests)

    def one(i: int) -> tuple[int, bool]:
        b = i % nblocks
        data = get(client, b * BLOCK, BLOCK, version)
        kept.append(data)
        return len(data), xxhash.xxh3_64_intdigest(data) == digests[b]

    with ThreadPoolExecutor(inflight) as pool:
        list(pool.map(one, range(inflight)))          # connections up, runtimes started
        f0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        c0, t0 = _cpu(), time.perf_counter()
        res = list(pool.map(one, range(n_gets)))
        secs, cpu = time.perf_counter() - t0, _cpu() - c0
        faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - f0
    return secs, cpu, sum(n for n, _ in res), sum(1 for _, ok in res if not ok), faults


def get_big(gib: float, inflight: list[int], rtt_ms: float, rounds: int,
            only: list[str] | None) -> None:
    import xxhash

    from bench.servers.seaweed import SeaweedServer
    from bench.wan import WanProxyProcess

    from neuralcache.daemon import _limit_malloc_arenas

    _limit_malloc_arenas()      # the daemon's malloc (two arenas), so blocks made in
    nblocks = 32                # any thread are recycled as the daemon's are
    n_gets = max(1, int(gib * 1024 * MB) // BLOCK)
    with tempfile.TemporaryDirectory(prefix="nc-micro-") as work, \
            SeaweedServer(work) as sw:
        c = sw.client()
        c.create_bucket(Bucket="micro")
        data = os.urandom(nblocks * BLOCK)
        digests = [xxhash.xxh3_64_intdigest(data[i * BLOCK:(i + 1) * BLOCK])
                   for i in range(nblocks)]
        version = c.put_object(Bucket="micro", Key="big", Body=data)["ETag"].strip('"')
        c0 = _cpu()
        for _ in range(4):
            for i in range(nblocks):
                xxhash.xxh3_64_intdigest(memoryview(data)[i * BLOCK:(i + 1) * BLOCK])
        hash_per_gib = (_cpu() - c0) / (4 * nblocks * BLOCK / 2**30)
        del data
        env = sw.env()
        os.environ.update(env)
        print(f"{n_gets} GETs of 8 MiB per row; CPU-s/GiB is the whole process's, less "
              f"xxh3's {hash_per_gib:.3f} CPU-s/GiB; {rounds} rounds, order reversed "
              "every other round")
        print(f"{'round':5} {'link':7} {'client':22} {'inflight':>8} {'MB/s':>7} "
              f"{'CPU-s/GiB':>10} {'faults/GiB':>10} {'wrong':>5}")
        with WanProxyProcess(f"127.0.0.1:{sw.s3_port}", rtt_ms=rtt_ms) as proxy:
            links = [("direct", sw.endpoint), (f"{rtt_ms:.0f}ms", proxy.endpoint)]
            for r in range(rounds):
                for link, endpoint in links:
                    names = list(_big_clients(endpoint, env, "micro", "big").items())
                    if only:
                        names = [(k, v) for k, v in names if any(o in k for o in only)]
                    if r % 2:
                        names.reverse()
                    for name, (make, get) in names:
                        try:
                            client = make()
                        except ImportError as exc:
                            print(f"{'':5} {link:7} {name:22} not installed ({exc.name})")
                            continue
                        for k in inflight:
                            secs, cpu, nbytes, wrong, faults = _get_run(
                                get, client, n_gets, k, version, digests)
                            gibs = nbytes / 2**30
                            print(f"{r + 1:5} {link:7} {name:22} {k:8} "
                                  f"{nbytes / secs / 1e6:7.0f} "
                                  f"{cpu / gibs - hash_per_gib:10.3f} "
                                  f"{faults / gibs:10.0f} {wrong:5}",
                                  flush=True)
                        if hasattr(client, "close"):
                            client.close()
                        del client
        _anatomy(sw.endpoint, version, n_gets)


def _anatomy(endpoint: str, version: str, n_gets: int) -> None:
    """Where NeuralCache's CPU per 8 MiB GET goes, directly (one thread): the request
    (a 1-byte GET, scaled to a GiB of 8 MiB GETs) and fresh memory with one copy
    (8 MiB bytes copied from a buffer and kept, as a block is); the rest of a GET is the
    socket receive."""
    import collections

    from neuralcache.backends.s3 import S3Backend

    b = S3Backend("micro", endpoint_url=endpoint)
    for _ in range(20):
        b.read("big", 0, 1, version)
    c0 = _cpu()
    for _ in range(300):
        b.read("big", 0, 1, version)
    per_request = (_cpu() - c0) / 300 * (2**30 // BLOCK)
    src = os.urandom(BLOCK)
    kept: collections.deque = collections.deque(maxlen=32)
    c0 = _cpu()
    for _ in range(n_gets):
        kept.append(bytes(memoryview(src)))
    memory = (_cpu() - c0) / (n_gets * BLOCK / 2**30)
    b.close()
    print(f"anatomy of the urllib3 path (direct, 1 thread), CPU-s per GiB of 8 MiB GETs: "
          f"request (sign, send, headers) {per_request:.3f}, fresh memory + one copy "
          f"{memory:.3f}; the rest of a GET's CPU is the socket receive")


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
    for k in keys:
        ns.put_file(k, 250, "v", 0.0)
    store = BlockStore(Backend(), MemoryTier(1 << 30), None, Stats(), block_size=8 << 20,
                       concurrency=64)
    pf = Prefetcher(ns, store, make_default_predictor([(k, 250) for k in sorted(keys)]),
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

        def populated():
            b = mmap.mmap(-1, block, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS
                          | mmap.MAP_POPULATE)
            os.preadv(fd, [b], 0)
            return b

        def shared():
            b = mmap.mmap(-1, block)
            os.preadv(fd, [b], 0)
            return b

        kinds = [("huge pages (buffers.fresh)",
                  lambda: buffers.read_into(lambda v: os.preadv(fd, [v], 0), block, True)),
                 ("4 KiB pages (private mmap)", small),
                 ("4 KiB, MAP_POPULATE", populated),
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


def writeback(gib: float, rounds: int, where: str | None) -> None:
    from neuralcache.write.files import WRITEBACK_STEP, pwrite_all

    chunk = MB
    size = int(gib * 1024) * MB
    buf = os.urandom(chunk)
    print(f"{size // MB} MiB in 1 MiB pwrites, then fsync; early writeback every "
          f"{WRITEBACK_STEP // MB} MiB or none")
    for r in range(rounds):
        for label, step in (("none", 0), ("early writeback", WRITEBACK_STEP)):
            os.sync()
            time.sleep(1)
            fd, path = tempfile.mkstemp(prefix="nc-micro-", dir=where)
            try:
                c0, t0 = _cpu(), time.monotonic()
                unkicked = 0
                for off in range(0, size, chunk):
                    kick = step > 0 and unkicked + chunk >= step
                    pwrite_all(fd, buf, off, kick)
                    unkicked = 0 if kick else unkicked + chunk
                t1 = time.monotonic()
                os.fsync(fd)
                t2 = time.monotonic()
                cpu = _cpu() - c0
            finally:
                os.close(fd)
                os.unlink(path)
            print(f"round {r + 1}  {label:16} writes {t1 - t0:5.2f} s  fsync {t2 - t1:5.2f} s"
                  f"  total {t2 - t0:5.2f} s  CPU {cpu:5.2f} s")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.micro")
    sub = ap.add_subparsers(dest="what", required=True)
    g = sub.add_parser("get-cpu")
    g.add_argument("--n", type=int, default=500)
    g.add_argument("--size", type=int, default=100_000)
    gb = sub.add_parser("get-big")
    gb.add_argument("--gib", type=float, default=1.0)
    gb.add_argument("--inflight", default="1,8,32")
    gb.add_argument("--rtt-ms", type=float, default=60.0)
    gb.add_argument("--rounds", type=int, default=2)
    gb.add_argument("--clients", default="", help="substrings of client names")
    sg = sub.add_parser("small-gets")
    sg.add_argument("--n", type=int, default=2000)
    sg.add_argument("--inflight", default="16,128")
    sg.add_argument("--rtt-ms", type=float, default=60.0)
    sg.add_argument("--rounds", type=int, default=2)
    le = sub.add_parser("lru-leak")
    le.add_argument("--n", type=int, default=300)
    pc = sub.add_parser("prefetch-cpu")
    pc.add_argument("--files", type=int, default=32_768)
    pc.add_argument("--opens", type=int, default=3000)
    wo = sub.add_parser("warm-opens")
    wo.add_argument("--files", type=int, default=3000)
    wo.add_argument("--opens", type=int, default=30_000)
    sr = sub.add_parser("shared-requests")
    sr.add_argument("--n", type=int, default=400)
    fm = sub.add_parser("fresh-memory")
    fm.add_argument("--gib", type=float, default=1.0)
    fm.add_argument("--rounds", type=int, default=3)
    dp = sub.add_parser("disk-put")
    dp.add_argument("--n", type=int, default=3000)
    dp.add_argument("--size", type=int, default=100_000)
    dp.add_argument("--rounds", type=int, default=2)
    dp.add_argument("--dir", default=None, help="where the caches go (default: TMPDIR)")
    wb = sub.add_parser("writeback")
    wb.add_argument("--gib", type=float, default=1.0)
    wb.add_argument("--rounds", type=int, default=2)
    wb.add_argument("--dir", default=None, help="where the file goes (default: TMPDIR)")
    a = ap.parse_args(argv)
    if a.what == "writeback":
        writeback(a.gib, a.rounds, a.dir)
    elif a.what == "disk-put":
        disk_put(a.n, a.size, a.rounds, a.dir)
    elif a.what == "fresh-memory":
        fresh_memory(a.gib, a.rounds)
    elif a.what == "get-cpu":
        get_cpu(a.n, a.size)
    elif a.what == "get-big":
        get_big(a.gib, [int(k) for k in a.inflight.split(",")], a.rtt_ms, a.rounds,
                [c for c in a.clients.split(",") if c] or None)
    elif a.what == "small-gets":
        from .micro_gets import small_gets
        small_gets(a.n, [int(k) for k in a.inflight.split(",")], a.rtt_ms, a.rounds)
    elif a.what == "warm-opens":
        from .micro_paths import warm_opens
        warm_opens(a.files, a.opens)
    elif a.what == "shared-requests":
        from .micro_paths import shared_requests
        shared_requests(a.n)
    elif a.what == "prefetch-cpu":
        prefetch_cpu(a.files, a.opens)
    else:
        lru_leak(a.n)
    return 0


if __name__ == "__main__":
    sys.exit(main())

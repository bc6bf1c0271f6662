"""``python -m bench.micro small-gets``: CPU per 100 KB GET with many in flight over the
emulated WAN, three ways: a worker thread per GET blocking in obstore's ``get`` (the
daemon's way until the thirty-eighth sitting, still its fallback), one asyncio thread
running obstore's ``get_async`` for trio (results handed back with ``run_sync_soon``),
and the daemon's GETs on the trio thread itself (neuralcache/backends/s3trio.py)."""
from __future__ import annotations

import asyncio
import os
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor

SIZE = 100_000
# Receive calls (socket reads) the trio thread's last run made (its row prints them per
# GET: ~1.2 here, so most answers are read whole in one call).
RECVS = [0]


def obstore_store(bucket: str, endpoint: str, env: dict):
    """obstore's S3 client for ``bucket`` at a test endpoint (get-big uses it too)."""
    from obstore.store import S3Store
    return S3Store(bucket, endpoint=endpoint, region="us-east-1",
                   access_key_id=env["AWS_ACCESS_KEY_ID"],
                   secret_access_key=env["AWS_SECRET_ACCESS_KEY"],
                   client_options={"allow_http": endpoint.startswith("http://")},
                   virtual_hosted_style_request=False)


def _cpu() -> float:
    t = os.times()
    return t.user + t.system


def _threads(store, keys, digests, inflight: int) -> int:
    import obstore
    import trio
    import xxhash
    wrong = 0

    async def main():
        lim = trio.CapacityLimiter(inflight)

        async def one(k):
            nonlocal wrong
            data = await trio.to_thread.run_sync(
                lambda: obstore.get(store, k, options={"range": (0, SIZE)}).bytes(),
                limiter=lim)
            wrong += xxhash.xxh3_64_intdigest(data) != digests[k]
        async with trio.open_nursery() as n:
            for k in keys:
                n.start_soon(one, k)
    trio.run(main)
    return wrong


def _asyncio(store, keys, digests, inflight: int) -> int:
    import obstore
    import trio
    import xxhash
    loop = asyncio.new_event_loop()
    th = threading.Thread(target=loop.run_forever, daemon=True)
    th.start()
    wrong = 0

    async def get(k):
        r = await obstore.get_async(store, k, options={"range": (0, SIZE)})
        return await r.bytes_async()

    async def main():
        token = trio.lowlevel.current_trio_token()
        sem = trio.Semaphore(inflight)

        async def one(k):
            nonlocal wrong
            async with sem:
                done, box = trio.Event(), []
                fut = asyncio.run_coroutine_threadsafe(get(k), loop)
                fut.add_done_callback(lambda f: (box.append(f), token.run_sync_soon(done.set)))
                await done.wait()
                data = box[0].result()
            wrong += xxhash.xxh3_64_intdigest(data) != digests[k]
        async with trio.open_nursery() as n:
            for k in keys:
                n.start_soon(one, k)
    try:
        trio.run(main)
    finally:
        loop.call_soon_threadsafe(loop.stop)
        th.join()
        loop.close()
    return wrong


def _on_trio(target: tuple[str, dict], keys, digests, inflight: int) -> int:
    """(endpoint URL, credentials env): its connections are opened anew in each call,
    which the other ways do not pay for."""
    from types import SimpleNamespace

    import trio
    import xxhash

    from neuralcache.backends import s3trio
    from neuralcache.backends.s3trio import TrioGets
    url, env = target
    recv_into = s3trio._Conn.recv_into

    async def counted(conn, view):          # how many receives an answer took
        RECVS[0] += 1
        return await recv_into(conn, view)
    creds = SimpleNamespace(access_key=env["AWS_ACCESS_KEY_ID"],
                            secret_key=env["AWS_SECRET_ACCESS_KEY"], token=None)
    wrong = 0

    async def main():
        gets, sem = TrioGets(), trio.Semaphore(inflight)

        async def one(k):
            nonlocal wrong
            async with sem:
                data = await gets.read(creds, "us-east-1", f"{url}/micro/{k}", 0, SIZE, "")
            wrong += not isinstance(data, (bytes, memoryview)) or \
                xxhash.xxh3_64_intdigest(data) != digests[k]
        async with trio.open_nursery() as n:
            for k in keys:
                n.start_soon(one, k)
        gets.close()
    RECVS[0] = 0
    s3trio._Conn.recv_into = counted
    try:
        trio.run(main)
    finally:
        s3trio._Conn.recv_into = recv_into
    return wrong


def small_gets(n: int, inflight: list[int], rtt_ms: float, rounds: int) -> None:
    import xxhash

    from bench.servers.seaweed import SeaweedServer
    from bench.wan import WanProxyProcess

    with tempfile.TemporaryDirectory(prefix="nc-micro-") as work, SeaweedServer(work) as sw:
        c = sw.client()
        c.create_bucket(Bucket="micro")
        digests: dict[str, int] = {}

        def put(i):
            data, key = os.urandom(SIZE), f"s/{i:06d}"
            digests[key] = xxhash.xxh3_64_intdigest(data)
            c.put_object(Bucket="micro", Key=key, Body=data)
        with ThreadPoolExecutor(16) as ex:
            list(ex.map(put, range(n)))
        env, keys = sw.env(), sorted(digests)
        print(f"{n} GETs of {SIZE} bytes per row over a {rtt_ms:.0f} ms link; CPU is the "
              f"whole process's (trio, threads, tokio, asyncio; xxh3 of each answer)")
        with WanProxyProcess(f"127.0.0.1:{sw.s3_port}", rtt_ms=rtt_ms) as proxy:
            for r in range(rounds):
                ways = [("threads (obstore)", _threads), ("asyncio thread", _asyncio),
                        ("trio thread", _on_trio)]
                if r % 2:
                    ways.reverse()
                for k in inflight:
                    for name, fn in ways:
                        store = (proxy.endpoint, env) if fn is _on_trio else \
                            obstore_store("micro", proxy.endpoint, env)
                        fn(store, keys[:k], digests, k)        # its connections up
                        c0, t0 = _cpu(), time.perf_counter()
                        wrong = fn(store, keys, digests, k)
                        secs, cpu = time.perf_counter() - t0, _cpu() - c0
                        recvs = f"  {RECVS[0] / n:.2f} receives per GET" \
                            if fn is _on_trio else ""
                        print(f"round {r + 1}  {name:17} {k:4} in flight  {n / secs:6.0f} "
                              f"GETs/s  {1e3 * cpu / n:.3f} ms CPU per GET  wrong {wrong}"
                              f"{recvs}", flush=True)

"""The shared tier (issue 13) with real mounts: a real SeaweedFS cluster (master, three
volume servers with replication, filer, S3 gateway: bench/cluster.py) behind a 1 ms
proxy is the shared tier, the session's SeaweedFS behind a 60 ms proxy the origin.
Every "node" is its own mount with its own cache directory; every byte read is
compared (xxh3) with what was uploaded."""
from __future__ import annotations

import concurrent.futures as cf
import json
import socket
import time
import urllib.request

import pytest
import xxhash

from bench.servers.cluster import SeaweedCluster
from bench.wan import WanProxyProcess
from conftest import (cli_env, digest, mounted, needs_fuse, new_bucket, payload, run_cli,
                      upload_tree)
from neuralcache.errors import Unavailable, UserError
from neuralcache.store import shared as sh
from neuralcache.store.tiers import BlockKey

pytestmark = needs_fuse

BS = 128 << 10
SHARED = "shared"


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    c = SeaweedCluster(tmp_path_factory.mktemp("cluster"), proxy_rtt_ms=1)
    c.start()
    try:
        c.create_bucket(SHARED)
        yield c
    finally:
        c.stop(grace=0)


@pytest.fixture(scope="module")
def origin(seaweed):
    p = WanProxyProcess(f"127.0.0.1:{seaweed.s3_port}", rtt_ms=60).start()
    try:
        yield p
    finally:
        p.stop()


def dataset(s3, seed: int, n: int, size: int, dirs=("d",)) -> tuple[str, dict[str, bytes]]:
    """n files per directory (the mount prefetches a small directory's files together
    on the first open, so a test that reads in phases uses a directory per phase)."""
    files = {f"{d}/{i:02d}.bin": payload(seed + 31 * j + i, size + 4099 * i)
             for j, d in enumerate(dirs) for i in range(n)}
    bucket = new_bucket(s3)
    upload_tree(s3, bucket, files)
    return bucket, files


def nblocks(files: dict[str, bytes]) -> int:
    return sum(-(-len(b) // BS) for b in files.values())


def node(origin, cluster, bucket, tmp_path, name, prefix, *extra, endpoint=None):
    return mounted(f"s3://{bucket}", tmp_path / f"mnt-{name}", env=cli_env(cluster),
                   cache_dir=tmp_path / f"cache-{name}",
                   args=["--endpoint-url", origin.endpoint, "--block-size", "128K",
                         "--shared-cache", f"s3://{SHARED}/{prefix}",
                         "--shared-cache-endpoint", endpoint or cluster.endpoint, *extra])


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def metric(scrape: bytes, series: str) -> float:
    line = next(x for x in scrape.decode().splitlines() if x.startswith(series + " "))
    return float(line.split()[1])


def stats(mp) -> dict:
    return json.loads((mp / ".neuralcache" / "stats.json").read_text())


def read_all(mp, files, order=None) -> None:
    for k in order or sorted(files):
        assert digest((mp / k).read_bytes()) == digest(files[k]), k


def drained(mp, writes: int, timeout: float = 30) -> dict:
    """Stats once `writes` blocks are written through and the queue is empty."""
    deadline = time.monotonic() + timeout
    while True:
        s = stats(mp)
        if s["shared_writes"] >= writes and s["shared_write_queue_bytes"] == 0:
            return s
        assert time.monotonic() < deadline, f"write-through did not drain: {s}"
        time.sleep(0.1)


def down_bytes(proxy) -> int:
    return proxy.stats()["bytes_down"]


def test_second_node_reads_from_the_shared_tier(s3, cluster, origin, tmp_path):
    bucket, files = dataset(s3, 100, 8, 300_000)
    total = sum(map(len, files.values()))
    with node(origin, cluster, bucket, tmp_path, "a", "t1") as a:
        read_all(a, files)
        sa = drained(a, nblocks(files))
    assert sa["shared_hits"] == 0 and sa["bytes_fetched"] == total
    assert sa["shared_bytes_written"] == total

    def second(name: str):
        port = free_port()
        with node(origin, cluster, bucket, tmp_path, name, "t1", "--metrics-port",
                  str(port)) as b:
            before = down_bytes(origin)
            read_all(b, files, order=sorted(files, reverse=True))
            wan = down_bytes(origin) - before
            sb = stats(b)
            scrape = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics",
                                            timeout=10).read()
        return wan, sb, scrape

    # A lookup past its deadline (a loaded machine's pause: the node looks the whole
    # directory up at once) is a miss by design, and its block comes from the origin; a
    # breaker that opened skips the tier.  Such a run measures once more on a fresh node
    # (the tier holds every block: node a wrote them).
    wan, sb, scrape = second("b")
    if sb["shared_misses"]:
        wan, sb, scrape = second("b2")
    misses = sb["shared_misses"]
    assert metric(scrape, 'neuralcache_cache_hits_total{tier="shared"}') == sb["shared_hits"]
    assert metric(scrape, "neuralcache_shared_read_bytes_total") == sb["shared_bytes_read"]
    # every block once, from the tier or (a miss) the origin; every miss a failed or
    # skipped request, and (twice in a row) few of them
    assert sb["shared_hits"] + misses == nblocks(files) and sb["shared_corrupt_blocks"] == 0
    assert sb["shared_bytes_read"] + sb["bytes_fetched"] == total, sb
    assert misses <= sb["shared_timeouts"] + sb["shared_errors"] + sb["shared_skipped"], sb
    assert misses <= nblocks(files) // 4, sb
    # (a missed block at most twice: a hedged fetch)
    assert wan < 0.02 * total + 2 * misses * BS, \
        f"origin carried {wan} bytes for a {total}-byte dataset ({misses} misses)"


def seed(s3, cs3, origin, bucket, prefix, files) -> dict[tuple[str, int], str]:
    """Write every block of ``files`` into the shared tier as a node would (the format
    of store/shared.py); (key, index) -> object name."""
    src = f"{origin.endpoint}|s3://{bucket}"
    names = {}
    for o in s3.list_objects_v2(Bucket=bucket)["Contents"]:
        key, etag, data = o["Key"], o["ETag"].strip('"'), files[o["Key"]]
        for i in range(0, len(data), BS):
            block = data[i:i + BS]
            header = {"src": src, "key": key, "ver": etag, "bs": BS, "i": i // BS,
                      "len": len(block), "xxh3": xxhash.xxh3_64_hexdigest(block)}
            name = f"{prefix}/" + sh.SharedTier.block_object(
                sh.block_name(src, key, etag, BS, i // BS))
            cs3.put_object(Bucket=SHARED, Key=name, Body=sh.pack(header, block))
            names[key, i // BS] = name
    return names


def test_corrupt_or_foreign_block_is_a_miss_and_is_overwritten(s3, cluster, origin, tmp_path):
    bucket, files = dataset(s3, 200, 3, 200_000)
    cs3 = cluster.client()
    names = seed(s3, cs3, origin, bucket, "t2", files)
    k0, k1 = sorted(files)[:2]
    o0, o1 = names[k0, 0], names[k1, 0]
    good0 = cs3.get_object(Bucket=SHARED, Key=o0)["Body"].read()
    # block 0 of k0: one data byte flipped; block 0 of k1: k0's (valid) block
    flipped = bytearray(good0)
    flipped[-1] ^= 0xFF
    cs3.put_object(Bucket=SHARED, Key=o0, Body=bytes(flipped))
    cs3.put_object(Bucket=SHARED, Key=o1, Body=good0)
    with node(origin, cluster, bucket, tmp_path, "b", "t2") as b:
        before = down_bytes(origin)
        read_all(b, files)
        sb = drained(b, 2)
        wan = down_bytes(origin) - before
    # A lookup past its deadline (a loaded machine's pause) is a miss too, by design:
    # of one of the two (not found corrupt then: a miss all the same) or of a good block,
    # fetched and written through again.
    failed = sb["shared_timeouts"] + sb["shared_errors"] + sb["shared_skipped"]
    misses = sb["shared_misses"]
    assert 2 - failed <= sb["shared_corrupt_blocks"] <= 2, sb
    assert 2 <= misses <= 2 + failed and sb["shared_hits"] == nblocks(files) - misses, sb
    assert 2 <= sb["shared_writes"] <= misses, sb
    # the missed blocks (each at most twice: a hedged fetch), nothing else
    assert 2 * BS <= wan < 2 * misses * BS, (wan, sb)
    for key, obj in ((k0, o0), (k1, o1)):
        header, data = sh.unpack(cs3.get_object(Bucket=SHARED, Key=obj)["Body"].read())
        assert header["key"] == key and bytes(data) == files[key][:BS]


def test_shared_tier_stalls_then_recovers_by_itself(s3, cluster, origin, tmp_path):
    """The tier stalls mid-run (its proxy replaced by one that holds every answer 30 s):
    reads go on from the origin, each slowed by at most the deadline until the breaker
    opens; once the tier answers again the node writes through again by itself."""
    bucket, files = dataset(s3, 300, 6, 150_000, dirs=("p1", "p2", "p3"))
    p1, p2, p3 = ({k: v for k, v in files.items() if k.startswith(d)} for d in ("p1", "p2", "p3"))
    upstream = f"127.0.0.1:{cluster.s3_port}"
    proxy = WanProxyProcess(upstream, rtt_ms=1).start()
    port = proxy.port
    try:
        # --prefetch off: the phases must not fetch each other's files ahead
        with node(origin, cluster, bucket, tmp_path, "s", "t3", "--prefetch", "off",
                  endpoint=proxy.endpoint) as m:
            read_all(m, p1)
            before = drained(m, nblocks(p1))
            proxy.stop()
            proxy = WanProxyProcess(upstream, rtt_ms=1, stall_rate=1.0, stall_s=30,
                                    listen_port=port).start()
            t0 = time.monotonic()
            read_all(m, p2)
            stalled = time.monotonic() - t0
            down = stats(m)
            proxy.stop()
            proxy = WanProxyProcess(upstream, rtt_ms=1, listen_port=port).start()
            deadline = time.monotonic() + 3 * sh.BREAKER_OPEN_S
            while not stats(m)["shared_available"]:       # the probe closes the breaker
                assert time.monotonic() < deadline, "the shared tier was not found again"
                time.sleep(0.2)
            read_all(m, p3)
            after = drained(m, before["shared_writes"] + nblocks(p3))
    finally:
        proxy.stop()
    assert down["read_errors"] == 0 and after["read_errors"] == 0
    assert down["shared_timeouts"] >= 1 and down["shared_available"] is False, down
    assert down["shared_skipped"] >= 1, down      # once open, the tier is not asked
    # at most a few deadlines more than the origin's ~0.1 s per block
    # (the deadline is at most the cold one here: few, fast answers so far)
    assert stalled < (nblocks(p2) * 0.1 + (sh.BREAKER_SILENCE + sh.BREAKER_FAILURES)
                      * sh.DEADLINE_COLD_S + 1.5), stalled
    assert after["shared_available"] is True


def test_shared_tier_unreachable_at_mount(s3, cluster, origin, tmp_path):
    bucket, files = dataset(s3, 350, 3, 150_000)
    dead = WanProxyProcess(f"127.0.0.1:{cluster.s3_port}", rtt_ms=1).start()
    dead.stop()                                       # nothing listens there now
    with node(origin, cluster, bucket, tmp_path, "dead", "t3", endpoint=dead.endpoint) as m:
        read_all(m, files)
        s = stats(m)
    assert s["read_errors"] == 0 and s["bytes_fetched"] == sum(map(len, files.values()))
    assert s["shared_hits"] == 0 and s["shared_available"] is False


def test_concurrent_cold_misses_fetch_each_block_about_once(s3, cluster, origin, tmp_path):
    def attempt(n: int):
        bucket, files = dataset(s3, 400 + n, 8, 400_000)
        total = sum(map(len, files.values()))
        with node(origin, cluster, bucket, tmp_path, f"n0-{n}", f"t4-{n}") as m0, \
                node(origin, cluster, bucket, tmp_path, f"n1-{n}", f"t4-{n}") as m1, \
                node(origin, cluster, bucket, tmp_path, f"n2-{n}", f"t4-{n}") as m2:
            before = down_bytes(origin)
            with cf.ThreadPoolExecutor(3) as pool:
                list(pool.map(lambda mp: read_all(mp, files), (m0, m1, m2)))
            wan = down_bytes(origin) - before
            return total, wan, [stats(m) for m in (m0, m1, m2)]

    # A breaker that opened means the tier stalled (the cluster shares 2 cores with
    # three nodes here: about one run in three): its nodes skipped the tier, so this
    # run cannot judge the leases.  Requests past their deadline are the same on a
    # smaller scale (each is a miss, by design, and its block comes from the origin:
    # CI on 8e1e97b, 1.36x the dataset with 3 and 6 timeouts on two nodes).  Measure
    # again on fresh nodes and a fresh prefix, up to three runs in all (CI on ef78753:
    # the first two both stalled, a breaker opened in the second), judging the first
    # run that did not stall, else the last.
    for n in range(3):
        total, wan, ss = attempt(n)
        if not any(s["shared_breaker_trips"] or s.get("shared_timeouts") for s in ss):
            break
    fetched = sum(s["bytes_fetched"] for s in ss)
    # without leases each node would fetch all of it: 3x
    assert fetched <= 1.3 * total, json.dumps([round(fetched / total, 2)] + [
        {k[7:]: v for k, v in x.items() if k.startswith("shared_") and v
         and not k.startswith("shared_bytes")} for x in ss])
    assert wan <= 1.3 * total, wan / total
    assert sum(s["shared_lease_waits"] for s in ss) > 0


def test_volume_server_killed_mid_read(s3, cluster, origin, tmp_path):
    bucket, files = dataset(s3, 500, 12, 200_000)
    seed(s3, cluster.client(), origin, bucket, "t5", files)
    order = sorted(files)
    try:
        with node(origin, cluster, bucket, tmp_path, "b", "t5", "--prefetch", "off") as b:
            read_all(b, files, order[:4])
            s0 = stats(b)
            cluster.kill_volume(0)
            read_all(b, files, order[4:])
            s = stats(b)
    finally:
        cluster.start_volume(0)
    assert s["read_errors"] == 0
    # replication: the blocks on the dead server are read from their other copy.  A
    # lookup past its deadline (a loaded machine) is a miss by design, fetched from the
    # origin: a few are excused; a failed one (no copy answered) or a skipped one is not.
    rest = nblocks({k: files[k] for k in order[4:]})
    hits, misses = (s[k] - s0[k] for k in ("shared_hits", "shared_misses"))
    assert hits + misses == rest and misses <= rest // 4, (s0, s)
    assert s["shared_misses"] <= s["shared_timeouts"], s
    assert s["bytes_fetched"] <= s["shared_misses"] * BS, s


def test_shared_cache_gc(cluster, monkeypatch):
    from neuralcache.admin import sharedgc

    for k, v in cluster.env().items():        # the in-process calls' credentials
        monkeypatch.setenv(k, v)

    s3 = cluster.client()
    keep = ["t6/other/x", "t6/nc1x", "t6/nc3/a"]             # not the tier's: untouched
    tier = ([f"t6/nc2/blocks/ab/{i}" for i in range(2)]
            + ["t6/nc1/blocks/ab/0", "t6/nc1/leases/ab"])  # an older release's layout
    for k in keep + tier:
        s3.put_object(Bucket=SHARED, Key=k, Body=b"x" * 10)
    url = f"s3://{SHARED}/t6"
    gc = lambda age, dry: sharedgc.gc(url, age, endpoint_url=cluster.endpoint,  # noqa: E731
                                      dry_run=dry)
    assert gc(3600, False) == (0, 0) and gc(0, True) == (4, 40)
    env = cli_env(cluster)
    args = ["shared-cache", "gc", url, "--endpoint-url", cluster.endpoint]
    r = run_cli(*args, "--older-than", "0s", env=env)
    assert r.returncode == 0 and "deleted 4 objects" in r.stdout, r.stderr
    left = {o["Key"] for o in s3.list_objects_v2(Bucket=SHARED, Prefix="t6/")["Contents"]}
    assert left == set(keep)
    r = run_cli(*args, "--older-than", "soon", env=env)
    assert r.returncode == 1 and r.stderr.count("\n") == 1 and "bad age" in r.stderr
    with pytest.raises(UserError, match="does not exist"):
        sharedgc.gc("s3://no-such-bucket-here", 86400, endpoint_url=cluster.endpoint)


def test_block_format_and_bad_input(monkeypatch):
    header = {"key": "a", "len": 3}
    h, data = sh.unpack(sh.pack(header, b"abc"))
    assert h == header and bytes(data) == b"abc"
    for bad in (b"", b"NCS1", b"XXXX\x02\x00\x00\x00{}", b"NCS1\xff\xff\x00\x00{}",
                b"NCS1\x02\x00\x00\x00[]"):
        with pytest.raises(ValueError):
            sh.unpack(bad)
    from neuralcache.admin.config import parse_o_options
    for url in ("http://b", "s3://", "s3:///p"):
        with pytest.raises(UserError, match="expected s3://BUCKET"):
            parse_o_options(f"shared_cache={url}")
    assert parse_o_options("shared_cache=s3://b/p,shared_cache_leases=off") == {
        "shared_cache": "s3://b/p", "shared_cache_leases": False}
    # the name covers source, key, version, block size and index
    names = {sh.block_name(*args) for args in (("s", "k", "v", 1, 0), ("s2", "k", "v", 1, 0),
                                               ("s", "k2", "v", 1, 0), ("s", "k", "v2", 1, 0),
                                               ("s", "k", "v", 2, 0), ("s", "k", "v", 1, 1))}
    assert len(names) == 6
    # the shared bucket makes whole-object GETs only: no obstore store behind it
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "k")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "s")
    sb = sh.SharedBucket("b", "p", endpoint_url="http://127.0.0.1:9", region="us-east-1")
    assert sb._native is None
    sb.close()


class Refusing:
    """A shared bucket whose every request is refused (breaker unit tests, no servers)."""
    bucket, prefix = "b", "p"

    def get(self, name):
        raise Unavailable("connection refused")

    def put(self, name, body, create_only=False):
        raise Unavailable("connection refused")


def test_breaker_counts_silence_from_the_first_unanswered_request():
    """Three refused lookups in a row open the breaker only once nothing has come back
    for BREAKER_SILENCE deadlines since the first of them -- also on a fresh node that
    never had an answer (silence once counted from the clock's origin there, so a new
    node's first three slow or failed lookups opened it at once).  No servers."""
    import trio

    async def main():
        t = sh.SharedTier(Refusing(), "src", "", 1 << 20)
        t0 = time.monotonic()
        for i in range(sh.BREAKER_FAILURES):
            await t.get(BlockKey(key="k", version="v1", index=i), 10)
        assert not t.down, "a fresh node's first failures opened the breaker at once"
        while not t.down and time.monotonic() - t0 < 10 * t.deadline():
            await t.get(BlockKey(key="k", version="v1", index=7), 10)
            await trio.sleep(0.02)
        assert t.down
        waited = time.monotonic() - t0
        assert max(sh.BREAKER_SILENCE * t.deadline(), sh.BREAKER_SILENCE_MIN_S) <= waited \
            < 4 * t.deadline(), waited

    trio.run(main)


def test_breaker_of_a_fast_tier_waits_for_half_a_second_of_silence():
    """A fast tier's deadline is DEADLINE_MIN_S, so BREAKER_SILENCE deadlines are 0.2 s:
    a sub-second hiccup opened the breaker (and sent reads to the WAN for
    BREAKER_OPEN_S).  The silence must also last BREAKER_SILENCE_MIN_S.  No servers."""
    import trio

    async def main():
        t = sh.SharedTier(Refusing(), "src", "", 1 << 20)
        t._lat.extend([0.005] * sh.LATENCY_MIN_SAMPLES)   # it answered fast so far
        assert t.deadline() == sh.DEADLINE_MIN_S
        assert sh.BREAKER_SILENCE * t.deadline() < sh.BREAKER_SILENCE_MIN_S
        t._answered = t0 = time.monotonic()
        while not t.down and time.monotonic() - t0 < 5:
            await t.get(BlockKey(key="k", version="v1", index=1), 10)
            await trio.sleep(0.02)
        waited = time.monotonic() - t0
        assert t.down
        assert sh.BREAKER_SILENCE_MIN_S <= waited < sh.BREAKER_SILENCE_MIN_S + 1.0, waited

    trio.run(main)

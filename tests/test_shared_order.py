"""The shared tier's read path against an in-memory bucket with a fixed latency (no
servers): what a lookup asks the tier, in which order, and how long a reader waits.
The bench behind it: ``python -m bench run --scenario multinode --quick`` (a cold
first epoch with the tier was 0.42-0.56x as fast as without it; docs/many-nodes.md)."""
from __future__ import annotations

import threading
import time

import trio

from neuralcache.store import shared as sh
from neuralcache.store.sharedobj import CLAIM_MAGIC
from neuralcache.store.tiers import BlockKey

LATENCY = 0.2          # per request: far above the test's own overheads


class SlowBucket:
    """An S3 bucket in memory: every request takes ``latency`` (block PUTs
    ``put_latency``), create-only PUTs honour If-None-Match, and each request is
    logged as (method, kind): kind "claim" for a PUT of a claim, else "block"."""
    bucket, prefix = "b", "p"

    def __init__(self, latency: float = LATENCY, put_latency: float | None = None):
        self.latency = latency
        self.put_latency = latency if put_latency is None else put_latency
        self.objects: dict[str, bytes] = {}
        self.log: list[tuple[str, str]] = []
        self._lock = threading.Lock()

    @staticmethod
    def _kind(body: bytes) -> str:
        return "claim" if body.startswith(CLAIM_MAGIC) else "block"

    def get(self, name):
        time.sleep(self.latency)
        with self._lock:
            self.log.append(("GET", "block"))
            return self.objects.get(name)

    def put(self, name, body, create_only=False):
        time.sleep(self.put_latency if self._kind(body) == "block" else self.latency)
        with self._lock:
            self.log.append(("PUT", self._kind(body)))
            if create_only and name in self.objects:
                return False
            self.objects[name] = bytes(body)
            return True

    def delete(self, name):
        time.sleep(self.latency)
        with self._lock:
            self.log.append(("DELETE", "block"))
            self.objects.pop(name, None)


def tier(bucket: SlowBucket) -> sh.SharedTier:
    return sh.SharedTier(bucket, "src", "", 1 << 20, origin_latency=lambda q: 0.05)


def store_block(t: sh.SharedTier, b: SlowBucket, bk: BlockKey, data: bytes) -> None:
    b.objects[t.block_object(t._hash(bk))] = sh.pack(t._header(bk, data), data)


def test_a_cold_miss_is_one_request_the_claim():
    """A cold tier (the first epoch: nearly every lookup misses): the claim at the
    block's name goes out alone, so a miss costs one request before the origin fetch
    (layout nc1 sent a GET and a lease PUT: two requests per miss; `python -m
    bench.micro shared-requests` has what each costs)."""
    b = SlowBucket()

    async def main():
        t = tier(b)
        assert t.cold()
        t0 = time.monotonic()
        assert await t.get(BlockKey("k", "v1", 0), 10) is None
        took = time.monotonic() - t0
        assert b.log == [("PUT", "claim")]
        assert BlockKey("k", "v1", 0) in t._held           # ours: fetch it
        # (not 1.6: a loaded machine's pause; a second round trip is >= 2 x LATENCY)
        assert took < 1.9 * LATENCY, f"a cold miss took {took:.2f} s: two round trips"

    trio.run(main)


def test_a_cold_lookup_finds_a_block_written_without_a_claim():
    """A block written by a node with leases off (no claim before it) is found on a
    cold tier: the claim is refused (the name is taken), and the GET answers."""
    b = SlowBucket(latency=0.01)

    async def main():
        t = tier(b)
        bk = BlockKey("k", "v1", 3)
        store_block(t, b, bk, b"x" * 10)
        assert t.cold()
        assert await t.get(bk, 10) == b"x" * 10
        assert t.c["shared_hits"] == 1 and bk not in t._held
        assert b.log == [("PUT", "claim"), ("GET", "block")]

    trio.run(main)


async def hit(t: sh.SharedTier, b: SlowBucket, bk: BlockKey) -> list:
    """``bk`` is in the tier and a lookup returns it; the requests that lookup sent."""
    data = bk.key.encode() * 10
    store_block(t, b, bk, data)
    b.log.clear()
    assert await t.get(bk, len(data)) == data
    return list(b.log)


def test_a_warm_tier_looks_up_first_and_takes_no_lease_on_a_hit():
    """Once most lookups hit, a hit is one GET (no claim before it)."""
    b = SlowBucket(latency=0.001)

    async def main():
        t = tier(b)
        for i in range(sh.COLD_WINDOW):
            await hit(t, b, BlockKey("k", "v1", i))
        assert not t.cold()
        assert await hit(t, b, BlockKey("k", "v1", 99)) == [("GET", "block")]

    trio.run(main)


def test_the_order_turns_after_a_short_run_of_hits_or_misses():
    """Epoch 2 on a tier epoch 1 filled: after COLD_RUN hits in a row a hit is one GET,
    not a refused claim and a GET (the window alone turned after half of it: a quick
    epoch's 16 blocks per node all paid two requests).  A new dataset on a warm tier:
    after COLD_RUN misses in a row a miss is one claim again."""
    b = SlowBucket(latency=0.001)

    async def main():
        t = tier(b)
        for i in range(sh.COLD_WINDOW):                       # epoch 1: all missed
            assert await t.get(BlockKey("k", "v1", i), 10) is None
        for i in range(sh.COLD_WINDOW, sh.COLD_WINDOW + sh.COLD_RUN):
            assert t.cold()
            assert await hit(t, b, BlockKey("k", "v1", i)) == [("PUT", "claim"),
                                                               ("GET", "block")]
        assert not t.cold()
        assert await hit(t, b, BlockKey("k", "v1", 500)) == [("GET", "block")]
        for i in range(sh.COLD_RUN):                          # a new dataset
            assert await t.get(BlockKey("new", "v1", i), 10) is None
        assert t.cold()
        b.log.clear()
        assert await t.get(BlockKey("new", "v1", 99), 10) is None
        assert b.log == [("PUT", "claim")]

    trio.run(main)


def test_a_block_waiting_for_its_write_through_is_served_from_the_queue():
    """A node fetched a block from the origin (under its lease) and queued its PUT; the
    block left its memory tier before a reader came (a read-ahead window above the
    memory tier).  The reader gets it from the write queue at once -- it used to look
    the block up, find its own lease and wait for its own write-through (seen in the
    bench: 0.4-0.9 s per block of the first epoch)."""
    b = SlowBucket(latency=0.05, put_latency=1.0)

    async def main():
        t = tier(b)
        bk = BlockKey("k", "v1", 5)
        async with trio.open_nursery() as n:
            await n.start(t.run)
            assert await t.get(bk, 10) is None and bk in t._held   # miss, lease ours
            t.fetched(bk, b"q" * 10)                               # the origin's bytes
            await trio.sleep(0.1)                                  # the PUT is under way
            asked = len(b.log)
            t0 = time.monotonic()
            assert await t.get(bk, 10) == b"q" * 10
            assert time.monotonic() - t0 < 0.05
            assert len(b.log) == asked, "it asked the tier for a block it is writing"
            assert t.c["shared_queue_hits"] == 1
            n.cancel_scope.cancel()

    trio.run(main)


def test_a_reader_waits_on_another_nodes_prefetch_about_one_origin_fetch():
    """Node B's prefetch (reading ahead, into the next epoch's share) claimed a block
    node A's reader needs now; B's PUT is slow (it queues behind B's own blocks).  A
    reads the claim, sees a prefetch took it, and waits about one origin fetch
    (PREFETCH_WAIT_FACTOR x its origin p90), not lease_wait().  A claim a reader's
    load took is waited out as before."""
    b = SlowBucket(latency=0.01)

    async def main():
        owner, reader = tier(b), tier(b)
        reader.origin_latency = lambda q: 0.1
        first, second = BlockKey("k", "v1", 1), BlockKey("k", "v1", 2)
        assert await owner.get(first, 10, prefetch=True, urgent=lambda: False) is None
        assert await owner.get(second, 10) is None          # a reader's load
        assert first in owner._held and second in owner._held
        assert reader.lease_wait() > 0.5
        t0 = time.monotonic()
        assert await reader.get(first, 10) is None          # fetch it ourselves
        took = time.monotonic() - t0
        assert 0.1 <= took < 0.35, took
        assert reader.c["shared_lease_prefetch_owner"] == 1
        t0 = time.monotonic()
        assert await reader.get(second, 10) is None
        assert time.monotonic() - t0 >= reader.lease_wait() - 0.25
        assert reader.c["shared_lease_prefetch_owner"] == 1

    trio.run(main)


def test_the_lease_wait_covers_the_write_through_queue():
    """An owner's block appears in the tier after its fetch *and* its write-through,
    queue included (0.5-1 s when a first epoch's blocks are all written at once), not
    after one PUT's round trip: lease_wait() follows this node's own write-throughs,
    measured from queueing to done, once it has LATENCY_MIN_SAMPLES of them."""
    t = tier(SlowBucket())
    t._lat.extend([0.01] * sh.LATENCY_MIN_SAMPLES)          # fast requests
    short = t.lease_wait()
    assert short < 0.5
    t._written.extend([0.9] * sh.LATENCY_MIN_SAMPLES)       # slow write-throughs
    assert t.lease_wait() >= min(sh.LEASE_WAIT_MAX_S,
                                 sh.LEASE_WAIT_FACTOR * (0.05 + 0.9)), t.lease_wait()


def test_a_claim_given_up_or_stale_is_not_waited_out():
    """The owner's fetch failed: it deletes its claim and a waiting node fetches the
    block itself at its next poll.  A claim older than CLAIM_STALE_S (its owner died
    before its block replaced it) is not waited for at all, and the block written by
    the node that fetched it then replaces the claim."""
    b = SlowBucket(latency=0.01)

    async def main():
        owner, reader = tier(b), tier(b)
        bk, old = BlockKey("k", "v1", 7), BlockKey("k", "v1", 8)
        async with trio.open_nursery() as n:
            await n.start(owner.run)
            await n.start(reader.run)
            assert await owner.get(bk, 10) is None and bk in owner._held

            async def give_up():
                await trio.sleep(0.1)
                owner.fetched(bk, None)            # the origin fetch failed
            n.start_soon(give_up)
            t0 = time.monotonic()
            assert await reader.get(bk, 10) is None
            assert time.monotonic() - t0 < 0.5 < reader.lease_wait()
            assert reader.c["shared_lease_dropped"] == 1

            name = reader.block_object(reader._hash(old))
            b.objects[name] = sh.claim("dead-node", time.time() - sh.CLAIM_STALE_S - 1, False)
            b.log.clear()
            t0 = time.monotonic()
            assert await reader.get(old, 10) is None
            # the claim and the look that found it stale, no poll, no wait (any lease
            # wait is >= LEASE_WAIT_MIN_S; 0.1 s was a loaded machine's pause away)
            assert b.log == [("PUT", "claim"), ("GET", "block")], b.log
            assert time.monotonic() - t0 < sh.LEASE_WAIT_MIN_S
            assert reader.c["shared_lease_stale"] == 1
            assert reader.c["shared_lease_waits"] == 1      # (the first claim's only)
            reader.fetched(old, b"s" * 10)          # its origin fetch: written through
            with trio.fail_after(2):
                while b.objects[name].startswith(CLAIM_MAGIC):
                    await trio.sleep(0.01)
            assert await owner.get(old, 10) == b"s" * 10
            n.cancel_scope.cancel()

    trio.run(main)

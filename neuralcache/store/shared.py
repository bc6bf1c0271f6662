"""The shared tier: an in-region S3 bucket that every node of a cluster reads before the
origin and writes what it fetched from the origin into, so each block crosses the WAN
about once per cluster (issue 13).  Lookup order: memory -> disk -> shared -> origin.

Objects (under ``--shared-cache s3://BUCKET[/PREFIX]``)::

    PREFIX/nc1/blocks/XY/<h>   one block: header + data (format below)
    PREFIX/nc1/leases/<h>      "I am fetching block h from the origin" (JSON, tiny)

``h`` = xxh3_128 of (source identity, full object key, version/ETag, block size, block
index): a changed origin object has a new ETag, so it can never be served an old block.
The block object is ``b"NCS1" | u32 header length | header JSON | data`` (names, format
and the bucket client: store/sharedobj.py); the header
names the source, key, version, block size, index, length and xxh3_64 of the data, and
every read checks all of them.  A mismatch (torn write, a bug, a hostile or confused
writer, an xxh3_128 collision) is a miss and a log line, and the block is overwritten
by the write-through that follows the origin fetch.  A node trusts the header and the
checksum, never the writer -- but only the cluster may write the bucket (see
docs/many-nodes.md: a writer can always poison a block it can write consistently).

Failure is a miss, never a failed read, and slowness costs a bounded wait: every
request runs in a worker thread under a deadline (``deadline()``: DEADLINE_FACTOR x the
p90 of the last LATENCY_WINDOW answers, late ones included, within [DEADLINE_MIN_S,
DEADLINE_MAX_S]; DEADLINE_COLD_S until LATENCY_MIN_SAMPLES answers).  A timeout or error
of a request a reader waits on (a block lookup, a lease create, a lease check; not a
write-through PUT, a lease delete or the probe) is a miss and counts toward a breaker:
after BREAKER_FAILURES such failures in a row (an answered one resets the count), when
nothing has come back from the tier for BREAKER_SILENCE x the current deadline (at
least BREAKER_SILENCE_MIN_S) -- silence counted from the first request sent after the
last answer -- the tier is
skipped (lookups are misses at once, no new block is queued for write-through; PUTs
already queued still run) while a background probe asks it every BREAKER_OPEN_S,
closing the breaker by itself when it answers.  So a tier that stalls costs the reads
of about BREAKER_SILENCE deadlines one deadline each, then nothing; one that refuses
connections costs them nothing but the origin fetch they make anyway.  A tier that
answers, but slowly, raises its own deadline (late answers count in the p90) up to
DEADLINE_MAX_S and stays in use: it still saves WAN bytes.

Concurrent misses (several nodes want the same block at once: the same epoch start, one
checkpoint loaded by every node): a lease.  On a miss the node creates the
lease object with a conditional put (``If-None-Match: *``: exactly one creator wins,
the rest get 412; checked here on SeaweedFS 4.48 with 8 racing creators, documented by
AWS S3 since Aug 2024; docs/many-nodes.md has a probe for other stores).  The winner
fetches from the origin and writes the block through; the lease stays (a node that
missed just before that write finds it, waits, and reads the block on its first poll;
gc and lifecycle rules remove leases with the blocks), and is deleted only when the
fetch fails or the write is skipped, so that nobody waits for it.  The others poll the
block object for up to ``lease_wait()`` (about two origin fetches and write-throughs)
and read it from the shared tier, or fetch from the origin themselves when it does not
come or a poll finds the lease gone -- or, for a reader, after about one origin fetch
when the lease says another node's prefetch took it (PREFETCH_WAIT_FACTOR).  The lease is taken before the origin request queues, never while
holding a backend slot, so nodes waiting on each other cannot deadlock.

The order of a lookup follows the tier's recent hit rate (``cold()``, COLD_*): warm,
the block is asked for first and the lease only on a miss (a hit is one request); cold
(fewer than half of the last lookups hit: a new dataset's first epoch), the block and
the lease are asked for at once, so that a miss costs one round trip before the origin
fetch instead of two in a row.  Both are asked for: a block whose lease is gone is
found all the same.

Write-through is in the background: a bounded queue (WRITE_QUEUE_MAX bytes) and
WRITERS tasks; when full, the block is not written (counted), a reader never waits.  A
block in that queue (or being PUT) is served from it to this node's own readers
(``shared_queue_hits``): it was fetched here, under this node's lease, and a lookup
would find that lease and wait for this node's own PUT.

Threads: requests are blocking (S3Backend, urllib3) and run in trio worker threads:
``SHARED_THREADS`` at most for lookups, leases and polls, WRITERS more for the
write-through (it never holds a thread a reader waits for); bookkeeping runs on the
trio thread, like BlockStore.
"""
from __future__ import annotations

import collections
import json
import logging
import os
import socket
import threading
import time
import uuid

import trio
import xxhash

from ..errors import BackendError, NotFound, PermissionDenied, UserError
from ..stats import percentile
from .sharedobj import (LAYOUT, MAGIC, MAX_HEADER, SharedBucket,  # noqa: F401 (re-exported)
                        block_name, pack, parse_shared_url, prefetch_lease,
                        source_identity, unpack, verified)
from .tiers import BlockKey

log = logging.getLogger(__name__)

# Deadline of one shared-tier request: DEADLINE_FACTOR x the p90 of the last
# LATENCY_WINDOW answered requests (lookups, misses and leases alike), within
# [DEADLINE_MIN_S, DEADLINE_MAX_S]; DEADLINE_COLD_S until LATENCY_MIN_SAMPLES.  A healthy
# in-region store answers an 8 MiB GET in ~10-50 ms of first byte plus ~40-80 ms of
# transfer (S3 Standard at ~100-200 MB/s per connection; S3 Express and a LAN MinIO
# faster), so 4 x p90 tells a stalled request from a slow one, and a sudden stall of a
# healthy tier costs a reader ~0.1-0.4 s before its read goes to the origin.  A tier
# that is slow because it is loaded (seen here: 0.1-1 s per request with four nodes and
# the cluster on two shared cores) raises its own deadline, up to DEADLINE_MAX_S: past
# that, waiting costs more than the WAN fetch it saves.
DEADLINE_FACTOR = 4.0
DEADLINE_MIN_S = 0.1
DEADLINE_MAX_S = 2.0
DEADLINE_COLD_S = 1.0
LATENCY_WINDOW = 256
LATENCY_MIN_SAMPLES = 20
# The mount-time check of the shared bucket (list + region): a tier that does not
# answer within this is left off (the breaker) rather than holding the mount up.
MOUNT_CHECK_S = 3.0
# A write-through PUT, in the background: the read deadline's cap, at least; its
# timeouts are write errors, not breaker failures (no reader waits on them).
PUT_DEADLINE_S = DEADLINE_MAX_S
# Breaker: after BREAKER_FAILURES failed or timed-out requests in a row that a reader
# waits on (lookups, lease creates and checks), when nothing at all has come back from
# the tier for BREAKER_SILENCE deadlines since the first request after the last answer
# (the first request ever, on a fresh node; late answers count: a
# tier in a load spike is slow, not dead, and its requests time out together), the
# tier is skipped (lookups are misses, nothing is written) and a background probe (one
# small GET) asks it every BREAKER_OPEN_S until it answers -- recovery by itself, no
# reader pays for the probe.  3 keeps one slow request from switching the tier off; 2
# deadlines of silence is 8 x the p90 of the tier's answers; 5 s is a few training
# steps.
BREAKER_FAILURES = 3
BREAKER_SILENCE = 2.0
# ... and never for less than this: a fast tier's deadline is DEADLINE_MIN_S (p90 of a
# few ms), so 2 deadlines are 0.2 s, and a sub-second hiccup of an in-region store (or
# of the 6-process test cluster on 2 cores: tests/test_shared.py's concurrent-misses
# test saw it one run in three) opened the breaker and sent every read to the WAN for
# BREAKER_OPEN_S.  Half a second of silence costs the reads in it one deadline each.
BREAKER_SILENCE_MIN_S = 0.5
BREAKER_OPEN_S = 5.0
# Worker threads for the requests a reader may wait on (lookups, leases, polls); the
# writers have WRITERS of their own.  Abandoned (timed-out) requests keep their thread
# until urllib3's own 5 s timeout, so this also bounds what a stalled tier ties up.  A
# cold lookup is two requests at once: 64 serve the ~20 loads per node a first epoch
# starts at once (was 32, shared with the writers).
SHARED_THREADS = 64
# Background write-through: bytes queued (like BlockStore's disk queue: enough for one
# read-ahead window of 8 x 8 MiB blocks) and concurrent PUTs (4 x ~100 MB/s in-region
# is above what one node fetches from the WAN).  A leased block (other nodes are
# waiting for it) may use up to twice the bytes before it is dropped.
WRITE_QUEUE_MAX = 64 << 20
WRITE_QUEUE_ENTRIES = 1024
WRITERS = 4
# Leases.  A waiter first polls the block after half the node's own origin p50 (the
# owner needs about one origin fetch), then every x1.5 longer, from LEASE_POLL_MIN_S to
# LEASE_POLL_MAX_S (a few in-region round trips), for at most lease_wait():
# LEASE_WAIT_FACTOR x (the node's origin p90 + the p90 of its own write-throughs from
# queueing to done, or the tier's p90 before LATENCY_MIN_SAMPLES of them: the owner's
# fetch, queue and PUT -- the queue was 0.5-1 s when an epoch's blocks were all
# written at once) + LEASE_WAIT_PAD_S, within [LEASE_WAIT_MIN_S, LEASE_WAIT_MAX_S].  Past it, or as
# soon as a poll finds the lease gone (the owner gave up), the waiter fetches from the
# origin itself: a duplicate fetch, never a wrong or failed read.  A dead owner's lease (crash) thus
# costs each concurrent waiter one lease_wait(), once: the block is written by them.
LEASE_POLL_MIN_S = 0.01
LEASE_POLL_MAX_S = 0.2
LEASE_WAIT_FACTOR = 2.0
LEASE_WAIT_PAD_S = 0.2
LEASE_WAIT_MIN_S = 0.3
LEASE_WAIT_MAX_S = 3.0
# A reader waiting on a lease a *prefetch* of another node took (the lease says so)
# waits at most PREFETCH_WAIT_FACTOR x its own origin p90 from when it reads that --
# about its own fetch -- then fetches the block itself (a second WAN fetch).  Such an
# owner reads ahead (the next epoch's share) and its PUT queues behind the blocks of
# its own readers: 0.5-0.8 s in the bench's first epoch, which ended with those few
# blocks.  Leases of demand reads and read-ahead (a checkpoint) are waited out.
PREFETCH_WAIT_FACTOR = 1.0
# The order of a lookup.  Warm tier: GET the block, the lease only on a miss (a hit is
# one request, a miss two in a row before the origin fetch: 0.08-0.4 s per block in
# the bench's first epoch).  Cold tier: the GET and the lease at once (a miss is one
# round trip, a hit one request more).  Cold: fewer than COLD_HIT_RATE of the last
# COLD_WINDOW lookups hit (half: there the two orders cost the same; 32 lookups are a
# few read-ahead windows, so the order follows an epoch boundary within a second), or
# fewer than COLD_MIN_LOOKUPS lookups so far.
COLD_HIT_RATE = 0.5
COLD_WINDOW = 32
COLD_MIN_LOOKUPS = 8


class _Failed(Exception):
    """A shared-tier request failed or timed out (already counted and logged)."""


class SharedTier:
    """Trio-side shared tier for one mount.  ``get`` before the origin, ``fetched``
    after it; ``run`` holds the write-through tasks and the breaker's probe."""

    def __init__(self, bucket: SharedBucket, source_id: str, key_prefix: str,
                 block_size: int, *, leases: bool = True, origin_latency=None,
                 node_id: str | None = None):
        self.bucket = bucket
        self.url = f"s3://{bucket.bucket}/{bucket.prefix}"
        self.source_id = source_id
        self.key_prefix = key_prefix
        self.block_size = block_size
        self.leases = leases
        # q -> the q-quantile of this node's recent origin fetch latencies (seconds)
        self.origin_latency = origin_latency or (lambda q: 0.1)
        self.node_id = node_id or f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:6]}"
        self._threads = trio.CapacityLimiter(SHARED_THREADS)
        self._write_threads = trio.CapacityLimiter(WRITERS)   # PUTs, lease deletes
        self._lat: collections.deque = collections.deque(maxlen=LATENCY_WINDOW)
        self._written: collections.deque = collections.deque(maxlen=LATENCY_WINDOW)
        self._lat_lock = threading.Lock()
        self._failures = 0
        self._answered = 0.0                     # the last answer, late ones included
        self._asked = 0.0                        # the first request after that answer
        self.down = False                        # breaker open: the tier is skipped
        self._held: set[BlockKey] = set()       # leases we created, block not yet written
        # hit (True) or miss of the last COLD_WINDOW lookups: cold() picks their order
        self._outcomes: collections.deque = collections.deque(maxlen=COLD_WINDOW)
        # fetched here, write-through queued or running: reads are served from here
        self._pending: dict[BlockKey, bytes] = {}
        self._send, self._recv = trio.open_memory_channel(WRITE_QUEUE_ENTRIES)
        self._nursery: trio.Nursery | None = None
        self.c = collections.Counter()           # the stats counters (snapshot())
        self.queue_bytes = 0

    # -- naming ----------------------------------------------------------------------
    def _hash(self, bk: BlockKey) -> str:
        return block_name(self.source_id, self.key_prefix + bk.key, bk.version,
                          self.block_size, bk.index)

    def _header(self, bk: BlockKey, data: bytes) -> dict:
        return {"src": self.source_id, "key": self.key_prefix + bk.key, "ver": bk.version,
                "bs": self.block_size, "i": bk.index, "len": len(data),
                "xxh3": xxhash.xxh3_64_hexdigest(data)}

    @staticmethod
    def block_object(h: str) -> str:
        return f"{LAYOUT}/blocks/{h[:2]}/{h}"

    @staticmethod
    def lease_object(h: str) -> str:
        return f"{LAYOUT}/leases/{h}"

    # -- lifecycle -------------------------------------------------------------------
    async def check(self) -> None:
        """At mount: a bucket that does not exist or refuses us is a one-line error; one
        that does not answer leaves the tier off until it does (the breaker)."""
        exc: BaseException | str = f"no answer within {MOUNT_CHECK_S:.0f} s"
        with trio.move_on_after(MOUNT_CHECK_S):
            try:
                await trio.to_thread.run_sync(self.bucket.check, abandon_on_cancel=True)
                return
            except (NotFound, PermissionDenied) as e:
                raise UserError(f"shared cache {self.url}: {e}; check --shared-cache, "
                                "--shared-cache-endpoint and the credentials") from None
            except BackendError as e:
                exc = e
        log.warning("shared cache %s does not answer (%s); reading from the origin until "
                    "it does", self.url, exc)
        self.down = True

    async def run(self, task_status=trio.TASK_STATUS_IGNORED) -> None:
        async with trio.open_nursery() as n:
            self._nursery = n
            for _ in range(WRITERS):
                n.start_soon(self._writer)
            n.start_soon(self._probe)
            task_status.started()
            await trio.sleep_forever()

    async def _probe(self) -> None:
        """While the breaker is open, ask the tier every BREAKER_OPEN_S (one GET of an
        object that need not exist) and close the breaker when it answers."""
        while True:
            await trio.sleep(BREAKER_OPEN_S)
            if not self.down:
                continue
            try:
                await self._call(self.bucket.get, f"{LAYOUT}/probe", breaker=False)
            except _Failed:
                continue
            self.down = False
            self._failures = 0
            log.warning("shared cache %s answers again", self.url)

    # -- requests --------------------------------------------------------------------
    def available(self) -> bool:
        return not self.down

    def deadline(self) -> float:
        with self._lat_lock:      # worker threads append; the metrics thread reads too
            lat = sorted(self._lat)
        if len(lat) < LATENCY_MIN_SAMPLES:
            return DEADLINE_COLD_S
        p90 = percentile(lat, 0.9)
        return min(DEADLINE_MAX_S, max(DEADLINE_MIN_S, DEADLINE_FACTOR * p90))

    def lease_wait(self) -> float:
        with self._lat_lock:
            put = sorted(self._written)
        put = (percentile(put, 0.9) if len(put) >= LATENCY_MIN_SAMPLES
               else self.deadline() / DEADLINE_FACTOR)
        own = self.origin_latency(0.9) + put
        return min(LEASE_WAIT_MAX_S, max(LEASE_WAIT_MIN_S,
                                         LEASE_WAIT_FACTOR * own + LEASE_WAIT_PAD_S))

    async def _call(self, fn, *args, deadline: float | None = None, breaker: bool = True,
                    limiter: trio.CapacityLimiter | None = None):
        """``fn(*args)`` in a worker thread within the deadline; _Failed on error or
        timeout (counted; with ``breaker``, a step toward opening it)."""
        t0 = time.monotonic()
        if self._asked <= self._answered:    # the first request since the last answer (or ever)
            self._asked = t0

        def timed():
            out = fn(*args)
            # also when the caller gave up (abandoned): the tier is slow, not dead
            with self._lat_lock:
                self._answered = now = time.monotonic()
                self._lat.append(now - t0)
            return out

        with trio.move_on_after(deadline or self.deadline()):
            try:
                out = await trio.to_thread.run_sync(timed, limiter=limiter or self._threads,
                                                    abandon_on_cancel=True)
            except BackendError as exc:
                self._failed("error", exc, breaker)
                raise _Failed() from None
            if breaker:
                self._failures = 0
            return out
        self._failed("timeout", None, breaker)
        raise _Failed()

    def _failed(self, kind: str, exc: BaseException | None, breaker: bool) -> None:
        self.c["shared_errors" if kind == "error" else "shared_timeouts"] += 1
        why = exc or f"no answer within {self.deadline() * 1000:.0f} ms"
        if not breaker:
            log.debug("shared cache %s: %s", self.url, why)
            return
        self._failures += 1
        # how long we have been asking without hearing anything back
        silent = (time.monotonic() - max(self._answered, self._asked)
                  > max(BREAKER_SILENCE * self.deadline(), BREAKER_SILENCE_MIN_S))
        if self._failures >= BREAKER_FAILURES and silent and not self.down:
            self.down = True
            self.c["shared_breaker_trips"] += 1
            log.warning("shared cache %s: %d requests in a row failed (last: %s); reading "
                        "from the origin until it answers again", self.url, self._failures,
                        why)
        else:
            log.debug("shared cache %s: %s", self.url, why)

    def _get_verified(self, bk: BlockKey, h: str, length: int) -> bytes | str | None:
        """(worker thread) The block's data if present and valid, None if absent, or
        what is wrong with it (a str)."""
        body = self.bucket.get(self.block_object(h))
        if body is None:
            return None
        return verified(body, self._header(bk, b""), length)

    async def _lookup(self, bk: BlockKey, h: str, length: int,
                      again: bool = False) -> bytes | None:
        """The block from the shared tier if there and valid, else None; _Failed.
        ``again``: a repeated look (a bad block was reported by the first)."""
        got = await self._call(self._get_verified, bk, h, length)
        if isinstance(got, str):
            if not again:
                self.c["shared_corrupt_blocks"] += 1
                log.warning("shared cache: block %s of %s@%s #%d failed verification "
                            "(%s): a miss; it will be overwritten", h, bk.key, bk.version,
                            bk.index, got)
            return None
        return got

    # -- the read side ---------------------------------------------------------------
    def cold(self) -> bool:
        """Whether the tier has been missing mostly: fewer than COLD_HIT_RATE of the last
        COLD_WINDOW lookups found their block (a fresh node counts as cold)."""
        n = len(self._outcomes)
        return n < COLD_MIN_LOOKUPS or sum(self._outcomes) < COLD_HIT_RATE * n

    async def get(self, bk: BlockKey, length: int, *, prefetch: bool = False,
                  urgent=lambda: True) -> bytes | None:
        """The block from the shared tier, or None: go to the origin (then call
        ``fetched``).  Never raises a domain error, never takes longer than the
        deadline per request (plus lease_wait() when another node is fetching it).
        ``prefetch``: a cross-file prefetch loads it; ``urgent()``: a reader waits on
        this load now (both for the lease: PREFETCH_WAIT_FACTOR)."""
        ask = (bk, prefetch, urgent)
        data = self._pending.get(bk)
        if data is not None:
            # we fetched it ourselves and its PUT has not finished: evicted here before
            # it was read (a read-ahead window above the memory tier).  Looking it up
            # would find our own lease and wait for our own write-through.
            self.c["shared_queue_hits"] += 1
            return data
        if self.down:
            self.c["shared_skipped"] += 1
            return None
        h = self._hash(bk)
        try:
            if self.leases and self.cold():
                data = await self._lease_and_lookup(ask, h, length)
            else:
                data = await self._lookup(bk, h, length)
                if data is None and self.leases:
                    data = await self._lease_or_wait(ask, h, length)
            self._outcomes.append(data is not None)
        except _Failed:
            data = None
        except Exception:  # a bug here must cost a miss, not the read
            log.exception("shared cache lookup of %s #%d failed", bk.key, bk.index)
            data = None
        if data is None:
            self.c["shared_misses"] += 1
            return None
        self.c["shared_hits"] += 1
        self.c["shared_bytes_read"] += len(data)
        return data

    async def _take_lease(self, ask, h: str) -> bool:
        """Create the lease on ``bk`` (True: ours, fetch it) or find it taken; _Failed."""
        bk, prefetch, urgent = ask
        lease = json.dumps({"node": self.node_id, "t": time.time(),
                            "prefetch": bool(prefetch and not urgent())}).encode()
        if await self._call(self.bucket.put, self.lease_object(h), lease, True):
            self._held.add(bk)
            self.c["shared_leases"] += 1
            return True
        return False

    async def _lease_and_lookup(self, ask, h: str, length: int) -> bytes | None:
        """A cold tier's order: the lease and the block at once, so that a miss costs
        one round trip before the origin fetch, not a GET that misses and then the
        lease.  The GET is not skipped: blocks written without a lease (a node with
        leases off, a lease expired or collected before its block) are found too."""
        self.c["shared_cold_lookups"] += 1
        got: dict = {}

        async def one(name, fn, *args):
            try:
                got[name] = await fn(*args)
            except _Failed:
                got[name] = _Failed

        async with trio.open_nursery() as n:
            n.start_soon(one, "data", self._lookup, ask[0], h, length)
            n.start_soon(one, "lease", self._take_lease, ask, h)
        data, lease = got["data"], got["lease"]
        if data is not _Failed and data is not None:
            self._held.discard(ask[0])           # ours, if we took it: it stays, as after a write
            return data
        if lease is True or lease is _Failed:
            return None                      # fetch it (under our lease, if we hold it)
        if data is _Failed:
            raise _Failed()
        return await self._wait(ask, h, length)   # another node is fetching it

    async def _lease_or_wait(self, ask, h: str, length: int) -> bytes | None:
        if await self._take_lease(ask, h):
            return None
        return await self._wait(ask, h, length)

    async def _wait(self, ask, h: str, length: int) -> bytes | None:
        """Another node holds the lease on ``bk``: poll for its block (None: give up).
        Once a reader waits on this load, the lease is read once: one a prefetch took
        is waited for PREFETCH_WAIT_FACTOR x the origin p90 at most."""
        bk, _, urgent = ask
        self.c["shared_lease_waits"] += 1
        t0 = time.monotonic()
        deadline = t0 + self.lease_wait()
        owner_checked = False
        poll = max(LEASE_POLL_MIN_S, 0.5 * self.origin_latency(0.5))
        n = 0
        try:
            while time.monotonic() + poll < deadline and not self.down:
                await trio.sleep(poll)
                poll = min(LEASE_POLL_MAX_S, poll * 1.5)
                n += 1
                try:
                    data = await self._lookup(bk, h, length, again=True)
                    if data is None and (n % 3 == 0 or not owner_checked and urgent()):
                        lease = await self._call(self.bucket.get, self.lease_object(h))
                        if lease is None:
                            self.c["shared_lease_dropped"] += 1
                            return None       # the owner gave up: fetch it ourselves
                        if not owner_checked and urgent():
                            owner_checked = True
                            if prefetch_lease(lease):
                                deadline = min(deadline, time.monotonic()
                                               + PREFETCH_WAIT_FACTOR
                                               * self.origin_latency(0.9))
                                self.c["shared_lease_prefetch_owner"] += 1
                except _Failed:
                    continue                  # one slow poll: keep waiting
                if data is not None:
                    self.c["shared_lease_wait_hits"] += 1
                    return data
            self.c["shared_lease_timeouts"] += 1
            return None
        finally:
            self.c["shared_lease_wait_s"] += time.monotonic() - t0

    # -- the write side --------------------------------------------------------------
    def fetched(self, bk: BlockKey, data: bytes | None) -> None:
        """After the origin fetch for a block ``get`` missed: write it through (in the
        background) or, when the fetch failed or the write is skipped, drop our lease
        so that waiting nodes need not wait it out."""
        leased = bk in self._held
        if data is None or self._nursery is None:
            self._release(bk)
            return
        limit = WRITE_QUEUE_MAX * (2 if leased else 1)
        if self.down or self.queue_bytes + len(data) > limit:
            self.c["shared_writes_skipped"] += 1
            self._release(bk)
            return
        try:
            self._send.send_nowait((bk, data, time.monotonic()))
        except trio.WouldBlock:
            self.c["shared_writes_skipped"] += 1
            self._release(bk)
            return
        self.queue_bytes += len(data)
        self._pending[bk] = data

    def _release(self, bk: BlockKey) -> None:
        """Delete our lease on ``bk`` (in the background), if we hold one."""
        if bk in self._held:
            self._held.discard(bk)
            if self._nursery is not None:
                self._nursery.start_soon(self._delete_lease, bk)

    async def _delete_lease(self, bk: BlockKey) -> None:
        try:
            await self._call(self.bucket.delete, self.lease_object(self._hash(bk)),
                             breaker=False, limiter=self._write_threads)
        except _Failed:
            pass     # waiters give up after lease_wait() anyway

    async def _writer(self) -> None:
        async for bk, data, queued in self._recv:
            ok = False
            try:
                body = await trio.to_thread.run_sync(
                    lambda: pack(self._header(bk, data), data), limiter=self._write_threads)
                await self._call(self.bucket.put, self.block_object(self._hash(bk)), body,
                                 deadline=max(PUT_DEADLINE_S, self.deadline()),
                                 breaker=False, limiter=self._write_threads)
                self.c["shared_writes"] += 1
                self.c["shared_bytes_written"] += len(data)
                self._written.append(time.monotonic() - queued)
                ok = True
            except _Failed:
                self.c["shared_write_errors"] += 1
            except Exception:  # a cache failure is never a reader's failure
                log.exception("shared cache write failed")
                self.c["shared_write_errors"] += 1
            finally:
                self.queue_bytes -= len(data)
                if self._pending.get(bk) is data:
                    del self._pending[bk]
            if ok:
                # the lease stays: a node that missed just before this write finds it,
                # waits, and reads the block on its first poll (deleting it would let
                # that node take a new lease and fetch the block again)
                self._held.discard(bk)
            else:
                self._release(bk)

    # -- stats -----------------------------------------------------------------------
    KEYS = ("shared_hits", "shared_misses", "shared_bytes_read", "shared_bytes_written",
            "shared_writes", "shared_write_errors", "shared_writes_skipped",
            "shared_corrupt_blocks", "shared_errors", "shared_timeouts", "shared_skipped",
            "shared_breaker_trips", "shared_leases", "shared_lease_waits",
            "shared_lease_wait_hits", "shared_lease_timeouts", "shared_lease_dropped",
            "shared_cold_lookups", "shared_queue_hits", "shared_lease_prefetch_owner")

    def snapshot(self) -> dict:
        out = {k: self.c[k] for k in self.KEYS}
        out.update(shared_cache=self.url, shared_available=not self.down,
                   shared_lease_wait_s=round(self.c["shared_lease_wait_s"], 3),
                   shared_write_queue_bytes=self.queue_bytes,
                   shared_deadline_ms=round(self.deadline() * 1000, 1))
        return out


def open_shared(cfg, backend, origin_latency) -> SharedTier:
    """The shared tier a MountConfig asks for (``cfg.shared_cache`` is set)."""
    bucket, prefix = parse_shared_url(cfg.shared_cache)
    sb = SharedBucket(bucket, prefix, endpoint_url=cfg.shared_cache_endpoint,
                      region=cfg.shared_cache_region, concurrency=SHARED_THREADS + WRITERS,
                      profile=cfg.shared_cache_profile)
    source_id, key_prefix = source_identity(backend, cfg.endpoint_url, cfg.source)
    return SharedTier(sb, source_id, key_prefix, cfg.block_size,
                      leases=cfg.shared_cache_leases, origin_latency=origin_latency)

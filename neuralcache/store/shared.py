"""The shared tier: an in-region S3 bucket that every node of a cluster reads before the
origin and writes what it fetched from the origin into, so each block crosses the WAN
about once per cluster (issue 13).  Lookup order: memory -> disk -> shared -> origin.

Objects (under ``--shared-cache s3://BUCKET[/PREFIX]``)::

    PREFIX/nc2/blocks/XY/<h>   one block: header + data (format below), or, while a node
                               fetches it from the origin, that node's claim (tiny)

The block object is ``b"NCS1" | u32 header length | header JSON | data``, a claim
``b"NCC1" | JSON`` (names, formats and the bucket client: store/sharedobj.py); the header
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
of a request a reader waits on (a block lookup, a claim, a poll; not a write-through
PUT, a claim's delete or the probe) is a miss and counts toward a breaker:
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
checkpoint loaded by every node): a claim.  On a miss the node puts a claim at the
block's name with a conditional put (``If-None-Match: *``: exactly one creator wins,
the rest get 412; checked here on SeaweedFS 4.48 with 8 racing creators, documented by
AWS S3 since Aug 2024; docs/many-nodes.md has a probe for other stores).  The winner
fetches from the origin and its write-through replaces the claim with the block; it
deletes the claim only when the fetch fails or the write is skipped, so that nobody
waits for it.  A loser reads the name: the block (a hit), or the claim, and then polls
the name for up to ``lease_wait()`` (about two origin fetches and write-throughs) and
reads the block from the shared tier -- or fetches from the origin itself when it does
not come, when a poll finds the name empty (the owner gave up), when the claim is
older than CLAIM_STALE_S (the owner died), or, for a reader, after about one origin
fetch when the claim says another node's prefetch took it (PREFETCH_WAIT_FACTOR).  The
claim is taken before the origin request queues, never while holding a backend slot,
so nodes waiting on each other cannot deadlock.  (Layout nc1 kept these "leases" as
objects of their own beside the blocks: a cold miss cost a GET and a lease PUT, and
every lease stayed in the bucket.  The counters and options keep the word lease.)

The order of a lookup follows the tier's recent hit rate (``cold()``, COLD_*): warm,
the block's name is read first and claimed only on a miss (a hit is one request);
cold (fewer than half of the last lookups hit: a new dataset's first epoch), it is
claimed first, so that a miss costs one request before the origin fetch (a hit two:
the claim's 412, then the GET).  A block written without a claim (a node with
``--shared-cache-leases off``) is found either way: the claim is refused.

Write-through is in the background: a bounded queue (WRITE_QUEUE_MAX bytes) and
WRITERS tasks; when full, the block is not written (counted), a reader never waits.  A
block in that queue (or being PUT) is served from it to this node's own readers
(``shared_queue_hits``): it was fetched here, under this node's claim, and a lookup
would find this node's claim and wait for this node's own PUT.

Threads: requests are blocking (S3Backend, urllib3) and run in trio worker threads:
``SHARED_THREADS`` at most for lookups, claims and polls, WRITERS more for the
write-through (it never holds a thread a reader waits for); bookkeeping runs on the
trio thread, like BlockStore.
"""
from __future__ import annotations

import collections
import itertools
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
                        block_name, claim, pack, parse_claim, parse_shared_url,
                        source_identity, unpack, verified)
from .tiers import BlockKey

log = logging.getLogger(__name__)

# Deadline of one shared-tier request: DEADLINE_FACTOR x the p90 of the last
# LATENCY_WINDOW answered requests (lookups, misses and claims alike), within
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
# waits on (lookups, claims, polls), when nothing at all has come back from
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
# Worker threads for the requests a reader may wait on (lookups, claims, polls); the
# writers have WRITERS of their own.  Abandoned (timed-out) requests keep their thread
# until urllib3's own 5 s timeout, so this also bounds what a stalled tier ties up.  A
# cold lookup is two requests at once: 64 serve the ~20 loads per node a first epoch
# starts at once (was 32, shared with the writers).
SHARED_THREADS = 64
# Background write-through: bytes queued (like BlockStore's disk queue: enough for one
# read-ahead window of 8 x 8 MiB blocks) and concurrent PUTs (4 x ~100 MB/s in-region
# is above what one node fetches from the WAN).  A claimed block (other nodes are
# waiting for it) may use up to twice the bytes before it is dropped.
WRITE_QUEUE_MAX = 64 << 20
WRITE_QUEUE_ENTRIES = 1024
WRITERS = 4
# Claims ("leases").  A waiter first polls the block's name after half the node's own origin p50 (the
# owner needs about one origin fetch), then every x1.5 longer, from LEASE_POLL_MIN_S to
# LEASE_POLL_MAX_S (a few in-region round trips), for at most lease_wait():
# LEASE_WAIT_FACTOR x (the node's origin p90 + the p90 of its own write-throughs from
# queueing to done, or the tier's p90 before LATENCY_MIN_SAMPLES of them: the owner's
# fetch, queue and PUT -- the queue was 0.5-1 s when an epoch's blocks were all
# written at once) + LEASE_WAIT_PAD_S, within [LEASE_WAIT_MIN_S, LEASE_WAIT_MAX_S].  Past it, or as
# soon as a poll finds the claim gone (the owner gave up), the waiter fetches from the
# origin itself: a duplicate fetch, never a wrong or failed read.  A dead owner's claim
# (crash) thus costs each concurrent waiter one lease_wait(), once: their write-through
# replaces it (and after CLAIM_STALE_S nobody waits for it).
LEASE_POLL_MIN_S = 0.01
LEASE_POLL_MAX_S = 0.2
LEASE_WAIT_FACTOR = 2.0
LEASE_WAIT_PAD_S = 0.2
LEASE_WAIT_MIN_S = 0.3
LEASE_WAIT_MAX_S = 3.0
# A reader waiting on a claim a *prefetch* of another node took (the claim says so)
# waits at most PREFETCH_WAIT_FACTOR x its own origin p90 from when it reads that --
# about its own fetch -- then fetches the block itself (a second WAN fetch).  Such an
# owner reads ahead (the next epoch's share) and its PUT queues behind the blocks of
# its own readers: 0.5-0.8 s in the bench's first epoch, which ended with those few
# blocks.  Claims of demand reads and read-ahead (a checkpoint) are waited out.
PREFETCH_WAIT_FACTOR = 1.0
# A claim older than this (by the wall clock of the node that reads it) is not waited
# for: its owner died or lost the tier before its block replaced it.  A block's fetch
# and write-through take at most a few LEASE_WAIT_MAX_S; a minute also covers clocks
# that NTP keeps within seconds.  The block written by the node that fetches it then
# replaces the claim.
CLAIM_STALE_S = 60.0
# The order of a lookup.  Warm tier: GET the block's name, the claim only on a miss (a
# hit is one request, a miss two in a row before the origin fetch: 0.08-0.4 s per block
# in the bench's first epoch).  Cold tier: the claim first (a miss is one request, a hit
# two: the claim's 412, then the GET; layout nc1 sent a GET and a lease PUT at once,
# two requests per miss -- `python -m bench.micro shared-requests`: a GET that misses
# costs the client ~0.5 ms of CPU and a SeaweedFS ~0.6 ms, a claim ~0.6 and ~2 ms).
# Cold: fewer than COLD_HIT_RATE of the last
# COLD_WINDOW lookups hit (half: there the two orders cost the same; 32 lookups are a
# few read-ahead windows, so the order follows an epoch boundary within a second), or
# fewer than COLD_MIN_LOOKUPS lookups so far -- unless the last COLD_RUN lookups all hit
# (warm) or all missed (cold): the epoch turned.  (The window alone took half an epoch
# of 64 blocks per node to turn, each hit two requests; the bench's quick epoch, 16.)
COLD_HIT_RATE = 0.5
COLD_WINDOW = 32
COLD_MIN_LOOKUPS = 8
COLD_RUN = 4


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
        self._write_threads = trio.CapacityLimiter(WRITERS)   # PUTs, claim deletes
        self._lat: collections.deque = collections.deque(maxlen=LATENCY_WINDOW)
        self._written: collections.deque = collections.deque(maxlen=LATENCY_WINDOW)
        self._lat_lock = threading.Lock()
        self._failures = 0
        self._answered = 0.0                     # the last answer, late ones included
        self._asked = 0.0                        # the first request after that answer
        self.down = False                        # breaker open: the tier is skipped
        self._held: set[BlockKey] = set()       # our claims, block not yet written
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

    def _get_verified(self, bk: BlockKey, h: str, length: int):
        """(worker thread) What the block's name holds: its data (bytes) if valid, None
        if absent, a claim's fields (a dict) while another node fetches it, or what is
        wrong with it (a str)."""
        body = self.bucket.get(self.block_object(h))
        if body is None:
            return None
        info = parse_claim(body)
        if info is not None:
            return info
        return verified(body, self._header(bk, b""), length)

    async def _lookup(self, bk: BlockKey, h: str, length: int, again: bool = False):
        """The block's data if the tier holds it and it is valid, a claim's fields (a
        dict) if a node is fetching it, else None; _Failed.  ``again``: a repeated look
        (a bad block was reported by the first)."""
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
        COLD_WINDOW lookups found their block (a fresh node counts as cold), or the
        last COLD_RUN all missed; not if the last COLD_RUN all hit."""
        run = set(itertools.islice(reversed(self._outcomes), COLD_RUN))
        if len(self._outcomes) >= COLD_RUN and len(run) == 1:
            return not run.pop()
        n = len(self._outcomes)
        return n < COLD_MIN_LOOKUPS or sum(self._outcomes) < COLD_HIT_RATE * n

    async def get(self, bk: BlockKey, length: int, *, prefetch: bool = False,
                  urgent=lambda: True) -> bytes | None:
        """The block from the shared tier, or None: go to the origin (then call
        ``fetched``).  Never raises a domain error, never takes longer than the
        deadline per request (plus lease_wait() when another node is fetching it).
        ``prefetch``: a cross-file prefetch loads it; ``urgent()``: a reader waits on
        this load now (both for the claim: PREFETCH_WAIT_FACTOR)."""
        ask = (bk, prefetch, urgent)
        data = self._pending.get(bk)
        if data is not None:
            # we fetched it ourselves and its PUT has not finished: evicted here before
            # it was read (a read-ahead window above the memory tier).  Looking it up
            # would find our own claim and wait for our own write-through.
            self.c["shared_queue_hits"] += 1
            return data
        if self.down:
            self.c["shared_skipped"] += 1
            return None
        h = self._hash(bk)
        try:
            if self.leases and self.cold():
                self.c["shared_cold_lookups"] += 1
                data = await self._claim_or_look(ask, h, length)
            else:
                data = await self._lookup(bk, h, length)
                if isinstance(data, dict):
                    data = await self._wait(ask, h, length, data) if self.leases else None
                elif data is None and self.leases:
                    data = await self._claim_or_look(ask, h, length)
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

    async def _claim_or_look(self, ask, h: str, length: int) -> bytes | None:
        """Claim the block (a create-only PUT of a claim at its name): ours -> None, fetch
        it.  Taken -> the name holds the block (a hit) or another node's claim (wait for
        it); a claim gone since (its owner gave up) or a bad block -> None: fetch it
        (unclaimed; the write-through replaces whatever is there).  _Failed.

        A cold tier (most lookups miss: a first epoch) starts here, so that a miss is
        one request before the origin fetch; a block already there costs one more."""
        bk, prefetch, urgent = ask
        body = claim(self.node_id, time.time(), bool(prefetch and not urgent()))
        if await self._call(self.bucket.put, self.block_object(h), body, True):
            self._held.add(bk)
            self.c["shared_leases"] += 1
            return None
        got = await self._lookup(bk, h, length)
        if isinstance(got, dict):
            return await self._wait(ask, h, length, got)
        return got

    async def _wait(self, ask, h: str, length: int, owner: dict) -> bytes | None:
        """Another node's claim is at the block's name (``owner``: its fields): poll the
        name until the block replaces it (None: give up and fetch it ourselves).  Each
        poll reads the claim too: gone (the owner gave up) ends the wait at once; one
        older than CLAIM_STALE_S (its owner died) is not waited for; one a prefetch took
        is waited for PREFETCH_WAIT_FACTOR x the origin p90 at most, once a reader waits
        on this load."""
        bk, _, urgent = ask
        if time.time() - owner["t"] > CLAIM_STALE_S:
            self.c["shared_lease_stale"] += 1
            return None
        self.c["shared_lease_waits"] += 1
        t0 = time.monotonic()
        deadline = t0 + self.lease_wait()
        owner_checked = False
        poll = max(LEASE_POLL_MIN_S, 0.5 * self.origin_latency(0.5))
        try:
            while True:
                if not owner_checked and urgent():
                    owner_checked = True
                    if owner["prefetch"]:
                        deadline = min(deadline, time.monotonic() + PREFETCH_WAIT_FACTOR
                                       * self.origin_latency(0.9))
                        self.c["shared_lease_prefetch_owner"] += 1
                left = deadline - time.monotonic()
                if left <= 0 or self.down:
                    break
                await trio.sleep(min(poll, left))      # the last look is at the deadline
                poll = min(LEASE_POLL_MAX_S, poll * 1.5)
                try:
                    got = await self._lookup(bk, h, length, again=True)
                except _Failed:
                    continue                  # one slow poll: keep waiting
                if isinstance(got, dict):
                    owner = got               # still claimed (perhaps by another node)
                elif got is None:
                    self.c["shared_lease_dropped"] += 1
                    return None               # the owner gave up: fetch it ourselves
                else:
                    self.c["shared_lease_wait_hits"] += 1
                    return got
            self.c["shared_lease_timeouts"] += 1
            return None
        finally:
            self.c["shared_lease_wait_s"] += time.monotonic() - t0

    # -- the write side --------------------------------------------------------------
    def fetched(self, bk: BlockKey, data: bytes | None) -> None:
        """After the origin fetch for a block ``get`` missed: write it through (in the
        background) or, when the fetch failed or the write is skipped, drop our claim
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
        """Delete our claim on ``bk`` (in the background), if we hold one, so that the
        nodes waiting on it fetch the block themselves at once."""
        if bk in self._held:
            self._held.discard(bk)
            if self._nursery is not None:
                self._nursery.start_soon(self._delete_claim, bk)

    async def _delete_claim(self, bk: BlockKey) -> None:
        try:
            await self._call(self.bucket.delete, self.block_object(self._hash(bk)),
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
                self._held.discard(bk)      # the block replaced our claim
            else:
                self._release(bk)

    # -- stats -----------------------------------------------------------------------
    KEYS = ("shared_hits", "shared_misses", "shared_bytes_read", "shared_bytes_written",
            "shared_writes", "shared_write_errors", "shared_writes_skipped",
            "shared_corrupt_blocks", "shared_errors", "shared_timeouts", "shared_skipped",
            "shared_breaker_trips", "shared_leases", "shared_lease_waits",
            "shared_lease_wait_hits", "shared_lease_timeouts", "shared_lease_dropped",
            "shared_cold_lookups", "shared_queue_hits", "shared_lease_prefetch_owner",
            "shared_lease_stale")

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

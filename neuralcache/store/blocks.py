"""BlockStore: where a read gets its blocks.  Memory tier, then disk tier, then one
single-flight fetch from the backend; fetched blocks are written to the disk tier in
the background (small speculative ones fetched in a thread by that thread), several
per thread job (batches.py).  The only path from the read side to the backend.

Concurrency invariants (see DEVELOPING.md):
* every call here runs on the trio loop; blocking work (backend, disk) runs in worker
  threads with their own limiters;
* at most one load per block is in flight (``_flights``); later callers wait on it;
* backend requests go through one PriorityLimiter: demand first, and ``reserved`` slots
  that speculative work may not take;
* speculative (read-ahead / prefetch) loads never raise to anyone but a demand reader
  that joined them, and that reader gets the same domain error it would have got.
"""
from __future__ import annotations

import logging
import math
import threading
import time

import trio

from .. import cpuacct
from . import batches, hedge
from . import limiter as lim
from . import writeback
from .pinned import Pinned
from .speculative import STAGE_FRACTION, Ledger
from .tiers import BlockKey, DiskTier, MemoryTier
from ..errors import BackendError, Unavailable, first_error
from ..stats import Stats

log = logging.getLogger(__name__)

# Ranged GET size.  AWS's guidance for S3 throughput is 8-16 MB per ranged GET; 8 MiB
# keeps time-to-first-byte of a cold block low (8 MiB at 200 MB/s is 40 ms, less than
# the 60 ms round trip it rides on).
DEFAULT_BLOCK_SIZE = 8 << 20
# Backend requests in flight.  Little's law: requests in flight = request rate x
# latency.  Large objects: 300 MB/s x 60 ms = 18 MB, 3 blocks of 8 MiB.  Small files
# are the hard case: 100 KB samples at 1,000 files/s x ~65 ms per GET = 65 in flight
# -- but 64 held the cold `samples` epoch at ~500 files/s: ~125 ms per GET through
# the busy 60 ms link (Little's law).  128: `python -m bench run --scenario
# samples,train-files` in alternating pairs, cold samples 482 / 469 / 481 / 484 / 506 ->
# 576 / 555 / 606 / 584 / 561 files/s, train-files epoch 1 with hints 591 / 580 -> 682 /
# 672 samples/s (bench/RESULTS.md).  The bytes in flight are bounded separately
# (MAX_INFLIGHT_BYTES), so large blocks do not get twice the memory.
DEFAULT_CONCURRENCY = 128
# Bytes of backend requests in flight, at most (a request starts anyway when nothing
# else is in flight): what 64 requests of the default 8 MiB block could hold, the
# bound before DEFAULT_CONCURRENCY went to 128.  MAX_INFLIGHT_BYTES // 8 of it is kept
# for demand reads, like DEFAULT_RESERVED_FOR_DEMAND's slots (8 blocks of 8 MiB).
MAX_INFLIGHT_BYTES = 512 << 20
# Slots only demand reads may use, so that speculative work never blocks a reader
# (8 = one per DataLoader worker of a typical job).
DEFAULT_RESERVED_FOR_DEMAND = 8
# A demand read gives up (EIO) after this long; the backend retries inside it (5
# attempts, each bounded by the S3 read timeout of 5 s, plus ~3 s of backoff).
DEMAND_DEADLINE_S = 30.0
# Pending background disk writes, in bytes: a quarter of the memory tier (the queue
# holds blocks beyond the memory bound), at least 8 blocks (one multi-block read plus
# read-ahead), at most 64 MiB.  Past it a fetched block is served and its write skipped
# (the disk is slower than the link); it is queued late when its reader leaves it, when
# memory evicts it or at unmount, if there is room then, else fetched again later,
# never at a reader's cost.  Measured: an entry-bounded queue of 64 blocks held ~100 MB
# beyond a 16 MiB memory tier under 16 random readers.
DISK_WRITE_QUEUE_MAX = 64 << 20
DISK_WRITE_QUEUE_MIN_BLOCKS = 8
DISK_WRITE_QUEUE_ENTRIES = 1024
# Disk-tier worker threads (reads and writes).
DISK_THREADS = 8
# Of them, jobs reading the small blocks loaded ahead (batches.Combined): two, as for
# the writers, so that a prefetch plan's reads go together (no other count measured).
DISK_READ_JOBS = 2
# Threads for hedged GETs (store/hedge.py), at most: two per demand reader a job
# typically has (DEFAULT_RESERVED_FOR_DEMAND).  Past it a hedge waits for one.
HEDGE_THREADS = 2 * DEFAULT_RESERVED_FOR_DEMAND
# A speculative load of a block up to this size fetched in a worker thread is written
# to the disk tier in that thread (one hand-off per cold small file, not two: ~65 us of
# CPU each); one fetched on the trio thread goes to the writers, which write in batches
# (batches.py), or, staged, in a job of its own.  1 MiB: its write (~0.1-0.5 ms) is
# small beside the GET.  At most DISK_THREADS such writes at once; past it, the writers.
INLINE_DISK_WRITE_MAX = 1 << 20
# How long a staged load's thread waits for one of those write slots (the disk sets
# staging's pace) before it gives up: a disk that takes longer than this per write is
# stalled, and the waiting threads hold backend slots that read-ahead needs.  A load
# that gives up is handled like one whose write failed (``_load_inner``).  Not
# measured: two orders of magnitude above a block write's time here (ms).
STAGE_SLOT_WAIT_S = 2.0


class _Flight:
    __slots__ = ("done", "data", "error", "ticket", "kind", "remote", "joined", "stored",
                 "unjoined", "stage", "running")

    def __init__(self, kind: int, stage: bool = False):
        self.done = trio.Event()
        self.data: bytes | None = None
        self.error: BaseException | None = None
        self.ticket: lim.Ticket | None = None
        self.kind = kind
        self.remote = False   # True once the data came from the backend
        self.joined = kind == lim.DEMAND   # a demand reader waits for this load
        self.stored = False   # True once the fetching thread wrote it to the disk tier
        self.unjoined = 0     # its bytes in Ledger.unjoined (no reader yet)
        self.stage = stage    # bound for the disk tier, not memory (no reader yet)
        self.running: hedge.Running | None = None   # its GET, started with no reader


class BlockStore:
    def __init__(self, backend, mem: MemoryTier, disk: DiskTier | None, stats: Stats, *,
                 block_size: int = DEFAULT_BLOCK_SIZE,
                 concurrency: int = DEFAULT_CONCURRENCY,
                 reserved: int = DEFAULT_RESERVED_FOR_DEMAND,
                 hedge_max_s: float = hedge.HEDGE_MAX_S):
        self.backend, self.mem, self.disk, self.stats = backend, mem, disk, stats
        self._read_async = getattr(backend, "read_async", None)   # (s3.py has it)
        self.block_size = block_size
        self.hedge_max_s = hedge_max_s
        self.limiter = lim.PriorityLimiter(concurrency, min(reserved, concurrency - 1),
                                           byte_cap=MAX_INFLIGHT_BYTES,
                                           reserved_bytes=MAX_INFLIGHT_BYTES // 8)
        self._backend_threads = trio.CapacityLimiter(concurrency)
        self._store_threads = trio.CapacityLimiter(concurrency)   # (see _fetch)
        self._disk_threads = trio.CapacityLimiter(DISK_THREADS)
        self._hedge_threads = trio.CapacityLimiter(HEDGE_THREADS)
        self._inline_writes = threading.Semaphore(DISK_THREADS)   # see INLINE_DISK_WRITE_MAX
        self._disk_reads = batches.Combined(lambda bk: self.disk.get(bk), DISK_READ_JOBS,
                                            self._disk_threads)
        self._flights: dict[BlockKey, _Flight] = {}
        self.spec = Ledger(stats, disk.taken if disk is not None else None)   # unread
        # unread speculative bytes the disk tier may hold (STAGE_FRACTION)
        self.stage_limit = int(disk.limit * STAGE_FRACTION) if disk is not None else 0
        self._send, self._recv = trio.open_memory_channel(DISK_WRITE_QUEUE_ENTRIES)
        self.write_queue_limit = max(DISK_WRITE_QUEUE_MIN_BLOCKS * block_size,
                                     min(DISK_WRITE_QUEUE_MAX, mem.limit // 4))
        self.write_queue_bytes = 0
        self._queued: dict[BlockKey, object] = {}   # the disk write queue's blocks
        self._let_go: set[BlockKey] = set()     # ... of those, dropped by ``consumed``
        self._cut_off: list = []    # (key, bytes) a writer took and the unmount stopped
        self.written_back = [0, 0]  # blocks and bytes write_back wrote so far
        self._nursery: trio.Nursery | None = None
        self.shared = None     # a store.shared.SharedTier between disk and origin, if set
        mem.evicting = self._evicting

    # -- lifecycle -------------------------------------------------------------------
    async def run(self, task_status=trio.TASK_STATUS_IGNORED) -> None:
        """Background work (disk writes, speculative loads); runs until cancelled."""
        async with trio.open_nursery() as n:
            self._nursery = n
            for _ in range(2):
                n.start_soon(self._disk_writer)
            task_status.started()
            await trio.sleep_forever()

    async def _disk_writer(self) -> None:
        async for item in self._recv:
            batch = [item]
            try:
                await batches.gather(self._recv, batch)   # and what else comes soon
                stored = [False] * len(batch)
                await trio.to_thread.run_sync(
                    batches.put_all, self.disk, batch,
                    [self.spec.waiting(bk) for bk, _ in batch], stored,
                    limiter=self._disk_threads)
            except trio.Cancelled:     # the unmount, before the writes began
                self._cut_off.extend(batch)             # (write_back writes them)
                raise
            finally:
                for bk, data in batch:
                    self.write_queue_bytes -= len(data)
                    self._queued.pop(bk, None)
            for (bk, data), ok in zip(batch, stored):
                if bk in self._let_go:  # ``consumed`` let it go counting on this write:
                    self._let_go.discard(bk)   # failed, memory keeps it (not one the LRU
                    if not ok and not self.disk.settled(bk) and self.mem.get(bk) is None:
                        self.mem.put(bk, data)        # evicted: as without a disk)

    async def write_back(self, budget_s: float) -> tuple[int, int, bool]:
        """After the unmount, ``run`` cancelled: write to the disk tier the blocks only
        memory or the write queue holds (their write was skipped with the queue full,
        failed, or had not run yet), most recently used first, so that the next mount
        of this cache finds them (store/writeback.py: the budget, an outage).  (Blocks
        written, bytes written, whether nothing is left unwritten.)"""
        todo: dict[BlockKey, object] = dict(self._cut_off)
        self._cut_off.clear()
        while True:                          # what the cancelled writers left queued
            try:
                bk, data = self._recv.receive_nowait()
            except (trio.WouldBlock, trio.EndOfChannel, trio.ClosedResourceError):
                break
            self.write_queue_bytes -= len(data)
            todo[bk] = data
        self._queued.clear()
        self._let_go.clear()
        if self.disk is None:                # memory was the only tier, by design
            return 0, 0, True
        for bk, data in self.mem.items():
            if bk not in todo and not self.disk.settled(bk):
                todo[bk] = data
        return await writeback.write_blocks(self.disk, list(todo.items()), budget_s,
                                            self._disk_threads, self.written_back)

    # -- geometry --------------------------------------------------------------------
    def nblocks(self, obj: Pinned) -> int:
        return max(1, math.ceil(obj.size / self.block_size)) if obj.size else 0

    def block_range(self, obj: Pinned, index: int) -> tuple[int, int]:
        off = index * self.block_size
        return off, max(0, min(self.block_size, obj.size - off))

    def _in_memory(self, bk: BlockKey) -> bool:
        return self.mem.get(bk) is not None or bk in self._flights

    def in_memory(self, obj: Pinned, index: int) -> bool:
        """In the memory tier or on its way there (the disk tier not counted)."""
        return self._in_memory(BlockKey(obj.key, obj.version, index))

    def cached(self, obj: Pinned, index: int) -> bool:
        """In memory, on its way there, or in the disk tier (or its write queue)."""
        bk = BlockKey(obj.key, obj.version, index)
        return self._in_memory(bk) or (self.disk is not None and self._for_disk(bk))

    def resident(self, obj: Pinned) -> bytes | None:
        """The whole of a one-block object when the memory tier holds it (fs/push.py
        pushes it into the kernel page cache at open; ``served`` then counts it); None
        otherwise.  Never waits, never fetches."""
        if not 0 < obj.size <= self.block_size:
            return None
        data = self.mem.get(BlockKey(obj.key, obj.version, 0))
        return data if data is not None and len(data) == obj.size else None

    async def load_whole(self, obj: Pinned) -> bytes | None:
        """The whole of a one-block object for a push at open, loaded like a demand
        read of it (joining a load in flight, from the disk tier or the remote; a
        domain error if it cannot be); None if it is larger, or shorter than listed
        (the READ then sees what the remote has)."""
        if not 0 < obj.size <= self.block_size:
            return None
        data, hit = await self.get(obj, 0)
        if len(data) != obj.size:
            return None
        if hit:
            self.stats.demand_hit_bytes += len(data)
        return data

    def served(self, obj: Pinned, n: int) -> None:
        """A resident object went to the kernel: the demand hit of the read it replaces."""
        st = self.stats
        st.mem_hits += 1
        st.demand_hit_blocks += 1
        st.demand_hit_bytes += n
        self.spec.read(BlockKey(obj.key, obj.version, 0), n)

    # -- reads ---------------------------------------------------------------------
    async def read(self, obj: Pinned, off: int, size: int) -> bytes | memoryview:
        """Bytes [off, off+size) of ``obj`` (short at end of object): demand read.

        Within one block the answer is a memoryview of the cached block, not a copy
        (pyfuse3 replies from any buffer; a 1 MiB slice copy per FUSE read was half of
        the trio thread's CPU on warm reads)."""
        end = min(obj.size, off + size)
        if off >= end:
            return b""
        first, last = off // self.block_size, (end - 1) // self.block_size
        base = first * self.block_size
        if first == last:
            data, hit = await self.get(obj, first)
            out = data if (off == base and end - base == len(data)) \
                else memoryview(data)[off - base:end - base]
        else:
            parts: list[bytes] = [b""] * (last - first + 1)
            hits = [False] * (last - first + 1)

            async def one(i: int) -> None:
                parts[i - first], hits[i - first] = await self.get(obj, i)

            try:
                async with trio.open_nursery() as n:
                    for i in range(first, last + 1):
                        n.start_soon(one, i)
            except BaseExceptionGroup as group:   # a block's error as itself, as the
                raise first_error(group) from None  # one-block read raises it
            hit = all(hits)
            last_base = last * self.block_size
            parts[0] = memoryview(parts[0])[off - base:]
            parts[-1] = memoryview(parts[-1])[:end - last_base]
            out = b"".join(parts)                  # one copy across the blocks
        if hit:
            self.stats.demand_hit_bytes += len(out)
        return out

    async def get(self, obj: Pinned, index: int) -> tuple[bytes, bool]:
        """One block for a demand reader and whether it was served without waiting on
        the remote; raises a domain error on failure."""
        bk = BlockKey(obj.key, obj.version, index)
        st = self.stats
        data = self.mem.get(bk)
        if data is not None:
            st.mem_hits += 1
            st.demand_hit_blocks += 1
            self.spec.read(bk, len(data))
            return data, True
        st.mem_misses += 1
        flight = self._flights.get(bk)
        if flight is not None:
            st.singleflight_joins += 1
            self.spec.joined(flight.unjoined)
            flight.unjoined = 0
            flight.joined = True
            if flight.ticket is not None:
                self.limiter.raise_priority(flight.ticket, lim.DEMAND)
        else:
            flight = self._start(bk, obj, lim.DEMAND)
        with trio.move_on_after(DEMAND_DEADLINE_S) as scope:
            if flight.running is not None:      # a GET read-ahead started: hedged
                off, length = self.block_range(obj, index)
                await flight.running.join(
                    flight.done, lambda: self._remote_read(obj, off, length),
                    hedge.delay(st, self.hedge_max_s), self._nursery, st,
                    f"{obj.key} @{off}", self._hedge_threads)
            else:
                await flight.done.wait()
        if scope.cancelled_caught:
            raise Unavailable(f"{obj.key}: no answer from the remote within "
                              f"{DEMAND_DEADLINE_S:.0f} s")
        if flight.error is not None:
            raise flight.error
        assert flight.data is not None
        self.spec.read(bk, len(flight.data))
        return flight.data, not flight.remote

    def consumed(self, obj: Pinned, index: int) -> None:
        """A sequential reader left this block behind (ahead/readahead.py ``behind``):
        the page cache holds its bytes and the disk tier has them, will or declined, so
        the memory tier lets it go now instead of at LRU time, and its buffer goes back
        to the recycler (buffers.Recycler): a cold 1 GiB read keeps its read-ahead in
        memory, not the whole GiB.  Without a disk tier memory is the only copy.  A
        block in memory only (its write skipped, the queue full: the disk was behind;
        or failed) is queued now if ``_queue_late`` may, else stays.  A block let go
        while its write is queued is remembered (``_let_go``, bounded by the queue) so
        that ``_disk_writer`` puts it back if that write fails."""
        bk = BlockKey(obj.key, obj.version, index)
        if self.disk is None:
            return
        if bk not in self._queued:
            if self.disk.settled(bk):
                self.mem.drop(bk)
                return
            # (the checks leave the LRU order alone; a disk outage: it stays)
            if bk not in self.mem or not self._queue_late(bk, lambda: self.mem.get(bk)):
                return
        if bk in self.mem:
            self._let_go.add(bk)
            self.mem.drop(bk)

    def _queue_late(self, bk: BlockKey, data) -> bool:
        """Queue a block only memory holds for the disk if it may go now: the disk
        takes writes and the queue keeps room for a whole block after it (``data()``
        is asked only then); counted in disk_writes_late.  True if queued."""
        if not self.disk.writable or \
                self.write_queue_bytes + self.block_size > self.write_queue_limit:
            return False
        if not self._queue_write(bk, data()):
            return False
        self.stats.disk_writes_late += 1
        return True

    def _evicting(self, bk: BlockKey, data) -> None:
        """The memory tier's bound evicts ``bk``.  If memory held its only copy (see
        ``consumed``), this is its last chance to reach the disk tier before a read
        fetches it again: ``_queue_late``, as there; a failed write of it does not
        bring it back (the bound).  Unread, it moves from memory's prefetch budget to
        the disk's (counted on, a small tier's budget filled with blocks it no longer
        held and prefetch stopped), and a read of it there counts as that load used."""
        self.spec.evicted(bk, lambda: self.disk is not None and (
            self._for_disk(bk) or self._queue_late(bk, lambda: data)))

    def _for_disk(self, bk: BlockKey) -> bool:
        """The disk tier holds ``bk`` or declined it (``settled``), or its write is queued."""
        return bk in self._queued or self.disk.settled(bk)

    def speculative_unread_bytes(self) -> int:
        """Speculative bytes bound for memory that no reader has read or is waiting
        for: loaded, or in flight (memory's prefetch budget)."""
        return self.spec.unread + self.spec.unjoined

    def stage_room(self) -> int:
        """Bytes staged loads may still bring (``prefetch(stage=True)``): the disk's
        prefetch budget (``stage_limit``) less the speculative bytes unread in the disk
        tier or on their way there, at most its free space less a block (the reads' own
        writes): staging never evicts (that may be read this epoch too); 0 when the
        disk tier takes no writes."""
        if self.disk is None or not self.disk.writable:
            return 0
        free = self.disk.limit - self.disk.used - self.spec.staging - self.block_size
        return max(0, min(free, self.spec.stage_room(
            self.stage_limit, self._for_disk)))

    def prefetch(self, obj: Pinned, index: int, kind: int = lim.READAHEAD,
                 stage: bool = False) -> bool:
        """Start loading a block speculatively unless present; True if started.
        ``stage``: for the disk tier (memory's prefetch budget is full; ``stage_room``),
        written there by its load (else by the writers; their queue full, dropped), not
        kept in memory unless a reader joins the load."""
        if self._nursery is None or index < 0 or index >= self.nblocks(obj):
            return False
        bk = BlockKey(obj.key, obj.version, index)
        if self._in_memory(bk):
            return False
        self._start(bk, obj, kind, stage and self.disk is not None)
        return True

    # -- loading ---------------------------------------------------------------------
    def _start(self, bk: BlockKey, obj: Pinned, kind: int, stage: bool = False) -> _Flight:
        flight = _Flight(kind, stage)
        self._flights[bk] = flight
        assert self._nursery is not None, "BlockStore.run() is not running"
        self._nursery.start_soon(self._load, bk, obj, flight)
        return flight

    async def _load(self, bk: BlockKey, obj: Pinned, flight: _Flight) -> None:
        spec = self.block_range(obj, bk.index)[1] if flight.kind != lim.DEMAND else 0
        flight.unjoined = 0 if flight.joined or flight.stage else spec
        self.spec.started(spec, flight.stage, flight.unjoined)
        try:
            flight.data = await self._load_inner(bk, obj, flight)
        except BackendError as exc:
            flight.error = exc
        except Exception as exc:  # a bug must fail one read, not the daemon
            log.exception("unexpected error loading %s block %d", bk.key, bk.index)
            flight.error = Unavailable(f"{bk.key}: internal error: {exc}")
        finally:
            self.spec.ended(spec, flight.stage, flight.unjoined)
            flight.unjoined = 0
            self._flights.pop(bk, None)
            flight.done.set()

    async def _load_inner(self, bk: BlockKey, obj: Pinned, flight: _Flight) -> bytes:
        st = self.stats
        if self.disk is not None and self._for_disk(bk):
            data = self._queued.get(bk)    # (its write queued; nothing viewed is recycled)
            n = self.block_range(obj, bk.index)[1]
            if data is None and n <= INLINE_DISK_WRITE_MAX and not flight.joined:
                data = await self._disk_reads.call(self._nursery, bk, n)   # (batches.py)
            elif data is None:                                 # a demand read: alone
                data = await trio.to_thread.run_sync(self.disk.get, bk, limiter=self._disk_threads)
            if data is not None:
                spilled = self.spec.from_disk(bk)
                if flight.kind == lim.DEMAND:
                    st.disk_hits += 1
                    st.demand_hit_blocks += 1
                if not flight.joined:
                    # speculative, from disk: bounded by the unread budget like a fetched
                    # block, but neither fetched nor "used" in the prefetch counters
                    # (unless a speculative fetch of it is there unread)
                    self.spec.loaded(bk, spilled[0] if spilled else None, len(data))
                elif spilled:
                    self.spec.count_used(spilled[0], len(data))
                self.mem.put(bk, data)
                return data
        if flight.kind == lim.DEMAND:
            st.disk_misses += 1
        self.spec.gone_from_disk(bk)            # (fetched anew)
        off, length = self.block_range(obj, bk.index)
        # the shared tier (store/shared.py), when configured: a miss or any failure of
        # it is None, and the origin fetch below writes the block through
        data = None if self.shared is None else await self.shared.get(
            bk, length, prefetch=flight.kind == lim.PREFETCH, urgent=lambda: flight.joined)
        if data is None:
            data = await self._from_origin(bk, obj, flight, off, length)
        if flight.kind != lim.DEMAND:
            if flight.kind == lim.READAHEAD:
                st.readahead_bytes_fetched += len(data)
            else:
                st.prefetch_bytes_fetched += len(data)
            if not flight.joined and flight.stage:
                # bound for the disk, memory's budget full: not stored in this thread
                # (the shared tier answered, the write failed or found no slot), it
                # goes through the writers; with their queue full it is dropped
                if flight.stored or bk in self._queued or self._queue_write(bk, data):
                    self.spec.staged(bk, flight.kind, len(data))
                else:
                    self.stats.disk_writes_skipped += 1
                return data                 # memory keeps what readers use
            if not flight.joined:                     # no reader joined while loading
                self.spec.loaded(bk, flight.kind, len(data))
            elif flight.kind == lim.READAHEAD:          # joined: used, but late
                st.readahead_bytes_used += len(data)
            else:
                st.prefetch_bytes_used += len(data)
        self.mem.put(bk, data)
        if (self.disk is not None and not flight.stored and not self._for_disk(bk)
                and not self._queue_write(bk, data)):      # (queued: those bytes are)
            self.stats.disk_writes_skipped += 1
        return data

    def _queue_write(self, bk: BlockKey, data) -> bool:
        """Hand ``data`` to the background disk writers; False if the queue is full."""
        if self.write_queue_bytes + len(data) > self.write_queue_limit:
            return False
        try:
            self._send.send_nowait((bk, data))
        except trio.WouldBlock:
            return False
        self.write_queue_bytes += len(data)
        self._queued[bk] = data
        return True

    async def _from_origin(self, bk: BlockKey, obj: Pinned, flight: _Flight, off: int,
                           length: int) -> bytes:
        st = self.stats
        data = None
        flight.ticket = self.limiter.ticket(lim.DEMAND if flight.joined else flight.kind,
                                            length)
        try:
            await self.limiter.acquire(flight.ticket)
            t0 = time.monotonic()
            try:
                data = await self._fetch(bk, obj, off, length, flight)
            except BackendError:
                st.record_backend(time.monotonic() - t0, 0, ok=False)
                raise
            finally:
                self.limiter.release(flight.ticket)
        finally:
            if self.shared is not None:
                self.shared.fetched(bk, data)   # write-through, or drop our lease
        st.record_backend(time.monotonic() - t0, len(data), ok=True)
        flight.remote = True
        return data

    async def _fetch(self, bk: BlockKey, obj: Pinned, off: int, length: int,
                     flight: _Flight) -> bytes:
        """One ranged read, on this thread where the backend can (backends/s3trio.py),
        stored as INLINE_DISK_WRITE_MAX says (``flight.stored``); hedged when slow."""
        def read():
            return self._remote_read(obj, off, length)
        on_loop = None if self._read_async is None else (     # s3trio.py, where it can
            lambda: self._read_async(obj.key, off, length, obj.version))

        if not flight.joined:
            inline = self.disk is not None and (length <= INLINE_DISK_WRITE_MAX or
                                                flight.stage)

            def slot() -> bool:
                # at most DISK_THREADS at once.  Not staged: never waiting (past it, the
                # writers' queue).  Staged: waiting (the disk's pace) unless one joins.
                if not flight.stage:
                    return self._inline_writes.acquire(False)
                give_up = time.monotonic() + STAGE_SLOT_WAIT_S
                while not self._inline_writes.acquire(timeout=0.01):
                    if flight.joined or time.monotonic() > give_up:
                        return False
                return True

            def store(data: bytes) -> bytes:
                if (inline and len(data) == length and not flight_running.ended
                        and slot()):     # (ended: a hedge answered; not wanted)
                    try:
                        flight.stored = self.disk.put(bk, data, not flight.joined)
                    except Exception:  # a cache failure is never a reader's failure
                        log.exception("disk cache write failed")
                    finally:
                        self._inline_writes.release()
                return data

            async def first() -> bytes:
                # the loop's GET takes no thread token (the ticket bounds it); its block
                # goes to the writers (in batches), or, staged, is stored at the disk's pace
                data = await on_loop() if on_loop is not None else None
                if data is None:
                    return await trio.to_thread.run_sync(
                        lambda: store(read()), limiter=self._backend_threads,
                        abandon_on_cancel=True)
                if not (inline and flight.stage):
                    return data
                return await trio.to_thread.run_sync(store, data, abandon_on_cancel=True,
                                                     limiter=self._store_threads)
            flight.running = flight_running = hedge.Running()
            try:
                return await flight.running.run(first)
            finally:
                flight.running = None
        return await hedge.demand(read, hedge.delay(self.stats, self.hedge_max_s),
                                  self.stats, f"{obj.key} @{off}", self._hedge_threads,
                                  on_loop)

    def _remote_read(self, obj: Pinned, off: int, length: int) -> bytes:
        """The backend's read (blocking: a worker thread's), its CPU counted as fetch."""
        t0 = cpuacct.clock()
        try:
            return self.backend.read(obj.key, off, length, obj.version)
        finally:
            cpuacct.charge("fetch", t0)

    def latency_estimate(self) -> float:
        """Median latency of recent block fetches (s), for Little's law; 60 ms at first."""
        return self.stats.latency_quantile(0.5, default=0.06)

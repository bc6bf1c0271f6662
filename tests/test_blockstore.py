"""BlockStore: single flight, tiers, corrupt blocks, unwritable cache (no kernel)."""
import threading
import time

import pytest
import trio

from neuralcache.store import batches, limiter as lim
from neuralcache.backends.posix import PosixBackend
from neuralcache.store.blocks import BlockStore, Pinned
from neuralcache.store.writeback import WRITE_BACK_WRITERS
from neuralcache.store.tiers import BlockKey, DiskTier, MemoryTier
from neuralcache.errors import NotFound, Unavailable, VersionChanged
from neuralcache.stats import Stats

from conftest import payload

BS = 64 << 10


class CountingBackend(PosixBackend):
    """The POSIX backend, counting and slowing reads to widen race windows."""

    def __init__(self, root, delay=0.05):
        super().__init__(root)
        self.calls = []
        self.delay = delay
        self._lock = threading.Lock()

    def read(self, key, offset, length, version):
        with self._lock:
            self.calls.append((key, offset, length))
        time.sleep(self.delay)
        return super().read(key, offset, length, version)


def make(tmp_path, data, *, disk=True, mem=1 << 20, delay=0.05):
    src = tmp_path / "src"
    src.mkdir(exist_ok=True)
    if not (src / "f.bin").exists():
        (src / "f.bin").write_bytes(data)
    be = CountingBackend(str(src), delay)
    info = be.stat("f.bin")
    d = None
    if disk:
        d = DiskTier(str(tmp_path / "cache"), 1 << 30)
        d.load()
    store = BlockStore(be, MemoryTier(mem), d, Stats(), block_size=BS, concurrency=8)
    return be, store, Pinned(info.key, info.version, info.size)


async def settle(store):
    """Until no load is in flight and the disk write queue is empty: a fixed sleep let
    a slow machine's store.run be cancelled before a queued write began."""
    while store._flights or store.write_queue_bytes:
        await trio.sleep(0.01)


def run_with_store(store, fn):
    async def main():
        async with trio.open_nursery() as n:
            await n.start(store.run)
            try:
                return await fn()
            finally:
                n.cancel_scope.cancel()
    return trio.run(main)


def test_single_flight_many_readers_one_fetch(tmp_path):
    data = payload(7, 3 * BS + 100)
    be, store, obj = make(tmp_path, data)
    results = []

    async def fn():
        async def reader(off):
            results.append((off, await store.read(obj, off, 1000)))
        async with trio.open_nursery() as n:
            for i in range(20):
                n.start_soon(reader, BS + i * 10)

    run_with_store(store, fn)
    assert len(be.calls) == 1
    assert all(r == data[off:off + 1000] for off, r in results)
    assert store.stats.singleflight_joins >= 19


def test_reads_across_blocks_and_end_of_file(tmp_path):
    data = payload(8, 3 * BS + 100)
    be, store, obj = make(tmp_path, data, delay=0)

    async def fn():
        assert await store.read(obj, BS - 10, 30) == data[BS - 10:BS + 20]
        assert await store.read(obj, 0, len(data) + 999) == data
        assert await store.read(obj, len(data), 10) == b""
        assert await store.read(obj, 3 * BS + 50, 1000) == data[3 * BS + 50:]

    run_with_store(store, fn)


class FailingBlockBackend(CountingBackend):
    """Every read of the object's second block fails with ``exc``."""

    def __init__(self, root, exc):
        super().__init__(root, delay=0)
        self.exc = exc

    def read(self, key, offset, length, version):
        if offset == BS:
            raise self.exc
        return super().read(key, offset, length, version)


@pytest.mark.parametrize("exc", [VersionChanged("changed"), NotFound("gone"),
                                 Unavailable("no answer")])
def test_a_read_across_blocks_fails_with_the_blocks_own_error(tmp_path, exc):
    """One block of a read that spans two fails: the read raises that error itself, as
    a one-block read does (the FUSE edge maps it by type: ESTALE, ENOENT; a rename's
    reader catches NotFound), not trio's group of the read's tasks (EIO)."""
    data = payload(10, 3 * BS)
    be, store, obj = make(tmp_path, data, delay=0)
    store.backend = FailingBlockBackend(str(tmp_path / "src"), exc)

    async def fn():
        with pytest.raises(type(exc)):
            await store.read(obj, BS, 10)              # the block alone
        with pytest.raises(type(exc)):
            await store.read(obj, BS - 10, 30)         # across the first two
    run_with_store(store, fn)


def test_first_error_unwraps_a_group_of_ordinary_errors_only():
    from neuralcache.errors import first_error
    e = NotFound("x")
    assert first_error(ExceptionGroup("g", [ExceptionGroup("h", [e]), ValueError()])) is e
    g = BaseExceptionGroup("g", [e, KeyboardInterrupt()])
    assert first_error(g) is g                         # trio's to unwind


def test_disk_tier_serves_after_memory_eviction_and_restart(tmp_path):
    data = payload(9, 4 * BS)
    be, store, obj = make(tmp_path, data, mem=BS, delay=0)

    async def fn():
        assert await store.read(obj, 0, len(data)) == data
        await settle(store)            # let background disk writes land
    run_with_store(store, fn)
    n_before = len(be.calls)
    be2, store2, obj2 = make(tmp_path, data, mem=BS, delay=0)

    async def fn2():
        return await store2.read(obj2, 0, len(data))
    assert run_with_store(store2, fn2) == data
    assert len(be2.calls) == 0 and n_before == 4
    assert store2.stats.disk_hits == 4


def test_corrupt_disk_block_is_refetched(tmp_path):
    data = payload(10, 2 * BS)
    be, store, obj = make(tmp_path, data, mem=BS, delay=0)

    async def fn():
        await store.read(obj, 0, len(data))
        await settle(store)
    run_with_store(store, fn)
    path, off, _ = store.disk.locate(BlockKey(obj.key, obj.version, 1))
    with open(path, "r+b") as f:              # flip one bit of the block's data
        f.seek(off + 100)
        b = f.read(1)[0]
        f.seek(off + 100)
        f.write(bytes([b ^ 1]))
    be2, store2, obj2 = make(tmp_path, data, mem=BS, delay=0)

    async def fn2():
        return await store2.read(obj2, 0, len(data))
    assert run_with_store(store2, fn2) == data
    assert be2.calls == [("f.bin", BS, BS)]
    assert store2.disk.corrupt_blocks == 1


def test_unwritable_disk_is_pass_through(tmp_path):
    data = payload(11, 2 * BS)
    be, store, obj = make(tmp_path, data, delay=0)
    store.disk.root = "/proc/neuralcache-cannot-write-here"

    async def fn():
        out = await store.read(obj, 0, len(data))
        await settle(store)                 # (the writers' attempts)
        return out
    assert run_with_store(store, fn) == data
    assert store.disk.writable is False


def test_prefetch_then_demand_counts_used_bytes(tmp_path):
    data = payload(12, 4 * BS)
    be, store, obj = make(tmp_path, data, delay=0.01)

    async def fn():
        assert store.prefetch(obj, 2, lim.READAHEAD)
        assert not store.prefetch(obj, 2, lim.READAHEAD)      # already in flight
        await trio.sleep(0.2)
        assert await store.read(obj, 2 * BS, 10) == data[2 * BS:2 * BS + 10]
    run_with_store(store, fn)
    s = store.stats
    assert s.readahead_bytes_fetched == BS and s.readahead_bytes_used == BS
    assert len(be.calls) == 1


def test_unread_speculative_bytes_are_counted_once_and_not_once_a_reader_waits(tmp_path):
    """The prefetcher's budget (ahead/prefetch.py) reads speculative_unread_bytes: a
    load in flight counts until a reader joins it; a block evicted from memory unread
    and loaded again counts once (it was counted twice, never subtracted: the budget
    filled up for good on a small memory tier)."""
    data = payload(13, 4 * BS)
    be, store, obj = make(tmp_path, data, disk=False, delay=0.2)

    async def fn():
        assert store.prefetch(obj, 1, lim.PREFETCH)
        await trio.sleep(0.05)
        assert store.speculative_unread_bytes() == BS          # in flight, unread
        async with trio.open_nursery() as n:
            n.start_soon(store.read, obj, BS, 10)              # a reader joins it
            await trio.sleep(0.05)
            assert store.speculative_unread_bytes() == 0
        assert store.prefetch(obj, 2, lim.PREFETCH)
        await settle(store)
        assert store.speculative_unread_bytes() == BS          # loaded, unread
        store.mem.drop(BlockKey(obj.key, obj.version, 2))       # evicted unread
        assert store.prefetch(obj, 2, lim.PREFETCH)
        await settle(store)
        assert store.speculative_unread_bytes() == BS
        assert await store.read(obj, 2 * BS, 10) == data[2 * BS:2 * BS + 10]
        assert store.speculative_unread_bytes() == 0
    run_with_store(store, fn)


def test_a_speculative_small_block_is_stored_by_the_thread_that_fetched_it(tmp_path):
    """One thread hand-off per prefetched small file: the block is in the disk tier
    when its load ends, and nothing was queued for the background writers (a demand
    load still goes through them).  The stored bytes are checked on a fresh store."""
    data = payload(14, 2 * BS)
    be, store, obj = make(tmp_path, data, delay=0)
    queued = []
    send = store._send.send_nowait
    store._send.send_nowait = lambda item: (queued.append(item[0].index), send(item))

    async def fn():
        assert store.prefetch(obj, 1, lim.PREFETCH)
        await settle(store)
        assert store.disk.contains(BlockKey(obj.key, obj.version, 1))
        assert queued == []
        assert await store.read(obj, 0, 10) == data[:10]      # demand: block 0
        await settle(store)
        assert queued == [0]
    run_with_store(store, fn)
    be2, store2, obj2 = make(tmp_path, data, delay=0)

    async def fn2():
        return await store2.read(obj2, 0, len(data))
    assert run_with_store(store2, fn2) == data
    assert be2.calls == [] and store2.stats.disk_hits == 2


class LoopBackend(CountingBackend):
    """A backend with reads on the trio thread (as s3.py's read_async) that answers
    blocks at even offsets itself and leaves the odd ones to read() (None)."""

    def __init__(self, root):
        super().__init__(root, 0)
        self.on_loop = []

    async def read_async(self, key, offset, length, version):
        trio.lowlevel.current_task()             # on the trio thread
        await trio.sleep(0.01)
        if (offset // BS) % 2:
            return None
        self.on_loop.append(offset // BS)
        return PosixBackend.read(self, key, offset, length, version)   # (not counted)


def test_reads_on_the_trio_thread_speculative_and_demand(tmp_path):
    """A speculative load the backend answers on the trio thread is stored on disk by
    the writers; one that read() answers in a thread is stored by that thread; a
    demand read takes the same way first; a None falls back to read() in a thread.
    Every byte is checked, and again from the disk on a fresh store."""
    data = payload(15, 4 * BS)
    src = tmp_path / "src"
    src.mkdir()
    (src / "f.bin").write_bytes(data)
    be = LoopBackend(str(src))
    info = be.stat("f.bin")
    disk = DiskTier(str(tmp_path / "cache"), 1 << 30)
    disk.load()
    store = BlockStore(be, MemoryTier(1 << 20), disk, Stats(), block_size=BS, concurrency=8)
    obj = Pinned(info.key, info.version, info.size)
    queued = []                                   # blocks left to the background writers
    send = store._send.send_nowait
    store._send.send_nowait = lambda item: (queued.append(item[0].index), send(item))

    async def fn():
        assert store.prefetch(obj, 0, lim.PREFETCH) and store.prefetch(obj, 1, lim.PREFETCH)
        await settle(store)
        assert store.disk.contains(BlockKey(obj.key, obj.version, 0))
        assert store.disk.contains(BlockKey(obj.key, obj.version, 1))
        assert queued == [0]      # the loop's answer to the writers; 1 stored by its thread
        assert await store.read(obj, 2 * BS, 2 * BS) == data[2 * BS:]   # demand
        assert await store.read(obj, 0, 2 * BS) == data[:2 * BS]
        await settle(store)                       # (the writers' batch of 2 and 3)
    run_with_store(store, fn)
    assert sorted(be.on_loop) == [0, 2]
    assert sorted(c[1] // BS for c in be.calls) == [1, 3]          # read(), in threads
    be2, store2, obj2 = make(tmp_path, data, delay=0)

    async def fn2():
        return await store2.read(obj2, 0, len(data))
    assert run_with_store(store2, fn2) == data
    assert be2.calls == [] and store2.stats.disk_hits == 4


def test_writers_store_blocks_answered_together_in_few_thread_jobs(tmp_path, monkeypatch):
    """Blocks answered on the trio thread at about the same time are written by the
    background writers in fewer thread jobs than blocks (batches.py), each one
    whole: a fresh store reads every byte back from the disk without a GET; loaded
    ahead, in fewer thread jobs than blocks too."""
    data = payload(16, 16 * BS)
    src = tmp_path / "src"
    src.mkdir()
    (src / "f.bin").write_bytes(data)

    class AllOnLoop(LoopBackend):
        async def read_async(self, key, offset, length, version):
            await trio.sleep(0.01)
            return PosixBackend.read(self, key, offset, length, version)
    be = AllOnLoop(str(src))
    info = be.stat("f.bin")
    disk = DiskTier(str(tmp_path / "cache"), 1 << 30)
    disk.load()
    store = BlockStore(be, MemoryTier(1 << 30), disk, Stats(), block_size=BS,
                       concurrency=16)
    obj = Pinned(info.key, info.version, info.size)
    jobs = []
    put_all = batches.put_all
    monkeypatch.setattr(batches, "put_all", lambda *a: (jobs.append(len(a[1])),
                                                           put_all(*a)))

    async def fn():
        for i in range(16):
            assert store.prefetch(obj, i, lim.PREFETCH)
        await settle(store)
    run_with_store(store, fn)
    assert sum(jobs) == 16 and len(jobs) < 8, jobs
    assert be.calls == []
    be2, store2, obj2 = make(tmp_path, data, delay=0)

    async def fn2():
        return await store2.read(obj2, 0, len(data))
    assert run_with_store(store2, fn2) == data
    assert be2.calls == [] and store2.stats.disk_hits == 16
    assert store2._disk_reads.calls == 0                 # demand reads: each alone
    be3, store3, obj3 = make(tmp_path, data, delay=0, mem=4 << 20)   # loaded ahead:

    async def fn3():                                     # read in few thread jobs
        for i in range(16):
            assert store3.prefetch(obj3, i, lim.PREFETCH)
        await settle(store3)
        return await store3.read(obj3, 0, len(data))
    assert run_with_store(store3, fn3) == data
    assert be3.calls == [] and store3.stats.disk_hits == 0         # (from memory)
    assert store3._disk_reads.calls == 16 and store3._disk_reads.batches < 8


def test_missing_object_error_reaches_reader_only(tmp_path):
    data = payload(13, BS)
    be, store, obj = make(tmp_path, data, delay=0)
    (tmp_path / "src" / "f.bin").unlink()

    async def fn():
        store.prefetch(obj, 0, lim.PREFETCH)      # must not raise anywhere
        await trio.sleep(0.05)
        try:
            await store.read(obj, 0, 10)
        except NotFound:
            return "notfound"
    assert run_with_store(store, fn) == "notfound"


class StallFirstBackend(CountingBackend):
    """The first ``stalls`` reads stall 3 s (a hung connection: the GET, then its
    hedges); later ones answer at once."""
    stalls = 1

    def read(self, key, offset, length, version):
        with self._lock:
            stall = len(self.calls) < self.stalls
            self.calls.append((key, offset, length))
        if stall:
            time.sleep(3.0)
        return PosixBackend.read(self, key, offset, length, version)


def hedging_store(tmp_path, seed, backend=StallFirstBackend, hedge_max_s=0.5, delay=0,
                  disk=None):
    """(data, backend, store, obj): one block-sized file behind ``backend``, a store
    whose hedge delay is ``hedge_max_s`` (it has no latency samples yet)."""
    data = payload(seed, BS)
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "f.bin").write_bytes(data)
    be = backend(str(tmp_path / "src"), delay)
    info = be.stat("f.bin")
    store = BlockStore(be, MemoryTier(1 << 20), disk, Stats(), block_size=BS,
                       concurrency=4, hedge_max_s=hedge_max_s)
    return data, be, store, Pinned(info.key, info.version, info.size)


def test_stalled_demand_read_is_hedged(tmp_path):
    data, be, store, obj = hedging_store(tmp_path, 14)

    async def fn():
        t0 = time.monotonic()
        got = await store.read(obj, 0, BS)
        return got, time.monotonic() - t0
    got, elapsed = run_with_store(store, fn)
    assert got == data
    assert elapsed < 2.0, elapsed
    assert store.stats.hedged_requests == 1 and len(be.calls) == 2


class StallFirstTwoBackend(StallFirstBackend):
    stalls = 2


@pytest.mark.parametrize("joined", [False, True], ids=["demand", "joined-read-ahead"])
def test_a_hedge_that_stalls_too_is_hedged_again(tmp_path, joined):
    data, be, store, obj = hedging_store(tmp_path, 18, StallFirstTwoBackend, hedge_max_s=0.3)

    async def fn():
        t0 = time.monotonic()
        if joined:
            store.prefetch(obj, 0, lim.READAHEAD)
            await trio.sleep(0.05)
        got = await store.read(obj, 0, BS)
        return got, time.monotonic() - t0
    got, elapsed = run_with_store(store, fn)
    assert got == data
    assert 0.5 < elapsed < 2.0, elapsed       # two hedge delays, not a stall's 3 s
    assert store.stats.hedged_requests == 2 and len(be.calls) == 3


class FailingBackend(CountingBackend):
    def read(self, key, offset, length, version):
        with self._lock:
            self.calls.append((key, offset, length))
        time.sleep(1.0)
        raise Unavailable("no answer")


def test_a_demand_read_fails_once_every_attempt_has_failed(tmp_path):
    _, be, store, obj = hedging_store(tmp_path, 19, FailingBackend, hedge_max_s=0.2)

    async def fn():
        try:
            await store.read(obj, 0, BS)
        except Unavailable:
            return "failed"
    assert run_with_store(store, fn) == "failed"
    assert len(be.calls) == 3 and store.stats.hedged_requests == 2


class FirstFailsLateBackend(CountingBackend):
    """The first read fails after 1 s; the others answer 1.2 s after they start."""

    def read(self, key, offset, length, version):
        with self._lock:
            first = not self.calls
            self.calls.append((key, offset, length))
        if first:
            time.sleep(1.0)
            raise Unavailable("connection reset")
        time.sleep(1.2)
        return PosixBackend.read(self, key, offset, length, version)


def test_a_joined_read_ahead_whose_get_fails_takes_the_hedges_answer(tmp_path):
    """The read-ahead GET fails while the reader's hedge is still out: the reader gets
    the hedge's bytes, not the first GET's error."""
    data, be, store, obj = hedging_store(tmp_path, 20, FirstFailsLateBackend, hedge_max_s=0.3)

    async def fn():
        store.prefetch(obj, 0, lim.READAHEAD)
        await trio.sleep(0.05)
        return await store.read(obj, 0, BS)
    assert run_with_store(store, fn) == data
    assert store.stats.hedged_requests >= 1 and store.stats.read_errors == 0


def test_a_read_ahead_a_hedge_beat_writes_nothing_to_the_disk_tier(tmp_path):
    """The stalled first GET answers after the hedge did: its thread does not write the
    block to the disk tier again (the hedge's bytes went through the writers)."""
    disk = DiskTier(str(tmp_path / "cache"), 1 << 30)
    disk.load()
    puts = []
    real_put = disk.put
    disk.put = lambda bk, d, unread=False: puts.append(bk) or real_put(bk, d, unread)
    data, be, store, obj = hedging_store(tmp_path, 21, disk=disk)

    async def fn():
        store.prefetch(obj, 0, lim.READAHEAD)
        await trio.sleep(0.6)
        got = await store.read(obj, 0, BS)
        await trio.sleep(3.0)                 # the stalled GET's thread has ended
        await settle(store)
        return got
    assert run_with_store(store, fn) == data
    assert store.stats.hedged_requests == 1 and len(be.calls) == 2
    assert len(puts) == 1
    bk = BlockKey(obj.key, obj.version, 0)
    assert bytes(disk.get(bk)) == data


def test_speculative_reads_are_not_hedged(tmp_path):
    data, be, store, obj = hedging_store(tmp_path, 15, CountingBackend, hedge_max_s=0.1,
                                         delay=0.5)

    async def fn():
        store.prefetch(obj, 0, lim.PREFETCH)
        await trio.sleep(1.0)
    run_with_store(store, fn)
    assert store.stats.hedged_requests == 0 and len(be.calls) == 1


def test_a_stalled_read_ahead_is_hedged_once_a_reader_joins_it(tmp_path):
    """Read-ahead's GET stalls with no reader; the reader that then needs the block
    hedges it at once (it has run past the hedge delay) and gets the hedge's bytes;
    the stalled GET's late answer changes nothing."""
    data, be, store, obj = hedging_store(tmp_path, 16)

    async def fn():
        store.prefetch(obj, 0, lim.READAHEAD)
        await trio.sleep(0.8)                  # stalled, nobody waiting: no hedge yet
        hedged_before = store.stats.hedged_requests
        t0 = time.monotonic()
        got = await store.read(obj, 0, BS)
        return got, time.monotonic() - t0, hedged_before
    got, elapsed, hedged_before = run_with_store(store, fn)
    assert hedged_before == 0
    assert got == data
    assert elapsed < 1.8, elapsed
    assert store.stats.hedged_requests == 1 and len(be.calls) == 2


def test_a_reader_joining_a_read_ahead_waits_for_the_hedge_delay_before_hedging(tmp_path):
    """A GET that is slow but not past the hedge delay when a reader joins it is hedged
    only once the delay has run out, and a second reader does not hedge it again."""
    data, be, store, obj = hedging_store(tmp_path, 17, hedge_max_s=0.6)

    async def fn():
        t0 = time.monotonic()
        store.prefetch(obj, 0, lim.READAHEAD)
        await trio.sleep(0.05)
        out = []

        async def reader():
            out.append(await store.read(obj, 0, BS))
        async with trio.open_nursery() as n:
            n.start_soon(reader)
            n.start_soon(reader)
        return out, time.monotonic() - t0
    out, elapsed = run_with_store(store, fn)
    assert out == [data, data]
    assert 0.55 < elapsed < 2.0, elapsed       # the delay (0.6 s from the GET's start)
    assert store.stats.hedged_requests == 1 and len(be.calls) == 2


def test_a_block_a_stream_left_behind_leaves_memory_once_the_disk_tier_has_it(tmp_path):
    data = payload(12, 4 * BS)
    be, store, obj = make(tmp_path, data, delay=0)
    keys = [BlockKey(obj.key, obj.version, i) for i in range(4)]

    async def fn():
        for i in range(4):
            assert await store.read(obj, i * BS, BS) == data[i * BS:(i + 1) * BS]
        while store.write_queue_bytes:          # the background writes land
            await trio.sleep(0.01)
        store.consumed(obj, 0)
        store._queued[keys[3]] = store.mem.get(keys[3])   # queued, not written yet
        store.disk.drop(keys[3])
        store.consumed(obj, 3)
        assert store._let_go == {keys[3]}       # (would be put back if that write failed)
        store.disk.drop(keys[2])                # neither written nor queued (skipped)
        limit, store.write_queue_limit = store.write_queue_limit, 0   # queue still full
        store.mem.get(keys[1])                  # block 2 is not the most recent one
        order = store.mem._lru.keys()
        store.consumed(obj, 2)
        assert store.mem._lru.keys() == order   # (not made the most recently used)
        assert [store.mem.get(k) is not None for k in keys] == [False, True, True, False]
        assert store.stats.disk_writes_late == 0
        store.write_queue_limit = limit         # room again: queued now, and let go
        store.consumed(obj, 2)
        assert store.stats.disk_writes_late == 1
        assert store._let_go == {keys[2], keys[3]} and store.mem.get(keys[2]) is None
        while store.write_queue_bytes:
            await trio.sleep(0.01)
        assert store.disk.contains(keys[2]) and store._let_go == {keys[3]}
        assert await store.read(obj, 0, BS) == data[:BS]     # from the disk tier
        assert await store.read(obj, 2 * BS, BS) == data[2 * BS:3 * BS]
        return len(be.calls)

    assert run_with_store(store, fn) == 4       # one fetch per block, none again


def test_a_block_let_go_before_its_disk_write_failed_stays_in_memory(tmp_path):
    """Review: ``consumed`` lets a block go while its disk write is queued; if that
    write then fails, memory keeps it (it was in neither tier, and a re-read
    fetched it again, or failed if the object changed since).  A block the LRU
    evicted meanwhile is not put back: the memory tier's bound holds."""
    data = payload(14, 2 * BS)
    be, store, obj = make(tmp_path, data, delay=0)
    gate = threading.Event()
    store.disk.put = lambda bk, data, *_: gate.wait(5) and False   # the disk takes nothing

    async def fn():
        assert await store.read(obj, 0, BS) == data[:BS]
        assert await store.read(obj, BS, BS) == data[BS:]
        b0, b1 = (BlockKey(obj.key, obj.version, i) for i in range(2))
        assert b0 in store._queued and b1 in store._queued    # writes not done yet
        store.consumed(obj, 0)            # let go, counting on the write
        store.mem.drop(b1)                # evicted by the LRU
        assert store.mem.get(b0) is None
        gate.set()
        while store.write_queue_bytes:
            await trio.sleep(0.01)
        assert store.mem.get(b0) is not None
        assert store.mem.get(b1) is None
        assert not store._let_go
        assert await store.read(obj, 0, BS) == data[:BS]
        return len(be.calls)

    assert run_with_store(store, fn) == 2


def test_a_skipped_block_queued_late_comes_back_to_memory_if_that_write_fails(tmp_path):
    """Review: a block whose write was skipped is queued when its reader leaves it,
    only while the disk takes writes; if that late write fails, memory keeps it."""
    data = payload(16, 2 * BS)
    be, store, obj = make(tmp_path, data, delay=0)
    b0, b1 = (BlockKey(obj.key, obj.version, i) for i in range(2))
    limit, store.write_queue_limit = store.write_queue_limit, 0     # every write skipped
    store.disk.put = lambda bk, data, *_: False                       # and the disk fails

    async def fn():
        assert await store.read(obj, 0, BS) == data[:BS]
        assert await store.read(obj, BS, BS) == data[BS:]
        assert store.stats.disk_writes_skipped == 2 and not store._queued
        store.write_queue_limit = limit
        store.disk.writable = False           # an outage: nothing queued, b1 stays
        store.consumed(obj, 1)
        assert store.stats.disk_writes_late == 0 and store.mem.get(b1) is not None
        store.disk.writable = True
        store.consumed(obj, 0)                # queued late, let go ...
        assert store.stats.disk_writes_late == 1 and store.mem.get(b0) is None
        assert store._let_go == {b0}
        while store.write_queue_bytes:
            await trio.sleep(0.01)
        assert store.mem.get(b0) is not None and not store._let_go   # ... and back
        assert await store.read(obj, 0, BS) == data[:BS]
        return len(be.calls)

    assert run_with_store(store, fn) == 2       # never fetched again


def test_a_block_only_memory_holds_goes_to_the_disk_when_memory_evicts_it(tmp_path):
    """A block whose write was skipped (queue full) and that no reader left behind
    stays in memory only; when the memory tier's bound evicts it, it is queued for
    the disk if the queue has room then (``_queue_late``, as for ``consumed``: its
    outage case is tested there), and the next read comes from disk.  With the queue
    full it goes (fetched again later)."""
    data = payload(17, 4 * BS)
    be, store, obj = make(tmp_path, data, mem=2 * BS, delay=0)
    keys = [BlockKey(obj.key, obj.version, i) for i in range(4)]
    limit = store.write_queue_limit

    async def drained():
        while store.write_queue_bytes:
            await trio.sleep(0.01)

    async def fn():
        store.write_queue_limit = 0                 # every write skipped
        for i in (0, 1):
            assert await store.read(obj, i * BS, BS) == data[i * BS:(i + 1) * BS]
        assert store.stats.disk_writes_skipped == 2
        store.write_queue_limit = limit             # room again; block 2 evicts 0
        assert await store.read(obj, 2 * BS, BS) == data[2 * BS:3 * BS]
        assert store.stats.disk_writes_late == 1
        await drained()
        assert store.disk.contains(keys[0]) and store.mem.get(keys[0]) is None
        store.write_queue_limit = 0                 # full again: block 3 evicts 1 ...
        assert await store.read(obj, 3 * BS, BS) == data[3 * BS:4 * BS]
        assert store.stats.disk_writes_late == 1    # ... which goes
        assert store.mem.get(keys[1]) is None and not store.disk.contains(keys[1])
        store.write_queue_limit = limit
        fetched = len(be.calls)
        assert await store.read(obj, 0, BS) == data[:BS]      # from the disk tier
        assert len(be.calls) == fetched
        assert await store.read(obj, BS, BS) == data[BS:2 * BS]   # fetched again
        return len(be.calls) - fetched

    assert run_with_store(store, fn) == 1


def test_a_speculative_block_evicted_unread_stops_counting_against_the_budget(tmp_path):
    """The prefetcher's budget counts loaded-unread bytes (speculative_unread_bytes).
    One the memory tier evicts before anyone read it is no longer held: counted on, a
    small tier's budget filled with blocks it did not hold and prefetch stopped
    (bench.breakdown --mount-args "--memory-cache-size 64M": 178 -> 270 files/s).  Read
    later from the disk tier, it counts as used; fetched again (no disk tier), not."""
    data = payload(18, 3 * BS)
    for disk in (True, False):
        (tmp_path / str(disk)).mkdir()
        be, store, obj = make(tmp_path / str(disk), data, disk=disk, mem=2 * BS, delay=0)

        async def fn():
            for i in range(3):
                assert store.prefetch(obj, i, lim.PREFETCH)
                while store._flights or store.write_queue_bytes:
                    await trio.sleep(0.01)
            held = store.speculative_unread_bytes()
            assert await store.read(obj, 2 * BS, BS) == data[2 * BS:]
            unread = store.speculative_unread_bytes()
            assert await store.read(obj, 0, BS) == data[:BS]     # evicted unread
            return held, unread, store.stats.prefetch_bytes_used, len(be.calls)

        assert run_with_store(store, fn) == (2 * BS, BS, 2 * BS if disk else BS,
                                             3 if disk else 4)


def test_without_a_disk_tier_a_block_left_behind_stays_in_memory(tmp_path):
    data = payload(13, 2 * BS)
    be, store, obj = make(tmp_path, data, disk=False, delay=0)

    async def fn():
        await store.read(obj, 0, BS)
        store.consumed(obj, 0)
        return store.mem.get(BlockKey(obj.key, obj.version, 0)) is not None

    assert run_with_store(store, fn)


def _read_all_then_stop(store, obj, data, before_stop=None):
    """Read every block with ``run`` going, then cancel it (the unmount)."""
    async def main():
        async with trio.open_nursery() as n:
            await n.start(store.run)
            for off in range(0, len(data), BS):
                assert await store.read(obj, off, BS) == data[off:off + BS]
            if before_stop is not None:
                before_stop()
            n.cancel_scope.cancel()
    trio.run(main)


def test_write_back_at_unmount_writes_what_only_memory_or_the_queue_holds(tmp_path):
    """Blocks whose disk write was skipped (queue full) stay in memory only; blocks in
    the write queue when ``run`` stopped were in neither tier, whether a writer had
    taken them (cut off before its thread started) or they were still queued: the
    unmount's ``write_back`` writes all three, and the next mount of the cache reads
    every block from disk, byte for byte, without one fetch."""
    data = payload(17, 6 * BS)
    be, store, obj = make(tmp_path, data, delay=0)
    keys = [BlockKey(obj.key, obj.version, i) for i in range(6)]
    limit, store.write_queue_limit = store.write_queue_limit, 0    # every write skipped

    def queue_three():     # blocks 3-5: queued (their reader left them), not written
        store.write_queue_limit = limit
        for k in keys[3:]:
            assert store._queue_write(k, store.mem.get(k))
            store.mem.drop(k)

    # the two writers, waiting, each take one and are cancelled before their thread
    # starts; the third stays in the channel
    _read_all_then_stop(store, obj, data, before_stop=queue_three)
    assert store.stats.disk_writes_skipped == 6
    assert not any(store.disk.contains(k) for k in keys)
    assert len(store._cut_off) == 2 and store.write_queue_bytes == BS
    res = trio.run(store.write_back, 5.0)
    assert res == (6, 6 * BS, True) and store.written_back == [6, 6 * BS]
    assert store.write_queue_bytes == 0 and not store._queued and not store._cut_off
    assert all(store.disk.contains(k) for k in keys)
    assert trio.run(store.write_back, 5.0) == (0, 0, True)      # nothing left to write

    be2, store2, obj2 = make(tmp_path, data, delay=0)            # the next mount
    _read_all_then_stop(store2, obj2, data)
    assert be2.calls == [] and store2.stats.disk_hits == 6


def test_write_back_starts_no_write_after_its_budget(tmp_path):
    """The writes under way when the budget ends finish; no other starts; every
    block the next mount finds reads right, the rest is fetched."""
    data = payload(18, 12 * BS)
    be, store, obj = make(tmp_path, data, delay=0)
    store.write_queue_limit = 0
    _read_all_then_stop(store, obj, data)
    real_put = store.disk.put
    gate = threading.Event()

    def slow_put(bk, block):               # the first writes outlast the budget
        gate.wait(10)
        return real_put(bk, block)
    store.disk.put = slow_put
    timer = threading.Timer(2.0, gate.set)
    timer.start()
    blocks, nbytes, complete = trio.run(store.write_back, 1.0)
    timer.join()
    assert not complete and blocks == WRITE_BACK_WRITERS
    be2, store2, obj2 = make(tmp_path, data, delay=0)            # every block reads right
    _read_all_then_stop(store2, obj2, data)
    assert store2.stats.disk_hits == WRITE_BACK_WRITERS
    assert len(be2.calls) == 12 - WRITE_BACK_WRITERS


def test_write_back_during_a_disk_outage_tries_once_and_after_one_writes(tmp_path):
    """Review: a disk that refused a write earlier is tried (the outage may be over:
    then everything is written and caching resumes); one still refusing stops the
    writers after the writes under way (a write fails at once inside the disk's
    retry window), not one try per block."""
    data = payload(19, 12 * BS)
    be, store, obj = make(tmp_path, data, delay=0)
    store.write_queue_limit = 0
    _read_all_then_stop(store, obj, data)
    store.disk.writable = False
    store.disk._retry_at = time.monotonic() + 60        # still within the outage
    calls = []
    real_put = store.disk.put

    def counting_put(bk, block):
        calls.append(bk)
        return real_put(bk, block)
    store.disk.put = counting_put
    assert trio.run(store.write_back, 5.0) == (0, 0, False)
    assert len(calls) == WRITE_BACK_WRITERS              # one per writer, then stop
    assert store.disk.writable is False and not any(
        store.disk.contains(BlockKey(obj.key, obj.version, i)) for i in range(12))
    store.disk._retry_at = time.monotonic() - 1         # the retry is due: it works
    assert trio.run(store.write_back, 5.0) == (12, 12 * BS, True)
    assert store.disk.writable is True


def test_a_signal_stops_the_daemons_write_back_and_it_says_what_it_wrote(tmp_path, caplog):
    """The writes under way finish, no other starts, and the log line counts them."""
    import os
    import signal

    from neuralcache import daemon

    data = payload(21, 12 * BS)
    be, store, obj = make(tmp_path, data, delay=0)
    store.write_queue_limit = 0
    _read_all_then_stop(store, obj, data)
    real_put = store.disk.put
    timer = threading.Timer(0.1, os.kill, (os.getpid(), signal.SIGTERM))
    first = threading.Lock()

    def slow_put(bk, block):       # 3 rounds of 4 writes, 0.3 s each; the signal
        if first.acquire(blocking=False):                 # comes in round 1
            timer.start()
        time.sleep(0.3)
        return real_put(bk, block)
    store.disk.put = slow_put
    with caplog.at_level("INFO", logger="neuralcache"):
        trio.run(daemon._write_back, store)
    timer.join()
    written = store.written_back[0]
    assert written == WRITE_BACK_WRITERS                 # round 1 finished, no more
    assert "signal 15: not writing the rest of memory to the disk cache" in caplog.text
    assert (f"wrote {written} blocks" in caplog.text
            and "(not all: time was up, a signal came or the disk refused them)"
            in caplog.text)


def test_the_daemon_writes_memory_back_after_the_unmount_and_says_so(tmp_path, caplog):
    from neuralcache import daemon

    data = payload(20, 3 * BS)
    be, store, obj = make(tmp_path, data, delay=0)
    store.write_queue_limit = 0
    _read_all_then_stop(store, obj, data)
    with caplog.at_level("INFO", logger="neuralcache"):
        trio.run(daemon._write_back, store)
        assert all(store.disk.contains(BlockKey(obj.key, obj.version, i))
                   for i in range(3))
        assert "wrote 3 blocks (0.2 MiB) held only in memory to the disk cache" in caplog.text

        async def broken(budget_s):
            raise RuntimeError("a bug")
        store.write_back = broken        # a bug in it: logged, the unmount goes on
        trio.run(daemon._write_back, store)
        assert "writing memory to the disk cache failed" in caplog.text


def test_a_read_ahead_block_on_its_way_to_the_disk_is_not_counted_lost(tmp_path):
    """Review: memory evicts unread read-ahead blocks whose disk writes are still
    queued (a slow disk); a read of one before its write lands fetched it again, and
    the stats blamed the disk (``ahead_lost_disk_bytes``) for a block it never held.
    Neither tier lost it: it was on its way, and the read takes it from the write
    queue (no second GET; CI: a sequential re-read on a slow disk went remote)."""
    data = payload(21, 4 * BS)
    be, store, obj = make(tmp_path, data, mem=2 * BS, delay=0)
    gate = threading.Event()
    real_put = store.disk.put
    store.disk.put = lambda bk, d, *a: gate.wait(10) and real_put(bk, d, *a)   # a slow disk
    store._inline_writes = threading.Semaphore(0)     # every write to the writers

    async def fn():
        for i in range(4):
            store.prefetch(obj, i, lim.READAHEAD)
        while store._flights:
            await trio.sleep(0.01)
        ks = [BlockKey(obj.key, obj.version, i) for i in range(4)]
        away = [k for k in ks if store.mem.get(k) is None and k in store._queued]
        assert away                                  # evicted unread, on its way
        i = away[0].index
        fetched = len(be.calls)
        assert await store.read(obj, i * BS, BS) == data[i * BS:(i + 1) * BS]
        assert len(be.calls) == fetched and store.stats.disk_hits == 1
        assert store.cached(obj, i)                 # (nothing would prefetch it)
        gate.set()
        while store.write_queue_bytes:
            await trio.sleep(0.01)
        return store.stats.ahead_lost_disk_bytes, store.stats.ahead_lost_memory_bytes

    assert run_with_store(store, fn) == (0, 0)


@pytest.mark.parametrize("inline", [True, False])
def test_blocks_fetched_ahead_reach_the_disk_as_unread(tmp_path, inline):
    """The disk tier learns which blocks no reader has read yet (``put(unread=)``):
    those go to the back of its eviction order even if their file was read this
    epoch (store/disk.py).  Written by the fetching thread, or by the writers."""
    data = payload(31, 4 * BS)
    be, store, obj = make(tmp_path, data, delay=0)
    if not inline:
        store._inline_writes = threading.Semaphore(0)     # every write to the writers
    seen, real = {}, store.disk.put

    def put(bk, d, unread=False):
        seen[bk.index] = unread
        return real(bk, d, unread)
    store.disk.put = put

    async def fn():
        assert await store.read(obj, 0, BS) == data[:BS]           # a demand read
        store.prefetch(obj, 2, lim.PREFETCH)
        store.prefetch(obj, 3, lim.PREFETCH, stage=True)
        while store._flights or store.write_queue_bytes:
            await trio.sleep(0.01)
    run_with_store(store, fn)
    assert seen == {0: False, 2: True, 3: True}


def test_every_block_a_reader_takes_is_reported_to_the_disk_tier(tmp_path):
    """Ledger.read tells the disk tier (``DiskTier.taken``) of every block a reader
    takes: fetched ahead, a memory hit, a demand load.  A block served from memory
    left the disk's order where it was, as if still to be read this epoch, and the
    eviction took blocks still to be read before it (bench.tools.epochs: epochs 2-4
    fetched 158-178 MiB instead of 185-204)."""
    data = payload(32, 3 * BS)
    be, store, obj = make(tmp_path, data, delay=0)
    taken = []
    store.spec.taken = taken.append

    async def fn():
        store.prefetch(obj, 1, lim.PREFETCH)
        await settle(store)
        for _ in range(2):
            assert await store.read(obj, BS, BS) == data[BS:2 * BS]
        assert await store.read(obj, 0, BS) == data[:BS]
    run_with_store(store, fn)
    assert taken == [BlockKey(obj.key, obj.version, i) for i in (1, 1, 0)]


def test_a_block_the_disk_declines_is_not_queued_again(tmp_path):
    """The disk tier declines a block read this epoch where only blocks still to be
    read are left to evict (DiskTier.put); the store does not hand it to the disk
    writers, nor queue it again when the memory tier evicts it (``settled``): one
    declined put per block, no late write, no skipped one."""
    data = payload(11, 4 * BS)
    be, store, obj = make(tmp_path, data, mem=BS)          # memory holds one block
    d = DiskTier(str(tmp_path / "small"), 2 * BS)
    d.load()
    store.disk = d
    d.spent = lambda key: key == obj.key
    d.evict_rank = lambda key: 0 if key == obj.key else 1
    for i in range(2):                                      # full: still to be read
        assert d.put(BlockKey("other", "v", i), bytes(BS))

    async def fn():
        for i in range(3):
            assert await store.read(obj, i * BS, BS) == data[i * BS:(i + 1) * BS]
            await settle(store)
    run_with_store(store, fn)
    assert d.declined == 3 and all(d.settled(BlockKey(obj.key, obj.version, i))
                                   for i in range(3))
    assert not d.settled(BlockKey(obj.key, obj.version, 3))
    assert d.contains(BlockKey("other", "v", 0)) and d.contains(BlockKey("other", "v", 1))
    assert store.stats.disk_writes_late == 0 and store.stats.disk_writes_skipped == 0

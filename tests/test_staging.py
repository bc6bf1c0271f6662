"""Staged prefetch: once memory's prefetch budget is full, prefetched blocks go to the
disk tier and not to memory, within the disk's own budget (no kernel)."""
import pytest
import trio

from neuralcache.ahead.prefetch import MIN_INFLIGHT_BYTES, Prefetcher
from neuralcache.namespace import Namespace
from neuralcache.stats import Stats
from neuralcache.store import limiter as lim
from neuralcache.store.blocks import BlockStore, Pinned
from neuralcache.store.speculative import STAGE_ENTRIES_MAX, Ledger
from neuralcache.store.tiers import BlockKey, DiskTier, MemoryTier

from conftest import cli_env, digest, mounted, needs_fuse, new_bucket, payload, upload_tree
from test_blockstore import BS, make, run_with_store
from test_prefetch import FakeBackend, P, Scripted, run


async def settle(store):
    while store._flights or store.write_queue_bytes:
        await trio.sleep(0.01)


def test_a_staged_block_goes_to_disk_not_memory_and_reading_it_there_counts_as_used(tmp_path):
    data = payload(21, 3 * BS)
    be, store, obj = make(tmp_path, data, delay=0.1)
    bk = BlockKey(obj.key, obj.version, 0)

    async def fn():
        room = store.stage_room()
        assert room == store.stage_limit > 0
        assert store.prefetch(obj, 0, lim.PREFETCH, stage=True)
        await trio.sleep(0.03)
        assert store.stage_room() == room - BS        # in flight, bound for disk
        assert store.speculative_unread_bytes() == 0  # ... not for memory
        await settle(store)
        assert store.mem.get(bk) is None and store.disk.contains(bk)
        assert store.stage_room() == room - BS
        assert store.stats.prefetch_bytes_staged == BS
        assert store.stats.prefetch_bytes_used == 0
        assert await store.read(obj, 0, BS) == data[:BS]     # from disk
        assert len(be.calls) == 1
        assert store.stats.prefetch_bytes_used == BS
        assert store.stage_room() == room
        assert store.speculative_unread_bytes() == 0

    run_with_store(store, fn)


def test_a_staged_load_a_reader_joins_lands_in_memory(tmp_path):
    data = payload(22, 2 * BS)
    be, store, obj = make(tmp_path, data, delay=0.2)

    async def fn():
        assert store.prefetch(obj, 1, lim.PREFETCH, stage=True)
        await trio.sleep(0.05)
        assert await store.read(obj, BS, BS) == data[BS:]     # joins the load
        await settle(store)
        assert store.mem.get(BlockKey(obj.key, obj.version, 1)) is not None
        assert store.stats.prefetch_bytes_staged == 0
        assert store.stats.prefetch_bytes_used == BS
        assert store.stage_room() == store.stage_limit

    run_with_store(store, fn)
    assert len(be.calls) == 1


def test_the_disk_budget_and_free_space_bound_staging(tmp_path):
    """Within ``stage_limit``, forgetting what the disk evicted unread; within the free
    space (evicting to stage took blocks the epoch still had to read)."""
    data = payload(23, 3 * BS)
    be, store, obj = make(tmp_path, data, delay=0)
    store.stage_limit = 2 * BS

    async def fn():
        for i in range(2):
            assert store.prefetch(obj, i, lim.PREFETCH, stage=True)
            await settle(store)
        assert store.stage_room() == 0
        store.disk.drop(BlockKey(obj.key, obj.version, 0))   # evicted unread
        assert store.stage_room() == BS
        store.disk.writable = False                          # a failed disk write
        assert store.stage_room() == 0
        store.disk.writable = True
        store.disk.limit = store.disk.used + BS + 1000       # staging never evicts
        assert store.stage_room() == 1000

    run_with_store(store, fn)
    # no disk tier: nothing can be staged, and a staged load is an ordinary one
    (tmp_path / "nodisk").mkdir()
    be, store, obj = make(tmp_path / "nodisk", data, disk=False, delay=0)

    async def fn2():
        assert store.stage_room() == 0
        assert store.prefetch(obj, 0, lim.PREFETCH, stage=True)
        await settle(store)
        return store.speculative_unread_bytes()

    assert run_with_store(store, fn2) == BS


def test_prefetch_past_the_memory_budget_is_staged_within_the_disk_budget(tmp_path):
    """20 files of 1 MiB predicted as a shuffled epoch's working set, a 4 MiB memory
    budget: the first go to memory, the rest of one pump's in-flight target (16 MiB) to
    the disk tier; with a 6 MiB disk budget only that much is staged.  An ordered
    source's (hints) are not staged: deeper, they reach only the far future."""
    mib = 1 << 20
    for source, stage_limit, staged in (("epochset", 1 << 30, MIN_INFLIGHT_BYTES - 4 * mib),
                                        ("epochset", 6 * mib, 6 * mib),
                                        ("hints", 1 << 30, 0)):
        objs = [(f"f{i:02d}", mib) for i in range(20)]
        ns = Namespace()
        for k, s in objs:
            ns.put_file(k, s, "v", 0.0)
        be = FakeBackend()
        disk = DiskTier(str(tmp_path / f"{source}{stage_limit}"), 1 << 30)
        disk.load()
        store = BlockStore(be, MemoryTier(1 << 30), disk, Stats(), block_size=8 * mib,
                           concurrency=32)
        store.stage_limit = stage_limit
        pf = Prefetcher(ns, store, Scripted([P(k, 0, s, 1.0, 1.0, source) for k, s in objs]),
                        budget_bytes=4 * mib)
        run(store, lambda: pf.on_open("x", 1, 1))
        in_memory = [k for k, _ in objs if store.mem.get(BlockKey(k, "v", 0)) is not None]
        on_disk = [k for k, _ in objs if store.disk.contains(BlockKey(k, "v", 0))]
        assert in_memory == [f"f{i:02d}" for i in range(4)]
        assert store.stats.prefetch_bytes_staged == staged
        assert len(be.calls) == 4 + staged // mib
        assert set(on_disk) >= {k for k, _ in objs[4:4 + staged // mib]}


def test_a_staged_load_the_shared_tier_answers_goes_to_disk_not_memory(tmp_path):
    """Another node fetched the blocks (the shared tier answers): a staged load is
    not stored by its thread, so the background writers take it, and memory's full
    budget is not overrun pump after pump."""
    mib = 1 << 20

    class SharedHit:
        async def get(self, bk, length, prefetch=False, urgent=lambda: True):
            return bytes(length)

        def fetched(self, bk, data):
            pass

    objs = [(f"f{i:02d}", mib) for i in range(40)]
    ns = Namespace()
    for k, s in objs:
        ns.put_file(k, s, "v", 0.0)
    disk = DiskTier(str(tmp_path / "cache"), 1 << 30)
    disk.load()
    store = BlockStore(FakeBackend(), MemoryTier(1 << 30), disk, Stats(),
                       block_size=8 * mib, concurrency=32)
    store.shared = SharedHit()
    pf = Prefetcher(ns, store, Scripted([P(k, 0, s, 1.0, 1.0, "epochset") for k, s in objs]),
                    budget_bytes=4 * mib)

    async def fn():
        for _ in range(3):
            pf._skip = 0
            pf._pump()
            await trio.sleep(0.05)
            await settle(store)

    run_with_store(store, fn)
    assert store.speculative_unread_bytes() <= pf.budget + mib
    in_memory = [k for k, _ in objs if store.mem.get(BlockKey(k, "v", 0)) is not None]
    assert in_memory == [f"f{i:02d}" for i in range(4)]          # memory's budget
    assert all(disk.contains(BlockKey(k, "v", 0)) for k, _ in objs)
    assert store.stats.prefetch_bytes_staged == 36 * mib         # the rest: disk only


def test_a_staged_load_that_finds_no_write_slot_gives_up_and_goes_to_the_writers(
        tmp_path, monkeypatch):
    """A stalled disk (every inline write slot held): the staged load's thread waits
    STAGE_SLOT_WAIT_S, not for ever, and the block goes through the writers."""
    import neuralcache.store.blocks as blocks
    monkeypatch.setattr(blocks, "STAGE_SLOT_WAIT_S", 0.1)
    data = payload(24, 2 * BS)
    be, store, obj = make(tmp_path, data, delay=0)
    for _ in range(blocks.DISK_THREADS):
        assert store._inline_writes.acquire(False)

    async def fn():
        assert store.prefetch(obj, 0, lim.PREFETCH, stage=True)
        with trio.fail_after(5):
            await settle(store)
        bk = BlockKey(obj.key, obj.version, 0)
        assert store.mem.get(bk) is None and store.disk.contains(bk)
        assert store.stats.prefetch_bytes_staged == BS

    run_with_store(store, fn)


def test_siblings_are_not_warmed_past_memorys_budget_when_the_disk_has_room(tmp_path):
    """Sibling warming loads into memory, never stages: the disk's room does not let it
    past memory's full prefetch budget."""
    mib = 1 << 20
    for with_disk in (False, True):
        ns = Namespace()
        ns.put_file("other", 4 * mib, "v", 0.0)
        for i in range(8):
            ns.put_file(f"d/s{i}", mib, "v", 0.0)
        disk = None
        if with_disk:
            disk = DiskTier(str(tmp_path / "cache"), 1 << 30)
            disk.load()
        store = BlockStore(FakeBackend(), MemoryTier(1 << 30), disk, Stats(),
                           block_size=8 * mib, concurrency=32)
        pf = Prefetcher(ns, store, Scripted([]), budget_bytes=2 * mib)

        async def fn():
            store.prefetch(Pinned("other", "v", 4 * mib), 0, lim.PREFETCH)  # budget full
            await settle(store)
            started = pf._warm_siblings("d/s0")
            await settle(store)
            return started, store.speculative_unread_bytes()

        assert run_with_store(store, fn) == (0, 4 * mib), with_disk


def test_the_ledger_forgets_evicted_entries_when_its_entry_cap_binds_first():
    """Many small staged files reach STAGE_ENTRIES_MAX before the byte budget: entries
    the disk evicted unread are forgotten then too, or staging stayed off."""
    led = Ledger(Stats())
    for i in range(STAGE_ENTRIES_MAX):
        led.staged(BlockKey(f"f{i}", "v", 0), lim.PREFETCH, 10_000)
    assert led.stage_room(10 << 30, lambda bk: True) == 0        # all still on disk
    assert led.stage_room(10 << 30, lambda bk: False) == 10 << 30  # all evicted
    assert led.on_disk == 0


@needs_fuse
@pytest.mark.e2e
def test_a_shuffled_epoch_larger_than_memory_is_staged_and_read_back_exactly(seaweed, s3,
                                                                          tmp_path):
    """A real mount whose memory tier (8 MiB: a 4 MiB prefetch budget) is far below a
    shuffled epoch of 400 x 50 KB files: the prefetcher stages past the budget, every
    byte read (by 4 threads, each file once) equals the source, and nothing is fetched
    twice."""
    import json
    import random
    from concurrent.futures import ThreadPoolExecutor
    from pathlib import Path

    bucket = new_bucket(s3)
    files = {f"train/c{i % 4}/s{i:04d}.jpg": payload(3000 + i, 50_000 + i) for i in range(400)}
    upload_tree(s3, bucket, files)
    order = list(files)
    random.Random(7).shuffle(order)
    with mounted(f"s3://{bucket}", tmp_path / "mnt", env=cli_env(seaweed),
                 cache_dir=tmp_path / "cache",
                 args=["--endpoint-url", seaweed.endpoint, "--memory-cache-size", "8M"]) as mp:
        def read(k):
            return digest((mp / k).read_bytes()) == digest(files[k])

        with ThreadPoolExecutor(4) as pool:
            assert all(pool.map(read, order))
        s = json.loads((Path(mp) / ".neuralcache" / "stats.json").read_text())
    assert s["prefetch_bytes_staged"] > 0, s
    assert s["prefetch_bytes_used"] > s["prefetch_bytes_staged"] // 2, s
    assert s["bytes_fetched"] == sum(map(len, files.values())), s

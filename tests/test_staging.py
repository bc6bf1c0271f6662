"""Staged prefetch: once memory's prefetch budget is full, prefetched blocks go to the
disk tier and not to memory, within the disk's own budget (no kernel)."""
import pytest
import trio

from neuralcache.ahead.prefetch import MIN_INFLIGHT_BYTES, Prefetcher
from neuralcache.namespace import Namespace
from neuralcache.stats import Stats
from neuralcache.store import limiter as lim
from neuralcache.store.blocks import BlockStore
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

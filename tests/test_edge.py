"""The FUSE edge (fs/operations.py) called directly, without a kernel: races that a
mount hits only under load, driven here step by step."""
import errno
import os

import pyfuse3
import pytest
import trio

from neuralcache.backends.base import ObjectInfo
from neuralcache.errors import NotFound
from neuralcache.fs.operations import FileHandle, Operations
from neuralcache.fs.trace import TraceRing
from neuralcache.meta.lister import Lister
from neuralcache.namespace import Namespace
from neuralcache.stats import Stats
from neuralcache.store.blocks import Pinned
from neuralcache.write.opqueue import OpQueue

OLD, NEW = "ckpt/.metadata.tmp", "ckpt/.metadata"
DATA = b"pickled metadata"


class Writes:
    """What Operations asks of a --writable mount's write layer on this path."""
    repin = invalidate_entry = None

    def __init__(self):
        self.queue = OpQueue()       # (held deletes: the edge counts open readers)

    def owns(self, h):
        return False

    def counting(self, edge):          # (write/readers.py: no journal readers here)
        return lambda inode: edge.get(inode, 0)

    async def follow_remote(self, h, off, size):
        return None            # not written here: read the remote as pinned


class MovingStore:
    """A store whose fetch of the old key is overtaken by the rename's copy + delete:
    the move finishes (the edge repins open handles) and the GET then finds nothing."""

    def __init__(self, ops_ref: list, moved: bool = True):
        self.ops_ref, self.moved, self.reads = ops_ref, moved, []

    async def read(self, p: Pinned, off: int, size: int):
        self.reads.append(p.key)
        if p.key == OLD:
            if self.moved:
                self.ops_ref[0]._repin(ObjectInfo(NEW, len(DATA), "etag-2", 0.0), key=OLD)
            raise NotFound(f"{p.key}: 404 NoSuchKey")
        return DATA[off:off + size]


def edge(store, writes=None) -> Operations:
    ns = Namespace()
    return Operations(ns, Lister(ns, None, ttl=60), store, None, Stats(), metadata_ttl=60,
                      readahead_bytes=0, trace=TraceRing(0), controls=None,
                      writes=writes or Writes())


def open_old(ops: Operations) -> int:
    ns = ops.ns
    node = ns.put_file(NEW, len(DATA), "etag-1", 0.0)
    return ops._new_fh(FileHandle(node, Pinned(OLD, "etag-1", len(DATA)), None, 1))


def test_read_racing_a_rename_reads_the_copy():
    ref: list = []
    store = MovingStore(ref)
    ops = edge(store)
    ref.append(ops)
    fh = open_old(ops)
    assert trio.run(ops.read, fh, 0, 100) == DATA
    assert store.reads == [OLD, NEW] and ops.stats.read_errors == 0


def test_a_gone_object_that_was_not_moved_is_enoent():
    ref: list = []
    store = MovingStore(ref, moved=False)
    ops = edge(store)
    ref.append(ops)
    fh = open_old(ops)
    with pytest.raises(pyfuse3.FUSEError) as e:
        trio.run(ops.read, fh, 0, 100)
    assert e.value.errno == errno.ENOENT
    assert store.reads == [OLD] and ops.stats.read_errors == 1


def test_dropping_a_changed_files_pages_leaves_the_request_thread_free(monkeypatch):
    """The kernel drops an inode's pages under their page locks, and a READ in flight
    holds its page locked until the request thread answers it: the drop must not run
    on that thread (it would wait for itself)."""
    import threading

    answered = threading.Event()
    calls = []

    def invalidate_inode(inode, attr_only=False):
        calls.append((inode, threading.current_thread() is threading.main_thread()))
        assert answered.wait(5), "the READ was never answered: the request thread waited"

    monkeypatch.setattr(pyfuse3, "invalidate_inode", invalidate_inode)
    ops = edge(MovingStore([]))

    async def main():
        async with trio.open_nursery() as n:
            await n.start(ops.pages.run)
            ops._kernel_version.set(7, "etag-1")
            ops._invalidate_inode(7)
            await trio.sleep(0.05)          # the request thread still serves (the READ)
            answered.set()
            while not calls:
                await trio.sleep(0.01)
            n.cancel_scope.cancel()

    trio.run(main)
    assert calls == [(7, False)] and ops._kernel_version.get_same(7, "etag-1") is None


def test_the_kernels_versions_are_one_hash_per_inode():
    """Whether the kernel's pages of an inode are of the version being opened: unknown
    until it is opened, then the same or not, forgotten on a change; inodes past the
    array in its dict; the array costs memory only where written."""
    from neuralcache.fs.pagedrop import ARRAY_INODES, KernelVersions

    def rss_mb():
        with open("/proc/self/status") as f:
            return next(int(x.split()[1]) for x in f if x.startswith("VmRSS")) / 1024

    r0 = rss_mb()
    kv = KernelVersions()
    for big in (False, True):
        base = ARRAY_INODES + 10 if big else 0
        assert kv.get_same(base + 5, "a") is None
        kv.set(base + 5, "v1")
        kv.set(base + 70_000, "v2")
        assert kv.get_same(base + 5, "v1") is True and kv.get_same(base + 5, "v2") is False
        assert kv.get_same(base + 70_000, "v2") is True
        assert kv.get_same(base + 69_999, "v2") is None
        kv.set(base + 5, "v2")
        assert kv.get_same(base + 5, "v2") is True and kv.get_same(base + 5, "v1") is False
        kv.forget(base + 5)
        kv.forget(base + 6)                  # never seen: nothing to forget
        assert kv.get_same(base + 5, "v2") is None and kv.get_same(base + 70_000, "v2")
    assert len(kv._over) == 1
    for ino in range(1, ARRAY_INODES, ARRAY_INODES // 64):   # 64 scattered opens
        kv.set(ino, "v")
    assert rss_mb() - r0 < 16               # of the array's 128 MB: pages written only


def test_a_mass_change_drops_each_inode_once_in_few_thread_hand_offs(monkeypatch):
    """A refresh that finds thousands of changed files: each inode's pages are dropped
    once however often it is queued, oldest first, in one thread at a time and one
    hand-off per DROP_BATCH inodes (it was a task and a thread per inode)."""
    import threading

    from neuralcache.fs import pagedrop

    calls, threads, hand_offs = [], set(), []
    monkeypatch.setattr(pyfuse3, "invalidate_inode",
                        lambda inode, attr_only=False: (calls.append(inode),
                                                        threads.add(threading.get_ident())))
    real = pagedrop._drop_all
    monkeypatch.setattr(pagedrop, "_drop_all",
                        lambda b, stop: (hand_offs.append(len(b)), real(b, stop)))
    ops = edge(MovingStore([]))
    n_files = 5 * pagedrop.DROP_BATCH + 3

    async def main():
        async with trio.open_nursery() as n:
            await n.start(ops.pages.run)
            for ino in range(100, 100 + n_files):
                ops._invalidate_inode(ino)
            for ino in range(100, 110):        # changed again before the drop: once
                ops._invalidate_inode(ino)
            with trio.fail_after(5):
                while ops.pages.pending() or ops.pages.dropped < n_files:
                    await trio.sleep(0.01)
            n.cancel_scope.cancel()

    trio.run(main)
    assert calls == list(range(100, 100 + n_files))
    assert len(hand_offs) == 6 and max(hand_offs) == pagedrop.DROP_BATCH
    assert threading.get_ident() not in threads


def test_an_open_of_a_changed_file_drops_its_old_size_at_once(monkeypatch):
    """CI under load (test_replaced_object_never_mixes_versions): a refresh found a new
    version, its page drop still queued for a worker, and the open pinned the new
    version while the kernel kept the old size from an earlier lookup: the read got the
    new bytes only up to the old length.  The open invalidates the attributes at once
    (on the request thread: no page lock), the pages still go in the worker."""
    import threading

    calls = []
    monkeypatch.setattr(pyfuse3, "invalidate_inode", lambda inode, attr_only=False: calls.append(
        (inode, attr_only, threading.current_thread() is threading.main_thread())))
    ops = edge(MovingStore([]))
    ops.writes = None                            # a read-only mount
    node = ops.ns.put_file("w.bin", 5, "etag-2", 0.0)
    ops._kernel_version.set(node.inode, "etag-1")
    ops._invalidate_inode(node.inode)            # the refresh: queued, not dropped yet

    class Ctx:
        pid, uid, gid = 1, 0, 0

    async def main():
        await ops.open(node.inode, os.O_RDONLY | os.O_DIRECT, Ctx())   # (no push)

    trio.run(main)
    assert calls == [(node.inode, True, True)]


class BlockStore1M:
    """A store of 1 MiB blocks that records which blocks readers left behind."""
    block_size = 1 << 20

    def __init__(self):
        self.consumed_blocks = []

    def nblocks(self, p):
        return -(-p.size // self.block_size)

    def consumed(self, p, i):
        self.consumed_blocks.append((p.key, i))


def test_closing_a_file_read_whole_gives_its_blocks_back():
    """A file read to its end in one stream: its close gives every block back to the
    store (the page cache has the bytes; the memory tier kept 1 GB of 8 MB shards,
    each one block the stream never left behind).  A file read in part keeps them."""
    from neuralcache.ahead.readahead import ReadAhead

    store = BlockStore1M()
    ops = edge(store)
    node = ops.ns.put_file("shard-0.tar", 3 << 20, "etag-1", 0.0)
    handles = []
    # whole; only the first MiB; whole with O_DIRECT (nothing in the page cache)
    for upto, direct in ((3 << 20, False), (1 << 20, False), (3 << 20, True)):
        ra = ReadAhead(store.block_size)
        for i, off in enumerate(range(0, upto, 128 << 10)):
            ra.on_read(off, 128 << 10, 3, 0.06, now=i * 1e-4)
        handles.append(ops._new_fh(FileHandle(node, Pinned(node.key, "etag-1", 3 << 20),
                                              ra, 1, direct=direct)))
    ops._reading[node.inode] = 3
    trio.run(ops.release, handles[1])
    trio.run(ops.release, handles[2])
    assert store.consumed_blocks == []
    trio.run(ops.release, handles[0])
    assert store.consumed_blocks == [(node.key, 0), (node.key, 1), (node.key, 2)]


def test_a_read_gives_the_predictor_its_deferred_opens_before_the_load():
    """An open counted warm is deferred (Prefetcher.on_open); its READ reaching the
    daemon means the pages were gone, and the load that follows stores the block on
    the disk tier, which asks the epoch tracker whether the file was read this epoch.
    The predictor hears of the open before the load (``reading``), not after it."""
    calls = []

    class Store:
        async def read(self, p, off, size):
            calls.append("load")
            return DATA[off:off + size]

    class Prefetcher:
        def reading(self):
            calls.append("reading")

        def on_read(self, *a):
            calls.append("on_read")

    ops = edge(Store())
    ops.prefetcher = Prefetcher()
    node = ops.ns.put_file(NEW, len(DATA), "etag-1", 0.0)
    fh = ops._new_fh(FileHandle(node, Pinned(NEW, "etag-1", len(DATA)), None, 1))
    assert trio.run(ops.read, fh, 0, 100) == DATA
    assert calls == ["reading", "load", "on_read"]

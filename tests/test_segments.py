"""The disk tier's segment files (blocks of at most PACK_MAX bytes), without a mount:
round trip, restart, corruption, eviction giving space back, disk full, concurrency."""
import errno
import os
import random
import shutil
import threading
import time

import pytest

from neuralcache.store import disk as disk_mod
from neuralcache.store import segments
from neuralcache.store.tiers import BlockKey, DiskTier, stored_blocks


def seg_files(tmp_path, ext="seg"):
    return sorted((tmp_path / "blocks" / "segments").glob(f"*.{ext}"))


def held_bytes(tmp_path) -> int:
    """Bytes the segment files hold on disk (punched holes hold none), less one page a
    file: a file with many holes needs an extent tree block (ext4)."""
    return sum(max(0, p.stat().st_blocks * 512 - 4096) for p in seg_files(tmp_path))


def tier(tmp_path, limit=1 << 30, **kw) -> DiskTier:
    d = DiskTier(str(tmp_path), limit, **kw)
    d.load()
    return d


def test_small_blocks_share_one_file_and_big_ones_keep_theirs(tmp_path):
    d = tier(tmp_path)
    sizes = [1, 100, 4096 - 40, 4096 - 39, 100_000, 3 << 20, disk_mod.PACK_MAX,
             disk_mod.PACK_MAX + 1]
    data = {BlockKey("f", "v", i): os.urandom(n) for i, n in enumerate(sizes)}
    for k, v in data.items():
        assert d.put(k, v)
    for k, v in data.items():
        assert bytes(d.get(k)) == v
    assert len(seg_files(tmp_path)) == 1 and len(seg_files(tmp_path, "idx")) == 1
    files = [p for p in (tmp_path / "blocks").glob("??/*")]
    assert len(files) == 1                          # PACK_MAX + 1
    # each record: whole pages at a page offset, data first, the key hash in its trailer
    for k, v in data.items():
        path, off, n = d.locate(k)
        assert n == len(v) and off % 4096 == 0
        with open(path, "rb") as f:
            f.seek(off)
            raw = f.read(segments.record_size(n) if path.endswith(".seg") else 1 << 30)
        assert raw[:n] == v and len(raw) % 4096 == 0
        if path.endswith(".seg"):
            assert raw.endswith(b"NCS1") and bytes.fromhex(k.name()) in raw[-40:]
    assert d.used == sum(sizes) and len(d) == len(sizes)


def test_segments_reload_in_write_order_and_evicted_records_stay_dead(tmp_path):
    d = tier(tmp_path, segment_bytes=64 << 10)     # 16 pages: a few records per segment
    keys = [BlockKey("f", "v", i) for i in range(48)]
    for k in keys:
        assert d.put(k, k.name().encode() * 100)     # 3.2 KB: one page each
    assert len(seg_files(tmp_path)) == 3
    d.drop(keys[5])
    d2 = DiskTier(str(tmp_path), 30 * 3200)          # room for the 30 newest
    assert d2.load() == 30
    assert all(d2.get(k) is None for k in keys[:18])
    assert all(bytes(d2.get(k)) == k.name().encode() * 100 for k in keys[18:])
    assert d2.used == 30 * 3200 and d2.corrupt_blocks == 0
    # the first segment lost all its records: deleted, with its log
    assert len(seg_files(tmp_path)) == 2 and len(seg_files(tmp_path, "idx")) == 2
    d3 = tier(tmp_path)
    assert len(d3) == 30 and d3.get(keys[5]) is None


def test_the_newest_copy_of_a_block_wins_at_start(tmp_path):
    k = BlockKey("f", "v", 0)
    d = tier(tmp_path)
    assert d.put(k, b"old" * 10)
    d2 = DiskTier(str(tmp_path), 1 << 30)            # not loaded: knows nothing
    assert d2.put(k, b"new" * 10)
    d3 = tier(tmp_path)
    assert len(d3) == 1 and bytes(d3.get(k)) == b"new" * 10 and d3.used == 30
    assert len(stored_blocks(str(tmp_path))) == 1


def test_block_files_and_records_reload_in_one_write_order(tmp_path):
    """Start-up merges the block files (blocks over pack_max) with the segments'
    records by when each was stored, one block at a time (not all in one list): a
    limit that keeps the newest N keeps exactly the last N written, of either kind, and
    a block stored again (a record, then a file) keeps only its newest copy."""
    d = tier(tmp_path, segment_bytes=64 << 10, pack_max=8192)
    keys = []
    for i in range(24):
        k = BlockKey("f", "v", i)
        n = 20_000 if i % 3 == 0 else 3_000           # a file, else a record
        assert d.put(k, bytes([i]) * n)
        keys.append(k)
        time.sleep(0.02)                   # mtimes and segment births apart
    again = BlockKey("f", "v", 1)          # a record, stored again below as a file
    d2 = DiskTier(str(tmp_path), 1 << 30, pack_max=8192)   # not loaded: knows nothing
    assert d2.put(again, b"\xee" * 20_000)
    keys = keys[:1] + keys[2:] + [again]
    want = keys[-10:]
    copy = tmp_path / "copy"               # what each counts (a file: up to its pages),
    shutil.copytree(tmp_path / "blocks", copy / "blocks")  # from a copy: d3 sees both
    room = tier(copy)._index
    d3 = DiskTier(str(tmp_path), sum(segments.loc_len(room[k.name()]) for k in want))
    assert d3.load() == 10
    assert [k.index for k in keys if d3.contains(k)] == [k.index for k in want]
    assert bytes(d3.get(again)) == b"\xee" * 20_000
    assert len(stored_blocks(str(tmp_path))) == 10


def test_a_file_copy_timed_between_a_segments_records_kills_only_its_record(tmp_path):
    """A segment's first record replaced by a block file whose mtime falls before the
    segment's next record (records are timed by estimate): the segment keeps its other
    records and the daemon starts (counting and killing one block at a time dropped the
    segment halfway through the load, and the next record found it gone)."""
    d = tier(tmp_path)
    x, y = BlockKey("f", "v", 0), BlockKey("f", "v", 1)
    assert d.put(x, b"x" * 3000)
    time.sleep(0.05)
    assert d.put(y, b"y" * 3000)
    (seg,) = seg_files(tmp_path)
    born = int(seg.name[:-4], 16) / 1e9
    os.utime(seg, (born + 1.0, born + 1.0))     # y's record timed at born + 0.5 s
    d2 = DiskTier(str(tmp_path), 1 << 30, pack_max=0)  # not loaded; x again, as a file
    assert d2.put(x, b"X" * 3000)
    (f,) = [p for p in (tmp_path / "blocks").glob("??/*") if p.is_file()]
    os.utime(f, (born + 0.1, born + 0.1))       # between x's record and y's
    d3 = tier(tmp_path)
    assert len(d3) == 2 and d3.used == 3000 + segments.loc_len(d3._index[x.name()])
    assert bytes(d3.get(x)) == b"X" * 3000 and bytes(d3.get(y)) == b"y" * 3000
    assert seg_files(tmp_path) == [seg]


@pytest.mark.parametrize("damage", ["data", "trailer", "hash", "zeros"])
def test_a_corrupt_record_is_a_miss_and_its_neighbours_serve(tmp_path, damage):
    d = tier(tmp_path)
    keys = [BlockKey("f", "v", i) for i in range(3)]
    for k in keys:
        assert d.put(k, bytes([k.index]) * 10_000)
    path, off, n = d.locate(keys[1])
    with open(path, "r+b") as f:
        f.seek(off)
        rec = bytearray(f.read(segments.record_size(n)))
        if damage == "data":
            rec[n // 2] ^= 1
        elif damage == "trailer":
            rec[-1] ^= 1
        elif damage == "hash":
            rec[-40] ^= 1
        else:
            rec[:] = bytes(len(rec))
        f.seek(off)
        f.write(rec)
    assert d.get(keys[1]) is None
    assert d.corrupt_blocks == 1 and not d.contains(keys[1]) and len(d) == 2
    assert bytes(d.get(keys[0])) == bytes([0]) * 10_000
    assert bytes(d.get(keys[2])) == bytes([2]) * 10_000
    d2 = tier(tmp_path)                              # dropped for good
    assert len(d2) == 2 and d2.get(keys[1]) is None and d2.corrupt_blocks == 0


def test_verify_all_finds_a_bad_record(tmp_path):
    d = tier(tmp_path)
    for i in range(5):
        d.put(BlockKey("f", "v", i), os.urandom(5000))
    path, off, _ = d.locate(BlockKey("f", "v", 3))
    with open(path, "r+b") as f:
        f.seek(off + 7)
        b = f.read(1)[0]
        f.seek(off + 7)
        f.write(bytes([b ^ 0xFF]))    # a change whatever the byte was (random data)
    assert tier(tmp_path).verify_all() == (4, 1)
    assert tier(tmp_path).verify_all() == (4, 0)


def test_truncated_or_garbled_segments_and_logs_never_crash(tmp_path):
    d = tier(tmp_path, segment_bytes=256 << 10)
    keys = [BlockKey("f", "v", i) for i in range(100)]
    data = {k: os.urandom(9000) for k in keys}       # 3 pages: 21 records a segment
    for k in keys:
        d.put(k, data[k])
    segs = seg_files(tmp_path)
    assert len(segs) == 5
    os.truncate(segs[0], 10 * 4096 + 100)            # a torn tail: 3 records left whole
    with open(segs[1], "r+b") as f:                  # random bytes over a whole segment
        f.write(os.urandom(segs[1].stat().st_size))
    # a garbled log entry: only that record is lost; and a torn tail
    log = segs[2].with_suffix(".idx")
    raw = bytearray(log.read_bytes())
    raw[5 * 32 + 3] ^= 0xFF
    log.write_bytes(bytes(raw) + b"torn")
    (segs[3].with_suffix(".idx")).write_bytes(os.urandom(1000))   # garbage log
    d2 = DiskTier(str(tmp_path), 1 << 30)
    assert d2.load() == 3 + 21 + 20 + 0 + 16
    assert log.stat().st_size == 21 * 32          # the torn tail is cut
    got = {k: d2.get(k) for k in keys}
    assert sum(v is not None for v in got.values()) == 3 + 20 + 16
    assert all(bytes(v) == data[k] for k, v in got.items() if v is not None)
    assert d2.corrupt_blocks == 21                   # segs[1]'s records
    assert not segs[3].exists()                      # no record left: deleted


def test_a_segment_truncated_under_a_running_tier(tmp_path):
    d = tier(tmp_path)
    keys = [BlockKey("f", "v", i) for i in range(3)]
    for k in keys:
        assert d.put(k, bytes([k.index]) * 10_000)  # 3 pages each
    path, off, _ = d.locate(keys[1])
    os.truncate(path, off + 4096)
    assert [d.get(k) is None for k in keys] == [False, True, True]
    assert d.corrupt_blocks == 2 and len(d) == 1


def test_eviction_punches_pages_out_and_deletes_dead_segments(tmp_path):
    d = tier(tmp_path, limit=64 * 100_000, segment_bytes=2 << 20)
    for i in range(400):
        assert d.put(BlockKey("f", "v", i), os.urandom(100_000))
    assert d.used <= 64 * 100_000 and len(d) == 64
    # 104 KiB per live record on disk, nothing for the 336 evicted ones
    assert held_bytes(tmp_path) <= 64 * segments.record_size(100_000)
    # 20 records a segment: the oldest segments died whole and were deleted
    assert len(seg_files(tmp_path)) <= 5
    assert len(stored_blocks(str(tmp_path))) == 64
    for i in range(336, 400):
        assert d.get(BlockKey("f", "v", i)) is not None


def test_random_eviction_keeps_disk_bytes_at_the_live_bytes(tmp_path):
    """Per-block eviction leaves sparse segments (epoch-aware ranks pick blocks all
    over); the holes keep what the disk holds equal to what is counted."""
    rng = random.Random(1)
    d = tier(tmp_path, limit=200 * 20_000, segment_bytes=1 << 20)
    d.evict_rank = lambda key: rng.random()
    for i in range(2000):
        assert d.put(BlockKey(f"f{i}", "v", 0), os.urandom(20_000))
    live_pages = len(d) * segments.record_size(20_000)
    assert live_pages - 4096 * len(seg_files(tmp_path)) <= held_bytes(tmp_path) <= live_pages
    d2 = tier(tmp_path, limit=200 * 20_000)
    assert len(d2) == len(d) and d2.verify_all() == (len(d), 0)


def test_disk_full_serves_reads_and_retries_writes(tmp_path, monkeypatch, caplog):
    d = tier(tmp_path, write_retry_s=0.3)
    old = BlockKey("old", "v", 0)
    assert d.put(old, b"o" * 5000)
    real = os.pwrite
    full = True

    def pwrite(fd, data, offset):
        if full:
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(fd, data, offset)

    monkeypatch.setattr(os, "pwrite", pwrite)
    assert d.put(BlockKey("a", "v", 0), b"a" * 5000) is False
    assert d.writable is False and d.used == 5000 and len(d) == 1
    assert d.put(BlockKey("b", "v", 0), b"b" * 5000) is False   # resting: not tried
    assert bytes(d.get(old)) == b"o" * 5000                      # reads still served
    time.sleep(0.35)
    assert d.put(BlockKey("b", "v", 0), b"b" * 5000) is False   # the retry: still full
    assert caplog.text.count("disk cache write failed") == 1
    full = False
    time.sleep(0.35)
    assert d.put(BlockKey("c", "v", 0), b"c" * 5000) is True
    assert d.writable is True and "caching resumed" in caplog.text
    d2 = tier(tmp_path)                  # the failed records left nothing behind
    assert len(d2) == 2 and d2.verify_all() == (2, 0)
    assert held_bytes(tmp_path) <= 2 * 8192


def test_without_hole_punching_blocks_get_files(tmp_path, monkeypatch, caplog):
    def no_punch(fd, offset, nbytes):
        raise OSError(errno.EOPNOTSUPP, "Operation not supported")

    monkeypatch.setattr(segments, "punch_hole", no_punch)
    d = tier(tmp_path)
    k = BlockKey("f", "v", 0)
    assert d.put(k, b"x" * 100) and bytes(d.get(k)) == b"x" * 100
    assert d.pack is False and not seg_files(tmp_path)
    assert d.locate(k)[0].endswith(k.name())


def test_without_o_direct_segments_go_through_the_page_cache(tmp_path):
    d = tier(tmp_path)
    d.direct = False
    k = BlockKey("f", "v", 0)
    assert d.put(k, b"y" * 100_000)
    assert bytes(d.get(k)) == b"y" * 100_000
    assert bytes(tier(tmp_path).get(k)) == b"y" * 100_000


def test_concurrent_readers_writers_and_evictions(tmp_path, monkeypatch):
    """8 threads putting, getting and dropping small blocks in a cache that holds a
    quarter of them, with few segment descriptors kept open: every answer is the
    block's own bytes or a miss, nothing is counted corrupt, the books balance."""
    monkeypatch.setattr(segments, "SEGMENT_FDS", 2)
    d = tier(tmp_path, limit=64 * 8192, segment_bytes=256 << 10)
    errors = []

    def body(k):
        return k.name().encode() * (1 + k.index % 200)

    def worker(w):
        rng = random.Random(w)
        for _ in range(1500):
            k = BlockKey(f"k{rng.randrange(256)}", "v", rng.randrange(4))
            op = rng.random()
            if op < 0.5:
                d.put(k, body(k))
            elif op < 0.95:
                got = d.get(k)
                if got is not None and bytes(got) != body(k):
                    errors.append(k)
            else:
                d.drop(k)

    ts = [threading.Thread(target=worker, args=(w,)) for w in range(8)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    assert not errors and d.corrupt_blocks == 0
    assert d.used <= 64 * 8192
    held = stored_blocks(str(tmp_path))
    assert len(held) == len(d)
    assert d.used == sum(n for _, _, n in held)
    d2 = tier(tmp_path, limit=64 * 8192)
    assert d2.verify_all() == (len(d), 0)


def test_a_new_segment_is_made_outside_the_lock(tmp_path, monkeypatch):
    """A file creation can wait on the filesystem's journal; the trio thread calls
    contains() under the same lock, so no segment is created while holding it."""
    d = tier(tmp_path, segment_bytes=64 << 10)
    k0 = BlockKey("f", "v", 0)
    assert d.put(k0, b"x" * 5000)
    real = segments.create
    slow, slept = threading.Event(), threading.Event()

    def create(dirpath, direct):
        slow.set()
        time.sleep(0.5)
        slept.set()
        return real(dirpath, direct)

    monkeypatch.setattr(segments, "create", create)
    t = threading.Thread(target=lambda: [d.put(BlockKey("g", "v", i), b"y" * 5000)
                                         for i in range(20)])
    t.start()
    assert slow.wait(5)
    assert d.contains(k0) and bytes(d.get(k0)) == b"x" * 5000
    # answered while the creation still sleeps (an order, not a speed: under the lock
    # they would return only after it)
    assert not slept.is_set()
    t.join()
    assert len(d) == 21 and len(seg_files(tmp_path)) == 3

"""neuralcache/buffers.py without a kernel mount: fresh block buffers and read_into."""
import io
import os

from neuralcache import buffers

MB = 1 << 20


def test_fresh_maps_zeroed_writable_memory_in_whole_huge_pages_when_asked():
    n = 8 * MB + 4096                       # a disk-cache block: data + trailer page
    assert len(buffers.fresh(n, huge_pages=False)) == n     # the default: no advice
    buf = buffers.fresh(n, huge_pages=True)
    assert len(buf) >= n and len(buf) % buffers.HUGE_PAGE == 0
    assert buf[:16] == bytes(16) and buf[n - 16:n] == bytes(16)
    buf[n - 4:n] = b"tail"
    assert buf[n - 4:n] == b"tail"
    small = buffers.fresh(1000, huge_pages=True)   # below a huge page: just what was asked
    assert len(small) == 1000


def test_read_into_fills_in_pieces_and_stops_at_the_end():
    data = os.urandom(3 * MB + 17)
    src = io.BytesIO(data)

    def dribble(view):                      # a socket hands over a little at a time
        return src.readinto(view[:65536])
    got = buffers.read_into(dribble, 3 * MB + 17)
    assert isinstance(got, memoryview) and got == data
    src.seek(MB)
    short = buffers.read_into(src.readinto, 4 * MB)     # the source ends first
    assert len(short) == 2 * MB + 17 and short == data[MB:]


def test_recycler_reuses_a_handed_back_buffer_only_once_no_view_of_it_is_left():
    r = buffers.Recycler(8 * MB + 4096, keep_bytes=64 * MB)
    a = r.take(8 * MB)
    a[:4] = b"AAAA"
    block = a[:8 * MB]                      # the memory tier's view of the block
    reply = block[MB:2 * MB]                # a FUSE reply still being written
    del a
    r.give(block)                           # the tier let go of it ...
    del block
    b = r.take(8 * MB)                      # ... but the reply still views it: fresh
    assert (r.reused, r.made) == (0, 2) and b.obj is not reply.obj
    b[:4] = b"BBBB"
    assert reply.obj[:4] == b"AAAA"         # nobody wrote into what the reply reads
    del reply
    c = r.take(MB + 4096)                   # no view left: that buffer again
    assert r.reused == 1 and c[:4] == b"AAAA"
    r.give(b)
    r.give(b)                               # handed back twice: listed once
    del b
    d = r.take(8 * MB)
    e = r.take(8 * MB)
    assert r.reused == 2 and d.obj is not e.obj and r.made == 3


def test_recycler_ignores_foreign_and_odd_sized_buffers_and_keeps_a_bounded_few():
    r = buffers.Recycler(8 * MB, keep_bytes=16 * MB)     # two slots kept
    assert r.keep == 2
    r.give(memoryview(bytes(8 * MB)))       # not one of its own: ignored
    r.give(b"plain bytes")
    assert r.take(64 * 1024).obj is not None and r.made == 0     # small: fresh memory
    assert len(r.take(9 * MB)) == 9 * MB and r.made == 0         # larger than a slot
    views = [r.take(8 * MB) for _ in range(3)]
    bufs = [v.obj for v in views]
    for v in views:
        r.give(v)
    del views, v
    again = [r.take(8 * MB) for _ in range(3)]
    assert r.reused == 2 and r.made == 4    # the third was not kept
    assert {id(v.obj) for v in again[:2]} <= {id(b) for b in bufs}


def test_memory_tier_hands_back_what_it_evicts_drops_and_replaces():
    from neuralcache.store.memory import BlockKey, MemoryTier
    given = []
    mem = MemoryTier(2 * MB, release=given.append)
    k = [BlockKey("f", "v1", i) for i in range(4)]
    blocks = [bytes([i]) * MB for i in range(4)]
    mem.put(k[0], blocks[0])
    mem.put(k[1], blocks[1])
    mem.put(k[2], blocks[2])                # evicts k[0]
    mem.drop(k[1])
    mem.put(k[2], blocks[3])                # replaces k[2]'s bytes
    mem.put(k[2], blocks[3])                # the same bytes again: nothing let go
    assert [g[0] for g in given] == [0, 1, 2] and mem.used == MB


def test_disk_tier_reads_blocks_into_recycled_buffers(tmp_path):
    """Both layouts of the disk tier (a record in a segment, a block file of its own)
    read into the recycler's buffers, and a buffer let go is read into again."""
    from neuralcache.store.blockfiles import padded
    from neuralcache.store.tiers import BlockKey, DiskTier
    for pack_max in (8 * MB, 1 * MB):       # 2 MiB blocks: packed, then a file each
        disk = DiskTier(str(tmp_path / f"c{pack_max}"), 1 << 30, pack_max=pack_max)
        disk.load()
        disk.read_buffers = r = buffers.Recycler(padded(2 * MB))
        blocks = {BlockKey("k", "v", i): os.urandom(2 * MB) for i in range(3)}
        for bk, data in blocks.items():
            assert disk.put(bk, data)
        for bk, data in blocks.items():
            got = disk.get(bk)
            assert got == data and isinstance(got.obj, buffers._Slot)
            r.give(got)
            del got
        assert (r.made, r.reused) == (1, 2), pack_max


def test_posix_block_reads_land_in_recycled_buffers(tmp_path):
    from neuralcache.backends.posix import PosixBackend
    data = os.urandom(5 * MB + 123)
    (tmp_path / "f.bin").write_bytes(data)
    be = PosixBackend(str(tmp_path))
    be.read_buffers = r = buffers.Recycler(2 * MB)
    v = be.stat("f.bin").version
    got = [be.read("f.bin", off, 2 * MB, v) for off in (0, 2 * MB)]
    assert [bytes(g) for g in got] == [data[:2 * MB], data[2 * MB:4 * MB]]
    assert all(isinstance(g.obj, buffers._Slot) for g in got)
    assert be.read("f.bin", 4 * MB, MB + 123, v) == data[4 * MB:]    # the short last block
    r.give(got[0])
    del got
    assert be.read("f.bin", 3 * MB, 2 * MB, v) == data[3 * MB:5 * MB] and r.reused == 1

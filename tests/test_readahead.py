"""Read-ahead window logic (pure)."""
from neuralcache.ahead.readahead import ReadAhead

BS = 1 << 20


def test_window_grows_while_sequential_and_is_capped():
    ra = ReadAhead(BS, max_bytes=8 * BS)
    requested = []
    off = 0
    t = 0.0
    while off < 40 * BS:
        requested += list(ra.on_read(off, 128 << 10, 64, latency_s=0.06, now=t))
        off += 128 << 10
        t += 0.0001
    assert requested == sorted(set(requested))          # each block asked once
    assert requested[0] == 1
    assert max(requested) >= 40                          # stays ahead of the reader
    assert ra.window <= 8


def test_seek_resets_window():
    ra = ReadAhead(BS, max_bytes=8 * BS)
    for i in range(40):
        ra.on_read(i * (128 << 10), 128 << 10, 64, 0.06, now=i * 1e-4)
    assert ra.window > 1
    assert list(ra.on_read(50 * BS, 4096, 64, 0.06, now=1.0)) == []
    assert ra.window == 1
    assert list(ra.on_read(50 * BS + 4096, 4096, 64, 0.06, now=1.001)) == [51, 52]


def test_never_past_end_and_off_when_zero():
    ra = ReadAhead(BS, max_bytes=8 * BS)
    got = []
    for i in range(24):
        got += ra.on_read(i * (128 << 10), 128 << 10, 3, 0.06, now=i * 1e-4)
    assert got == [1, 2]
    assert list(ReadAhead(BS, max_bytes=0).on_read(0, 4096, 10, 0.06)) == []


def test_slow_reader_gets_small_window():
    ra = ReadAhead(BS, max_bytes=64 * BS)
    t = 0.0
    for i in range(200):           # 128 KiB every 100 ms = 1.3 MB/s
        ra.on_read(i * (128 << 10), 128 << 10, 1000, 0.06, now=t)
        t += 0.1
    assert ra.window <= 2           # Little's law: 1.3 MB/s x 60 ms x 2 < 1 block


def test_random_reads_do_not_start_read_ahead():
    import random

    ra = ReadAhead(BS, max_bytes=8 * BS)
    rnd = random.Random(1)
    started = 0
    for i in range(2000):                     # 128 KiB at random over 1 GiB
        off = rnd.randrange(0, 1024) * BS + rnd.randrange(0, 8) * (128 << 10)
        started += len(ra.on_read(off, 128 << 10, 1024, 0.06, now=i * 1e-3))
    assert started <= 20, started             # ~1% false streaks at most


def test_behind_reports_each_block_a_stream_left_behind_once():
    from neuralcache.ahead.readahead import SEQ_SLACK
    bs = 8 << 20
    ra = ReadAhead(bs, max_bytes=64 << 20)
    assert list(ra.behind()) == []
    off = 0
    while off < SEQ_SLACK + 2 * bs:          # sequential 1 MiB reads
        ra.on_read(off, 1 << 20, 100, 0.06, now=1.0)
        off += 1 << 20
    # the furthest read ends at SEQ_SLACK + 2 blocks: blocks 0 and 1 are behind
    assert list(ra.behind()) == [0, 1]
    assert list(ra.behind()) == []           # once each
    ra.on_read(off, 1 << 20, 100, 0.06, now=1.0)
    assert list(ra.behind()) == []           # block 2 not wholly behind yet
    ra.on_read(0, 1 << 20, 100, 0.06, now=1.0)     # a seek back: no stream, nothing
    assert list(ra.behind()) == []


def test_random_reads_leave_nothing_behind():
    import random
    rng = random.Random(3)
    ra = ReadAhead(8 << 20, max_bytes=64 << 20)
    for _ in range(500):
        ra.on_read(rng.randrange(0, 1 << 30, 128 << 10), 128 << 10, 128, 0.06, now=1.0)
        assert list(ra.behind()) == []


def test_a_file_read_whole_gives_its_blocks_back_at_close():
    """A file read from its first byte to its last in one stream: at close the blocks
    ``behind`` did not report are given back (the page cache holds them; shards of
    one block each were never reported, and 1 GB of them kept the memory tier full of
    fresh buffers: bench/RESULTS.md, twentieth sitting); also after a read of its tail
    first, as torch.load does.  Not a file read in part, or whose last stream began
    past its first byte."""
    size = 3 * BS + 100
    whole = ReadAhead(BS, max_bytes=8 * BS)
    for i, off in enumerate(range(0, size, 128 << 10)):
        whole.on_read(off, min(128 << 10, size - off), 4, 0.06, now=i * 1e-4)
    assert list(whole.finished(4, size)) == [0, 1, 2, 3]
    assert list(whole.finished(4, size)) == []            # once

    part = ReadAhead(BS, max_bytes=8 * BS)
    for i in range(8):
        part.on_read(i * (128 << 10), 128 << 10, 4, 0.06, now=i * 1e-4)
    assert list(part.finished(4, size)) == []

    header_tail = ReadAhead(BS, max_bytes=8 * BS)    # review: 2 header reads, the tail
    for i, (off, n) in enumerate(((0, 4096), (4096, 4096), (size - BS, BS))):
        header_tail.on_read(off, n, 4, 0.06, now=i * 1e-4)
    assert list(header_tail.finished(4, size)) == []

    tail_first = ReadAhead(BS, max_bytes=8 * BS)
    tail_first.on_read(size - 100, 100, 4, 0.06, now=0.0)
    for i, off in enumerate(range(0, size, 128 << 10)):
        tail_first.on_read(off, min(128 << 10, size - off), 4, 0.06, now=(i + 1) * 1e-4)
    assert list(tail_first.finished(4, size)) == [0, 1, 2, 3]

    big = 40 * BS + 100
    two = ReadAhead(BS, max_bytes=8 * BS)
    for i in range(8):                                     # the first MiB
        two.on_read(i * (128 << 10), 128 << 10, 41, 0.06, now=i * 1e-4)
    for i, off in enumerate(range(36 * BS, big, 128 << 10)):   # then a seek past it
        two.on_read(off, min(128 << 10, big - off), 41, 0.06, now=(i + 9) * 1e-4)
    assert list(two.finished(41, big)) == []

    twice = ReadAhead(BS, max_bytes=8 * BS)          # review: half of it twice, the tail
    size8 = 8 * BS
    reads = [(off, 128 << 10) for off in range(0, 4 * BS, 128 << 10)] * 2 \
        + [(size8 - BS, BS)]
    for i, (off, n) in enumerate(reads):
        twice.on_read(off, n, 8, 0.06, now=i * 1e-4)
    assert twice.streak_bytes >= size8                     # counted as many bytes...
    assert list(twice.finished(8, size8)) == [0, 1, 2, 3, 7]   # ...not blocks 4-6

    long = ReadAhead(BS, max_bytes=8 * BS)           # what it keeps stays a handful
    for i in range(300):
        long.on_read(i * BS, BS, 300, 0.06, now=i * 1e-4)
        list(long.behind())
    assert len(long.touched) <= (32 << 20) // BS + 1
    assert list(long.finished(300, 300 * BS)) == list(range(300 - len(long.touched), 300))


def test_the_kernels_first_reads_out_of_order_are_one_stream_from_the_first_byte():
    """The kernel sends a file's first READs in parallel and they arrive in any order
    (seen: 1, 0, 3, 2, 7, 6, 5, 4 MiB ...): one stream from byte 0, so ``behind`` gives
    back from block 0 and ``finished`` the rest at close.  Before, each read behind
    the last reset the stream until two came in order: it began past byte 0 and those
    blocks stayed in memory after the close."""
    from neuralcache.ahead.readahead import SEQ_SLACK
    bs = 2 << 20
    size = 72 * BS + 4321
    nblocks = -(-size // bs)
    ra = ReadAhead(bs, max_bytes=8 << 20)
    order = [1, 0, 3, 2, 7, 6, 5, 4, 12, 13, 9, 8, 15, 14, 11, 10] + list(range(16, 73))
    released = []
    for i, mib in enumerate(order):
        ra.on_read(mib * BS, min(BS, size - mib * BS), nblocks, 0.06, now=i * 1e-3)
        released += ra.behind()
        if i == 1:
            assert ra.streak >= 2 and ra.stream_start == 0
    assert released == list(range(0, (size - SEQ_SLACK) // bs))
    assert ra.finished(nblocks, size) == list(range(len(released), nblocks))

    # a read() of 2 MiB or more: a first batch of up to 16 READs, reversed or
    # scrambled (review); the file is still one stream, given back whole at close
    for first in ([7, 6, 5, 4, 3, 2, 1, 0], [3, 0, 1, 2], [15, 14, 13, 12, 11, 10, 9,
                                                          8, 7, 6, 5, 4, 3, 2, 1, 0]):
        ra = ReadAhead(bs, max_bytes=8 << 20)
        released = []
        for i, mib in enumerate(first + list(range(len(first), 73))):
            ra.on_read(mib * BS, min(BS, size - mib * BS), nblocks, 0.06, now=i * 1e-3)
            released += ra.behind()
        assert ra.stream_start == 0, first
        assert released + ra.finished(nblocks, size) == list(range(nblocks)), first

    # a stream begun mid-file takes a read ending where it began, not one far back
    mid = ReadAhead(bs, max_bytes=8 << 20)
    mid.on_read(41 * BS, BS, nblocks, 0.06, now=0.0)
    mid.on_read(40 * BS, BS, nblocks, 0.06, now=1e-3)
    assert mid.stream_start == 40 * BS and mid.streak == 2
    far = ReadAhead(bs, max_bytes=8 << 20)
    far.on_read(41 * BS, BS, nblocks, 0.06, now=0.0)
    far.on_read(30 * BS, BS, nblocks, 0.06, now=1e-3)
    assert far.stream_start == 30 * BS and far.streak == 1       # a seek: a new stream


def test_random_1mib_reads_do_not_start_read_ahead():
    """As test_random_reads_do_not_start_read_ahead with reads of 1 MiB, the size
    the kernel sends: a young stream takes a read behind it only if it ends exactly
    where the stream began (a review measured ~47 % more false streams when it took
    any within START_SLACK)."""
    import random

    ra = ReadAhead(BS, max_bytes=8 * BS)
    rnd = random.Random(2)
    started = 0
    for i in range(5000):                     # anywhere in 1 GiB, not aligned
        started += len(ra.on_read(rnd.randrange(0, 1023 * BS), BS, 1024, 0.06,
                                  now=i * 1e-3)) > 0
    assert started <= 10, started    # (seeded) 7 here and before; 13 with the slack back


def _replay(order_mib, size, bs=8 << 20, max_bytes=128 << 20):
    """Reads of 1 MiB at ``order_mib`` (MiB offsets); (blocks reported by behind in
    order, blocks finished at close, blocks read after behind reported them)."""
    nblocks = -(-size // bs)
    ra = ReadAhead(bs, max_bytes=max_bytes)
    released, again = [], []
    for i, mib in enumerate(order_mib):
        off = mib * BS
        n = min(BS, size - off)
        again += [b for b in range(off // bs, (off + n - 1) // bs + 1) if b in released]
        ra.on_read(off, n, nblocks, 0.06, now=i * 1e-3)
        released += ra.behind()
    return released, ra.finished(nblocks, size), again


def test_every_order_of_the_first_reads_gives_the_file_back_at_close():
    """Every order of a file's first six 1 MiB READs (they arrive in parallel; 0, 3,
    1, 2 and 2, 3, 0, 1 began the stream past byte 0, and 6 of 10 blocks stayed in
    memory after the close, review): each block reported once, none read after."""
    import itertools
    size = 72 * BS + 4321
    n = -(-size // BS)
    for first in itertools.permutations(range(6)):
        released, done, again = _replay(list(first) + list(range(6, n)), size)
        assert sorted(released + done) == list(range(10)) and not again, first


def test_a_late_read_does_not_end_the_stream():
    """With 64 READs in flight one may be answered up to 64 MiB behind the furthest:
    still the same stream (33 behind began a new one, whose close kept 9 of 25
    blocks); a second pass from the start is a new stream, whose blocks are given back
    again (they were kept until the LRU took them)."""
    size = 200 * BS
    for late in (31, 33, 47, 63):
        order = list(range(200))
        order.remove(60)
        order.insert(order.index(60 + late) + 1, 60)
        released, done, _ = _replay(order, size)
        assert sorted(released + done) == list(range(25)), late
    released, done, again = _replay(list(range(200)) * 2, size)
    assert sorted(released + done) == sorted(list(range(21)) * 2 + list(range(21, 25)))


def test_blocks_are_given_back_with_read_ahead_below_a_block():
    """--readahead-size below a block: no read-ahead, but the blocks read are still
    given back (they stayed until the LRU took them)."""
    size = 200 * BS
    ra = ReadAhead(8 << 20, max_bytes=4 << 20)
    fetched, released = [], []
    for i in range(200):
        fetched += ra.on_read(i * BS, BS, 25, 0.06, now=i * 1e-3)
        released += ra.behind()
    assert fetched == []
    assert released + ra.finished(25, size) == list(range(25))


def test_a_stray_read_before_a_stream_gives_back_only_what_was_read():
    """A read at 30 MiB inside an established stream begun at 40 MiB (review): the
    stream gives back the blocks read from, not block 4 (32-40 MiB), never read."""
    released, _, _ = _replay(list(range(40, 60)) + [30] + list(range(60, 120)), 200 * BS)
    assert released == list(range(5, 11))            # (block 3 only partly inside)

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

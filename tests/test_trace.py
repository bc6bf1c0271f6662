"""The access trace ring (neuralcache/fs/trace.py): the last events, in order, as the
JSON lines DEVELOPING.md documents."""
import json

from neuralcache.fs.trace import TraceRing


def test_the_ring_keeps_the_last_events_in_order():
    r = TraceRing(3)
    assert r.dump() == b"" and len(r) == 0
    for i in range(5):
        r.record("read" if i % 2 else "open", f"d/f{i}", i * 10, i + 1, 100 + i, 1000 + i)
    assert len(r) == 3 and r.recorded == 5
    got = [json.loads(line) for line in r.dump().decode().splitlines()]
    assert [(e["op"], e["path"], e["off"], e["len"], e["pid"], e["size"]) for e in got] == \
        [("open", "d/f2", 20, 3, 102, 1002), ("read", "d/f3", 30, 4, 103, 1003),
         ("open", "d/f4", 40, 5, 104, 1004)]
    ts = [e["t"] for e in got]
    assert ts == sorted(ts) and ts[0] >= 0


def test_a_path_that_is_not_utf8_survives_and_a_zero_ring_records_nothing():
    r = TraceRing(2)
    r.record("open", "d/\udcff", 0, 0, 1, 5)
    assert json.loads(r.dump().decode("utf-8", "surrogateescape"))["path"] == "d/\udcff"
    off = TraceRing(0)
    off.record("open", "x", 0, 0, 1, 1)
    assert off.dump() == b"" and len(off) == 0 and not off.enabled

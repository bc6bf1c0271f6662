import io
import json

import pytest
from hypothesis import given, strategies as st

from predictors.events import Event, dumps, parse_line, read_jsonl, write_jsonl

SAMPLE = ('{"t": 12.345678, "op": "open", "path": "train/00017.tar", "off": 0, "len": 0, '
          '"pid": 4242, "size": 8388608}\n'
          '{"t": 12.351002, "op": "read", "path": "train/00017.tar", "off": 0, "len": 131072, '
          '"pid": 4242, "size": 8388608}\n')

events = st.builds(
    Event,
    t=st.floats(min_value=0, max_value=1e7, allow_nan=False, allow_infinity=False),
    op=st.sampled_from(["open", "read"]),
    path=st.text(min_size=1).filter(lambda s: "\0" not in s),
    off=st.integers(0, 2**53), len=st.integers(0, 2**40), pid=st.integers(0, 2**31),
    size=st.integers(0, 2**53))


def test_reads_the_documented_example():
    evs = read_jsonl(io.StringIO(SAMPLE))
    assert evs[0] == Event(12.345678, "open", "train/00017.tar", 0, 0, 4242, 8388608)
    assert evs[1].op == "read" and evs[1].len == 131072


@given(st.lists(events, max_size=20))
def test_roundtrip(evs):
    buf = io.StringIO()
    write_jsonl(evs, buf)
    assert read_jsonl(io.StringIO(buf.getvalue())) == evs


def test_writer_uses_exactly_the_documented_keys():
    d = json.loads(dumps(Event(1.5, "open", "a", 0, 0, 1, 2)))
    assert list(d) == ["t", "op", "path", "off", "len", "pid", "size"]


def test_event_is_frozen():
    ev = Event(1.0, "open", "a", 0, 0, 1, 2)
    with pytest.raises(AttributeError):
        ev.path = "b"


@pytest.mark.parametrize("bad", [
    "not json",
    "[1, 2]",
    '{"t": 1, "op": "open", "path": "a", "off": 0, "len": 0, "pid": 1}',            # no size
    '{"t": 1, "op": "write", "path": "a", "off": 0, "len": 0, "pid": 1, "size": 1}',
    '{"t": 1, "op": "open", "path": "", "off": 0, "len": 0, "pid": 1, "size": 1}',
    '{"t": 1, "op": "open", "path": "a\\u0000b", "off": 0, "len": 0, "pid": 1, "size": 1}',
    '{"t": 1, "op": "read", "path": "a", "off": -1, "len": 0, "pid": 1, "size": 1}',
    '{"t": 1, "op": "read", "path": "a", "off": 1.5, "len": 0, "pid": 1, "size": 1}',
    '{"t": "x", "op": "read", "path": "a", "off": 0, "len": 0, "pid": 1, "size": 1}',
    '{"t": NaN, "op": "read", "path": "a", "off": 0, "len": 0, "pid": 1, "size": 1}',
    '{"t": 1, "op": "read", "path": "a", "off": 0, "len": true, "pid": 1, "size": 1}',
    '{"t": 1, "op": "read", "path": "a", "off": 0, "len": 0, "pid": 1, "size": 1, "x": 2}',
])
def test_malformed_line_names_its_number(bad):
    text = SAMPLE + "\n" + bad + "\n"     # a blank line 3 is skipped; the bad one is line 4
    with pytest.raises(ValueError, match=r"line 4\b"):
        read_jsonl(io.StringIO(text))


def test_parse_line_ok():
    assert parse_line(SAMPLE.splitlines()[0]).size == 8388608

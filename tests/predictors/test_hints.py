import pytest

from predictors.ensemble import make_default_predictor
from predictors.events import Event
from predictors.hints import HintPredictor, parse_hints

CAT = [(f"d/{i:04d}.jpg", 100) for i in range(100)]
P = [p for p, _ in CAT]


def op(path, t=0.0, pid=1):
    return Event(t, "open", path, 0, 0, pid, 100)


@pytest.mark.parametrize("bad, needle", [
    (["d/0001.jpg", "d/../0002.jpg"], "hint 1"),       # not a path inside the mount
    (["d/0001.jpg", "/d/0002.jpg"], "hint 1"),
    (["d/0001.jpg", ""], "hint 1"),
    (["d/0001.jpg", "d/00\x0002.jpg"], "hint 1"),
    (["d/0001.jpg", 7], "hint 1"),
    (["d/0001.jpg", None, "d/0002.jpg"], "hint 1"),
    ([], "empty"),
    ("d/0001.jpg", "sequence"),
])
def test_malformed_hints_raise_and_change_nothing(bad, needle):
    p = HintPredictor(CAT)
    p.set_hints(P[10:20])
    p.observe(op(P[10]))
    before = p.predict(5)
    with pytest.raises(ValueError, match=needle):
        p.set_hints(bad)
    assert p.predict(5) == before


def test_hints_take_precedence_in_the_ensemble():
    e = make_default_predictor(CAT)
    for i in range(40):                      # a clear sequential scan
        e.observe(op(P[i], t=i * 0.01))
    assert e.predict(3)[0].path == P[40]
    order = [P[i] for i in (90, 3, 77, 51, 12)]
    e.set_hints(order)
    assert [x.path for x in e.predict(5)] == order
    assert all(x.source == "hints" for x in e.predict(5))
    e.observe(op(P[90], t=1.0))
    assert [x.path for x in e.predict(2)] == order[1:3]
    e.clear_hints()
    assert e.predict(1)[0].source != "hints"


def test_cursor_tolerates_interleaved_workers():
    p = HintPredictor(CAT)
    p.set_hints(P)
    # 4 workers with batch 5: worker k reads batches k, k+4, ... interleaved
    reads = [P[b * 5 + j] for j in range(5) for b in range(4)]   # first 4 batches, scrambled
    for k, path in enumerate(reads[:-3]):
        p.observe(op(path, t=k * 0.01, pid=k % 4))
    nxt = [x.path for x in p.predict(5)]
    assert nxt[:3] == sorted(reads[-3:])      # the holes first, in hinted order
    assert nxt[3:] == [P[20], P[21]]          # then the frontier
    assert p.remaining() == 100 - 17


def test_unhinted_and_stray_opens_do_not_move_the_cursor():
    p = HintPredictor(CAT)
    p.set_hints(P[:50])
    p.observe(op(P[70]))                      # not hinted
    assert p.predict(1)[0].path == P[0]


def test_hints_can_repeat_paths_for_several_epochs():
    p = HintPredictor(CAT)
    p.set_hints(P[:10] + P[:10])
    for path in P[:10]:
        p.observe(op(path))
    assert [x.path for x in p.predict(3)] == P[:3]
    assert p.active


def test_parse_hints():
    assert parse_hints("a/b\r\nc\n\n") == ["a/b", "c"]


def test_a_hint_naming_nothing_listed_yet_is_taken():
    """A lazily listed mount cannot check hints against a catalog: they are taken,
    and one that names nothing is skipped when its turn comes."""
    p = HintPredictor(CAT)
    p.set_hints(["d/9999.jpg", P[1]])
    assert [x.path for x in p.predict(2)] == ["d/9999.jpg", P[1]]


def test_stream_checks_and_packs_as_it_comes():
    from predictors.hints import HintStream

    paths = [f"train/n{d:04d}/img_{i:05d}.jpg" for d in range(50) for i in range(500)]
    data = ("\r\n".join(paths) + "\r\n\n").encode()
    hs = HintStream()
    for off in range(0, len(data), 4099):          # writes cut mid-line
        hs.feed(data[off:off + 4099])
    order = hs.finish()
    assert len(order) == len(paths) and order[0] == paths[0] and order[-1] == paths[-1]
    assert order.positions(paths[12_345]) == [12_345]
    assert order.nbytes() < len(data) / 2            # packed
    for bad, line in [(b"ok\nalso/ok\nx/../y\n", 2), (b"a\n/abs\n", 1), (b"a\0b\n", 0),
                      (b"d/.\n", 0), (b"a//b\n", 0)]:
        with pytest.raises(ValueError, match=f"hint {line}"):
            HintStream().feed(bad)
    hs = HintStream()
    hs.feed(b"d/.hidden\nlast-without-newline")
    assert list(hs.finish()) == ["d/.hidden", "last-without-newline"]


def test_packed_order_cursor_consumes_like_a_list():
    from predictors.order import OrderCursor, PackedOrder

    order = [f"p{i % 3000}" for i in range(9000)]       # three epochs of one order
    a, b = OrderCursor(order), OrderCursor(PackedOrder(order))
    for i in [0, 2, 1, 5, 3, 4, 3000, 7000, 7001, 6]:
        assert a.consume(order[i]) == b.consume(order[i]), i
    assert a.upcoming(20) == b.upcoming(20)
    assert a.consume("not-there") is None and b.consume("not-there") is None

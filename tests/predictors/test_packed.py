"""The packed catalog (predictors/packed.py) answers as the plain one, predictions over
it are the same, and the ensemble's one shared epoch tracker predicts as three did."""
import random
from collections import defaultdict

import pytest

from predictors import make_default_predictor
from predictors.base import Catalog
from predictors.epoch import ACTIVE_EVENTS, EpochTracker
from predictors.epochset import EpochSetPredictor
from predictors.events import Event
from predictors.features import PatternFeatures
from predictors.packed import DirSegment, PackedCatalog
from predictors.successor import SuccessorPredictor
from predictors.tracegen import family_spec, generate


def segments(entries):
    by = defaultdict(list)
    for p, s in entries:
        d, sep, n = p.rpartition("/")
        by[d + sep].append((n, s))
    return [DirSegment(k, v) for k, v in by.items()]


def test_packed_catalog_answers_as_the_sorted_catalog():
    rnd = random.Random(3)
    names = ["a", "b.jpg", "é", "z z", "x\udcff", "img_0001.JPEG", "-", "~"]
    dirs = ["", "a/", "a/b/", "a/b-c/", "a/b/c/", "ab/", "a0/"]
    entries = sorted({(d + n + (str(k) if k else ""), rnd.randrange(1 << 30))
                      for d in dirs for n in names for k in range(3)})
    entries = list(dict(entries).items())            # one size per path
    packed = PackedCatalog(segments(entries))
    plain = Catalog(sorted(entries))
    assert len(packed) == len(plain) == len(entries)
    assert packed.total_bytes() == plain.total_bytes()
    for p, s in entries:
        i = packed.index.get(p)
        assert i is not None and packed.paths[i] == p and packed.sizes[i] == s
        assert p in packed.index and packed.size_of(p) == s == plain.size_of(p)
    assert packed.paths[-1] == packed.paths[len(packed) - 1]
    for missing in ("a/nope", "q/a", "a/b/c", "", "a/b/"):
        assert packed.index.get(missing) is None and missing not in packed.index
    assert packed.size_of("a/nope", 7) == 7
    with pytest.raises(IndexError):
        packed.paths[len(packed)]
    for prefix in ("", "a/", "a/b/", "a/b-c/", "a/b/c/", "ab/", "q/"):
        want = {p for p, _ in entries if p.startswith(prefix)}
        for cat in (packed, plain):
            lo, hi = cat.scope_range(prefix)
            assert {cat.paths[i] for i in range(lo, hi)} == want, (prefix, cat)
    assert sorted(packed.entries()) == sorted(entries)
    asked = [p for p, _ in entries[::2]] + ["a/nope", "q/x", "\ud800"]
    for cat in (packed, plain):
        assert sorted(cat.indices(asked)) == sorted(cat.index.get(p) for p in asked[:-3])
    assert packed.index.get("a/\ud800") is None         # not encodable: not there


def lockstep(a, b, events, every, same=None) -> int:
    """Feed both predictors each event; every ``every`` events their predictions (and
    ``same(a, b)``) must agree.  Returns how many predictions were compared."""
    compared = 0
    for k, ev in enumerate(events):
        a.observe(ev)
        b.observe(ev)
        if k % every == 0:
            pa = a.predict(32)
            assert pa == b.predict(32), k
            assert same is None or same(a, b), k
            compared += len(pa)
    return compared


def pairs(tr):
    packed = PackedCatalog(segments(tr.catalog))
    plain = Catalog(packed.entries())                # the same order
    return make_default_predictor(plain), make_default_predictor(packed)


@pytest.mark.parametrize("family", ["sequential", "strided", "shuffled", "repeated"])
def test_predictions_over_a_packed_catalog_are_the_same(family):
    tr = generate(family_spec(family, n_files=800, epochs=2))
    a, b = pairs(tr)
    assert isinstance(b.catalog, PackedCatalog)
    compared = lockstep(a, b, tr.events, 7)
    assert a.pattern == b.pattern and compared > 0


@pytest.mark.parametrize("family", ["sequential", "shuffled", "repeated", "random"])
def test_one_shared_epoch_tracker_predicts_as_three(family):
    tr = generate(family_spec(family, n_files=600, epochs=3, seed=2))
    shared = make_default_predictor(tr.catalog)
    assert shared.successor.tracker is shared.epochset.tracker is shared.features.tracker
    own = make_default_predictor(tr.catalog)
    own.successor, own.epochset, own.features = (SuccessorPredictor(), EpochSetPredictor(),
                                                 PatternFeatures())
    own.set_catalog(tr.catalog)
    assert own.successor.tracker is not own.epochset.tracker
    compared = lockstep(shared, own, tr.events, 5,
                        lambda x, y: x.features.vector() == y.features.vector())
    assert shared.pattern == own.pattern
    assert shared.epochset.tracker.epoch == own.epochset.tracker.epoch >= 1
    assert compared > 0 or family == "random"


def test_active_keeps_only_the_last_events():
    """``active`` as if every access were remembered, from a bounded record."""
    t, last = EpochTracker(), {}
    rnd = random.Random(1)
    paths = [f"f{i}" for i in range(300)]
    for k in range(6000):
        p = rnd.choice(paths[:40] if k % 3 else paths)
        t.observe(Event(float(k), rnd.choice(["open", "read"]), p, 0, 1, 1 + k % 4, 1))
        last[p] = t.events
        for q in rnd.sample(paths, 20) + [p]:
            assert t.active(q) == (q in last and t.events - last[q] < ACTIVE_EVENTS)
    assert len(t._touch) <= ACTIVE_EVENTS


def test_see_observes_once_and_answers_with_the_state_before_the_event():
    tr = generate(family_spec("shuffled", n_files=300, epochs=3, seed=4))
    a, b = EpochTracker(tr.catalog), EpochTracker(tr.catalog)
    seen, last_open, opens = set(), {}, 0        # last_open: the fourth answer, counted here
    for ev in tr.events:
        was, active = b.consumed(ev.path), b.active(ev.path)
        want = (b.observe(ev), was, active, last_open.get(ev.path, 0))
        assert a.see(ev) == want
        assert a.see(ev) == want           # a second sharer of the tracker: the same answer
        if ev.op == "open":
            opens += 1
            last_open[ev.path] = opens
        seen.add(want[:3])
    assert a.events == b.events and a.epoch == b.epoch >= 2
    assert a.opens == opens and a.opened_paths == len(last_open)
    assert (False, True, False) in seen and (False, False, False) in seen

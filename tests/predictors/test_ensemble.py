import time

import pytest

from predictors import Prediction, Predictor, make_default_predictor
from predictors.epochset import EpochSetPredictor
from predictors.events import Event
from predictors.hints import HintPredictor
from predictors.seqread import SeqReadPredictor
from predictors.simulate import SimConfig, run, touched_bytes
from predictors.stride import StridePredictor
from predictors.successor import SuccessorPredictor
from predictors.tracegen import family_spec, generate

ALL = [StridePredictor, SuccessorPredictor, EpochSetPredictor, HintPredictor,
       SeqReadPredictor, make_default_predictor]


@pytest.mark.parametrize("make", ALL)
def test_contract(make):
    tr = generate(family_spec("sequential", n_files=120, epochs=2))
    p = make(tr.catalog)
    assert isinstance(p, Predictor) and p.name
    if isinstance(p, HintPredictor):
        p.set_hints(tr.order)
    for ev in tr.events:
        p.observe(ev)
        preds = p.predict(8)
        assert len(preds) <= 8
        for x in preds:
            assert isinstance(x, Prediction)
            assert 0.0 <= x.prob <= 1.0 and x.eta_s >= 0 and x.length >= 0
        assert len({x.path for x in preds}) == len(preds)
    assert p.predict(0) == []


@pytest.mark.parametrize("family", ["sequential", "strided", "repeated"])
def test_ensemble_precision_in_simulator(family):
    tr = generate(family_spec(family))
    cap = touched_bytes(tr.events) // 2
    r = run(tr, make_default_predictor, SimConfig(capacity=cap, eviction="epoch"))
    assert r.precision >= 0.9
    none = run(tr, None, SimConfig(capacity=cap, eviction="epoch"))
    assert r.hit_rate > none.hit_rate + 0.3


def test_ensemble_follows_the_pattern():
    for family, expect in [("sequential", "sequential"), ("strided", "strided"),
                           ("repeated", "repeated"), ("shuffled", "shuffled"),
                           ("random", "random")]:
        tr = generate(family_spec(family, seed=5))
        p = make_default_predictor(tr.catalog)
        for ev in tr.events:
            p.observe(ev)
        assert p.pattern == expect, family


def test_predict_is_fast_on_a_100k_catalog():
    cat = [(f"train/{i:07d}.jpg", 110_000) for i in range(100_000)]
    p = make_default_predictor(cat)
    t = 0.0
    for i in range(2000):                        # a scan by 4 workers
        p.observe(Event(t, "open", cat[(i % 4) * 25_000 + i // 4][0], 0, 0, 100 + i % 4,
                        110_000))
        t += 0.004
    n = 200
    t0 = time.perf_counter()
    for _ in range(n):
        p.predict(64)
    per = (time.perf_counter() - t0) / n
    assert per < 0.005          # measured ~0.1-0.2 ms; loose bound for a shared machine

from predictors.events import Event
from predictors.stride import StridePredictor
from predictors.tracegen import TraceSpec, generate

CAT = [(f"shards/{i:05d}.tar", 1000) for i in range(400)]


def feed(p, idxs, pid=1, t0=0.0):
    for k, i in enumerate(idxs):
        p.observe(Event(t0 + k * 0.01, "open", CAT[i][0], 0, 0, pid, 1000))


def test_rank_r_of_w_single_reader():
    p = StridePredictor(CAT)
    feed(p, [3 + 8 * k for k in range(10)])     # rank 3 of 8: 3, 11, ..., 75
    preds = p.predict(5)
    assert [x.path for x in preds] == [CAT[83 + 8 * k][0] for k in range(5)]
    assert preds[0].prob > 0.5 and preds[0].source == "stride"
    assert all(a.eta_s < b.eta_s for a, b in zip(preds, preds[1:]))


def test_sequential_scan_and_no_prediction_for_random():
    p = StridePredictor(CAT)
    feed(p, range(20))
    assert [x.path for x in p.predict(3)] == [CAT[i][0] for i in (20, 21, 22)]
    q = StridePredictor(CAT)
    feed(q, [5, 300, 17, 222, 90, 133, 7, 301, 44, 250])
    assert q.predict(5) == []


def test_rank_r_of_w_with_dataloader_workers():
    tr = generate(TraceSpec(family="strided", n_files=1200, rank=2, world=4, workers=4,
                            batch=8, epochs=1))
    p = StridePredictor(tr.catalog)
    hits = total = 0
    pred: set = set()
    for ev in tr.events:
        if ev.op == "open":
            total += 1
            hits += ev.path in pred
        p.observe(ev)
        if ev.op == "open":
            pred = {x.path for x in p.predict(16)}
            # never predicts another rank's files
            assert all(int(x[-9:-4]) % 4 == 2 for x in pred)
    assert hits / total > 0.8

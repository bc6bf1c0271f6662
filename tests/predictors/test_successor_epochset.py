import random

from predictors.epochset import EpochSetPredictor
from predictors.events import Event
from predictors.successor import SuccessorPredictor
from predictors.tracegen import TraceSpec, generate

CAT = [(f"img/{i:05d}.jpg", 100) for i in range(200)]


def opens(order, t0=0.0, pid=1):
    return [Event(t0 + k * 0.01, "open", CAT[i][0], 0, 0, pid, 100) for k, i in enumerate(order)]


def test_successor_predicts_repeated_order_after_one_epoch():
    order = list(range(200))
    random.Random(1).shuffle(order)
    p = SuccessorPredictor(CAT)
    for ev in opens(order):
        p.observe(ev)
    assert p.predict(5) == []                     # nothing learned yet: one epoch seen
    second = opens(order, t0=10.0)
    for ev in second[:30]:
        p.observe(ev)
    preds = p.predict(5)
    assert [x.path for x in preds] == [CAT[i][0] for i in order[30:35]]
    assert preds[0].prob > 0.8


def test_successor_follows_an_epoch_that_a_read_started():
    """The read that completes last epoch's members (its file's open went unseen: the
    daemon drops warm opens past a bound) starts the next epoch: the successor follows
    the epoch that just ended, not the one before it."""
    first, second = list(range(200)), list(range(200))
    random.Random(2).shuffle(second)
    p = SuccessorPredictor(CAT)
    for ev in opens(first) + opens(second[:-1], t0=10.0):
        p.observe(ev)
    assert p.tracker.epoch == 1
    p.observe(Event(20.0, "read", CAT[second[-1]][0], 0, 100, 1, 100))
    assert p.tracker.epoch == 2 and p.tracker.prev_order == [CAT[i][0] for i in second]
    for ev in opens(second[:30], t0=30.0):           # the second epoch's order again
        p.observe(ev)
    preds = p.predict(5)
    assert [x.path for x in preds] == [CAT[i][0] for i in second[30:35]]
    assert preds[0].prob > 0.8


def test_successor_tolerates_interleaved_workers():
    tr = generate(TraceSpec(family="repeated", n_files=300, workers=8, batch=4, epochs=2))
    p = SuccessorPredictor(tr.catalog)
    hits = total = 0
    pred: set = set()
    for ev, ep in zip(tr.events, tr.epoch_of):
        if ev.op == "open" and ep == 1:
            total += 1
            hits += ev.path in pred
        p.observe(ev)
        if ev.op == "open":
            pred = {x.path for x in p.predict(48)}
    assert hits / total > 0.85


def test_successor_is_unsure_on_reshuffled_epochs():
    tr = generate(TraceSpec(family="shuffled", n_files=300, workers=4, epochs=2))
    p = SuccessorPredictor(tr.catalog)
    for ev in tr.events:
        p.observe(ev)
    assert p.confidence() < 0.3


def test_epochset_offers_only_unread_members():
    order = list(range(200))
    random.Random(2).shuffle(order)
    p = EpochSetPredictor(CAT[:150] + CAT[150:])
    sub = [i for i in order if i < 120]           # the job's working set: 120 files
    for ev in opens(sub):
        p.observe(ev)
    random.Random(3).shuffle(sub)
    for ev in opens(sub[:50], t0=10.0):           # epoch 2: 50 read so far
        p.observe(ev)
    assert p.tracker.epoch == 1
    preds = p.predict(1000)
    got = {x.path for x in preds}
    assert got == {CAT[i][0] for i in sub[50:]}   # exactly the 70 unread members
    assert all(x.prob == 1.0 for x in preds)      # each will be read this epoch
    assert [x.path for x in preds] == sorted(got)  # stable listing order
    p.note_planned(preds[0].path)                  # the scheduler has it: skip it
    assert p.is_planned(preds[0].path)
    assert preds[0].path not in {x.path for x in p.predict(1000)}


def test_epochset_predicts_the_head_of_a_large_member():
    from predictors.epochset import HEAD_BYTES, WHOLE_FILE_MAX
    cat = [("d/big", WHOLE_FILE_MAX + 1), ("d/small", 1000), ("d/x", 10)]
    p = EpochSetPredictor(cat)
    p.observe(Event(0.0, "open", "d/x", 0, 0, 1, 10))
    got = {x.path: (x.length, x.prob) for x in p.predict(10)}
    assert got == {"d/big": (HEAD_BYTES, 0.5), "d/small": (1000, 0.5)}   # first epoch: 0.5


def test_epochset_boundary_from_its_mask_is_the_lookup_of_last_epochs_members():
    """From the second boundary on, the epoch set takes last epoch's members from the
    mask its own events marked instead of looking each up; the candidates must be the
    same as the lookup's after every event, including boundaries found by coverage
    (whose last member's read was the boundary) and by an old re-read (with carries),
    and after a new catalog mid-epoch (the daemon's grows as the crawl lists)."""
    import numpy as np

    from predictors.tracegen import family_spec

    class LookingUp(EpochSetPredictor):
        read_whole = property(lambda self: False, lambda self, v: None)

    for fam, seed in (("shuffled", 1), ("repeated", 2), ("random", 3), ("webdataset", 4),
                      ("sequential", 5)):
        tr = generate(family_spec(fam, seed=seed, epochs=5))
        a, b = EpochSetPredictor(tr.catalog), LookingUp(tr.catalog)
        masked = 0
        for k, ev in enumerate(tr.events):
            if k % 997 == 500:
                a.set_catalog(tr.catalog)
                b.set_catalog(tr.catalog)
            whole, epoch = a.read_whole, a.tracker.epoch
            a.observe(ev)
            b.observe(ev)
            masked += whole and a.tracker.epoch > epoch
            assert np.array_equal(a.unread, b.unread) and a.remaining == b.remaining, fam
        assert masked >= 2, fam

def test_a_growing_packed_catalog_keeps_the_read_mask(monkeypatch):
    """A new packed catalog with more members read than REMAP_MEMBERS_MAX takes the old
    mask for the directories both share and asks the tracker about the files of the
    others (new, or listed again): the boundary then swaps masks, and its candidates
    are the lookup's after every event, while the catalog grows as the daemon's does
    during the crawl and directories are packed again."""
    import numpy as np

    import predictors.epochset as es
    from predictors.packed import DirSegment, PackedCatalog

    monkeypatch.setattr(es, "REMAP_MEMBERS_MAX", 3)

    class LookingUp(EpochSetPredictor):
        read_whole = property(lambda self: False, lambda self, v: None)

    class NoLookups(PackedCatalog):             # a's boundaries must use the mask
        __slots__ = ()

        def indices(self, paths):
            raise AssertionError("looked up")

    # joining in this order, so that a directory sorting before the shared ones moves
    # them in the new catalog (c7 first, c0 last)
    dirs = [(f"ds/c{d}/", [(f"f{i:02d}", 100) for i in range(40)])
            for d in (7, 5, 6, 2, 4, 1, 3, 0)]
    segs = [DirSegment(p, files) for p, files in dirs]
    paths = [p + n for p, files in dirs for n, _ in files]
    rnd = random.Random(7)
    events = []
    for e in range(4):
        order = paths[:]
        rnd.shuffle(order)
        events += [Event(e * 10 + k * 0.01, "open", p, 0, 0, 1, 100)
                   for k, p in enumerate(order)]
    a, b = EpochSetPredictor(NoLookups(segs[:2])), LookingUp(PackedCatalog(segs[:2]))
    shown, masked = 2, 0
    for k, ev in enumerate(events):
        if k % 25 == 24:
            if shown < len(segs):
                shown += 1                                  # a directory joins
            else:
                d = rnd.randrange(len(segs))                # one is listed again
                segs[d] = DirSegment(*dirs[d])
            a.set_catalog(NoLookups(segs[:shown]))
            b.set_catalog(PackedCatalog(segs[:shown]))
            assert a.read_whole, k
        epoch = a.tracker.epoch
        a.observe(ev)
        b.observe(ev)
        masked += a.tracker.epoch > epoch
        assert np.array_equal(a.unread, b.unread) and a.remaining == b.remaining, k
        cat = a.catalog       # the mask is this epoch's members in the catalog
        assert [i for i in range(len(cat)) if a.read[i]] == \
            [i for i in range(len(cat)) if a.tracker.consumed(cat.paths[i])], k
    assert masked >= 3


def test_a_catalog_bringing_too_many_new_files_leaves_the_boundary_to_lookups(
        monkeypatch):
    """CARRY_FILES_MAX bounds the files a new catalog asks the tracker about."""
    import predictors.epochset as es
    from predictors.packed import DirSegment, PackedCatalog

    monkeypatch.setattr(es, "REMAP_MEMBERS_MAX", 3)
    segs = [DirSegment(f"ds/c{d}/", [(f"f{i:02d}", 100) for i in range(40)])
            for d in range(2)]
    for limit, whole in ((39, False), (40, True)):
        monkeypatch.setattr(es, "CARRY_FILES_MAX", limit)
        p = EpochSetPredictor(PackedCatalog(segs[:1]))
        for i in range(10):
            p.observe(Event(i * 0.01, "open", f"ds/c0/f{i:02d}", 0, 0, 1, 100))
        p.set_catalog(PackedCatalog(segs))              # 40 new files
        assert p.read_whole is whole
        assert int(p.read.sum()) == 10          # c0's, carried either way

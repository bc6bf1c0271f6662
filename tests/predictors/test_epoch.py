import random

from predictors.epoch import EpochTracker
from predictors.events import Event
from predictors.simulate import SimConfig, run, touched_bytes
from predictors.tracegen import TraceSpec, generate


def op(path, t=0.0):
    return Event(t, "open", path, 0, 0, 1, 100)


def test_epoch_boundaries_and_evict_rank():
    paths = [f"f{i:03d}" for i in range(100)]
    tr = EpochTracker([(p, 100) for p in paths])
    rng = random.Random(0)
    for e in range(3):
        order = paths[:]
        rng.shuffle(order)
        for k, p in enumerate(order):
            tr.observe(op(p))
            if k == 89:
                assert tr.epoch == e
                read, unread = order[:90], order[90:]
                assert all(tr.consumed(p) for p in read)
                assert not any(tr.consumed(p) for p in unread)
                ranks_read = [tr.evict_rank(p) for p in read]
                ranks_unread = [tr.evict_rank(p) for p in unread]
                assert max(ranks_read) < min(ranks_unread)   # consumed goes first
                # consumed and no longer being read: newest consumed first ...
                assert not tr.active(read[10]) and tr.active(read[-1])
                assert tr.evict_rank(read[0]) > tr.evict_rank(read[10])
                # ... then those still being read (the last ACTIVE_EVENTS events)
                assert tr.evict_rank(read[-1]) > tr.evict_rank(read[0])
    assert tr.epoch in (2, 3)    # the last epoch's end is seen when it is fully covered
    assert len(tr.boundaries) == tr.epoch


def test_local_reopens_do_not_end_an_epoch():
    tr = EpochTracker()
    for i in range(50):
        tr.observe(op(f"p{i}"))
        tr.observe(op(f"p{i}"))               # e.g. the reader opens each file twice
    assert tr.epoch == 0


def test_overflow_epoch_aware_beats_lru():
    # dataset twice the cache, 3 shuffled epochs, no prefetch: LRU hits
    # f + (1-f) ln(1-f) = 0.15 per epoch, keeping a fixed half hits 0.5
    tr = generate(TraceSpec(family="shuffled", n_files=600, epochs=3, workers=4))
    cap = touched_bytes(tr.events) // 2
    lru = run(tr, None, SimConfig(capacity=cap, eviction="lru")).epoch_hit_rate([1, 2])
    ep = run(tr, None, SimConfig(capacity=cap, eviction="epoch")).epoch_hit_rate([1, 2])
    assert ep >= 0.45
    assert lru <= 0.25


def test_prev_position_is_the_place_in_last_epochs_order():
    """The tracker's one record per path answers what the features' and the successor's
    maps did (each path's place in last epoch's order), before and after the path is
    read again, across boundaries found both ways (coverage and an old re-read), with
    carried re-reads and paths that leave the working set."""
    from predictors.tracegen import family_spec
    for fam, seed in (("shuffled", 3), ("repeated", 5), ("random", 7), ("webdataset", 2)):
        tr = generate(family_spec(fam, seed=seed, epochs=4))
        t = EpochTracker(tr.catalog)
        paths = sorted({ev.path for ev in tr.events})
        rnd, epochs = random.Random(seed), 0
        for k, ev in enumerate(tr.events):
            if t.observe(ev):
                epochs += 1
                where = {p: i for i, p in enumerate(t.prev_order)}
                assert len(where) == len(t.prev_order) == t.prev_count  # each once
            if t.epoch and k % 5 == 0:
                for p in rnd.sample(paths, 10) + [ev.path]:
                    assert t.prev_position(p) == where.get(p, -1), (fam, k, p)
        assert epochs >= 3 and t.epoch == epochs
    assert EpochTracker().prev_position("nothing") == -1

"""The prefetch scheduler against a scripted predictor (no kernel)."""
from collections import namedtuple

import pytest
import trio

from neuralcache.store.blocks import BlockStore
from neuralcache.store.tiers import MemoryTier
from neuralcache.errors import UserError
from neuralcache.namespace import Namespace
from neuralcache.ahead.prefetch import SIBLINGS_MAX_FILES, Prefetcher
from neuralcache.stats import Stats

P = namedtuple("P", "path offset length eta_s prob source")
BS = 8 << 20


class FakeBackend:
    def __init__(self):
        self.calls = []

    def read(self, key, offset, length, version):
        self.calls.append((key, offset, length))
        return bytes(length)


class Scripted:
    def __init__(self, preds):
        self.preds = preds
        self.hints = None
        self.planned = set()

    def set_catalog(self, entries):
        pass

    def observe(self, ev):
        pass

    def predict(self, n):
        return self.preds[:n]

    def set_hints(self, paths):
        if "bad" in paths:
            raise ValueError("hint 1: not a path")
        self.hints = paths

    def clear_hints(self):
        self.hints = None

    def note_planned(self, path):
        self.planned.add(path)

    def is_planned(self, path):
        return path in self.planned


def setup(preds, objects, budget=1 << 30):
    ns = Namespace()
    for k, s in objects:
        ns.put_file(k, s, "v", 0.0)
    be = FakeBackend()
    store = BlockStore(be, MemoryTier(1 << 30), None, Stats(), block_size=BS, concurrency=16)
    return ns, be, store, Prefetcher(ns, store, Scripted(preds), budget_bytes=budget)


def run(store, fn):
    async def main():
        async with trio.open_nursery() as n:
            await n.start(store.run)
            fn()
            await trio.sleep(0.2)
            # and until every load started has ended (a loaded machine: 0.2 s was not
            # always enough for 168 loads through 16 threads)
            with trio.move_on_after(10):
                while store._flights:
                    await trio.sleep(0.01)
            n.cancel_scope.cancel()
    trio.run(main)


def test_a_head_only_prediction_fetches_the_block_holding_it():
    big = 40 * BS
    ns, be, store, pf = setup([P("big", 0, 1 << 20, 1.0, 1.0, "epochset"),
                               P("small", 0, 1000, 1.0, 1.0, "epochset")],
                              [("big", big), ("small", 1000)])
    run(store, lambda: pf.on_open("elsewhere/other", 1, 1))
    assert sorted(be.calls) == [("big", 0, BS), ("small", 0, 1000)]
    assert pf.predictor.planned == {"small"}     # "big" is not whole: not planned


def test_weak_predictions_are_cut_whatever_their_source():
    ns, be, store, pf = setup([P("a", 0, 10, 1.0, 0.01, "stride"),
                               P("b", 0, 10, 1.0, 0.9, "stride"),
                               P("c", 0, 10, 1.0, 0.01, "epochset")],
                              [("a", 10), ("b", 10), ("c", 10)])
    run(store, lambda: pf.on_open("elsewhere/x", 1, 1))
    assert sorted(k for k, _, _ in be.calls) == ["b"]


def test_planned_files_are_not_fetched_again():
    ns, be, store, pf = setup([P("a", 0, 10, 1.0, 1.0, "hints")], [("a", 10)])
    pf.predictor.note_planned("a")
    run(store, lambda: pf.on_open("elsewhere/x", 1, 1))
    assert be.calls == []


def test_no_prediction_backs_off_until_a_miss_or_a_prediction_to_start():
    """An empty answer (every file of the epoch planned) is asked again less and less
    often: each of 3,000 opens of a small-file epoch used to ask.  A read that waited
    on the remote plans at once, and a start resets the backoff."""
    ns, be, store, pf = setup([], [("a", 10)])
    asked = []
    predict = pf.predictor.predict
    pf.predictor.predict = lambda n: asked.append(n) or predict(n)

    def opens(k):
        for i in range(k):
            pf.on_open(f"elsewhere/x{i}", 1, 1)

    def body():
        opens(40)
        quiet = len(asked)
        store.stats.disk_misses += 1        # a reader waited on the remote
        opens(1)
        after_miss = len(asked) - quiet
        pf.predictor.preds = [P("a", 0, 10, 1.0, 1.0, "epochset")]
        store.stats.disk_misses += 1
        opens(3)                               # starts "a": no backoff after a start
        return quiet, after_miss

    out = {}
    run(store, lambda: out.update(zip(("quiet", "after_miss"), body())))
    assert out["quiet"] <= 7               # 1, 2, 4, 8, 16, 32: not 40
    assert out["after_miss"] == 1
    assert [k for k, _, _ in be.calls] == ["a"]
    assert pf.plans == len(asked)           # the stats' prefetch_plans, _empty
    assert pf.plans_empty == out["quiet"] + out["after_miss"]


def test_a_warm_open_plans_nothing_and_is_observed_when_the_predictor_is_needed():
    """The kernel holds the file's pages: its read never reaches the daemon, so the
    open costs no planning and the predictor sees it only before it is next asked
    (a third of the trio thread in a warm epoch was observing); the next cold open
    gives it the warm opens in order, then its own, then plans."""
    ns, be, store, pf = setup([P("a", 0, 10, 1.0, 1.0, "hints")], [("a", 10)])
    seen = []
    pf.predictor.observe = seen.append
    run(store, lambda: [pf.on_open(f"warm/{i}", 1, 1, warm=True) for i in range(3)])
    assert be.calls == [] and seen == []
    run(store, lambda: pf.on_open("elsewhere/y", 1, 1))
    assert [e.path for e in seen] == ["warm/0", "warm/1", "warm/2", "elsewhere/y"]
    assert be.calls == [("a", 0, 10)]
    # a READ of a file opened warm (its pages gone): the predictor hears of the open
    # before the read's load (``reading``, called by the edge), with nothing planned
    run(store, lambda: pf.on_open("warm/3", 1, 1, warm=True))
    seen.clear()
    pf.reading()
    assert [e.path for e in seen] == ["warm/3"] and be.calls == [("a", 0, 10)]


def test_a_long_warm_stretch_keeps_only_its_last_opens():
    """A warm epoch longer than the ring: the predictor is given the last
    WARM_DEFER_MAX opens (the rest are counted as unseen), before a hint, a read or a
    plan needs it."""
    from neuralcache.ahead.prefetch import WARM_DEFER_MAX

    ns, be, store, pf = setup([], [("a", 10)])
    seen = []
    pf.predictor.observe = seen.append
    for i in range(WARM_DEFER_MAX + 5):
        pf.on_open(f"warm/{i}", 1, 1, warm=True)
    assert seen == [] and pf.warm_opens_unseen == 5
    pf.on_read("a", 0, 10, 10, 1)
    assert len(seen) == WARM_DEFER_MAX + 1 and seen[0].path == "warm/5"
    assert seen[-1].op == "read"


def test_a_predicted_file_on_disk_only_is_loaded_into_memory(tmp_path):
    """From the disk tier, not the remote, and bounded by the unread budget: in memory
    before its open, a small file is pushed to the kernel page cache at open."""
    from neuralcache.store.blocks import Pinned
    from neuralcache.store.tiers import BlockKey, DiskTier

    objs = [("big", 2 << 20)] + [(f"f{i}", 1 << 20) for i in range(6)]
    ns, be, store, pf = setup([P(k, 0, s, 1.0, 1.0, "hints") for k, s in objs], objs,
                              budget=3 << 20)
    store.disk = DiskTier(str(tmp_path / "cache"), 1 << 30)
    for k, s in objs:
        assert store.disk.put(BlockKey(k, "v", 0), bytes([len(k)]) * s)
    run(store, lambda: pf.on_open("x", 1, 1))
    assert be.calls == []                                  # nothing from the remote
    assert store.mem.get(BlockKey("big", "v", 0)) is None  # > DISK_LOAD_MAX: on demand
    objs = objs[1:]
    loaded = [k for k, s in objs if store.mem.get(BlockKey(k, "v", 0)) is not None]
    assert 3 <= len(loaded) <= 4, loaded                   # the budget holds
    assert store.resident(Pinned(loaded[0], "v", 1 << 20)) == bytes([2]) * (1 << 20)
    assert store.stats.prefetch_bytes_fetched == 0


def test_large_files_get_several_loads_in_flight_from_the_start():
    """Early in an epoch (no measured rate yet) predicted shards get MIN_INFLIGHT_LOADS
    loads in flight (a read-ahead window); small and multi-block files keep the bytes
    floor."""
    from neuralcache.ahead.prefetch import MIN_INFLIGHT_BYTES, MIN_INFLIGHT_LOADS

    shards = [(f"shard{i:02d}", BS - 1000) for i in range(20)]
    ns, be, store, pf = setup([P(k, 0, 0, 1.0, 1.0, "hints") for k, _ in shards], shards)
    run(store, lambda: pf.on_open("x", 1, 1))
    assert len(be.calls) == MIN_INFLIGHT_LOADS == 16
    # a larger file gets the bytes floor: its read-ahead starts when it is opened
    ns, be, store, pf = setup([P("big", 0, 0, 1.0, 1.0, "hints")], [("big", 20 * BS)])
    run(store, lambda: pf.on_open("x", 1, 1))
    assert len(be.calls) == MIN_INFLIGHT_BYTES // BS == 2
    small = [(f"s{i:03d}", 100_000) for i in range(400)]
    ns, be, store, pf = setup([P(k, 0, n, 1.0, 1.0, "hints") for k, n in small], small)
    run(store, lambda: pf.on_open("x", 1, 1))
    assert len(be.calls) == -(-MIN_INFLIGHT_BYTES // 100_000)


def test_sibling_directories_join_the_catalog_below_the_mount_root_only():
    """ds/c0 opened: its sibling class ds/c1 joins the catalog.  fio/ opened: its
    siblings at the mount's root are other datasets and stay out."""
    objs = [("ds/c0/a", 10), ("ds/c1/b", 10), ("fio/f", 10), ("other/x", 10)]
    ns, be, store, pf = setup([], objs)
    ino = {d: ns.by_path(d).inode for d in ("ds/c0", "ds/c1", "fio", "other")}
    pf.on_open("fio/f", 10, 1, ino["fio"])
    assert ino["other"] not in pf._catalog_dirs | pf._wanted_dirs
    pf.on_open("ds/c0/a", 10, 1, ino["ds/c0"])
    assert ino["ds/c1"] in pf._catalog_dirs | pf._wanted_dirs


def test_unread_budget_bounds_prefetch():
    objs = [(f"f{i:02d}", 1 << 20) for i in range(20)]
    ns, be, store, pf = setup([P(k, 0, s, 1.0, 1.0, "hints") for k, s in objs], objs,
                              budget=4 << 20)
    run(store, lambda: pf.on_open("x", 1, 1))
    assert 4 <= len(be.calls) <= 5


def test_loads_in_flight_count_against_the_unread_budget():
    """A memory tier below the in-flight floor (a 4 MiB node): loads still in flight
    land unread in it, so they count against the budget too.  Counted apart, 16 MiB
    of 512 KiB files started at once into a 2 MiB budget (the multinode bench: the next
    epoch's share fetched and evicted before it was read)."""
    import threading

    gate = threading.Event()

    class Slow(FakeBackend):
        def read(self, key, offset, length, version):
            self.calls.append((key, offset, length))
            gate.wait(5)
            return bytes(length)

    objs = [(f"f{i:02d}", 512 << 10) for i in range(40)]
    ns, _, store, pf = setup([P(k, 0, s, 1.0, 1.0, "hints") for k, s in objs], objs,
                             budget=2 << 20)
    be = store.backend = Slow()

    async def main():
        async with trio.open_nursery() as n:
            await n.start(store.run)
            pf.on_open("x", 1, 1)
            await trio.sleep(0.05)
            pf.on_open("y", 1, 1)                # a second pump while they load
            await trio.sleep(0.05)
            started = len(store._flights)
            gate.set()
            n.cancel_scope.cancel()
        return started

    assert trio.run(main) == 4                  # 4 x 512 KiB = the 2 MiB budget
    assert len(be.calls) == 4


def test_bad_hints_are_a_user_error_and_change_nothing():
    ns, be, store, pf = setup([], [("a", 1)])
    with pytest.raises(UserError):
        pf.set_hints(["a", "bad"])
    assert pf.hints_set == 0
    assert pf.set_hints(["a"]) == 1 and pf.predictor.hints == ["a"]


def test_first_open_in_a_small_directory_starts_every_sibling():
    """A checkpoint directory loads in about one round trip, not one per file."""
    objs = [("ckpt/config.json", 700), ("ckpt/generation_config.json", 100),
            ("ckpt/model.safetensors", 3 * BS), ("data/a", 10)]
    ns, be, store, pf = setup([], objs)
    run(store, lambda: pf.on_open("ckpt/config.json", 700, 1))
    assert sorted(be.calls) == [("ckpt/generation_config.json", 0, 100),
                                ("ckpt/model.safetensors", 0, BS)]   # first block only
    be.calls.clear()
    run(store, lambda: pf.on_open("ckpt/generation_config.json", 100, 1))
    assert be.calls == []                      # once per directory


def test_large_directories_are_left_to_the_predictor():
    objs = [(f"d/{i:03d}", 10) for i in range(SIBLINGS_MAX_FILES + 1)]
    ns, be, store, pf = setup([], objs)
    run(store, lambda: pf.on_open("d/000", 10, 1))
    assert be.calls == []


def test_a_large_catalog_is_packed_and_each_directory_packed_once(monkeypatch):
    """predictors/packed.py: a catalog of CATALOG_CHEAP_FILES files or more is packed,
    from directory segments packed once each (again only when listed again)."""
    import neuralcache.ahead.prefetch as pfm
    from predictors.base import Catalog
    from predictors.packed import PackedCatalog

    objs = [(f"ds/c{c}/f{i:03d}", 10 + i) for c in (2, 0, 1) for i in range(50)]
    ns, be, store, pf = setup([], objs)
    got = []
    pf.predictor.set_catalog = got.append
    ino = {c: ns.by_path(f"ds/c{c}").inode for c in range(3)}
    pf.on_open("ds/c0/f000", 10, 1, ino[0])          # its siblings c1, c2 join it
    cat = got[-1]
    assert type(cat) is Catalog and list(cat.paths) == sorted(p for p, _ in objs)
    segs = dict(pf._segments)
    assert set(segs) == set(ino.values())
    monkeypatch.setattr(pfm, "CATALOG_CHEAP_FILES", 100)
    pf._catalog_at = 0.0                               # (past CATALOG_EVERY_S)
    pf.listed(ino[1])                                  # c1 listed again
    cat = got[-1]
    assert isinstance(cat, PackedCatalog) and len(cat) == 150
    assert [cat.paths[i] for i in range(150)] == sorted(p for p, _ in objs)
    assert all(cat.size_of(p) == s for p, s in objs)
    assert pf._segments[ino[0]] is segs[ino[0]] and pf._segments[ino[2]] is segs[ino[2]]
    assert pf._segments[ino[1]] is not segs[ino[1]]
    # a file added to c2: packed again; c0 removed: out of the catalog
    ns.put_file("ds/c2/new", 5, "v", 0.0)
    ns.remove(ns.by_path("ds/c0"))
    pf._catalog_stale, pf._catalog_at = True, 0.0
    pf._rebuild_catalog()
    cat = got[-1]
    assert isinstance(cat, PackedCatalog) and len(cat) == 101
    assert cat.size_of("ds/c2/new") == 5 and "ds/c0/f000" not in cat.index
    assert pf._segments[ino[2]] is not segs[ino[2]] and ino[0] not in pf._segments


def test_directories_join_the_catalog_a_step_at_a_time(monkeypatch):
    """CATALOG_STEP_S: directories already listed (a walk of the tree before the first
    read) are packed a few per open, not all in the open that brings them; the catalog
    is rebuilt once the last is packed, and has every file of them."""
    import neuralcache.ahead.prefetch as pfm

    monkeypatch.setattr(pfm, "CATALOG_STEP_S", 0.0)         # one directory a step
    objs = [(f"ds/c{c}/f{i:02d}", 10) for c in range(6) for i in range(20)]
    ns, be, store, pf = setup([], objs)
    got = []
    pf.predictor.set_catalog = got.append
    ino = ns.by_path("ds/c0").inode
    pf.on_open("ds/c0/f00", 10, 1, ino)                      # brings its 5 siblings
    assert got == [] and len(pf._segments) == 1 and pf._catalog_stale
    for k in range(4):
        pf.on_open(f"ds/c0/f{k + 1:02d}", 10, 1, ino)
    assert got == [] and len(pf._segments) == 5
    pf.on_open("ds/c0/f10", 10, 1, ino)                      # the last one: rebuilt
    assert len(got) == 1 and len(got[-1]) == 120 and not pf._catalog_stale
    assert sorted(got[-1].paths) == sorted(p for p, _ in objs)
    pf.on_open("ds/c0/f11", 10, 1, ino)                      # nothing new: not again
    assert len(got) == 1

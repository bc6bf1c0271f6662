"""Opt-in CPU accounting (neuralcache/cpuacct.py): parts add up, off costs nothing."""
import os

import xxhash

from neuralcache import cpuacct
from neuralcache.store.tiers import BlockKey, DiskTier


def _burn():
    for _ in range(30):
        xxhash.xxh3_64_intdigest(os.urandom(1 << 20))


def test_off_by_default_measures_nothing():
    assert os.environ.get("NEURALCACHE_CPU_ACCOUNTING") != "1"
    assert cpuacct.clock() == 0 and cpuacct.snapshot() is None


def test_parts_are_charged_to_the_thread_that_ran_them(monkeypatch, tmp_path):
    monkeypatch.setattr(cpuacct, "ENABLED", True)
    cpuacct.set_loop_thread()
    before = cpuacct.snapshot()
    t0 = cpuacct.clock()
    _burn()
    cpuacct.charge("fetch", t0)
    disk = DiskTier(str(tmp_path), 1 << 30)
    disk.load()
    data = os.urandom(4 << 20)
    assert disk.put(BlockKey("k", "v", 0), data)
    assert disk.get(BlockKey("k", "v", 0)) == data
    after = cpuacct.snapshot()
    d = {k: after[k] - before.get(k, 0.0) for k in after}
    assert d["fetch"] > 0.005
    assert d["disk_write"] > 0 and d["disk_read"] > 0
    assert 0 < d["checksum"] <= d["disk_write"] + d["disk_read"]
    # this test runs on the "loop" thread: its CPU covers what was charged on it
    assert d["loop_thread"] >= d["fetch"] - 0.02
    assert after["total"] >= after["loop_thread"]

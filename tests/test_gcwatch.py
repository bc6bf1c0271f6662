"""The garbage collector's pauses (neuralcache/gcwatch.py): counted, timed, logged."""
import gc
import logging

from neuralcache import gcwatch
from neuralcache.gcwatch import GcWatch


def test_each_collection_is_timed_and_a_long_one_logged(caplog, monkeypatch):
    w = GcWatch()
    w.install()
    w.install()                          # twice is once
    monkeypatch.setattr(gcwatch, "LOG_PAUSE_S", 0.0)
    try:
        with caplog.at_level(logging.WARNING, logger="neuralcache.gcwatch"):
            gc.collect()
    finally:
        w.uninstall()
    assert w.collections[2] == 1
    assert w.total_s > 0 and w.longest_s > 0
    assert "garbage collector stopped the daemon" in caplog.text
    assert "generation 2" in caplog.text
    s = w.stats()
    assert s["gc_collections"][2] == 1
    assert s["gc_pause_longest_ms"] == round(w.longest_s * 1e3, 1)
    assert s["gc_pause_total_s"] == round(w.total_s, 3)
    gc.collect()                         # no longer watched
    assert w.collections[2] == 1


def test_short_pauses_are_not_logged(caplog):
    w = GcWatch()
    w.install()
    try:
        with caplog.at_level(logging.WARNING, logger="neuralcache.gcwatch"):
            gc.collect(0)
    finally:
        w.uninstall()
    assert w.collections[0] >= 1
    assert "garbage collector" not in caplog.text

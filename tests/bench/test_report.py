"""Ratios and table of a run, the scenario registry (no servers, no mounts)."""
from __future__ import annotations

from bench.report import results as report
from bench.scenarios.registry import SCENARIOS, register


def _rows():
    return [
        {"scenario": "shards", "system": "link", "phase": "link", "value": 200.0,
         "unit": "MB/s", "mbps": 200.0, "link_bytes_down": 10},
        {"scenario": "shards", "system": "local", "phase": "cold", "value": 800.0,
         "unit": "MB/s", "mbps": 800.0},
        {"scenario": "shards", "system": "rclone", "phase": "cold", "value": 20.0,
         "unit": "MB/s", "mbps": 20.0, "byte_hit_rate_est": 0.0, "link_bytes_down": 5e6},
        {"scenario": "shards", "system": "s3fs", "phase": "-", "error": "boom"},
        {"scenario": "train", "system": "local", "phase": "cold", "value": 110.0,
         "unit": "samples/s", "mbps": 10.0,
         "windows": [{"batch": b, "samples_per_s": 116.0} for b in (4, 8, 12, 16)]},
        {"scenario": "train", "system": "rclone", "phase": "cold", "value": 90.0,
         "unit": "samples/s", "mbps": 8.0,
         "windows": [{"batch": 4, "samples_per_s": 40.0}, {"batch": 8, "samples_per_s": 100.0},
                     {"batch": 12, "samples_per_s": 111.0}, {"batch": 16, "samples_per_s": 116.0}]},
    ]


def test_annotate_ratios_and_within5():
    rows = report.annotate(_rows())
    rc = rows[2]
    assert rc["x_local"] == 20.0 / 800.0
    assert rc["x_link"] == 20.0 / 200.0
    assert rows[5]["within5_batch"] == 12   # 111 >= 0.95 * 116
    assert "x_local" not in rows[3]


def test_table_shows_errors_and_rows():
    rows = report.annotate(_rows())
    text = report.table(rows, {"argv": ["bench", "run"], "rtt_ms": 60, "cpus": 2},
                        ["a note"])
    assert "ERROR boom" in text
    assert "within 5% of local at batch 12" in text
    assert "note: a note" in text


def test_table_shows_the_host_control_of_a_row():
    """harness.measure's proxy CPU and steal: a note where there is enough to read."""
    rows = _rows()
    rows[2].update(link_bytes_down=1 << 30, link_bytes_up=0, proxy_cpu_s=0.3, steal_s=0.45)
    rows[1].update(proxy_cpu_s=0.0, steal_s=0.02)         # no link bytes, no steal
    text = report.table(report.annotate(rows), {"argv": ["bench", "run"]})
    line = next(x for x in text.splitlines() if " rclone " in x and "shards" in x)
    assert "WAN emu 0.30 s/GiB" in line and "steal 0.5 s" in line
    line = next(x for x in text.splitlines() if " local " in x and "shards" in x)
    assert "WAN emu" not in line and "steal" not in line


def test_registry_is_extensible():
    assert {"shards", "samples", "train", "bigfile", "overflow", "fio"} <= set(SCENARIOS)
    register("dummy", lambda ctx: [])
    try:
        assert SCENARIOS["dummy"](None) == []
    finally:
        del SCENARIOS["dummy"]


def test_plots_draw_bars_and_train_windows(tmp_path):
    made = report.plots(report.annotate(_rows()), tmp_path)
    assert [p.name for p in made] == ["shards.png", "train.png"]
    assert all(p.stat().st_size > 1000 for p in made)


def test_hints_system_runs_only_where_hints_are_published():
    from bench.scenarios.registry import hints_note, systems_for
    from bench.systems.registry import MOUNT_SYSTEMS as ALL_SYSTEMS   # peers: tests/bench/test_peers.py

    for name in ("shards", "samples", "train-files"):
        assert systems_for(name, ALL_SYSTEMS) == ALL_SYSTEMS
    for name in ("train", "bigfile", "overflow", "fio"):
        got = systems_for(name, ALL_SYSTEMS)
        assert "neuralcache-hints" not in got and "neuralcache" in got
        assert len(got) == len(ALL_SYSTEMS) - 1
    assert hints_note(["shards", "samples"], ALL_SYSTEMS) is None
    assert hints_note(["samples", "bigfile", "maze"], ["local", "neuralcache"]) is None
    note = hints_note(["samples", "bigfile", "maze"], ["neuralcache", "neuralcache-hints"])
    assert note.startswith("neuralcache-hints skipped in bigfile, maze:")


def test_measure_records_the_host_control_and_the_daemons_fresh_pages(tmp_path):
    """harness.measure: the proxy's CPU over the phase, the VM's steal, and the minor
    faults of the system's daemon (here this process: the phase touches 16 MiB of
    fresh memory, so at least ~4k faults)."""
    import mmap
    import os

    from bench.scenarios.harness import Ctx

    class Proxy:
        n = 0

        def stats(self):
            Proxy.n += 1
            return {"bytes_up": 0, "bytes_down": 10 * Proxy.n, "connections": 0,
                    "cpu_s": 0.25 * Proxy.n}

    class Mount:
        remote, daemon_pids = True, staticmethod(lambda: [os.getpid()])

        def stats(self):
            return None

    ctx = Ctx(quick=True, seed=0, out_dir=tmp_path, work_dir=tmp_path, data_dir=tmp_path,
              systems=[], rtt_ms=60, mbit=None, bucket="b", seaweed=None, s3=None,
              s3_link=None, proxy=Proxy(), sys_env=None, timeout_s=60)

    def touch():
        buf = mmap.mmap(-1, 16 << 20)
        for off in range(0, len(buf), mmap.PAGESIZE):
            buf[off] = 1
        return {"seconds": 0.1, "bytes": 100}

    row = ctx.measure(Mount(), "cold", touch)
    assert row["proxy_cpu_s"] == 0.25 and row["link_bytes_down"] == 10
    assert row["steal_s"] >= 0
    assert row["daemon_minor_faults"] >= 3000

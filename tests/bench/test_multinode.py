"""The multinode scenario's table, targets and runner rows (bench/scenarios/multinode/
table.py) from a made-up result (no servers, no mounts)."""
from __future__ import annotations

from bench.scenarios.multinode import table as mn
from bench.report import results as report
from bench.scenarios.registry import SCENARIOS, DEFAULT


def _epoch(e, wan_x, mbps, **kw):
    return {"epoch": e, "wan_x": wan_x, "wan_bytes": int(wan_x * 1e6), "bytes": 1_000_000,
            "wall_s": 1.0, "reads": 64, "failed": 0, "verify_errors": 0, "min_mbps": mbps,
            "mean_mbps": mbps * 1.1, **kw}


def _result(**over):
    r = {"params": {"nodes": 4, "epochs": 3, "files": 64, "file_kb": 512, "ckpt_mb": 32,
                    "seed": 0, "rtt_ms": 60.0, "others": ["rclone", "s3fs"]},
         "dataset_bytes": 1_000_000, "file_bytes": [524288, 530150], "ckpt_bytes": 32 << 20,
         "cache_mb": 4, "block": "1M", "readers": 4,
         "link_mbps": {"in_region_alone": 100.0, "in_region": 50.0,
                       "in_region_nodes": [50.0] * 4, "wan_alone": 25.0},
         "epochs": {"without": [_epoch(1, 1.0, 20.0), _epoch(2, 1.0, 20.0),
                                _epoch(3, 1.0, 20.0)],
                    "with": [_epoch(1, 1.05, 19.0, shared_hits=5),
                             _epoch(2, 0.0, 46.0, shared_hits=64),
                             _epoch(3, 0.0, 48.0, shared_hits=64)],
                    "rclone": [_epoch(e, 1.0, 15.0) for e in (1, 2, 3)]},
         "errors": {"s3fs": "SystemUnavailable: s3fs not installed"},
         "faults": {"volume_killed": _epoch(4, 0.01, 40.0, fault_at_s=0.5, read_errors=0),
                    "gateway_killed": _epoch(5, 0.5, 20.0, fault_at_s=0.4,
                                             shared_breaker_trips=4),
                    "tier_down": _epoch(6, 1.0, 19.0, shared_skipped=64),
                    "after_recovery": _epoch(7, 0.0, 45.0, shared_hits=64),
                    "gateway_restart_s": 1.5, "recovered_after_s": 4.2,
                    "breakers": {"opened_after_s": [1.0, 2.5, None, 1.2],
                                 "deadline_ms": [400.0, 500.0, 600.0, None]}},
         "checkpoint": {
             "alone": {"nodes": 1, "origin_x": 1.0, "max_s": 1.0, "lease_waits": 0,
                       "read_errors": 0, "verify_errors": 0},
             "with": {"nodes": 4, "origin_x": 1.05, "max_s": 1.2, "lease_waits": 30,
                      "read_errors": 0, "verify_errors": 0},
             "with, leases off": {"nodes": 4, "origin_x": 4.0, "max_s": 1.5, "lease_waits": 0,
                                  "read_errors": 0, "verify_errors": 0},
             "without": {"nodes": 4, "origin_x": 4.0, "max_s": 1.4, "lease_waits": 0,
                         "read_errors": 0, "verify_errors": 0}}}
    r.update(over)
    return r


def test_targets_met_and_missed():
    t = {x["measure"]: x for x in mn.targets(_result())}
    assert len(t) == 8
    assert all(x["met"] for x in t.values())
    r = _result()
    r["epochs"]["with"][0]["wan_x"] = 1.2                 # 1.2x over 3 epochs > 1.1x
    r["epochs"]["with"][2]["min_mbps"] = 40.0              # 40/50 = 0.8 < 0.9
    r["faults"]["volume_killed"]["failed"] = 1
    r["faults"]["recovered_after_s"] = None
    r["checkpoint"]["with"]["max_s"] = 1.4                 # 1.4x one node alone
    r["epochs"]["with"][0]["min_mbps"] = 17.0              # 17/20 = 0.85 < 0.9
    missed = {x["measure"] for x in mn.targets(r) if not x["met"]}
    assert missed == {"WAN bytes over 3 epochs, 4 nodes, --shared-cache",
                      "per-node MB/s, epochs 2-3 (slowest node, worst epoch)",
                      "volume server killed mid-epoch",
                      "tier back: used again by itself",
                      "4 nodes load one checkpoint: each node's load time",
                      "epoch 1, slowest node, with / without the tier"}


def test_tier_down_compares_with_the_nodes_without_the_tier():
    r = _result()
    r["faults"]["tier_down"]["min_mbps"] = 17.0            # 17 / 20 = 0.85 < 0.9
    t = {x["measure"]: x for x in mn.targets(r)}
    assert not t["tier down: reads go on at single-node speed"]["met"]
    assert t["tier down: reads go on at single-node speed"]["value"].startswith("0.85")


def test_table_shows_every_part():
    text = mn.table(_result())
    assert "dataset: 64 synthetic files of 512-518 KiB" in text
    assert "4x nc --shared-cache, epoch 2" in text
    assert "4x rclone (each alone), all" in text
    assert "4x s3fs (each alone)" in text and "ERROR SystemUnavailable" in text
    assert "volume server killed at 0.5 s" in text
    assert "used the tier again 4.2 s later, by itself" in text
    assert "breaker opened on 3 of 4 nodes 1.0-2.5 s after the kill" in text
    assert text.count("yes") >= 7 and "NO" not in text.split("target (issue 13)")[1]


def test_epochs_only_shows_the_epochs_and_the_tiers_counters():
    r = _result(faults={}, checkpoint={}, errors={})
    r["params"]["others"] = []
    r["epochs"] = {k: v for k, v in r["epochs"].items() if k in ("with", "without")}
    r["epochs"]["with"][0].update(shared_leases=40, shared_lease_waits=3)
    text = mn.table(r)
    assert "epoch 1: hits 5, leases 40, lease_waits 3" in text
    assert "epoch 1, slowest node, with / without the tier: 0.95 (19.0 / 20.0" in text
    assert "checkpoint" not in text.split("dataset:")[1].split("\n", 1)[1]
    assert len(mn.targets(r)) == 3
    assert mn.rows(r)


def test_rows_feed_the_runner_table():
    rows = report.annotate(mn.rows(_result()))
    with2 = next(r for r in rows if r["system"] == "4x nc --shared-cache"
                 and r["phase"] == "epoch2")
    assert with2["x_link"] == 46.0 / 50.0
    assert any(r.get("error") for r in rows)
    text = report.table(rows, {"argv": ["bench", "run"], "rtt_ms": 60, "cpus": 2})
    assert "multinode" in text and "recovered" in text


def test_registered_but_not_in_all():
    assert "multinode" in SCENARIOS and "multinode" not in DEFAULT

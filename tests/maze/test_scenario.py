"""The maze bench scenario's report pieces (no servers, no mounts, no torch)."""
from __future__ import annotations

from bench.report import results as report
from bench.scenarios.maze import scenario


def _result(rate_first: float, rate: float, steps: int = 250) -> dict:
    per_batch = [{"step": i, "samples": 64, "step_s": 64 / (rate_first if i <= 10 else rate),
                  "wait_s": 0.0, "loss": 1.0} for i in range(1, steps + 1)]
    return {"per_batch": per_batch}


def test_window_table_is_fine_early_then_coarse():
    lines = scenario.window_table({"local": _result(100, 100), "neuralcache": _result(20, 99)},
                                  250)
    spans = [ln.split()[-3] for ln in lines[1:]]
    assert spans[:2] == ["1-10", "11-20"] and spans[9] == "91-100"
    assert spans[10:] == ["101-200", "201-250"]
    first = lines[1].split()
    assert float(first[-2]) == 100.0 and float(first[-1]) == 20.0


def test_maze_rows_in_the_table():
    win = [{"batch": b, "samples_per_s": 100.0} for b in (10, 20, 30, 40)]
    slow = [{"batch": 10, "samples_per_s": 30.0}, {"batch": 20, "samples_per_s": 97.0},
            {"batch": 30, "samples_per_s": 99.0}, {"batch": 40, "samples_per_s": 100.0}]
    rows = report.annotate([
        {"scenario": "maze", "system": "local", "phase": "train", "value": 100.0,
         "unit": "samples/s", "mbps": 0.0, "windows": win, "accuracy_before": 0.0,
         "accuracy_after": 0.97, "same_bytes_as_local": True, "loss_max_diff": 0.0},
        {"scenario": "maze", "system": "neuralcache", "phase": "train", "value": 95.0,
         "unit": "samples/s", "mbps": 0.0, "windows": slow, "accuracy_before": 0.0,
         "accuracy_after": 0.97, "same_bytes_as_local": True, "loss_max_diff": 0.0},
        {"scenario": "maze", "system": "rclone", "phase": "train", "value": 50.0,
         "unit": "samples/s", "mbps": 0.0, "windows": slow[:1], "accuracy_before": 0.0,
         "accuracy_after": 0.5, "same_bytes_as_local": False, "loss_max_diff": 0.3},
    ])
    assert rows[1]["within5_batch"] == 20 and rows[1]["x_local"] == 0.95
    assert "within5_batch" not in rows[0]
    text = report.table(rows, {"argv": ["bench", "run"], "rtt_ms": 60, "cpus": 2})
    nc = next(ln for ln in text.splitlines() if " neuralcache " in ln)
    assert "within 5% of local at batch 20" in nc and "bytes == local" in nc
    assert "accuracy 0% -> 97%" in nc
    rc = next(ln for ln in text.splitlines() if " rclone " in ln)
    assert "BYTES DIFFER" in rc and "at batch never" in rc
    loc = next(ln for ln in text.splitlines() if " local " in ln)
    assert "within 5%" not in loc and "bytes ==" not in loc


def test_maze_plots_throughput_and_loss(tmp_path):
    import types

    res = {"samples_per_s": 90.0, "loss_curve": [2.0, 1.0, 0.5],
           "windows": [{"last_step": s, "samples_per_s": 90.0, "stall_fraction": 0.1,
                        "loss": 1.0} for s in (10, 20, 30)]}
    scenario._plots(types.SimpleNamespace(out_dir=tmp_path, rtt_ms=60), {"local": res})
    for name in ("maze_throughput.png", "maze_loss.png"):
        assert (tmp_path / name).stat().st_size > 1000


def test_maze_without_torch_stops_before_any_work(monkeypatch, tmp_path, capsys):
    import importlib.util

    from bench import __main__ as cli
    from bench import runner

    real = importlib.util.find_spec

    def find_spec(name, *args, **kwargs):          # as if torch were not installed
        return None if name == "torch" else real(name, *args, **kwargs)

    def no_server(*args, **kwargs):
        raise AssertionError("the run started SeaweedFS")

    monkeypatch.setattr(importlib.util, "find_spec", find_spec)
    monkeypatch.setattr(runner, "SeaweedServer", no_server)
    out = tmp_path / "out"
    assert cli.main(["run", "--scenario", "maze", "--out", str(out)]) != 0
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["the maze scenario needs torch: pip install 'neuralcache[torch]'"]
    assert not out.exists()                        # nothing generated, nothing written


def test_maze_requirements_met_here_or_named():
    import importlib.util

    msg = scenario.requirements()
    if all(importlib.util.find_spec(m) for m in scenario.TORCH_MODULES):
        assert msg is None
    else:
        assert msg.endswith("pip install 'neuralcache[torch]'")

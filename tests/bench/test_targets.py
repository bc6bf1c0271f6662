"""bench.targets reads issue 10's and issue 20's targets off a run's rows."""
from bench.report.targets import check, table

GIB = 1 << 30


def row(sc, ph, system, value, **kw):
    return {"scenario": sc, "phase": ph, "system": system, "value": value, **kw}


def test_targets_from_rows():
    rows = [row("bigfile", "link", "link", 400.0),
            row("bigfile", "cold", "neuralcache", 360.0, cpu_daemon_s=0.9, bytes=GIB),
            row("bigfile", "cold", "rclone", 200.0, cpu_daemon_s=2.0, bytes=GIB),
            row("bigfile", "cold", "s3fs", 290.0, cpu_daemon_s=1.0, bytes=GIB),
            row("samples", "cold", "neuralcache", 500.0, cpu_daemon_s=2.0, files=1000),
            row("samples", "cold", "rclone", 50.0),
            row("samples", "warm", "neuralcache", 1000.0),
            row("samples", "warm", "local", 4000.0),
            row("samples", "warm", "rclone", 400.0),
            row("fio", "rand128k", "neuralcache", 100.0),
            row("fio", "rand128k", "s3fs", 150.0, error="mount failed")]
    got = {what: (measured, ok) for what, _, measured, ok in check({"rows": rows})}
    assert got["daemon CPU per GiB, bigfile cold"] == ("0.90 s (rclone 2.00)", True)
    assert got["daemon CPU per GiB, shards cold"][1] is None         # not measured
    assert got["daemon CPU per cold 100 KB file"] == ("2.00 ms", False)
    # 360 / 400 link = 0.9, but 360 / 290 (s3fs, the best peer) = 1.24 >= 1.2
    assert got["bigfile cold"] == ("0.90 x link, 1.24 x s3fs", True)
    assert got["samples cold, no hints"] == ("10.00 x rclone", True)
    assert got["samples warm"] == ("0.25 x local, 2.50 x rclone", False)
    assert got["fio rand128k"][1] is None          # an error row is not a measurement
    assert "| samples warm | >= 0.5 x local, >= 2 x rclone |" in table(check({"rows": rows}))


def test_kernel_path_targets_from_rows_and_a_breakdown():
    from bench.report.targets import check_kernel_path

    rows = [row("samples", "warm", "neuralcache", 4000.0),
            row("samples", "warm", "local", 4500.0),
            row("samples", "cold", "neuralcache", 500.0, cpu_daemon_s=0.5, files=1000),
            row("bigfile", "cold", "neuralcache", 400.0),
            row("bigfile", "cold", "local", 1000.0),
            row("bigfile", "cold", "s3fs", 380.0),
            row("bigfile", "cold", "s3torchconnector", 420.0),
            row("shards", "cold", "neuralcache", 200.0),
            row("shards", "cold", "neuralcache-hints", 330.0),
            row("shards", "cold", "s3torchconnector-tuned", 300.0),
            row("shards", "cold", "rclone", 900.0),           # a mount: not a library
            row("train-files", "epoch1", "neuralcache-hints", 700.0),
            row("train-files", "epoch1", "mosaic-tuned", 650.0),
            row("checkpoint", "save", "neuralcache", 2.0),
            row("checkpoint", "save", "local", 1.8),
            row("checkpoint", "durable", "local", 2.5),      # close + fsync
            row("checkpoint", "reload", "neuralcache", 300.0),
            row("checkpoint", "reload", "s3torchconnector", 320.0),
            row("multinode", "epoch1", "4x nc --shared-cache", 9.0),
            row("multinode", "epoch1", "4x neuralcache", 10.0)]
    bd = {"rows": {
        "files cold": {"files": 100, "fuse_requests": {"lookup": 100, "open": 100,
                                                       "read": 10, "release": 100}},
        "files warm 2": {"files": 100, "fuse_requests": {"open": 100, "release": 100}},
        "bigfile cold": {"fuse_read_sizes": {"<=1M": 1024, "<=128K": 2}},
        "bigfile disk": {"seconds": 1.0, "bytes": GIB, "cpu": {"total": 0.8}}}}
    got = {what: (measured, ok) for what, _, measured, ok, _values in
           check_kernel_path({"rows": rows}, bd)}
    assert got["FUSE requests per warm / cold small file (bench.breakdown)"] == (
        "2.00 / 3.10", False)
    assert got["READ size, sequential cold read (bench.breakdown)"] == ("<=1M", True)
    assert got["warm samples"] == ("0.89 x local", True)
    assert got["1 GiB from the disk cache (bench.breakdown)"] == (
        "1.07 x local, 0.80 CPU-s per GiB", False)
    assert got["daemon CPU per cold 100 KB file (samples)"] == ("0.50 ms", True)
    assert got["cold bigfile"] == ("0.95 x s3torchconnector (neuralcache)", False)
    assert got["cold shards"] == ("1.10 x s3torchconnector-tuned (neuralcache-hints)", True)
    assert got["train-files epoch 1 with hints"] == ("1.08 x mosaic-tuned", True)
    assert got["checkpoint close() / cold reload"] == (
        "1.11 x local (0.80 x local close + fsync) / 0.94 x S3Checkpoint", False)
    assert got["multinode epoch 1, slowest node with --shared-cache / without"] == (
        "0.90", True)
    assert check_kernel_path({"rows": []})[0][3] is None       # nothing measured


def test_several_runs_give_medians_ranges_and_how_many_met(tmp_path):
    """--runs: each argument one run (files joined by commas, or a directory); a target
    is met when more than half the runs that measured it met it."""
    import json

    from bench.report.targets import main

    def run(nc, best):
        rows = [row("bigfile", "cold", "neuralcache", nc),
                row("bigfile", "cold", "s3fs", best)]
        return {"rows": rows}

    paths = []
    for k, (nc, best) in enumerate(((440.0, 400.0), (520.0, 400.0), (400.0, 400.0))):
        d = tmp_path / f"run{k}"
        d.mkdir()
        (d / "results.json").write_text(json.dumps(run(nc, best)))
        paths.append(str(d))
    bd = tmp_path / "bd.json"
    bd.write_text(json.dumps({"rows": {"bigfile cold": {"fuse_read_sizes": {"<=1M": 9}},
                                       "bigfile disk": {"seconds": 1.0, "bytes": GIB,
                                                        "cpu": {"total": 0.4}}}}))
    r0 = run(440.0, 400.0)
    r0["rows"].append(row("bigfile", "cold", "local", 1000.0))
    (tmp_path / "run0" / "results.json").write_text(json.dumps(r0))
    paths[0] += "," + str(bd)         # a breakdown joined to the first run only
    import contextlib
    import io
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert main(["--runs", *paths]) == 0
    text = out.getvalue()
    # ratios 1.10, 1.30, 1.00: median 1.10, met (>= 1.1) in 2 of 3
    assert "| cold bigfile | >= 1.1 x the best mount or library | 1.10 (1.00-1.30) | " \
        "2 of 3 | yes |" in text
    # measured in one run of three: no verdict; a row only the first run has
    assert "| READ size, sequential cold read (bench.breakdown) | 1 MiB | <=1M | 1 of 1 " \
        "| - |" in text
    assert "| 1 GiB from the disk cache (bench.breakdown) | >= 0.8 x local cold, <= 0.5 " \
        "CPU-s per GiB | 1.07 (1.07-1.07) / 0.40 (0.40-0.40) | 1 of 1 | - |" in text
    assert "| 1 GiB from the disk cache (bench.breakdown) | 1.07 x local, 0.40 CPU-s per " \
        "GiB | - | - |" in text
    assert "| warm samples | >= 0.8 x local | - | 0 of 0 | - |" in text
    assert "| cold bigfile | 1.10 x s3fs (neuralcache) | 1.30 x s3fs (neuralcache) | " \
        "1.00 x s3fs (neuralcache) |" in text
    # one run of three short of the median's side: not met
    (tmp_path / "run1" / "results.json").write_text(json.dumps(run(420.0, 400.0)))
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        main(["--runs", *paths])
    assert "| 1.05 (1.00-1.10) | 1 of 3 | no |" in out.getvalue()
    # --breakdown does not mix with --runs (each run joins its own)
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        assert main(["--runs", *paths, "--breakdown", str(bd)]) == 2
    # a directory with nothing in it is a one-line error, not a traceback
    (tmp_path / "empty").mkdir()
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        assert main(["--runs", str(tmp_path / "empty")]) == 2
    assert "neither results.json nor breakdown.json" in err.getvalue()

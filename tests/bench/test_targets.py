"""bench.targets reads issue 10's targets off one run's rows."""
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

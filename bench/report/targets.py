"""The data-plane targets, checked against ``python -m bench run`` results (and
``python -m bench.breakdown`` for the rows only it measures): issue 20's kernel-path
table (the default) or issue 10's first one (``--issue 10``).

    python -m bench.targets OUT/results.json [MORE/results.json ...]
                            [--breakdown OUT/breakdown.json] [--issue 20|10]
    python -m bench.targets --runs RUN1/results.json,RUN1/breakdown.json RUN2 ...

Several results files are read as one (the full run, ``--scenario checkpoint`` and
``--scenario multinode``, which ``python -m bench run`` leaves out of "all").  With
``--runs`` each argument is one run (comma-joined files or directories) and the table
gives each target's median, range and how many runs met it.

Every ratio comes from rows of the same run (the machines are shared and noisy; only
side-by-side ratios mean anything).  A row the run did not measure shows as "-".
"""
from __future__ import annotations

import argparse
import json
import os
import sys

GIB = 1 << 30


def _rows(results: dict) -> dict[tuple[str, str, str], dict]:
    return {(r["scenario"], r["phase"], r["system"]): r for r in results["rows"]
            if "value" in r and not r.get("error")}


def _daemon_cpu_per_gib(r: dict | None) -> float | None:
    if not r or r.get("cpu_daemon_s") is None or not r.get("bytes"):
        return None
    return r["cpu_daemon_s"] / (r["bytes"] / GIB)


def _ratio(a: dict | None, b: dict | None) -> float | None:
    if not a or not b or not b.get("value"):
        return None
    return a["value"] / b["value"]


def _best(rows: dict, scenario: str, phase: str, systems: tuple[str, ...]) -> dict | None:
    got = [rows.get((scenario, phase, s)) for s in systems]
    got = [r for r in got if r]
    return max(got, key=lambda r: r["value"]) if got else None


def _fmt(x: float | None, unit: str = "") -> str:
    return "-" if x is None else f"{x:.2f}{unit}"


def check(results: dict, breakdown: dict | None = None) -> list[tuple[str, str, str, bool | None]]:
    """(what, target, measured, met) per target; met is None where not measured."""
    rows = _rows(results)
    nc = "neuralcache"
    out: list[tuple[str, str, str, bool | None]] = []

    def add(what, target, measured, ok):
        out.append((what, target, measured, ok))

    for sc in ("bigfile", "shards"):
        mine = _daemon_cpu_per_gib(rows.get((sc, "cold", nc)))
        rcl = _daemon_cpu_per_gib(rows.get((sc, "cold", "rclone")))
        ok = None if mine is None else (mine <= 1.0 and (rcl is None or mine <= rcl))
        add(f"daemon CPU per GiB, {sc} cold", "<= 1.0 s and <= rclone's",
            f"{_fmt(mine)} s (rclone {_fmt(rcl)})", ok)
    r = rows.get(("samples", "cold", nc))
    per_file = (r["cpu_daemon_s"] / r["files"] * 1000) if r and r.get("files") \
        and r.get("cpu_daemon_s") is not None else None
    add("daemon CPU per cold 100 KB file", "<= 0.4 ms", _fmt(per_file, " ms"),
        None if per_file is None else per_file <= 0.4)
    for sc in ("shards", "bigfile"):
        mine, link = rows.get((sc, "cold", nc)), rows.get((sc, "link", "link"))
        best = _best(rows, sc, "cold", ("rclone", "s3fs", "s3torchconnector",
                                         "s3torchconnector-tuned"))
        xl, xb = _ratio(mine, link), _ratio(mine, best)
        ok = None if xl is None else (xl >= 0.85 and (xb is None or xb >= 1.2))
        add(f"{sc} cold", ">= 0.85 x link, >= 1.2 x best peer",
            f"{_fmt(xl)} x link, {_fmt(xb)} x {best['system'] if best else '-'}", ok)
    x = _ratio(rows.get(("samples", "cold", nc)), rows.get(("samples", "cold", "rclone")))
    add("samples cold, no hints", ">= 10 x rclone", f"{_fmt(x)} x rclone",
        None if x is None else x >= 10)
    x = _ratio(rows.get(("samples", "cold", "neuralcache-hints")),
               rows.get(("samples", "link", "link")))
    add("samples cold, with hints", ">= 0.8 x link", f"{_fmt(x)} x link",
        None if x is None else x >= 0.8)
    xl = _ratio(rows.get(("samples", "warm", nc)), rows.get(("samples", "warm", "local")))
    xr = _ratio(rows.get(("samples", "warm", nc)), rows.get(("samples", "warm", "rclone")))
    add("samples warm", ">= 0.5 x local, >= 2 x rclone",
        f"{_fmt(xl)} x local, {_fmt(xr)} x rclone",
        None if xl is None else (xl >= 0.5 and (xr is None or xr >= 2)))
    x = _ratio(rows.get(("shards", "warm", nc)), rows.get(("shards", "warm", "local")))
    add("shards warm", ">= 0.9 x local", f"{_fmt(x)} x local", None if x is None else x >= 0.9)
    disk = (breakdown or {}).get("rows", {}).get("bigfile disk")
    if disk and disk.get("seconds"):
        cpu = disk["cpu"]["total"] / (disk["bytes"] / GIB)
        add("1 GiB from the disk cache (bench.breakdown)", "<= 0.5 CPU-s per GiB",
            f"{cpu:.2f} CPU-s per GiB, {disk['bytes'] / disk['seconds'] / 1e6:.0f} MB/s",
            cpu <= 0.5)
    else:
        add("1 GiB from the disk cache (bench.breakdown)", "<= 0.5 CPU-s per GiB, "
            ">= 0.8 x local cold", "-", None)
    mine = rows.get(("fio", "rand128k", nc))
    best = _best(rows, "fio", "rand128k", ("rclone", "s3fs"))
    x = _ratio(mine, best)
    add("fio rand128k", ">= s3fs and rclone",
        f"{_fmt(x)} x {best['system'] if best else '-'}", None if x is None else x >= 1.0)
    return out


LIBRARIES = ("s3torchconnector", "s3torchconnector-tuned", "mosaic", "mosaic-tuned",
             "litdata", "litdata-tuned")
MOUNTS = ("rclone", "s3fs")


def _requests_per_file(row: dict | None) -> float | None:
    if not row or not row.get("files"):
        return None
    return sum(row.get("fuse_requests", {}).values()) / row["files"]


def check_kernel_path(results: dict, breakdown: dict | None = None) -> list[tuple]:
    """Issue 20's targets, every one a row whether measured or not: (what, target,
    measured, met, values); met is None if not measured, values the numbers behind it
    (for ``summary``'s medians; None where not measured)."""
    rows = _rows(results)
    bd = (breakdown or {}).get("rows", {})
    nc, hints = "neuralcache", "neuralcache-hints"
    out: list[tuple[str, str, str, bool | None]] = []

    def add(what, target, measured, ok, *values):
        out.append((what, target, measured, ok, values))

    warm, cold = _requests_per_file(bd.get("files warm 2")), _requests_per_file(
        bd.get("files cold"))
    add("FUSE requests per warm / cold small file (bench.breakdown)", "<= 2 / <= 3",
        f"{_fmt(warm)} / {_fmt(cold)}",
        None if warm is None or cold is None else warm <= 2.05 and cold <= 3.05, warm, cold)
    sizes = (bd.get("bigfile cold") or {}).get("fuse_read_sizes") or {}
    top = max(sizes, key=sizes.get) if sizes else None
    add("READ size, sequential cold read (bench.breakdown)", "1 MiB",
        top or "-", None if top is None else top == "<=1M")
    x = _ratio(rows.get(("samples", "warm", nc)), rows.get(("samples", "warm", "local")))
    add("warm samples", ">= 0.8 x local", f"{_fmt(x)} x local", None if x is None else x >= 0.8,
        x)
    disk, local = bd.get("bigfile disk"), rows.get(("bigfile", "cold", "local"))
    if disk and disk.get("seconds") and local:
        cpu = disk["cpu"]["total"] / (disk["bytes"] / GIB)
        xl = disk["bytes"] / disk["seconds"] / 1e6 / local["value"]
        add("1 GiB from the disk cache (bench.breakdown)", ">= 0.8 x local cold, <= 0.5 "
            "CPU-s per GiB", f"{xl:.2f} x local, {cpu:.2f} CPU-s per GiB",
            xl >= 0.8 and cpu <= 0.5, xl, cpu)
    else:
        add("1 GiB from the disk cache (bench.breakdown)", ">= 0.8 x local cold, <= 0.5 "
            "CPU-s per GiB", "-", None, None, None)
    r = rows.get(("samples", "cold", nc))
    per_file = (r["cpu_daemon_s"] / r["files"] * 1000) if r and r.get("files") \
        and r.get("cpu_daemon_s") is not None else None
    add("daemon CPU per cold 100 KB file (samples)", "<= 0.6 ms", _fmt(per_file, " ms"),
        None if per_file is None else per_file <= 0.6, per_file)
    for sc, peers, want, what in (("bigfile", MOUNTS + LIBRARIES, 1.1, "best mount or library"),
                                  ("shards", LIBRARIES, 1.1, "best library")):
        mine = _best(rows, sc, "cold", (nc, hints))
        best = _best(rows, sc, "cold", peers)
        x = _ratio(mine, best)
        add(f"cold {sc}", f">= {want} x the {what}",
            f"{_fmt(x)} x {best['system'] if best else '-'}"
            f" ({mine['system'] if mine else '-'})", None if x is None else x >= want, x)
    x = _ratio(rows.get(("train-files", "epoch1", hints)), best := _best(
        rows, "train-files", "epoch1", LIBRARIES))
    add("train-files epoch 1 with hints", ">= 1.05 x the best library",
        f"{_fmt(x)} x {best['system'] if best else '-'}", None if x is None else x >= 1.05, x)
    save, lsave = rows.get(("checkpoint", "save", nc)), rows.get(("checkpoint", "save",
                                                                  "local"))
    xs = save["value"] / lsave["value"] if save and lsave and lsave.get("value") else None
    # NeuralCache's close() returns with the bytes fsynced in its journal: beside the
    # target's ratio (against local's close, which leaves them in the page cache), the
    # one against local's close + fsync (its durable row), the like-for-like point.
    ldur = rows.get(("checkpoint", "durable", "local"))
    xd = save["value"] / ldur["value"] if save and ldur and ldur.get("value") else None
    xr = _ratio(rows.get(("checkpoint", "reload", nc)),
                rows.get(("checkpoint", "reload", "s3torchconnector")))
    add("checkpoint close() / cold reload", "<= 1.2 x local / >= 1.1 x S3Checkpoint",
        f"{_fmt(xs)} x local"
        + (f" ({_fmt(xd)} x local close + fsync)" if xd is not None else "")
        + f" / {_fmt(xr)} x S3Checkpoint",
        None if xs is None or xr is None else xs <= 1.2 and xr >= 1.1, xs, xr)
    x = _ratio(rows.get(("multinode", "epoch1", "4x nc --shared-cache")),
               rows.get(("multinode", "epoch1", "4x neuralcache")))
    add("multinode epoch 1, slowest node with --shared-cache / without", ">= 0.9",
        _fmt(x), None if x is None else x >= 0.9, x)
    return out


def table(checked) -> str:
    lines = ["| target | wanted | this run | met |", "|---|---|---|---|"]
    for what, target, measured, ok, *_ in checked:
        lines.append(f"| {what} | {target} | {measured} | "
                     f"{'-' if ok is None else ('yes' if ok else 'no')} |")
    return "\n".join(lines)


def _median(xs: list[float]) -> float:
    xs = sorted(xs)
    mid = len(xs) // 2
    return xs[mid] if len(xs) % 2 else (xs[mid - 1] + xs[mid]) / 2


def summary(runs: list[list[tuple]]) -> str:
    """Several runs' checks (each from ``check_kernel_path``), one target a row, matched
    by name: the median of each number with its range, and in how many runs it was
    met.  The verdict is "yes" when met in more than half of all the runs, "no" when
    measured in more than half and not met in more than half, else "-" (too few
    measured).  A single run's ratio swings by more than the targets' margins here
    (bench/RESULTS.md, the pair runs of train-files and bigfile), so a verdict stands
    on several."""
    n = len(runs)
    names: list[str] = []
    by_run = []
    for run in runs:
        got = {}
        for row in run:
            names += [row[0]] if row[0] not in names else []
            got[row[0]] = row
        by_run.append(got)
    lines = [f"| target | wanted | median (least-most) of {n} runs | met in | met |",
             "|---|---|---|---|---|"]
    for what in names:
        got = [r[what] for r in by_run if what in r]
        wanted = got[0][1]
        measured = [g for g in got if g[3] is not None]
        cols = []
        for k in range(max((len(g[4]) for g in got), default=0)):
            xs = [g[4][k] for g in got if len(g[4]) > k and g[4][k] is not None]
            cols.append(f"{_median(xs):.2f} ({min(xs):.2f}-{max(xs):.2f})" if xs else "-")
        if not cols:        # no number to take a median of (the READ size): the values seen
            cols = [", ".join(sorted({g[2] for g in measured})) or "-"]
        met = sum(1 for g in measured if g[3])
        verdict = "yes" if met * 2 > n else ("no" if len(measured) * 2 > n else "-")
        lines.append(f"| {what} | {wanted} | {' / '.join(cols)} | "
                     f"{met} of {len(measured)} | {verdict} |")
    lines += ["", "| target | " + " | ".join(f"run {k + 1}" for k in range(n)) + " |",
              "|---|" + "---|" * n]
    for what in names:
        lines.append(f"| {what} | " + " | ".join(r[what][2] if what in r else "-"
                                                  for r in by_run) + " |")
    return "\n".join(lines)


def _load_run(spec: str) -> tuple[dict, dict | None]:
    """One run from a comma-separated list of paths: results.json files (rows, read as
    one), breakdown.json files (told apart by their rows: a dict of workloads) or
    directories holding either or both."""
    results, breakdown = {"rows": []}, None
    for path in filter(None, spec.split(",")):
        if os.path.isdir(path):
            found = [os.path.join(path, n) for n in ("results.json", "breakdown.json")
                     if os.path.exists(os.path.join(path, n))]
            if not found:
                raise ValueError(f"{path}: neither results.json nor breakdown.json in it")
        else:
            found = [path]
        for f_path in found:
            with open(f_path) as f:
                doc = json.load(f)
            if isinstance(doc.get("rows"), dict):
                if breakdown is not None:
                    raise ValueError(f"{spec}: two breakdown.json files in one run")
                breakdown = doc
            else:
                results["rows"] += doc["rows"]
    return results, breakdown


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.targets", description=__doc__.split(
        "\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("results", nargs="+",
                   help="results.json files written by python -m bench run (read as one); "
                        "with --runs, one run per argument")
    p.add_argument("--breakdown", help="breakdown.json written by python -m bench.breakdown")
    p.add_argument("--issue", choices=("20", "10"), default="20",
                   help="whose targets: 20 (kernel path, default) or 10 (the first table)")
    p.add_argument("--runs", action="store_true",
                   help="each argument is one run: its results.json and breakdown.json "
                        "files (or the directories holding them) joined by commas; prints "
                        "each target's median and range and in how many runs it was met")
    a = p.parse_args(argv)
    checker = check_kernel_path if a.issue == "20" else check
    if a.runs and (a.breakdown or a.issue != "20"):
        print("--runs reads issue 20's targets, and each run's breakdown.json from its "
              "own argument (join it with a comma), not --breakdown", file=sys.stderr)
        return 2
    try:
        if a.runs:
            runs = [_load_run(spec) for spec in a.results]
        else:
            results = {"rows": []}
            for path in a.results:
                with open(path) as f:
                    results["rows"] += json.load(f)["rows"]
            breakdown = None
            if a.breakdown:
                with open(a.breakdown) as f:
                    breakdown = json.load(f)
    except (OSError, ValueError, KeyError, AttributeError) as exc:
        print(f"cannot read the results: {exc}", file=sys.stderr)
        return 2
    if a.runs:
        print(summary([checker(r, b) for r, b in runs]))
    else:
        print(table(checker(results, breakdown)))
    return 0


if __name__ == "__main__":
    sys.exit(main())

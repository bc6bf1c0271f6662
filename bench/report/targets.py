"""Issue 10's data-plane targets, checked against one ``python -m bench run`` (and,
for the disk-cache row, one ``python -m bench.breakdown``).

    python -m bench.targets OUT/results.json [--breakdown OUT/breakdown.json]

Every ratio comes from rows of the same run (the machines are shared and noisy; only
side-by-side ratios mean anything).  A row the run did not measure shows as "-".
"""
from __future__ import annotations

import argparse
import json
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


def table(checked) -> str:
    lines = ["| target | wanted | this run | met |", "|---|---|---|---|"]
    for what, target, measured, ok in checked:
        lines.append(f"| {what} | {target} | {measured} | "
                     f"{'-' if ok is None else ('yes' if ok else 'no')} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.targets", description=__doc__.split(
        "\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("results", help="results.json written by python -m bench run")
    p.add_argument("--breakdown", help="breakdown.json written by python -m bench.breakdown")
    a = p.parse_args(argv)
    try:
        with open(a.results) as f:
            results = json.load(f)
        breakdown = None
        if a.breakdown:
            with open(a.breakdown) as f:
                breakdown = json.load(f)
    except (OSError, ValueError) as exc:
        print(f"cannot read the results: {exc}", file=sys.stderr)
        return 2
    print(table(check(results, breakdown)))
    return 0


if __name__ == "__main__":
    sys.exit(main())

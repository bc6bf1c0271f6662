"""The benchmark runner: one run, every system side by side, through one emulated link.

``run(args)`` starts SeaweedFS and the WAN proxy, builds a ``Ctx`` and calls each
selected scenario (``bench.scenarios.registry.SCENARIOS[name](ctx)``), then prints the table and
writes ``results.json`` and the plots.  Everything started is stopped on the way out,
also on Ctrl-C, SIGTERM or error (mounts first, then the proxy, then SeaweedFS).
"""
from __future__ import annotations

import contextlib
import json
import os
import platform
import shutil
import signal
import sys
import time
from pathlib import Path

from bench.report import results as report
from bench.scenarios.harness import Ctx, log
from bench.scenarios.registry import (DEFAULT, SCENARIOS, hints_note, missing_requirements,
                                      peers_note, systems_for)
from bench.servers.seaweed import SeaweedServer
from bench.systems.base import SystemEnv
from bench.systems.mounts import code_revision
from bench.systems.registry import ALL_SYSTEMS
from bench.wan import WanProxyProcess, cpu_note

BUCKET = "bench"
# A scenario's body on one system may not take longer than this (a hung FUSE read is
# aborted by killing the mount, so the run goes on with an error row).
TIMEOUT_QUICK_S = 120.0
TIMEOUT_FULL_S = 900.0


# -- the run ---------------------------------------------------------------------------------
def _sigterm(signum, frame):
    raise KeyboardInterrupt(f"signal {signum}")


def run(args) -> int:
    names = list(DEFAULT) if args.scenario in (None, "all") else args.scenario.split(",")
    unknown = [n for n in names if n not in SCENARIOS]
    if unknown:
        print(f"unknown scenario(s) {unknown}; known: {', '.join(SCENARIOS)}", file=sys.stderr)
        return 2
    systems = ALL_SYSTEMS if args.systems in (None, "all") else args.systems.split(",")
    bad = [s for s in systems if s not in ALL_SYSTEMS]
    if bad:
        print(f"unknown system(s) {bad}; known: {', '.join(ALL_SYSTEMS)}", file=sys.stderr)
        return 2
    systems = [s for s in ALL_SYSTEMS if s in systems]   # canonical order: link, local, ...
    missing = missing_requirements(names)      # before anything is generated or started
    if missing:
        print(missing, file=sys.stderr)
        return 2
    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    work = Path(args.work_dir).resolve() if args.work_dir else out / "work"
    work.mkdir(parents=True, exist_ok=True)
    data = Path(args.data_dir).resolve() if args.data_dir else work / "data"
    old = signal.signal(signal.SIGTERM, _sigterm)
    t_start = time.monotonic()
    rows: list[dict] = []
    meta = {"argv": sys.argv, "command": "python -m bench " + " ".join(sys.argv[1:]),
            "started": time.strftime("%Y-%m-%d %H:%M:%S"), "host": platform.node(),
            "cpus": os.cpu_count(), "rtt_ms": args.rtt_ms, "mbit": args.mbit,
            "jitter_ms": args.jitter_ms, "reset_rate": args.reset_rate,
            "stall_rate": args.stall_rate, "stall_s": args.stall_s,
            "quick": args.quick, "seed": args.seed, "scenarios": names, "systems": systems,
            "code_at_start": code_revision()}
    sw_dir = work / "seaweed"
    try:
        with contextlib.ExitStack() as stack:
            if not args.keep_seaweed:
                shutil.rmtree(sw_dir, ignore_errors=True)
            sw_dir.mkdir(parents=True, exist_ok=True)
            t0 = time.monotonic()
            sw = stack.enter_context(SeaweedServer(sw_dir))
            log(f"SeaweedFS up at {sw.endpoint} in {time.monotonic() - t0:.1f} s")
            s3 = sw.client()
            with contextlib.suppress(Exception):
                s3.create_bucket(Bucket=BUCKET)
            host, port = sw.endpoint.rsplit("//", 1)[1].split(":")
            proxy = stack.enter_context(WanProxyProcess(
                f"{host}:{port}", rtt_ms=args.rtt_ms, mbit=args.mbit, seed=args.seed,
                jitter_ms=args.jitter_ms, reset_rate=args.reset_rate,
                stall_rate=args.stall_rate, stall_s=args.stall_s,
                log_path=str(out / "wan.log")))
            log(f"WAN proxy {proxy.endpoint} -> {sw.endpoint}, RTT {args.rtt_ms} ms"
                 + (f", {args.mbit} Mbit/s" if args.mbit else ""))
            env = SystemEnv(work_dir=work / "mnt", data_dir=data, bucket=BUCKET,
                            endpoint=proxy.endpoint, access_key=sw.access_key,
                            secret_key=sw.secret_key, direct_endpoint=sw.endpoint)
            ctx = Ctx(quick=args.quick, seed=args.seed, out_dir=out, work_dir=work,
                      data_dir=data, systems=systems, rtt_ms=args.rtt_ms, mbit=args.mbit,
                      bucket=BUCKET, seaweed=sw, s3=s3, s3_link=sw.client(proxy.endpoint),
                      proxy=proxy, sys_env=env,
                      timeout_s=args.timeout or (TIMEOUT_QUICK_S if args.quick else TIMEOUT_FULL_S))
            note = hints_note(names, systems)
            if note and args.systems not in (None, "all"):    # named by the user
                ctx.notes.append(note)
            note = peers_note(names, systems)
            if note:
                ctx.notes.append(note)
            for name in names:
                ts = time.monotonic()
                log(f"== scenario {name}")
                ctx.systems = systems_for(name, systems)
                try:
                    got = SCENARIOS[name](ctx)
                except KeyboardInterrupt:
                    raise
                except Exception as exc:
                    log(f"scenario {name} failed: {type(exc).__name__}: {exc}")
                    got = [{"scenario": name, "system": "-", "phase": "-",
                            "error": " ".join(f"{type(exc).__name__}: {exc}".split())[:300]}]
                rows.extend(got)
                log(f"== scenario {name} done in {time.monotonic() - ts:.1f} s")
                _write(out, meta, rows, ctx.notes, t_start, partial=True)
            meta["proxy_stats"] = proxy.stats()
            if (note := cpu_note(meta["proxy_stats"])) is not None:
                ctx.notes.append(note)       # the table measures the systems, not the proxy
            rows = report.annotate(rows)
            _write(out, meta, rows, ctx.notes, t_start, partial=False)
            print(report.table(rows, meta, ctx.notes), flush=True)
            try:
                for p in report.plots(rows, out):
                    log(f"plot {p}")
            except Exception as exc:  # plots are a nicety; never lose the results over them
                log(f"plots failed: {exc}")
            log("stopping the proxy and SeaweedFS")
    except KeyboardInterrupt:
        log("interrupted; cleaned up")
        _write(out, meta, rows, [], t_start, partial=True)
        return 130
    finally:
        signal.signal(signal.SIGTERM, old)
        if not args.keep_seaweed:     # GBs no later run reads (it starts from an empty one)
            shutil.rmtree(sw_dir, ignore_errors=True)
    log(f"results in {out / 'results.json'} ({time.monotonic() - t_start:.0f} s total)")
    return 0


def _write(out: Path, meta: dict, rows: list[dict], notes: list, t_start: float,
           partial: bool) -> None:
    meta = dict(meta, elapsed_s=time.monotonic() - t_start, partial=partial)
    tmp = out / "results.json.tmp"
    tmp.write_text(json.dumps({"meta": meta, "notes": notes, "rows": rows}, indent=1,
                              default=str))
    os.replace(tmp, out / "results.json")

"""The benchmark runner: one run, every system side by side, through one emulated link.

``run(args)`` starts SeaweedFS and the WAN proxy, builds a ``Ctx`` and calls each
selected scenario (``bench.scenarios.SCENARIOS[name](ctx)``), then prints the table and
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
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from bench import datasets
from bench.seaweed import SeaweedServer
from bench.systems import (ALL_SYSTEMS, MountOptions, Mounted, SystemEnv, SystemUnavailable,
                           code_revision, drop_page_cache, make_system)
from bench.wan import WanProxyProcess

BUCKET = "bench"
# A scenario's body on one system may not take longer than this (a hung FUSE read is
# aborted by killing the mount, so the run goes on with an error row).
TIMEOUT_QUICK_S = 120.0
TIMEOUT_FULL_S = 900.0


@dataclass
class Ctx:
    """What a scenario function gets.  See bench/README.md ("Adding a scenario")."""

    quick: bool
    seed: int
    out_dir: Path                   # results.json, plots, logs
    work_dir: Path                  # scratch (mountpoints, caches, SeaweedFS data)
    data_dir: Path                  # local copy of every dataset = the "local" data root
    systems: list[str]              # selected systems, in run order ("link" first)
    rtt_ms: float
    mbit: float | None
    bucket: str
    seaweed: SeaweedServer
    s3: object                      # boto3 client straight to SeaweedFS (uploads, setup)
    s3_link: object                 # boto3 client through the WAN proxy
    proxy: WanProxyProcess          # .endpoint, .stats() -> {"bytes_up", "bytes_down", ...}
    sys_env: SystemEnv
    timeout_s: float
    manifests: dict = field(default_factory=dict)
    notes: list = field(default_factory=list)

    # -- data -----------------------------------------------------------------------------
    def log(self, msg: str) -> None:
        print(f"[bench {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)

    def add_dataset(self, ds: datasets.Dataset) -> dict:
        """Materialise ``ds`` locally and upload it (once per run); returns its manifest."""
        if ds.name in self.manifests:
            return self.manifests[ds.name]
        t0 = time.monotonic()
        man = datasets.materialize(ds, self.data_dir, self.seed)
        t1 = time.monotonic()
        n = datasets.upload(ds, man, self.data_dir, self.s3, self.bucket)
        self.log(f"dataset {ds.name}: {len(man['files'])} files, "
                 f"{datasets.total_bytes(man) / 1e6:.0f} MB (generate {t1 - t0:.1f} s, "
                 f"upload {n / 1e6:.0f} MB {time.monotonic() - t1:.1f} s)")
        self.manifests[ds.name] = man
        return man

    def dataset(self, name: str, **kw) -> dict:
        return self.add_dataset(datasets.standard(name, self.quick, **kw))

    # -- systems ------------------------------------------------------------------------------
    @contextlib.contextmanager
    def mount(self, system: str, opts: MountOptions | None = None):
        """Mount ``system`` fresh with an empty cache; yields a ``Mounted`` (``.root``)."""
        with make_system(system, self.sys_env).mount(opts) as m:
            yield m

    def drop_caches(self, m: Mounted, ds_name: str, level: int = 1) -> str:
        files = [m.root / ds_name / rel for rel in self.manifests.get(ds_name, {}).get("files", {})]
        return drop_page_cache(files, level=level)

    def measure(self, m: Mounted | None, phase: str, fn: Callable[[], dict]) -> dict:
        """Run ``fn`` and attach link bytes (proxy counter deltas) and cache stats deltas."""
        p0 = self.proxy.stats()
        s0 = m.stats() if m else None
        res = fn()
        p1 = self.proxy.stats()
        s1 = m.stats() if m else None
        row = {"phase": phase, **res,
               "link_bytes_down": p1["bytes_down"] - p0["bytes_down"],
               "link_bytes_up": p1["bytes_up"] - p0["bytes_up"],
               "link_connections": p1["connections"] - p0["connections"]}
        row.setdefault("mbps", row["bytes"] / max(row["seconds"], 1e-9) / 1e6)
        if m is not None and m.remote and row.get("bytes"):
            row["byte_hit_rate_est"] = max(0.0, 1.0 - row["link_bytes_down"] / row["bytes"])
        if s0 is not None and s1 is not None:
            row.update(_stats_delta(s0, s1))
            row["system_stats"] = s1
        return row

    def run_systems(self, scenario: str, ds_name: str, manifest: dict,
                    body: Callable[["Ctx", Mounted], list[dict]],
                    link_value: Callable[[dict], tuple[float, str]] | None = None,
                    opts: MountOptions | None = None) -> list[dict]:
        """The usual scenario loop: the link ceiling, then each system mounted fresh."""
        from bench.workloads import link_fetch

        rows = []
        for system in self.systems:
            self.log(f"{scenario}: {system}")
            base = {"scenario": scenario, "system": system}
            try:
                if system == "link":
                    r = self.measure(None, "link", lambda: link_fetch(
                        self.s3_link, self.bucket, ds_name, manifest))
                    r["value"], r["unit"] = (link_value or (lambda x: (x["mbps"], "MB/s")))(r)
                    rows.append({**base, **r})
                    continue
                with self.mount(system, opts) as m, _Watchdog(m, self.timeout_s):
                    for r in body(self, m):
                        rows.append({**base, **r, "mount": _plain(m.info)})
            except KeyboardInterrupt:
                raise
            except Exception as exc:  # one system failing is a row, not the end of the run
                rows.append(self.error_row(base, "-", exc))
        return rows

    def error_row(self, base: dict, phase: str, exc: Exception) -> dict:
        """Log a system's failure and return it as a table row."""
        msg = f"{type(exc).__name__}: {exc}"
        self.log(f"{base['scenario']}: {base['system']} failed: {msg}")
        return {**base, "phase": phase, "error": msg[:300]}


def _plain(info: dict) -> dict:
    return {k: v for k, v in info.items() if k != "cmd"} | {"cmd": " ".join(map(str, info.get("cmd", [])))}


def _stats_delta(s0: dict, s1: dict) -> dict:
    """Hit rate and prefetch precision over one phase from two ``stats --json`` snapshots."""
    d = lambda k: (s1.get(k) or 0) - (s0.get(k) or 0)  # noqa: E731
    out = {"bytes_served": d("bytes_served"), "bytes_fetched": d("bytes_fetched")}
    if "demand_hit_bytes" in s1:      # hit_rate is demand_hit_bytes / bytes_served
        if d("bytes_served") > 0:
            out["hit_rate"] = d("demand_hit_bytes") / d("bytes_served")
    else:                             # the DEVELOPING.md definition, over block lookups
        lookups = d("mem_hits") + d("mem_misses")
        if lookups > 0:
            out["hit_rate"] = (d("mem_hits") + d("disk_hits")) / lookups
    if d("bytes_served") == 0 and d("reads") == 0:
        out["served_by_page_cache"] = True   # nothing reached the daemon (keep_cache)
    fetched = d("readahead_bytes_fetched") + d("prefetch_bytes_fetched")
    if fetched > 0:
        out["prefetch_precision"] = min(
            1.0, (d("readahead_bytes_used") + d("prefetch_bytes_used")) / fetched)
    return out


class _Watchdog:
    """Abort a mount whose workload runs past ``timeout_s`` (hung reads then fail)."""

    def __init__(self, m: Mounted, timeout_s: float):
        self.m = m
        self.timer = threading.Timer(timeout_s, self._fire)
        self.timer.daemon = True
        self.fired = False

    def _fire(self):
        self.fired = True
        print(f"[bench] watchdog: aborting {self.m.name} mount {self.m.root}", file=sys.stderr)
        from bench.systems import abort_mount
        abort_mount(self.m)

    def __enter__(self):
        self.timer.start()
        return self

    def __exit__(self, *exc):
        self.timer.cancel()
        if self.fired and exc[0] is not None:
            raise TimeoutError(f"{self.m.name}: workload exceeded the watchdog") from exc[1]


# -- the run ---------------------------------------------------------------------------------
def _sigterm(signum, frame):
    raise KeyboardInterrupt(f"signal {signum}")


def run(args) -> int:
    from bench import report
    from bench.scenarios import DEFAULT, SCENARIOS

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
    try:
        with contextlib.ExitStack() as stack:
            sw_dir = work / "seaweed"
            if not args.keep_seaweed:
                shutil.rmtree(sw_dir, ignore_errors=True)
            sw_dir.mkdir(parents=True, exist_ok=True)
            t0 = time.monotonic()
            sw = stack.enter_context(SeaweedServer(sw_dir))
            _log(f"SeaweedFS up at {sw.endpoint} in {time.monotonic() - t0:.1f} s")
            s3 = sw.client()
            with contextlib.suppress(Exception):
                s3.create_bucket(Bucket=BUCKET)
            host, port = sw.endpoint.rsplit("//", 1)[1].split(":")
            proxy = stack.enter_context(WanProxyProcess(
                f"{host}:{port}", rtt_ms=args.rtt_ms, mbit=args.mbit, seed=args.seed,
                jitter_ms=args.jitter_ms, reset_rate=args.reset_rate,
                stall_rate=args.stall_rate, stall_s=args.stall_s,
                log_path=str(out / "wan.log")))
            _log(f"WAN proxy {proxy.endpoint} -> {sw.endpoint}, RTT {args.rtt_ms} ms"
                 + (f", {args.mbit} Mbit/s" if args.mbit else ""))
            env = SystemEnv(work_dir=work / "mnt", data_dir=data, bucket=BUCKET,
                            endpoint=proxy.endpoint, access_key=sw.access_key,
                            secret_key=sw.secret_key)
            ctx = Ctx(quick=args.quick, seed=args.seed, out_dir=out, work_dir=work,
                      data_dir=data, systems=systems, rtt_ms=args.rtt_ms, mbit=args.mbit,
                      bucket=BUCKET, seaweed=sw, s3=s3, s3_link=sw.client(proxy.endpoint),
                      proxy=proxy, sys_env=env,
                      timeout_s=args.timeout or (TIMEOUT_QUICK_S if args.quick else TIMEOUT_FULL_S))
            for name in names:
                ts = time.monotonic()
                _log(f"== scenario {name}")
                try:
                    got = SCENARIOS[name](ctx)
                except KeyboardInterrupt:
                    raise
                except Exception as exc:
                    _log(f"scenario {name} failed: {type(exc).__name__}: {exc}")
                    got = [{"scenario": name, "system": "-", "phase": "-",
                            "error": f"{type(exc).__name__}: {exc}"[:300]}]
                rows.extend(got)
                _log(f"== scenario {name} done in {time.monotonic() - ts:.1f} s")
                _write(out, meta, rows, ctx.notes, t_start, partial=True)
            meta["proxy_stats"] = proxy.stats()
            rows = report.annotate(rows)
            _write(out, meta, rows, ctx.notes, t_start, partial=False)
            print(report.table(rows, meta, ctx.notes), flush=True)
            try:
                for p in report.plots(rows, out):
                    _log(f"plot {p}")
            except Exception as exc:  # plots are a nicety; never lose the results over them
                _log(f"plots failed: {exc}")
            _log("stopping the proxy and SeaweedFS")
    except KeyboardInterrupt:
        _log("interrupted; cleaned up")
        _write(out, meta, rows, [], t_start, partial=True)
        return 130
    finally:
        signal.signal(signal.SIGTERM, old)
    _log(f"results in {out / 'results.json'} ({time.monotonic() - t_start:.0f} s total)")
    return 0


def _log(msg: str) -> None:
    print(f"[bench {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def _write(out: Path, meta: dict, rows: list[dict], notes: list, t_start: float,
           partial: bool) -> None:
    meta = dict(meta, elapsed_s=time.monotonic() - t_start, partial=partial)
    tmp = out / "results.json.tmp"
    tmp.write_text(json.dumps({"meta": meta, "notes": notes, "rows": rows}, indent=1,
                              default=str))
    os.replace(tmp, out / "results.json")

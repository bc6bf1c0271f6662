"""What a scenario runs in: ``Ctx`` (the run's servers, datasets and systems) and the
per-system loop with its watchdog.

The runner (bench/runner.py) starts SeaweedFS and the WAN proxy and builds one ``Ctx``;
each scenario (bench/scenarios/) gets it and reaches the run only through it; the
harness itself imports only bench/systems/ (and this package's datasets).
"""
from __future__ import annotations

import contextlib
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Callable

from bench.scenarios import datasets
from bench.systems.base import MountOptions, Mounted, SystemEnv, abort_mount
from bench.systems.cpu import CpuMeter, machine_steal, minor_faults_of
from bench.systems.link import link_fetch
from bench.systems.pagecache import dirty_kb, drop_page_cache, read_into_cache
from bench.systems.registry import make_system

if TYPE_CHECKING:
    from bench.servers.seaweed import SeaweedServer
    from bench.wan import WanProxyProcess


def log(msg: str) -> None:
    """Progress on stderr."""
    print(f"[bench {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


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
        log(msg)

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
        """Open ``system`` fresh with an empty cache; yields a ``Mounted``: a mount
        (``.root``) or a client system (``.kind == "client"``, ``.client``)."""
        with make_system(system, self.sys_env).open(opts) as m:
            yield m

    def drop_caches(self, m: Mounted, ds_name: str, level: int = 1) -> str:
        if m.root is None:
            return "n/a"
        files = [m.root / ds_name / rel for rel in self.manifests.get(ds_name, {}).get("files", {})]
        return drop_page_cache(files, level=level)

    def fresh_start(self) -> dict:
        """Give the next system the start every other system got: the dirty pages the one
        before left (a mount's cache files, a checkpoint) written back, the page cache
        dropped, then SeaweedFS's files read back in, so every system reads from a hot
        store (as S3's own caches would be) and none from what the one before left.
        Without it a cold row measured the writeback and the store's cache the systems
        before left (bench/RESULTS.md: the same code read bigfile at 0.52-1.30x
        s3torchconnector depending on the order)."""
        dirty = dirty_kb()
        t0 = time.monotonic()
        method = drop_page_cache(level=3)
        sw = getattr(self.seaweed, "workdir", None)        # None: a test's Ctx has no store
        store = read_into_cache(sw / "data") if sw is not None else 0
        return {"method": method, "dirty_kb_before": dirty, "store_bytes_warmed": store,
                "seconds": round(time.monotonic() - t0, 2)}

    def _not_client_cpu(self) -> list[int]:
        """The processes standing for the network and the store (not the client's CPU)."""
        return [getattr(getattr(x, "proc", None), "pid", None) for x in (self.seaweed, self.proxy)]

    def measure(self, m: Mounted | None, phase: str, fn: Callable[[], dict]) -> dict:
        """Run ``fn`` and attach link bytes (proxy counter deltas), cache stats deltas and
        the CPU of every process involved (bench/systems/cpu.py: this process and its children,
        e.g. loader workers, plus the system's daemon; not the proxy or SeaweedFS)."""
        p0 = self.proxy.stats()
        s0 = m.stats() if m else None
        steal0 = machine_steal()
        f0 = minor_faults_of(m.daemon_pids() if m else [])
        cpu = CpuMeter(m.daemon_pids if m else list, self._not_client_cpu).start()
        res = fn()
        cpu_row = cpu.stop()
        steal = machine_steal() - steal0
        f1 = minor_faults_of(f0)
        p1 = self.proxy.stats()
        s1 = m.stats() if m else None
        row = {"phase": phase, **cpu_row, **res,
               "link_bytes_down": p1["bytes_down"] - p0["bytes_down"],
               "link_bytes_up": p1["bytes_up"] - p0["bytes_up"],
               "link_connections": p1["connections"] - p0["connections"],
               # the host's speed in this row: the proxy does the same work per byte for
               # every system, so its CPU per GiB (and the VM's steal) is the control
               # that tells a slow row from a slow minute of the machine
               "steal_s": round(steal, 3)}
        if p0.get("cpu_s") is not None and p1.get("cpu_s") is not None:
            row["proxy_cpu_s"] = round(p1["cpu_s"] - p0["cpu_s"], 3)
        if f1:      # fresh memory the daemon touched: dear on a VM that returns freed pages
            row["daemon_minor_faults"] = sum(f1[p] - f0[p] for p in f1)
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
        rows = []
        if "link" in self.systems:
            self.log(f"{scenario}: link")
            base = {"scenario": scenario, "system": "link"}
            start = self.fresh_start()
            with self.failure_as_row(rows, base):
                r = self.measure(None, "link", lambda: link_fetch(
                    self.s3_link, self.bucket, ds_name, manifest))
                r["value"], r["unit"] = (link_value or (lambda x: (x["mbps"], "MB/s")))(r)
                rows.append({**base, **r, "mount": {"start": start}})
        return rows + self.each_mounted(scenario, [s for s in self.systems if s != "link"],
                                        body, opts=opts)

    def each_mounted(self, scenario: str, systems: list[str],
                     body: Callable[["Ctx", Mounted], list[dict]], *,
                     opts: MountOptions | None = None, timeout_s: float | None = None,
                     phase: str = "-", step: str = "") -> list[dict]:
        """Each of ``systems`` mounted fresh under a watchdog (``timeout_s``, default the
        run's): ``body(ctx, m)`` -> rows, each with the mount's info; a failing system
        becomes one error row with ``phase``.  ``step`` names the work in the log."""
        rows: list[dict] = []
        for system in systems:
            self.log(f"{scenario}: {step + ' on ' if step else ''}{system}")
            base = {"scenario": scenario, "system": system}
            start = self.fresh_start()
            with self.failure_as_row(rows, base, phase), self.mount(system, opts) as m, \
                    Watchdog(m, timeout_s or self.timeout_s):
                for r in body(self, m):
                    rows.append({**base, **r, "mount": {**plain_info(m.info), "start": start}})
        return rows

    @contextlib.contextmanager
    def failure_as_row(self, rows: list[dict], base: dict, phase: str = "-"):
        """One system failing is a row, not the end of the run (Ctrl-C still ends it)."""
        try:
            yield
        except Exception as exc:
            rows.append(self.error_row(base, phase, exc))

    def error_row(self, base: dict, phase: str, exc: Exception) -> dict:
        """Log a system's failure and return it as a table row."""
        lines = [ln.strip() for ln in str(exc).strip().splitlines() if ln.strip()] or [""]
        # one line: a loader worker's error comes as "Caught X in worker ... Traceback
        # ... X: cause"; keep its first and last line
        text = lines[0] if len(lines) == 1 else f"{lines[0]} ... {lines[-1]}"
        msg = f"{type(exc).__name__}: {text}"
        self.log(f"{base['scenario']}: {base['system']} failed: {msg}")
        return {**base, "phase": phase, "error": msg[:300]}


def client_row(m, row: dict) -> dict:
    """A client system's row carries what its converted copy cost (not counted)."""
    conv = m.client.conversion() if m.kind == "client" else None
    return {**row, "conversion": conv} if conv else row


def plain_info(info: dict) -> dict:
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


class Watchdog:
    """Abort a mount whose workload runs past ``timeout_s`` (hung reads then fail)."""

    def __init__(self, m: Mounted, timeout_s: float):
        self.m = m
        self.timer = threading.Timer(timeout_s, self._fire)
        self.timer.daemon = True
        self.fired = False

    def _fire(self):
        self.fired = True
        print(f"[bench] watchdog: aborting {self.m.name} mount {self.m.root}", file=sys.stderr)
        abort_mount(self.m)

    def __enter__(self):
        self.timer.start()
        return self

    def __exit__(self, *exc):
        self.timer.cancel()
        if self.fired and exc[0] is not None:
            raise TimeoutError(f"{self.m.name}: workload exceeded the watchdog") from exc[1]

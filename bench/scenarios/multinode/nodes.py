"""The multinode scenario's nodes: NeuralCache mounts (or rclone / s3fs ones), each with
its own cache directory, reading one epoch's shares at once, and the faults.

A "node" is a mount with its own cache directory: NeuralCache with disk and memory
caches of ``CACHE_MB`` each -- below one node's share of an epoch, so a node cannot keep
what it read -- and 1 MiB blocks.  ``Bench.epoch`` has every node read its
DistributedSampler-style share (``share``) with ``READERS`` threads, after publishing
that order and the next epoch's as hints; every file is checked against its xxh3, then
dropped from the kernel page cache (``read_uncached``), and a failed read is counted,
not raised.  ``Bench.with_shared`` runs the epochs and then the faults on the same
nodes, ``Bench.checkpoint`` one checkpoint load.  What is measured and why:
scenario.py.
"""
from __future__ import annotations

import concurrent.futures as cf
import contextlib
import dataclasses
import os
import random
import threading
import time
from pathlib import Path
from typing import Callable

import xxhash

from bench.servers.cluster import SeaweedCluster
from bench.servers.seaweed import SeaweedServer
from bench.systems.cpu import cpu_seconds, machine_busy, thread_cpu
from bench.systems.base import Mounted, MountOptions, SystemEnv, abort_mount
from bench.systems.ncmount import mounted, stats
from bench.systems.registry import make_system
from bench.wan import WanProxyProcess

MB = 1 << 20
# Reader threads per node (a DataLoader's workers).
READERS = 4
# Each node's disk and memory cache, MiB: below one node's share of an epoch (256 x 512
# KiB / 4 nodes = 32 MiB; --quick 64 files: 8 MiB), so re-reads cannot come from the node.
CACHE_MB = 4
BLOCK = "1M"
# The checkpoint loads' caches (disk, memory), MiB: above the 64 MiB read-ahead window, as
# on a real node.  With the epochs' 4 MiB a sequential read evicted its own read-ahead
# before reaching it and one node alone fetched the checkpoint 1.55 times.
CKPT_CACHE_MB, CKPT_MEMORY_MB = 1024, 256
# Counters summed over the nodes per epoch (results JSON).
DELTAS = ("shared_hits", "shared_misses", "shared_leases", "shared_lease_waits",
          "shared_lease_wait_s", "shared_lease_timeouts", "shared_lease_dropped",
          "shared_errors", "shared_timeouts", "shared_breaker_trips", "shared_skipped",
          "shared_writes", "shared_writes_skipped", "shared_write_errors",
          "shared_corrupt_blocks", "bytes_fetched", "read_errors", "shared_cold_lookups",
          "shared_queue_hits", "shared_lease_prefetch_owner", "shared_lease_wait_hits")
ORIGIN_BUCKET = "multinode"
SHARED_BUCKET = "multinode-shared"
LINK_BUCKET = "multinode-link"          # the dataset as plain objects on the cluster
# A phase (one epoch, one checkpoint load) that runs longer than this gets its mounts
# aborted (hung reads fail and are counted), so the run goes on.
PHASE_TIMEOUT_S = 300.0
# How long the nodes may take to use the tier again after it is back (their probe asks
# every 5 s).
RECOVERY_WAIT_S = 60.0
# With the tier down, epochs run until every node's breaker has opened (so that its
# recovery is what is measured next), or this long after the kill.
DOWN_MAX_S = 60.0
DOWN_MIN_EPOCHS, DOWN_MAX_EPOCHS = 2, 10
# After the volume server is killed, epochs go on (the server down) for this long: the
# master notices the dead server only after missed heartbeats.
VOLUME_DOWN_S, VOLUME_MAX_EPOCHS = 10.0, 40


def _each_at_once(fn, n: int) -> None:
    """``fn(rank)`` for every rank in its own thread, all at once (the nodes); joined."""
    threads = [threading.Thread(target=fn, args=(r,)) for r in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()


@dataclasses.dataclass
class Params:
    nodes: int = 4
    epochs: int = 3
    files: int = 256
    file_kb: int = 512
    ckpt_mb: int = 128
    seed: int = 0
    rtt_ms: float = 60.0
    others: tuple = ("rclone", "s3fs")      # comparison systems, each node alone
    # "all", or "epochs": only the epochs without and with the tier (no faults, no
    # checkpoint; for before/after pairs of the tier's read path)
    parts: str = "all"


@dataclasses.dataclass
class Setup:
    """Where ``measure`` runs: the origin server, the WAN proxy in front of it, the
    systems' environment (rclone, s3fs) and scratch space."""

    work: Path
    origin: SeaweedServer
    wan: WanProxyProcess
    sys_env: SystemEnv
    log: Callable[[str], None]


def make_files(n: int, size: int, seed: int) -> dict[str, bytes]:
    return {f"ds/{i:04d}.bin": random.Random(seed * 7919 + i).randbytes(size + 977 * (i % 7))
            for i in range(n)}


def share(files: list[str], epoch: int, rank: int, nodes: int, seed: int) -> list[str]:
    """DistributedSampler's split: one permutation per epoch, every nodes-th from rank."""
    perm = sorted(files)
    random.Random(seed * 1009 + epoch).shuffle(perm)
    return perm[rank::nodes]


def link_rate(s3, bucket: str, keys: list[str]) -> float:
    """MB/s of GETs of ``keys`` with ``s3``, READERS at a time (connections opened
    first)."""
    with cf.ThreadPoolExecutor(READERS) as pool:
        list(pool.map(lambda _: s3.head_bucket(Bucket=bucket), range(READERS)))
        t0 = time.monotonic()
        n = sum(pool.map(lambda k: len(s3.get_object(Bucket=bucket, Key=k)["Body"].read()),
                         keys))
    return n / (time.monotonic() - t0) / 1e6


def read_uncached(path: Path) -> bytes:
    """The whole file, then its pages dropped from the kernel page cache
    (POSIX_FADV_DONTNEED on this file only): a node's page cache is not limited like its
    NeuralCache caches, and after a few epochs it would serve the whole dataset."""
    with open(path, "rb", buffering=0) as f:
        data = f.read()
        with contextlib.suppress(OSError):
            os.posix_fadvise(f.fileno(), 0, 0, os.POSIX_FADV_DONTNEED)
    return data


@contextlib.contextmanager
def guard(roots: list[Path], what: str, log: Callable[[str], None]):
    """Abort the mounts at ``roots`` if the phase runs past PHASE_TIMEOUT_S."""
    def fire():
        log(f"multinode: {what} ran past {PHASE_TIMEOUT_S:.0f} s: aborting its mounts")
        for r in roots:
            with contextlib.suppress(Exception):
                abort_mount(Mounted("node", r, True, info={"fuse_dev": os.stat(r).st_dev}))
    t = threading.Timer(PHASE_TIMEOUT_S, fire)
    t.daemon = True
    t.start()
    try:
        yield
    finally:
        t.cancel()


class Bench:
    def __init__(self, s: Setup, p: Params, cluster: SeaweedCluster,
                 files: dict[str, bytes]):
        self.s, self.p, self.cluster, self.files = s, p, cluster, files
        self.digests = {k: xxhash.xxh3_64_hexdigest(v) for k, v in files.items()}
        self.total = sum(map(len, files.values()))
        self.env = dict(os.environ, **s.origin.env())
        self.runs = 0

    def wan_down(self) -> int:
        return self.s.wan.stats()["bytes_down"]

    # -- nodes -------------------------------------------------------------------------
    def mount_args(self, shared: str | None, leases: bool = True,
                   cache: tuple[int, int] = (CACHE_MB, CACHE_MB)) -> list[str]:
        args = ["--endpoint-url", self.s.wan.endpoint, "--block-size", BLOCK,
                "--cache-size", f"{cache[0]}M", "--memory-cache-size", f"{cache[1]}M"]
        if shared:
            args += ["--shared-cache", f"s3://{SHARED_BUCKET}/{shared}",
                     "--shared-cache-endpoint", self.cluster.endpoint]
            if not leases:
                args += ["--shared-cache-leases", "off"]
        return args

    @contextlib.contextmanager
    def nc_nodes(self, n: int, shared: str | None, leases: bool = True,
                 cache: tuple[int, int] = (CACHE_MB, CACHE_MB)):
        """``n`` fresh NeuralCache mounts (own cache directories): [(root, stats_fn)]."""
        self.runs += 1
        with contextlib.ExitStack() as stack:
            nodes = []
            for r in range(n):
                d = self.s.work / f"run{self.runs}" / f"node{r}"
                root = stack.enter_context(mounted(
                    f"s3://{ORIGIN_BUCKET}", d / "mnt", "--cache-dir", d / "cache",
                    *self.mount_args(shared, leases, cache), env=self.env))
                nodes.append((root, lambda root=root: stats(root)))
            yield nodes

    @contextlib.contextmanager
    def system_nodes(self, system: str, n: int):
        """``n`` fresh mounts of rclone or s3fs (bench/systems/), each its own cache."""
        opts = MountOptions(cache_mb=CACHE_MB, memory_cache_mb=CACHE_MB)
        with contextlib.ExitStack() as stack:
            nodes = []
            for r in range(n):
                env = dataclasses.replace(self.s.sys_env,
                                          work_dir=self.s.work / f"{system}{r}")
                m = stack.enter_context(make_system(system, env).open(opts))
                nodes.append((m.root, None))
            yield nodes

    # -- one epoch on every node at once -----------------------------------------------
    def epoch(self, nodes, epoch: int, hints: bool,
              midway: Callable[[], None] | None = None) -> dict:
        """Every node reads its share of ``epoch``; ``midway()`` runs (in its own thread)
        once half of all reads are done."""
        from neuralcache.hints import publish_order

        n = len(nodes)
        names = list(self.files)
        orders = [share(names, epoch, r, n, self.p.seed) for r in range(n)]
        half = sum(map(len, orders)) // 2
        lock = threading.Lock()
        done = [0]
        fault: dict = {}
        res = [None] * n

        def one(root, rel):
            try:
                data = read_uncached(root / rel)
            except OSError as exc:
                out = (0, 0, 1, f"{rel}: {exc}")
            else:
                out = (len(data), int(xxhash.xxh3_64_hexdigest(data) != self.digests[rel]),
                       0, None)
            with lock:
                done[0] += 1
                go = midway is not None and not fault and done[0] >= half
                if go:
                    fault["t"] = time.monotonic()
            if go:
                th = threading.Thread(target=self._fault, args=(midway, fault))
                fault["thread"] = th
                th.start()
            return out

        def node(r):
            root = nodes[r][0]
            t0 = time.monotonic()
            try:
                if hints:
                    nxt = share(names, epoch + 1, r, n, self.p.seed)
                    publish_order(str(root), orders[r] + nxt)
                with cf.ThreadPoolExecutor(READERS) as pool:
                    got = list(pool.map(lambda rel: one(root, rel), orders[r]))
            except Exception as exc:     # counted as every read of the node failing
                got = [(0, 0, 1, f"{type(exc).__name__}: {exc}")] * len(orders[r])
            dt = max(time.monotonic() - t0, 1e-6)
            res[r] = {"bytes": sum(g[0] for g in got), "seconds": dt,
                      "wrong": sum(g[1] for g in got), "errors": sum(g[2] for g in got),
                      "first_error": next((g[3] for g in got if g[3]), None)}

        w0 = self.wan_down()
        s0 = [f() if f else {} for _, f in nodes]
        daemons = [x["pid"] for x in s0 if x.get("pid")]
        c0 = self._cpu(daemons)
        t0 = time.monotonic()
        with guard([root for root, _ in nodes], f"epoch {epoch}", self.s.log):
            _each_at_once(node, n)
        wall = time.monotonic() - t0
        if fault.get("thread"):
            fault["thread"].join()
        s1 = [f() if f else {} for _, f in nodes]
        c1 = self._cpu(daemons)
        mbps = [x["bytes"] / x["seconds"] / 1e6 for x in res]
        out = {"epoch": epoch + 1, "wan_bytes": self.wan_down() - w0, "wall_s": wall,
               "bytes": sum(x["bytes"] for x in res), "reads": sum(map(len, orders)),
               "failed": sum(x["errors"] for x in res),
               "verify_errors": sum(x["wrong"] for x in res),
               "first_error": next((x["first_error"] for x in res if x["first_error"]), None),
               "min_mbps": min(mbps), "mean_mbps": sum(mbps) / n, "node_mbps": mbps,
               "node_bytes": [x["bytes"] for x in res], "node_s": [x["seconds"] for x in res]}
        out["wan_x"] = out["wan_bytes"] / self.total
        # CPU seconds of the epoch: the NeuralCache daemons (also by thread group), the
        # shared tier's cluster (every process and its proxy; it shares the machine's
        # cores with the nodes here), and the machine (os.cpu_count() x wall_s is all)
        for k in ("daemon", "tier", "machine"):
            out[f"{k}_cpu_s"] = round(c1[k] - c0[k], 2)
        out["daemon_cpu_by_thread"] = {
            k: round(v - c0["threads"].get(k, 0.0), 2) for k, v in c1["threads"].items()
            if v - c0["threads"].get(k, 0.0) >= 0.01}
        if any(s1):
            out.update({k: round(sum(b.get(k, 0) - a.get(k, 0) for a, b in zip(s0, s1)), 3)
                        for k in DELTAS})
            out["shared_available"] = [s.get("shared_available") for s in s1]
        if "t" in fault:
            out["fault_at_s"] = round(fault["t"] - t0, 2)
            out["fault_took_s"] = round(fault.get("took", 0), 2)
            if "error" in fault:
                out["fault_error"] = fault["error"]
        return out

    def _cpu(self, daemons: list[int]) -> dict:
        """CPU seconds so far: "daemon" (the daemons), "tier" (the cluster's live
        processes and its proxy), "machine" (every core), "threads" (the daemons' by
        thread group, summed over the daemons)."""
        def one(pid):
            try:
                return cpu_seconds(pid)
            except OSError:          # gone (a fault killed it)
                return 0.0
        groups: dict[str, float] = {}
        for pid in daemons:
            try:
                for k, v in thread_cpu(pid).items():
                    groups[k] = groups.get(k, 0.0) + v
            except OSError:
                pass
        tier = [p.pid for p in self.cluster.procs.values()]
        if self.cluster.proxy is not None and self.cluster.proxy.proc is not None:
            tier.append(self.cluster.proxy.proc.pid)    # its 1 ms proxy (a Python process)
        return {"daemon": sum(map(one, daemons)), "tier": sum(map(one, tier)),
                "machine": machine_busy(), "threads": groups}

    @staticmethod
    def _fault(fn, fault: dict) -> None:
        t = time.monotonic()
        try:
            fn()
        except Exception as exc:     # the measurement says so; the epoch goes on
            fault["error"] = f"{type(exc).__name__}: {exc}"
        fault["took"] = time.monotonic() - t

    def epochs(self, nodes, hints: bool, label: str) -> list[dict]:
        rows = []
        for e in range(self.p.epochs):
            self.s.log(f"multinode: {label}, epoch {e + 1}")
            rows.append(self.epoch(nodes, e, hints))
        return rows

    # -- the runs ---------------------------------------------------------------------
    def with_shared(self, faults_too: bool = True) -> tuple[list[dict], dict]:
        """3 epochs with the tier, then (``faults_too``) the faults on the same nodes."""
        c = self.cluster
        faults: dict = {}
        with self.nc_nodes(self.p.nodes, "epochs") as nodes:
            rows = self.epochs(nodes, True, "with --shared-cache")
            if not faults_too:
                return rows, {}
            e = self.p.epochs
            self.s.log("multinode: volume server 0 killed mid-epoch")
            killed = [self.epoch(nodes, e, True, midway=lambda: c.kill_volume(0))]
            t_kill = time.monotonic() - killed[0]["wall_s"] + killed[0].get("fault_at_s", 0)
            while (time.monotonic() - t_kill < VOLUME_DOWN_S
                   and len(killed) < VOLUME_MAX_EPOCHS):
                self.s.log("multinode: an epoch with volume server 0 down")
                killed.append(self.epoch(nodes, e + len(killed), True))
            faults["volume_killed"] = merge(killed)
            faults["volume_killed"]["fault_at_s"] = killed[0].get("fault_at_s", 0)
            faults["volume_killed"]["down_s"] = round(time.monotonic() - t_kill, 1)
            if "fault_error" in killed[0]:
                faults["volume_killed"]["fault_error"] = killed[0]["fault_error"]
            e += len(killed) - 1
            if "volume0" not in c.procs:       # killed (else the kill failed: noted)
                c.start_volume(0)
            self.s.log("multinode: S3 gateway killed mid-epoch")
            watch = BreakerWatch(nodes)
            faults["gateway_killed"] = self.epoch(
                nodes, e + 1, True, midway=lambda: (c.kill_s3(), watch.start()))
            down = []
            while True:
                self.s.log(f"multinode: an epoch with the tier down (breakers open: "
                           f"{watch.open_count()}/{len(nodes)})")
                down.append(self.epoch(nodes, e + 2 + len(down), True))
                if len(down) >= DOWN_MIN_EPOCHS and (
                        watch.open_count() == len(nodes) or len(down) >= DOWN_MAX_EPOCHS
                        or time.monotonic() - watch.t0 > DOWN_MAX_S):
                    break
            watch.stop()
            faults["tier_down"] = merge(down)
            faults["breakers"] = watch.result()
            t0 = time.monotonic()
            c.start_s3()
            t_back = time.monotonic()
            faults["gateway_restart_s"] = round(t_back - t0, 2)
            recovered = None
            while time.monotonic() - t_back < RECOVERY_WAIT_S:
                if all(f().get("shared_available") for _, f in nodes):
                    recovered = round(time.monotonic() - t_back, 2)
                    break
                time.sleep(0.1)
            faults["recovered_after_s"] = recovered
            self.s.log(f"multinode: gateway back; nodes use the tier again after "
                       f"{recovered} s; one more epoch")
            faults["after_recovery"] = self.epoch(nodes, e + 2 + len(down), True)
        return rows, faults

    def checkpoint(self, key: str, digest: str, size: int, n: int, shared: str | None,
                   leases: bool = True) -> dict:
        with self.nc_nodes(n, shared, leases, (CKPT_CACHE_MB, CKPT_MEMORY_MB)) as nodes:
            w0 = self.wan_down()
            times = [0.0] * n
            ok = [False] * n

            def load(r):
                t0 = time.monotonic()
                h = xxhash.xxh3_64()
                try:
                    with open(nodes[r][0] / key, "rb", buffering=0) as f:
                        while b := f.read(MB):
                            h.update(b)
                except OSError:
                    pass
                times[r] = time.monotonic() - t0
                ok[r] = h.hexdigest() == digest

            with guard([root for root, _ in nodes], "checkpoint load", self.s.log):
                _each_at_once(load, n)
            wan = self.wan_down() - w0
            st = [f() for _, f in nodes]
        return {"nodes": n, "origin_x": wan / size, "max_s": max(times),
                "mean_s": sum(times) / n, "times_s": times, "verify_errors": ok.count(False),
                "fetched_x": sum(s["bytes_fetched"] for s in st) / size,
                "read_errors": sum(s.get("read_errors", 0) for s in st),
                "lease_waits": sum(s.get("shared_lease_waits", 0) for s in st),
                # fresh nodes: their totals are this load's (results JSON only)
                **{k: round(sum(s.get(k, 0) for s in st), 3) for k in DELTAS}}


class BreakerWatch:
    """After ``start()`` (the tier was just killed), polls each node's stats and notes
    when its breaker opened (``shared_available`` false) and the deadline it had."""

    def __init__(self, nodes):
        self.nodes = nodes
        self.t0 = 0.0
        self.opened: dict[int, float] = {}
        self.deadline_ms: dict[int, float] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def start(self) -> None:
        self.t0 = time.monotonic()
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set() and len(self.opened) < len(self.nodes):
            for r, (_, f) in enumerate(self.nodes):
                if r in self.opened:
                    continue
                with contextlib.suppress(Exception):
                    st = f()
                    if st.get("shared_available") is False:
                        self.opened[r] = time.monotonic() - self.t0
                    else:
                        self.deadline_ms[r] = st.get("shared_deadline_ms")
            self._stop.wait(0.1)

    def open_count(self) -> int:
        return len(self.opened)

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()

    def result(self) -> dict:
        return {"opened_after_s": [round(self.opened[r], 2) if r in self.opened else None
                                   for r in range(len(self.nodes))],
                "deadline_ms": [self.deadline_ms.get(r) for r in range(len(self.nodes))]}


def merge(eps: list[dict]) -> dict:
    """Several epochs as one row: sums; each node's MB/s over all of them; WAN per epoch."""
    n = len(eps[0]["node_bytes"])
    nb = [sum(e["node_bytes"][r] for e in eps) for r in range(n)]
    ns = [sum(e["node_s"][r] for e in eps) for r in range(n)]
    mbps = [b / s / 1e6 for b, s in zip(nb, ns)]
    out = {"epoch": f"{eps[0]['epoch']}-{eps[-1]['epoch']}" if len(eps) > 1 else eps[0]["epoch"],
           "epochs": len(eps), "wall_s": sum(e["wall_s"] for e in eps),
           "min_mbps": min(mbps), "mean_mbps": sum(mbps) / n, "node_mbps": mbps,
           "node_bytes": nb, "node_s": ns,
           "wan_x": sum(e["wan_x"] for e in eps) / len(eps),
           "first_error": next((e["first_error"] for e in eps if e["first_error"]), None)}
    for k in ("wan_bytes", "bytes", "reads", "failed", "verify_errors", *DELTAS):
        if k in eps[0]:
            out[k] = sum(e[k] for e in eps)
    return out

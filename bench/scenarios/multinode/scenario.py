"""Many nodes, one dataset (issue 13): WAN bytes, per-node throughput, faults and one
checkpoint loaded by every node, with and without the shared tier.

    python -m bench run --scenario multinode [--quick] [--out DIR]     # the issue's table
    python -m bench.multinode [--nodes 4] [--epochs 3] [--files 256] [--file-kb 512]
                              [--ckpt-mb 128] [--rtt-ms 60] [--systems rclone,s3fs]
                              [--out FILE.json]

One implementation, two ways in.  As the ``multinode`` scenario of ``python -m bench
run`` it reuses the runner's origin -- its SeaweedFS (``ctx.seaweed``, bucket
``multinode``) behind its WAN proxy (``ctx.proxy``, the run's --rtt-ms and link faults),
whose byte counter is the WAN bytes -- and its systems (``bench/systems/``: rclone and
s3fs mounted as in the main bench, one per node).  ``python -m bench.multinode`` starts
its own SeaweedFS and WAN proxy the same way and runs the same ``measure``.  The shared
tier is always this module's own SeaweedFS *cluster* (``bench/cluster.py``: master,
3 volume servers with replication 001, filer, S3 gateway, each a process) behind a 1 ms
proxy.

A "node" is a mount with its own cache directory: NeuralCache with disk and memory
caches of ``CACHE_MB`` each -- below one node's share of an epoch (256 x 512 KiB / 4 =
32 MiB; 8 MiB with --quick), so a node cannot keep what it read -- and 1 MiB blocks (a
512 KiB file is one block; the checkpoint many).  Each epoch every node reads its
DistributedSampler-style share (a permutation seeded by the epoch, every ``nodes``-th
file from ``rank``) with ``READERS`` threads, after publishing that order and the next
epoch's as hints (what ``HintingSampler`` does; not for rclone/s3fs); every file is
checked against its xxh3, then dropped from the kernel page cache (``read_uncached``:
the page cache is not bounded like the node's caches and would otherwise serve whole
epochs), and a failed read is counted, not raised.  The nodes run each epoch at the same
time; the WAN proxy's byte counter is read between epochs.

Measured, in this order:

* links: one node's share fetched with boto3 (READERS GETs at a time) from the shared
  cluster through its 1 ms proxy -- one node alone, and all nodes at once (the
  *in-region link* row: the mean per node; epochs 2-3 are compared with it) -- and
  from the origin through the WAN proxy, one node alone;
* 4 NeuralCache nodes without ``--shared-cache``, 3 epochs;
* 4 nodes with it, 3 epochs, then the same nodes go on: epoch 4 kills volume server 0
  (SIGKILL) when half of the epoch's reads are done, and epochs go on until it has been
  down ``VOLUME_DOWN_S`` (then it is restarted);
  the next epoch kills the cluster's S3 gateway at half-way; epochs run with the tier
  down (at least DOWN_MIN_EPOCHS, until every node's breaker has opened); then the
  gateway is started again, the nodes are watched until each reports
  ``shared_available`` (nothing is done to them) and one more epoch runs;
* 4 rclone and 4 s3fs nodes (each alone: no shared tier), 3 epochs, WAN bytes from the
  proxy's counter;
* one checkpoint file (the shards-like case: one file of many blocks) loaded by one
  node alone (with the tier, and without it), then by 4 at once: with the shared tier,
  with it but leases off, without; each load by fresh nodes whose caches
  (``CKPT_CACHE_MB``, ``CKPT_MEMORY_MB``) are above the 64 MiB read-ahead window.

``table()`` prints it all with the issue's targets and whether each is met.
"""
from __future__ import annotations

import argparse
import concurrent.futures as cf
import contextlib
import dataclasses
import json
import os
import random
import shutil
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Callable

import xxhash

from bench.servers.cluster import SeaweedCluster
from bench.servers.seaweed import SeaweedServer
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
          "shared_corrupt_blocks", "bytes_fetched", "read_errors")
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

# The targets.
TARGET_WAN_X = 1.1             # WAN bytes over 3 epochs / dataset, with the shared tier
TARGET_LINK_X = 0.9            # slowest node's MB/s in epochs 2-3 / in-region link
TARGET_CKPT_ORIGIN_X = 1.2     # origin bytes / checkpoint, 4 nodes at once
TARGET_CKPT_TIME_X = 1.3       # slowest node's load time / one node alone
TARGET_DOWN_X = 0.9            # "single-node speed": tier down vs without the tier

LABELS = {"without": "4x neuralcache", "with": "4x nc --shared-cache",
          "rclone": "4x rclone", "s3fs": "4x s3fs"}


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
        t0 = time.monotonic()
        with guard([root for root, _ in nodes], f"epoch {epoch}", self.s.log):
            _each_at_once(node, n)
        wall = time.monotonic() - t0
        if fault.get("thread"):
            fault["thread"].join()
        s1 = [f() if f else {} for _, f in nodes]
        mbps = [x["bytes"] / x["seconds"] / 1e6 for x in res]
        out = {"epoch": epoch + 1, "wan_bytes": self.wan_down() - w0, "wall_s": wall,
               "bytes": sum(x["bytes"] for x in res), "reads": sum(map(len, orders)),
               "failed": sum(x["errors"] for x in res),
               "verify_errors": sum(x["wrong"] for x in res),
               "first_error": next((x["first_error"] for x in res if x["first_error"]), None),
               "min_mbps": min(mbps), "mean_mbps": sum(mbps) / n, "node_mbps": mbps,
               "node_bytes": [x["bytes"] for x in res], "node_s": [x["seconds"] for x in res]}
        out["wan_x"] = out["wan_bytes"] / self.total
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
    def with_shared(self) -> tuple[list[dict], dict]:
        """3 epochs with the tier, then the faults on the same nodes."""
        c = self.cluster
        faults: dict = {}
        with self.nc_nodes(self.p.nodes, "epochs") as nodes:
            rows = self.epochs(nodes, True, "with --shared-cache")
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


def summarize(rows: list[dict], epochs: int) -> dict:
    """The 'all' line of a 3-epoch run: WAN over the first ``epochs`` epochs."""
    first = rows[:epochs]
    return {"epoch": "all", "wan_x": sum(r["wan_x"] for r in first),
            "reads": sum(r["reads"] for r in first),
            "failed": sum(r["failed"] for r in first),
            "verify_errors": sum(r["verify_errors"] for r in first),
            "shared_hits": sum(r.get("shared_hits", 0) for r in first)}


def measure(s: Setup, p: Params) -> dict:
    """Everything in the module docstring; the result as one dict (``table()``)."""
    files = make_files(p.files, p.file_kb << 10, p.seed)
    ckpt = random.Random(p.seed + 1).randbytes(p.ckpt_mb * MB)
    ck_key, ck_digest = "ckpt/model.bin", xxhash.xxh3_64_hexdigest(ckpt)
    out: dict = {"params": dataclasses.asdict(p), "dataset_bytes": sum(map(len, files.values())),
                 "file_bytes": [min(map(len, files.values())), max(map(len, files.values()))],
                 "ckpt_bytes": len(ckpt), "cache_mb": CACHE_MB, "block": BLOCK,
                 "ckpt_cache_mb": [CKPT_CACHE_MB, CKPT_MEMORY_MB],
                 "readers": READERS}
    s.work.mkdir(parents=True, exist_ok=True)
    cluster = SeaweedCluster(s.work / "cluster", proxy_rtt_ms=1)
    try:
        t0 = time.monotonic()
        cluster.start()
        s.log(f"multinode: SeaweedFS cluster up at {cluster.endpoint} (1 ms proxy -> "
              f"{cluster.direct_endpoint}) in {time.monotonic() - t0:.1f} s")
        cluster.create_bucket(SHARED_BUCKET)
        cluster.create_bucket(LINK_BUCKET)
        s3 = s.origin.client()
        with contextlib.suppress(Exception):
            s3.create_bucket(Bucket=ORIGIN_BUCKET)
        direct = cluster.client(cluster.direct_endpoint)
        with cf.ThreadPoolExecutor(8) as pool:
            list(pool.map(lambda kv: s3.put_object(Bucket=ORIGIN_BUCKET, Key=kv[0],
                                                   Body=kv[1]),
                          list(files.items()) + [(ck_key, ckpt)]))
            list(pool.map(lambda kv: direct.put_object(Bucket=LINK_BUCKET, Key=kv[0],
                                                       Body=kv[1]), files.items()))
        names = list(files)
        shares = [share(names, 0, r, p.nodes, p.seed) for r in range(p.nodes)]
        near = [cluster.client(cluster.endpoint) for _ in range(p.nodes)]
        alone = link_rate(near[0], LINK_BUCKET, shares[0])
        with cf.ThreadPoolExecutor(p.nodes) as pool:
            together = list(pool.map(lambda r: link_rate(near[r], LINK_BUCKET, shares[r]),
                                     range(p.nodes)))
        wan = link_rate(s.origin.client(s.wan.endpoint), ORIGIN_BUCKET, shares[0])
        out["link_mbps"] = {"in_region_alone": alone, "in_region": sum(together) / p.nodes,
                            "in_region_nodes": together, "wan_alone": wan}
        s.log(f"multinode: links {out['link_mbps']}")
        b = Bench(s, p, cluster, files)
        res: dict = {}
        with b.nc_nodes(p.nodes, None) as nodes:
            res["without"] = b.epochs(nodes, True, "without --shared-cache")
        res["with"], out["faults"] = b.with_shared()
        out["errors"] = {}
        for system in p.others:
            try:
                with b.system_nodes(system, p.nodes) as nodes:
                    res[system] = b.epochs(nodes, False, f"{system} (each node alone)")
            except Exception as exc:   # not installed, mount failed: a line in the table
                out["errors"][system] = " ".join(f"{type(exc).__name__}: {exc}".split())[:200]
                s.log(f"multinode: {system} failed: {out['errors'][system]}")
        out["epochs"] = res
        size = len(ckpt)
        out["checkpoint"] = {}
        for name, n, shared, leases in (("alone", 1, "ck-alone", True),
                                        ("alone, without", 1, None, True),
                                        ("with", p.nodes, "ck-with", True),
                                        ("with, leases off", p.nodes, "ck-nolease", False),
                                        ("without", p.nodes, None, True)):
            s.log(f"multinode: checkpoint, {n} node(s), {name}")
            out["checkpoint"][name] = b.checkpoint(ck_key, ck_digest, size, n, shared, leases)
    finally:
        cluster.stop(grace=0)
    return out


# -- the table and the targets ------------------------------------------------------------
def _low(rows: list[dict], epochs=(2, 3)) -> float | None:
    """The worst slowest-node MB/s over ``epochs``."""
    got = [r["min_mbps"] for r in rows if r["epoch"] in epochs]
    return min(got) if got else None


def _mean(rows: list[dict], epochs=(2, 3)) -> float | None:
    got = [r["min_mbps"] for r in rows if r["epoch"] in epochs]
    return sum(got) / len(got) if got else None


def targets(r: dict) -> list[dict]:
    """The issue's targets: [{"measure", "target", "value", "met"}]."""
    ep, link, f, ck = r["epochs"], r["link_mbps"]["in_region"], r["faults"], r["checkpoint"]
    n = r["params"]["epochs"]
    out = []
    wan = summarize(ep["with"], n)["wan_x"]
    out.append({"measure": f"WAN bytes over {n} epochs, 4 nodes, --shared-cache",
                "target": f"<= {TARGET_WAN_X}x dataset", "value": f"{wan:.2f}x",
                "met": wan <= TARGET_WAN_X})
    low = _low(ep["with"])
    x = low / link if low is not None else 0.0
    out.append({"measure": "per-node MB/s, epochs 2-3 (slowest node, worst epoch)",
                "target": f">= {TARGET_LINK_X} x in-region link",
                "value": f"{x:.2f} ({low or 0:.1f} / {link:.1f} MB/s)", "met": x >= TARGET_LINK_X})
    alone, w = ck["alone"], ck["with"]
    out.append({"measure": "4 nodes load one checkpoint: origin bytes",
                "target": f"<= {TARGET_CKPT_ORIGIN_X}x checkpoint",
                "value": f"{w['origin_x']:.2f}x", "met": w["origin_x"] <= TARGET_CKPT_ORIGIN_X})
    tx = w["max_s"] / alone["max_s"]
    out.append({"measure": "4 nodes load one checkpoint: each node's load time",
                "target": f"<= {TARGET_CKPT_TIME_X}x one node alone",
                "value": f"{tx:.2f}x ({w['max_s']:.2f} / {alone['max_s']:.2f} s)" + (
                    f"; {w['max_s'] / ck['alone, without']['max_s']:.2f}x without the tier"
                    if "alone, without" in ck else ""),
                "met": tx <= TARGET_CKPT_TIME_X and not w["verify_errors"]})
    v = f["volume_killed"]
    bad = v["failed"] + v["verify_errors"] + v.get("read_errors", 0)
    out.append({"measure": "volume server killed mid-epoch",
                "target": "no failed read, no wrong byte",
                "value": f"{v['reads']} reads, {v['failed']} failed, "
                         f"{v['verify_errors']} wrong",
                "met": bad == 0 and "fault_error" not in v})
    base = _mean(ep["without"])
    d = f["tier_down"]
    dx = d["min_mbps"] / base if base else 0.0
    g = f["gateway_killed"]
    out.append({"measure": "tier down: reads go on at single-node speed",
                "target": f">= {TARGET_DOWN_X} x without the tier, no failed read",
                "value": f"{dx:.2f} ({d['min_mbps']:.1f} / {base or 0:.1f} MB/s), "
                         f"{g['failed'] + d['failed']} failed, "
                         f"{g['verify_errors'] + d['verify_errors']} wrong",
                "met": dx >= TARGET_DOWN_X and not (g["failed"] + d["failed"]
                                                    + g["verify_errors"] + d["verify_errors"])})
    a = f["after_recovery"]
    rec = f["recovered_after_s"]
    opened = sum(x is not None for x in f.get("breakers", {}).get("opened_after_s", []))
    out.append({"measure": "tier back: used again by itself",
                "target": "shared hits > 0, no remount",
                "value": (f"{opened}/{r['params']['nodes']} breakers opened, all closed "
                          f"{rec:.1f} s after; {a.get('shared_hits', 0)} hits"
                          if rec is not None else
                          f"not within {RECOVERY_WAIT_S:.0f} s; {a.get('shared_hits', 0)} hits"),
                "met": rec is not None and a.get("shared_hits", 0) > 0})
    return out


def table(r: dict) -> str:
    p, link = r["params"], r["link_mbps"]
    lo, hi = r["file_bytes"]
    lines = [
        f"multinode: {p['nodes']} nodes x {r['readers']} readers, {p['epochs']} epochs, "
        f"origin {p['rtt_ms']:.0f} ms away, shared tier = SeaweedFS cluster (master, 3 "
        f"volume servers, replication 001, filer, s3) behind 1 ms; {r['block'][:-1]} MiB blocks, "
        f"{r['cache_mb']} MiB disk + {r['cache_mb']} MiB memory cache per node",
        f"dataset: {p['files']} synthetic files of {lo / 1024:.0f}-{hi / 1024:.0f} KiB "
        f"({r['dataset_bytes'] / 1e6:.1f} MB; random bytes, neither the `samples` set "
        f"(80-120 KB files) nor the `shards` set (~8 MB tars)); each epoch a "
        f"DistributedSampler-style split; the several-MB case is the checkpoint: one "
        f"file of {r['ckpt_bytes'] / MB:.0f} MiB, loaded by fresh nodes with "
        f"{r.get('ckpt_cache_mb', [CKPT_CACHE_MB, CKPT_MEMORY_MB])[0]} MiB disk + "
        f"{r.get('ckpt_cache_mb', [CKPT_CACHE_MB, CKPT_MEMORY_MB])[1]} MiB memory cache "
        "(above the 64 MiB read-ahead)",
        f"links, one node's share, {r['readers']} GETs at a time: in-region (the cluster "
        f"via 1 ms) {link['in_region_alone']:.1f} MB/s alone, {link['in_region']:.1f} MB/s "
        f"per node with {p['nodes']} at once (= the in-region link row: 'x link'); WAN "
        f"(origin via {p['rtt_ms']:.0f} ms) {link['wan_alone']:.1f} MB/s alone",
        "",
        f"{'epochs':<38}{'WAN/dataset':>12}{'slowest MB/s':>14}{'x link':>8}"
        f"{'mean MB/s':>11}{'failed':>8}{'wrong':>7}"]
    for name in ("without", "with", *p["others"]):
        rows = r["epochs"].get(name)
        label = LABELS.get(name, name) + (" (each alone)" if name in p["others"] else "")
        if rows is None:
            err = r.get("errors", {}).get(name, "not run")
            lines.append(f"{label:<38}ERROR {err[:100]}")
            continue
        for e in rows:
            lines.append(f"{label + ', epoch ' + str(e['epoch']):<38}{e['wan_x']:>12.2f}"
                         f"{e['min_mbps']:>14.1f}{e['min_mbps'] / link['in_region']:>8.2f}"
                         f"{e['mean_mbps']:>11.1f}{e['failed']:>8}{e['verify_errors']:>7}")
        a = summarize(rows, p["epochs"])
        lines.append(f"{label + ', all':<38}{a['wan_x']:>12.2f}"
                     + (f"{'':22}shared hits {a['shared_hits']}" if name == "with" else ""))
    f = r["faults"]
    lines += ["", f"{'faults (the --shared-cache nodes go on)':<50}{'reads':>6}{'failed':>7}"
                  f"{'wrong':>6}{'WAN/dataset':>12}{'slowest MB/s':>13}{'shared hits':>12}"]
    down = f["tier_down"]
    for key, label in (("volume_killed", "epoch{s} {e}: volume server killed at {t}"),
                       ("gateway_killed", "epoch {e}: S3 gateway killed at {t}"),
                       ("tier_down", "epoch{s} {e}: the tier down" + (
                           "" if None not in f.get("breakers", {}).get("opened_after_s", [])
                           else " (breakers not all open)")),
                       ("after_recovery", "epoch {e}: gateway back, nodes untouched")):
        e = f[key]
        t = f"{e['fault_at_s']:.1f} s" if "fault_at_s" in e else "-"
        text = label.format(e=e["epoch"], t=t, s="s" if e.get("epochs", 1) > 1 else "")
        lines.append(f"{text:<50}{e['reads']:>6}{e['failed']:>7}{e['verify_errors']:>6}"
                     f"{e['wan_x']:>12.2f}{e['min_mbps']:>13.1f}{e.get('shared_hits', 0):>12}"
                     + (f"  FAULT FAILED {e['fault_error']}" if e.get("fault_error") else ""))
    g, br, rec = f["gateway_killed"], f.get("breakers", {}), f["recovered_after_s"]
    opened = [x for x in br.get("opened_after_s", []) if x is not None]
    dl = [x for x in br.get("deadline_ms", []) if x]
    lines.append(
        f"(volume server killed, then down {f['volume_killed'].get('down_s', 0):.0f} s: "
        f"{f['volume_killed'].get('shared_errors', 0)} shared-tier "
        f"errors, {f['volume_killed'].get('shared_timeouts', 0)} timeouts, "
        f"{f['volume_killed'].get('shared_misses', 0)} misses (each read from the origin); "
        "tier down: "
        f"{g.get('shared_errors', 0) + down.get('shared_errors', 0)} errors + "
        f"{g.get('shared_timeouts', 0) + down.get('shared_timeouts', 0)} timeouts, then the "
        f"breaker opened on {len(opened)} of {r['params']['nodes']} nodes"
        + (f" {min(opened):.1f}-{max(opened):.1f} s after the kill" if opened else "")
        + (f" (deadlines {min(dl):.0f}-{max(dl):.0f} ms)" if dl else "")
        + f" and skipped {down.get('shared_skipped', 0)} lookups; gateway restarted in "
        f"{f['gateway_restart_s']:.1f} s, every node used the tier again "
        + (f"{rec:.1f} s later, by itself)" if rec is not None
           else f"NOT within {RECOVERY_WAIT_S:.0f} s)"))
    lines += ["", f"{'checkpoint load':<38}{'origin/ckpt':>12}{'slowest s':>11}"
                  f"{'x alone':>9}{'lease waits':>13}{'failed':>8}{'wrong':>7}"]
    alone = r["checkpoint"]["alone"]["max_s"]
    for name, c in r["checkpoint"].items():
        label = f"{c['nodes']} node{'s' if c['nodes'] > 1 else ''}, {name}"
        lines.append(f"{label:<38}{c['origin_x']:>12.2f}{c['max_s']:>11.2f}"
                     f"{c['max_s'] / alone:>9.2f}{c['lease_waits']:>13}"
                     f"{c['read_errors']:>8}{c['verify_errors']:>7}")
    lines += ["", f"{'target (issue 13)':<56}{'goal':<42}{'measured':<53}met"]
    for t in targets(r):
        lines.append(f"{t['measure']:<56}{t['target']:<42}{t['value']:<52} "
                     f"{'yes' if t['met'] else 'NO'}")
    lines.append("('x link': slowest node's MB/s / the in-region link row; 'single-node "
                 "speed': the slowest node with the tier down / the slowest node of the same "
                 "4 nodes without --shared-cache, mean of epochs 2-3; rclone/s3fs cache "
                 f"{CACHE_MB} MiB like the nodes, but s3fs cannot start below "
                 "176 MiB, so it keeps the whole dataset)")
    return "\n".join(lines)


def rows(r: dict) -> list[dict]:
    """The runner's rows (bench/report/results.py): per epoch and checkpoint load, the slowest
    node's MB/s, WAN bytes as ``link_bytes_down``; a ``link`` row = the in-region link."""
    link = r["link_mbps"]["in_region"]
    base = {"scenario": "multinode"}
    out = [{**base, "system": "link", "phase": "link", "value": link, "unit": "MB/s",
            "mbps": link, "note": "in-region, per node, 4 at once"}]
    for name, eps in r["epochs"].items():
        for e in eps:
            out.append({**base, "system": LABELS.get(name, name), "phase": f"epoch{e['epoch']}",
                        "value": e["min_mbps"], "unit": "MB/s", "mbps": e["min_mbps"],
                        "bytes": e["bytes"], "seconds": e["wall_s"],
                        "verify_errors": e["verify_errors"],
                        "link_bytes_down": e["wan_bytes"],
                        "byte_hit_rate_est": max(0.0, 1 - e["wan_bytes"] / max(e["bytes"], 1))})
    phases = {"volume_killed": "vol-kill", "gateway_killed": "gw-kill",
              "tier_down": "tier-down", "after_recovery": "recovered"}
    for key in phases:
        if isinstance(e := r["faults"].get(key), dict):
            out.append({**base, "system": LABELS["with"], "phase": phases[key],
                        "value": e["min_mbps"], "unit": "MB/s", "mbps": e["min_mbps"],
                        "bytes": e["bytes"], "seconds": e["wall_s"],
                        "verify_errors": e["verify_errors"], "link_bytes_down": e["wan_bytes"],
                        "byte_hit_rate_est": max(0.0, 1 - e["wan_bytes"] / max(e["bytes"], 1)),
                        "fault": key})
    for name, err in r.get("errors", {}).items():
        out.append({**base, "system": LABELS.get(name, name), "phase": "-", "error": err})
    for name, c in r["checkpoint"].items():
        sysname = {
            "alone": "1x nc --shared-cache", "alone, without": "1x neuralcache",
            "with": LABELS["with"], "without": LABELS["without"],
            "with, leases off": "4x nc --shared, no lease"}[name]
        out.append({**base, "system": sysname, "phase": "ckpt", "value": c["max_s"],
                    "unit": "s load", "bytes": r["ckpt_bytes"], "seconds": c["max_s"],
                    "verify_errors": c["verify_errors"],
                    "link_bytes_down": int(c["origin_x"] * r["ckpt_bytes"])})
    return out


# -- the two ways in -------------------------------------------------------------------------
def params_for(quick: bool, seed: int, rtt_ms: float, systems: list[str]) -> Params:
    return Params(files=64 if quick else 256, ckpt_mb=32 if quick else 128, seed=seed,
                  rtt_ms=rtt_ms,
                  others=tuple(s for s in ("rclone", "s3fs") if s in systems))


def scenario(ctx) -> list[dict]:
    """4 nodes sharing an in-region tier: WAN bytes, faults, a checkpoint (issue 13)."""
    work = Path(ctx.work_dir) / "multinode"
    shutil.rmtree(work, ignore_errors=True)
    s = Setup(work=work, origin=ctx.seaweed, wan=ctx.proxy, log=ctx.log,
              sys_env=dataclasses.replace(ctx.sys_env, bucket=ORIGIN_BUCKET))
    p = params_for(ctx.quick, ctx.seed, ctx.rtt_ms, ctx.systems)
    try:
        r = measure(s, p)
    except SystemExit as exc:       # a neuralcache command failed (bench/systems/ncmount.py)
        raise RuntimeError(str(exc)) from None
    r["targets"] = targets(r)
    text = table(r)
    out = Path(ctx.out_dir)
    (out / "multinode.json").write_text(json.dumps(r, indent=1, default=str))
    (out / "multinode.txt").write_text(text + "\n")
    ctx.log("multinode table:\n" + text)
    ctx.notes.append("multinode (also in multinode.txt; rows above: slowest node per "
                     "epoch, link MB = WAN bytes):\n" + text)
    shutil.rmtree(work, ignore_errors=True)
    return rows(r)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.multinode", description=__doc__
                                 .split("\n\n")[0])
    ap.add_argument("--nodes", type=int, default=4)
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--files", type=int, default=256)
    ap.add_argument("--file-kb", type=int, default=512)
    ap.add_argument("--ckpt-mb", type=int, default=128)  # --files 64 --ckpt-mb 32: quick
    ap.add_argument("--rtt-ms", type=float, default=60.0)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--systems", default="rclone,s3fs",
                    help="comparison systems, each node alone ('' for none)")
    ap.add_argument("--out", help="also write the results as JSON here")
    a = ap.parse_args(argv)
    p = Params(nodes=a.nodes, epochs=a.epochs, files=a.files, file_kb=a.file_kb,
               ckpt_mb=a.ckpt_mb, seed=a.seed, rtt_ms=a.rtt_ms,
               others=tuple(x for x in a.systems.split(",") if x))
    work = Path(tempfile.mkdtemp(prefix="nc-multinode-"))

    def log(msg):
        print(f"[multinode {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)

    origin = SeaweedServer(work / "origin")
    wan = None
    try:
        origin.start()
        wan = WanProxyProcess(f"127.0.0.1:{origin.s3_port}", rtt_ms=a.rtt_ms).start()
        env = SystemEnv(work_dir=work / "systems", data_dir=work / "data",
                        bucket=ORIGIN_BUCKET, endpoint=wan.endpoint,
                        access_key=origin.access_key, secret_key=origin.secret_key,
                        direct_endpoint=origin.endpoint)
        r = measure(Setup(work=work / "run", origin=origin, wan=wan, sys_env=env, log=log), p)
    except BaseException:
        log(f"failed; logs kept in {work}")
        raise
    finally:
        if wan is not None:
            wan.stop()
        origin.stop(grace=0)
    r["targets"] = targets(r)
    print(table(r))
    if a.out:
        Path(a.out).write_text(json.dumps(r, indent=2, default=str))
    shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Many nodes, one dataset: WAN bytes and per-node throughput with and without the shared
tier (issue 13).

    python -m bench.multinode [--nodes 4] [--epochs 3] [--files 64] [--file-kb 512]
                              [--ckpt-mb 32] [--rtt-ms 60] [--out FILE.json]

The origin is an all-in-one SeaweedFS (``SeaweedServer``) behind the WAN proxy
(--rtt-ms); the shared tier a SeaweedFS cluster (``SeaweedCluster``: master, 3 volume
servers with replication, filer, S3 gateway) behind a 1 ms proxy.  A "node" is a
NeuralCache mount with its own cache directory, disk and memory caches of
``CACHE_MB`` each -- smaller than one node's share of an epoch, so a node cannot keep
what it read -- and 1 MiB blocks (the small default sizes still give a checkpoint
several blocks per node).  Each epoch every node reads its DistributedSampler-style share
(a permutation seeded by the epoch, every ``nodes``-th file from ``rank``) with
``READERS`` threads, after publishing that order and the next epoch's as hints (what
``HintingSampler`` does); every file is checked against its xxh3.  Nodes run each epoch
at the same time; the WAN proxy's byte counter is read between epochs.

Rows: the in-region and WAN link ceilings for one node's share (boto3 GETs, READERS
threads); per epoch, WAN bytes / dataset and the slowest node's MB/s, without and with
``--shared-cache``; and one checkpoint file loaded by one node alone and by all nodes at
once (with the shared tier, with it but leases off, without it): origin bytes /
checkpoint and the slowest node's load time.
"""
from __future__ import annotations

import argparse
import concurrent.futures as cf
import json
import os
import random
import shutil
import sys
import tempfile
import threading
import time
from pathlib import Path

import xxhash

from .cluster import SeaweedCluster
from .ncmount import mounted, stats
from .seaweed import SeaweedServer
from .wan import WanProxyProcess

MB = 1 << 20
# Reader threads per node (a DataLoader's workers).
READERS = 4
# Each node's disk and memory cache, MiB: below one node's share of an epoch at the
# default sizes (64 x 512 KiB / 4 nodes = 8 MiB), so re-reads cannot come from the node.
CACHE_MB = 4
BLOCK = "1M"
# Counters summed over the nodes per epoch (results.json only).
DELTAS = ("shared_hits", "shared_misses", "shared_leases", "shared_lease_waits",
          "shared_lease_wait_s", "shared_lease_timeouts", "shared_lease_dropped",
          "shared_timeouts", "shared_breaker_trips", "shared_skipped",
          "shared_writes_skipped", "shared_write_errors", "bytes_fetched")
ORIGIN_BUCKET = "multinode"
SHARED_BUCKET = "multinode-shared"


def make_files(n: int, size: int, seed: int) -> dict[str, bytes]:
    return {f"ds/{i:04d}.bin": random.Random(seed * 7919 + i).randbytes(size + 977 * (i % 7))
            for i in range(n)}


def share(files: list[str], epoch: int, rank: int, nodes: int, seed: int) -> list[str]:
    """DistributedSampler's split: one permutation per epoch, every nodes-th from rank."""
    perm = sorted(files)
    random.Random(seed * 1009 + epoch).shuffle(perm)
    return perm[rank::nodes]


def read_files(root: Path, order: list[str], digests: dict[str, str]) -> tuple[int, int]:
    """Read ``order`` with READERS threads; (bytes, files whose xxh3 did not match)."""
    def one(rel):
        data = (root / rel).read_bytes()
        return len(data), xxhash.xxh3_64_hexdigest(data) != digests[rel]

    with cf.ThreadPoolExecutor(READERS) as pool:
        res = list(pool.map(one, order))
    return sum(n for n, _ in res), sum(bad for _, bad in res)


def link_rate(endpoint: str, server: SeaweedServer, keys: list[str]) -> float:
    """MB/s of GETs of ``keys`` through ``endpoint``, READERS at a time (connections
    opened first)."""
    s3 = server.client(endpoint)
    with cf.ThreadPoolExecutor(READERS) as pool:
        list(pool.map(lambda _: s3.head_bucket(Bucket=ORIGIN_BUCKET), range(READERS)))
        t0 = time.monotonic()
        n = sum(pool.map(lambda k: len(s3.get_object(Bucket=ORIGIN_BUCKET, Key=k)["Body"]
                                      .read()), keys))
    return n / (time.monotonic() - t0) / 1e6


class Bench:
    def __init__(self, work: Path, a: argparse.Namespace, origin: SeaweedServer,
                 wan: WanProxyProcess, cluster: SeaweedCluster):
        self.work, self.a, self.origin, self.wan, self.cluster = work, a, origin, wan, cluster
        self.env = dict(os.environ, **origin.env())
        self.runs = 0

    def mount_args(self, shared: str | None, leases: bool = True) -> list[str]:
        args = ["--endpoint-url", self.wan.endpoint, "--block-size", BLOCK,
                "--cache-size", f"{CACHE_MB}M", "--memory-cache-size", f"{CACHE_MB}M"]
        if shared:
            args += ["--shared-cache", f"s3://{SHARED_BUCKET}/{shared}",
                     "--shared-cache-endpoint", self.cluster.endpoint]
            if not leases:
                args += ["--shared-cache-leases", "off"]
        return args

    def nodes(self, n: int, shared: str | None, leases: bool = True):
        """Context manager: ``n`` fresh mounts (own cache directories)."""
        import contextlib

        self.runs += 1
        stack = contextlib.ExitStack()
        mps = []
        for r in range(n):
            d = self.work / f"run{self.runs}" / f"node{r}"
            mps.append(stack.enter_context(mounted(
                f"s3://{ORIGIN_BUCKET}", d / "mnt", "--cache-dir", d / "cache",
                *self.mount_args(shared, leases), env=self.env)))
        return stack, mps

    def wan_down(self) -> int:
        return self.wan.stats()["bytes_down"]

    def epochs(self, files: dict[str, bytes], digests: dict[str, str],
               shared: str | None) -> list[dict]:
        from neuralcache.hints import publish_order

        a = self.a
        total = sum(map(len, files.values()))
        rows = []
        stack, mps = self.nodes(a.nodes, shared)
        with stack:
            for epoch in range(a.epochs):
                w0 = self.wan_down()
                s0 = [stats(m) for m in mps]
                times = [0.0] * a.nodes
                bad = [0] * a.nodes

                def run(rank):
                    order = share(list(files), epoch, rank, a.nodes, a.seed)
                    nxt = share(list(files), epoch + 1, rank, a.nodes, a.seed)
                    t0 = time.monotonic()
                    publish_order(str(mps[rank]), order + nxt)
                    n, bad[rank] = read_files(mps[rank], order, digests)
                    times[rank] = n / (time.monotonic() - t0) / 1e6

                threads = [threading.Thread(target=run, args=(r,)) for r in range(a.nodes)]
                for t in threads:
                    t.start()
                for t in threads:
                    t.join()
                s1 = [stats(m) for m in mps]
                rows.append({"epoch": epoch + 1, "wan_x": (self.wan_down() - w0) / total,
                             "min_mbps": min(times), "mean_mbps": sum(times) / len(times),
                             "verify_errors": sum(bad),
                             **{k: round(sum(b.get(k, 0) - a0.get(k, 0)
                                             for a0, b in zip(s0, s1)), 3)
                                for k in DELTAS}})
            st = [stats(m) for m in mps]
        rows.append({"epoch": "all", "wan_x": sum(r["wan_x"] for r in rows),
                     "shared_hits": sum(s.get("shared_hits", 0) for s in st),
                     "read_errors": sum(s["read_errors"] for s in st)})
        return rows

    def checkpoint(self, key: str, digest: str, size: int, n: int, shared: str | None,
                   leases: bool = True) -> dict:
        stack, mps = self.nodes(n, shared, leases)
        with stack:
            w0 = self.wan_down()
            times = [0.0] * n
            ok = [False] * n

            def load(r):
                t0 = time.monotonic()
                h = xxhash.xxh3_64()
                with open(mps[r] / key, "rb", buffering=0) as f:
                    while b := f.read(MB):
                        h.update(b)
                times[r] = time.monotonic() - t0
                ok[r] = h.hexdigest() == digest

            threads = [threading.Thread(target=load, args=(r,)) for r in range(n)]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            wan = self.wan_down() - w0
            st = [stats(m) for m in mps]
        return {"nodes": n, "origin_x": wan / size, "max_s": max(times),
                "mean_s": sum(times) / n, "verify_errors": ok.count(False),
                "fetched_x": sum(s["bytes_fetched"] for s in st) / size,
                "lease_waits": sum(s.get("shared_lease_waits", 0) for s in st)}


def run(a: argparse.Namespace) -> dict:
    work = Path(tempfile.mkdtemp(prefix="nc-multinode-"))
    files = make_files(a.files, a.file_kb << 10, a.seed)
    digests = {k: xxhash.xxh3_64_hexdigest(v) for k, v in files.items()}
    ckpt = random.Random(a.seed).randbytes(a.ckpt_mb * MB)
    ck_key, ck_digest = "ckpt/model.bin", xxhash.xxh3_64_hexdigest(ckpt)
    out: dict = {"args": vars(a), "dataset_bytes": sum(map(len, files.values()))}
    origin = SeaweedServer(work / "origin")
    cluster = SeaweedCluster(work / "cluster", proxy_rtt_ms=1)
    wan = near = None
    try:
        origin.start()
        cluster.start()
        cluster.create_bucket(SHARED_BUCKET)
        s3 = origin.client()
        s3.create_bucket(Bucket=ORIGIN_BUCKET)
        with cf.ThreadPoolExecutor(8) as pool:
            list(pool.map(lambda kv: s3.put_object(Bucket=ORIGIN_BUCKET, Key=kv[0],
                                                   Body=kv[1]),
                          list(files.items()) + [(ck_key, ckpt)]))
        upstream = f"127.0.0.1:{origin.s3_port}"
        wan = WanProxyProcess(upstream, rtt_ms=a.rtt_ms).start()
        near = WanProxyProcess(upstream, rtt_ms=1).start()
        one_share = share(list(files), 0, 0, a.nodes, a.seed)
        out["link_mbps"] = {"in_region": link_rate(near.endpoint, origin, one_share),
                            "wan": link_rate(wan.endpoint, origin, one_share)}
        b = Bench(work, a, origin, wan, cluster)
        out["epochs"] = {"without": b.epochs(files, digests, None),
                         "with": b.epochs(files, digests, "epochs")}
        size = len(ckpt)
        out["checkpoint"] = {
            "alone": b.checkpoint(ck_key, ck_digest, size, 1, "ck-alone"),
            "with": b.checkpoint(ck_key, ck_digest, size, a.nodes, "ck-with"),
            "with, leases off": b.checkpoint(ck_key, ck_digest, size, a.nodes, "ck-nolease",
                                             leases=False),
            "without": b.checkpoint(ck_key, ck_digest, size, a.nodes, None)}
    except BaseException:
        print(f"multinode: failed; logs kept in {work}", file=sys.stderr)
        raise
    else:
        shutil.rmtree(work, ignore_errors=True)
    finally:
        for p in (wan, near):
            if p is not None:
                p.stop()
        cluster.stop(grace=0)
        origin.stop(grace=0)
    return out


def table(r: dict) -> str:
    a = r["args"]
    link = r["link_mbps"]
    lines = [f"multinode: {a['nodes']} nodes, {a['epochs']} epochs over {a['files']} x "
             f"{a['file_kb']} KiB ({r['dataset_bytes'] / 1e6:.0f} MB), checkpoint "
             f"{a['ckpt_mb']} MiB, {a['rtt_ms']:.0f} ms origin, 1 ms shared tier, "
             f"caches {CACHE_MB} MiB per node",
             f"link ceiling for one node's share ({READERS} GETs at a time): in-region "
             f"{link['in_region']:.1f} MB/s, WAN {link['wan']:.1f} MB/s", "",
             f"{'epochs':<28}{'WAN bytes / dataset':>22}{'slowest node MB/s':>19}"
             f"{'x in-region link':>18}"]
    for name in ("without", "with"):
        for e in r["epochs"][name]:
            label = f"{name} --shared-cache, epoch {e['epoch']}"
            if e["epoch"] == "all":
                lines.append(f"{label:<40}{e['wan_x']:>10.2f}   (read errors "
                             f"{e['read_errors']}, shared hits {e['shared_hits']})")
            else:
                lines.append(f"{label:<40}{e['wan_x']:>10.2f}{e['min_mbps']:>19.1f}"
                             f"{e['min_mbps'] / link['in_region']:>18.2f}"
                             + (f"  VERIFY ERRORS {e['verify_errors']}"
                                if e["verify_errors"] else ""))
    lines += ["", f"{'checkpoint load':<28}{'origin bytes / ckpt':>22}{'slowest load s':>16}"
                  f"{'x alone':>10}{'lease waits':>13}"]
    alone = r["checkpoint"]["alone"]["max_s"]
    for name, c in r["checkpoint"].items():
        label = f"{c['nodes']} node{'s' if c['nodes'] > 1 else ''}, {name}"
        lines.append(f"{label:<28}{c['origin_x']:>22.2f}{c['max_s']:>16.2f}"
                     f"{c['max_s'] / alone:>10.2f}{c['lease_waits']:>13}"
                     + (f"  VERIFY ERRORS {c['verify_errors']}" if c["verify_errors"] else ""))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.multinode", description=__doc__
                                 .split("\n\n")[0])
    ap.add_argument("--nodes", type=int, default=4)
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--files", type=int, default=64)
    ap.add_argument("--file-kb", type=int, default=512)
    ap.add_argument("--ckpt-mb", type=int, default=32)
    ap.add_argument("--rtt-ms", type=float, default=60.0)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", help="also write the results as JSON here")
    a = ap.parse_args(argv)
    r = run(a)
    print(table(r))
    if a.out:
        Path(a.out).write_text(json.dumps(r, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Many nodes, one dataset (issue 13): WAN bytes, per-node throughput, faults and one
checkpoint loaded by every node, with and without the shared tier.

    python -m bench run --scenario multinode [--quick] [--out DIR]     # the issue's table
    python -m bench.multinode [--nodes 4] [--epochs 3] [--files 256] [--file-kb 512]
                              [--ckpt-mb 128] [--rtt-ms 60] [--systems rclone,s3fs]
                              [--only all|epochs] [--out FILE.json]

One implementation, two ways in.  As the ``multinode`` scenario of ``python -m bench
run`` it reuses the runner's origin -- its SeaweedFS (``ctx.seaweed``, bucket
``multinode``) behind its WAN proxy (``ctx.proxy``, the run's --rtt-ms and link faults),
whose byte counter is the WAN bytes -- and its systems (``bench/systems/``: rclone and
s3fs mounted as in the main bench, one per node).  ``python -m bench.multinode`` starts
its own SeaweedFS and WAN proxy the same way and runs the same ``measure``.  The shared
tier is always this module's own SeaweedFS *cluster* (``bench/servers/cluster.py``: master,
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

The nodes and the faults: nodes.py; ``table()`` (table.py) prints it all with the
issue's targets and whether each is met.
"""
from __future__ import annotations

import argparse
import concurrent.futures as cf
import contextlib
import dataclasses
import json
import random
import shutil
import sys
import tempfile
import time
from pathlib import Path

import xxhash

from bench.servers.cluster import SeaweedCluster
from bench.servers.seaweed import SeaweedServer
from bench.systems.base import SystemEnv
from bench.wan import WanProxyProcess

from .nodes import (BLOCK, CACHE_MB, CKPT_CACHE_MB, CKPT_MEMORY_MB, LINK_BUCKET, MB, ORIGIN_BUCKET,
                    READERS, SHARED_BUCKET, Bench, Params, Setup, link_rate, make_files, share)
from .table import rows, table, targets


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
        res["with"], out["faults"] = b.with_shared(p.parts == "all")
        out["errors"] = {}
        out["epochs"] = res
        out["checkpoint"] = {}
        if p.parts == "epochs":
            return out
        for system in p.others:
            try:
                with b.system_nodes(system, p.nodes) as nodes:
                    res[system] = b.epochs(nodes, False, f"{system} (each node alone)")
            except Exception as exc:   # not installed, mount failed: a line in the table
                out["errors"][system] = " ".join(f"{type(exc).__name__}: {exc}".split())[:200]
                s.log(f"multinode: {system} failed: {out['errors'][system]}")
        size = len(ckpt)
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
    ap.add_argument("--only", choices=("all", "epochs"), default="all",
                    help="epochs: only the epochs without and with --shared-cache (no "
                         "faults, checkpoint or other systems), with the tier's counters")
    ap.add_argument("--out", help="also write the results as JSON here")
    a = ap.parse_args(argv)
    p = Params(nodes=a.nodes, epochs=a.epochs, files=a.files, file_kb=a.file_kb,
               ckpt_mb=a.ckpt_mb, seed=a.seed, rtt_ms=a.rtt_ms,
               others=tuple(x for x in a.systems.split(",") if x and a.only == "all"),
               parts=a.only)
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

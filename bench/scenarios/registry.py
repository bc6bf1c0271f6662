"""The scenario registry: name -> function(ctx) -> list of result rows.

A row is a dict with at least ``scenario``, ``system``, ``phase`` and either ``value`` +
``unit`` (+ ``seconds``, ``bytes``) or ``error``; ``Ctx.run_systems`` and ``Ctx.measure``
fill in the rest (link bytes, hit rate, prefetch precision).  To add a scenario, write
``def my_scenario(ctx): ...`` and ``register("name", my_scenario)`` -- see README.md.
"""
from __future__ import annotations

import importlib
import time
from typing import Callable

from bench.scenarios import checkpoint
from bench.scenarios import train as train_mod
from bench.scenarios import train_files as tf
from bench.scenarios import workloads as wl
from bench.systems import loader, peers
from bench.systems.base import MountOptions
from bench.systems.mounts import S3FS_MIN_CACHE_MB
from bench.systems.registry import PEER_SYSTEMS

SCENARIOS: dict[str, Callable] = {}
# What "--scenario all" runs: the built-in scenarios (their sizes fit the --quick and
# full time budgets); registered extras such as maze run when named.
DEFAULT: list[str] = []
# The scenarios whose workload hands its read order to the mount when the system asks
# for it (``m.info["hints"]``, the neuralcache-hints system).  Elsewhere that system
# would be the same as neuralcache, so it does not run there.
HINTED: list[str] = []
HINTS_SYSTEM = "neuralcache-hints"
# name -> fn() -> None, or one line saying what to install (asked before a run starts).
REQUIRES: dict[str, Callable[[], str | None]] = {}


def register(name: str, fn: Callable, default: bool = False, hints: bool = False,
             requires: Callable[[], str | None] | None = None) -> Callable:
    SCENARIOS[name] = fn
    if default and name not in DEFAULT:
        DEFAULT.append(name)
    if hints and name not in HINTED:
        HINTED.append(name)
    if requires is not None:
        REQUIRES[name] = requires
    return fn


def missing_requirements(names: list[str]) -> str | None:
    """The first scenario requirement that this machine lacks, as one line; else None."""
    for name in names:
        msg = REQUIRES[name]() if name in REQUIRES else None
        if msg:
            return msg
    return None


def systems_for(name: str, systems: list[str]) -> list[str]:
    """The systems scenario ``name`` runs: ``systems`` without neuralcache-hints unless the
    scenario publishes hints, and without the peers (client systems) that have no
    version of its workload (bench/systems/peers.py: ``scenarios_of``)."""
    out = list(systems) if name in HINTED else [s for s in systems if s != HINTS_SYSTEM]
    return [s for s in out if s not in PEER_SYSTEMS or name in peers.scenarios_of(s)]


def peers_note(names: list[str], systems: list[str]) -> str | None:
    """The one note for a run with peers: which scenarios each peer has no version of."""
    skipped = []
    for s in systems:
        if s in PEER_SYSTEMS and "-tuned" not in s:
            out = [n for n in names if n not in peers.scenarios_of(s)]
            if out:
                skipped.append(f"{s} (+ -tuned) in {', '.join(out)}")
    if not skipped:
        return None
    return ("peers run only in the scenarios they have a workload for; skipped: "
            + "; ".join(skipped))


def _client_row(m, row: dict) -> dict:
    """A client system's row carries what its converted copy cost (not counted)."""
    conv = m.client.conversion() if m.kind == "client" else None
    return {**row, "conversion": conv} if conv else row


def hints_note(names: list[str], systems: list[str]) -> str | None:
    """The one note for a run whose user named neuralcache-hints: where it was skipped."""
    skipped = [n for n in names if HINTS_SYSTEM in systems and n not in HINTED]
    if not skipped:
        return None
    return (f"{HINTS_SYSTEM} skipped in {', '.join(skipped)}: only {', '.join(HINTED)} "
            "publish hints; elsewhere it would equal neuralcache")


def shards(ctx):
    """WebDataset shards: shuffled shard order, each shard sequential; cold then warm."""
    man = ctx.dataset("shards")

    def body(ctx, m):
        if m.kind == "client":
            return [ctx.measure(m, ph, lambda: m.client.shards_epoch("shards", man, seed))
                    for ph, seed in (("cold", 1), ("warm", 2))]
        h = m.info.get("hints", False)
        return [ctx.measure(m, "cold", lambda: wl.shards_epoch(m.root, "shards", man, 1, hints=h)),
                ctx.measure(m, "warm", lambda: wl.shards_epoch(m.root, "shards", man, 2, hints=h))]
    return ctx.run_systems("shards", "shards", man, body)


def samples(ctx):
    """File per sample (ImageNet-like), random order, 8 parallel readers; cold then warm."""
    man = ctx.dataset("samples")

    def body(ctx, m):
        if m.kind == "client":
            m.client.prepare("samples", man)
            return [_client_row(m, ctx.measure(m, ph, lambda: m.client.samples_epoch(
                "samples", man, 1, epoch))) for ph, epoch in (("cold", 1), ("warm", 2))]
        h = m.info.get("hints", False)
        return [ctx.measure(m, "cold", lambda: wl.samples_epoch(m.root, "samples", man, 1,
                                                               hints=h)),
                ctx.measure(m, "warm", lambda: wl.samples_epoch(m.root, "samples", man, 2,
                                                               hints=h))]
    return ctx.run_systems("samples", "samples", man, body,
                           link_value=lambda r: (r["files_per_s"], "files/s"))


def bigfile(ctx):
    """One large file read sequentially, cold (the model-weights cold start)."""
    man = ctx.dataset("bigfile")

    def body(ctx, m):
        if m.kind == "client":
            return [ctx.measure(m, "cold", lambda: m.client.bigfile_read("bigfile", man))]
        return [ctx.measure(m, "cold", lambda: wl.bigfile_read(m.root, "bigfile", man))]
    return ctx.run_systems("bigfile", "bigfile", man, body)


def train(ctx):
    """Training loop at a fixed compute rate (~116 samples/s from local disk), cold."""
    man = ctx.dataset("train")
    p = man["signature"]["params"]
    nsamples = p["shards"] * p["samples_per_shard"]
    window = 4 if ctx.quick else 8

    def body(ctx, m):
        return [ctx.measure(m, "cold", lambda: train_mod.train_run(
            m.root, "train", man, seed=1, window=window))]
    return ctx.run_systems("train", "train", man, body,
                           link_value=lambda r: (nsamples / r["seconds"], "samples/s"))


def train_files(ctx):
    """ImageNet-like files, 8 DataLoader workers, ~1,000 samples/s from local, 2 epochs."""
    man = ctx.add_dataset(tf.dataset(ctx.quick))
    nsamples = len(man["files"])
    window = 5 if ctx.quick else tf.WINDOW
    loader.quiet_torch_warnings()
    ctx.notes.append(
        f"train-files: {nsamples} files, batch {loader.BATCH}, {loader.WORKERS} DataLoader workers "
        f"(tuned peers: see bench/README.md), compute {tf.COMPUTE_S * 1000:.0f} ms per batch "
        f"(~{tf.TARGET_SAMPLES_PER_S:.0f} samples/s from local disk), windows of {window} "
        "batches; epoch 2 reshuffled; cpu s = every process involved (workers, daemon)")

    def body(ctx, m):
        ld = {}
        if m.kind == "client":
            m.client.prepare("train-files", man)
        tf.warm_loader_machinery()

        def epoch(e):
            t0 = time.monotonic()          # epoch 1 includes building the loader
            if "x" not in ld:
                ld["x"] = (m.client.loader("train-files", man, 1) if m.kind == "client"
                           else tf.mount_loader(m.root, "train-files", man, 1,
                                                hints=m.info.get("hints", False)))
            r = loader.train_files(ld["x"].epoch, man, tf.COMPUTE_S, window, e, t0=t0)
            r["workers"] = ld["x"].workers
            return r
        return [_client_row(m, ctx.measure(m, f"epoch{e}", lambda: epoch(e)))
                for e in range(1, tf.EPOCHS + 1)]
    return ctx.run_systems("train-files", "train-files", man, body,
                           link_value=lambda r: (nsamples / r["seconds"], "samples/s"))


def overflow(ctx):
    """Three shuffled epochs over a dataset twice the cache size (cache set per system)."""
    cache_mb = 16 if ctx.quick else 256
    man = ctx.dataset("overflow", cache_mb=cache_mb)
    opts = MountOptions(cache_mb=cache_mb, memory_cache_mb=max(cache_mb // 4, 8))
    ctx.notes.append(f"overflow: cache {cache_mb} MiB (neuralcache disk {cache_mb} MiB + "
                     f"memory {opts.memory_cache_mb} MiB; rclone --vfs-cache-max-size "
                     f"{cache_mb}M; s3fs: cache dir on a tmpfs of max(cache, {S3FS_MIN_CACHE_MB} MiB) "
                     "+ 8 MiB with ensure_diskfree=8), dataset "
                     f"{sum(m['size'] for m in man['files'].values()) / 2**20:.0f} MiB; "
                     "kernel page cache dropped before every epoch")

    def body(ctx, m):
        rows = []
        for epoch in (1, 2, 3):
            method = ctx.drop_caches(m, "overflow", level=1)
            r = ctx.measure(m, f"epoch{epoch}",
                            lambda: wl.shards_epoch(m.root, "overflow", man, 10 + epoch))
            r["page_cache_drop"] = method
            rows.append(r)
        return rows
    return ctx.run_systems("overflow", "overflow", man, body, opts=opts)


def fio(ctx):
    """fio jobs from scenarios/fio_jobs/*.fio (each job its own files, so each is cold); fio JSON."""
    man = ctx.dataset("fio")
    runtime = 3 if ctx.quick else 15

    def body(ctx, m):
        rows = []
        for job in wl.fio_jobs():
            ctx.drop_caches(m, "fio", level=1)
            rows.append(ctx.measure(m, job, lambda: wl.fio_run(m.root, "fio", man, job, runtime)))
        return rows
    return ctx.run_systems("fio", "fio", man, body)


for _fn in (shards, samples, train, bigfile, overflow, fio):
    register(_fn.__name__, _fn, default=True, hints=_fn in (shards, samples))
register("train-files", train_files, default=True, hints=True)
register("checkpoint", checkpoint.scenario)    # checkpoint.py; long: not in "all"
register("multinode", importlib.import_module("bench.scenarios.multinode.scenario").scenario)


def _maybe_register_maze() -> None:
    """bench/scenarios/maze/scenario.py exposing ``scenario(ctx)`` becomes the ``maze`` scenario.

    A module that exists but fails to import still registers, as a scenario that
    raises the import error -- the run shows an error row instead of a missing scenario.
    """
    try:
        mod = importlib.import_module("bench.scenarios.maze.scenario")
    except ModuleNotFoundError as exc:
        if exc.name in ("bench.scenarios.maze", "bench.scenarios.maze.scenario"):
            return
        err = exc
    except Exception as exc:  # a broken module must not break the other scenarios
        err = exc
    else:
        fn = getattr(mod, "scenario", None)
        if callable(fn):
            register("maze", fn, requires=getattr(mod, "requirements", None))
        return

    def broken(ctx):
        raise RuntimeError(f"bench.scenarios.maze.scenario failed to import: {err!r}")
    broken.__doc__ = "maze (import failed)"
    register("maze", broken)


_maybe_register_maze()

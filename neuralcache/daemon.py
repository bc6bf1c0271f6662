"""The daemon: wires backend, namespace, caches, prefetcher and the FUSE edge, mounts,
serves until unmounted or signalled, then unmounts cleanly.

``serve(cfg, on_ready)`` is the only entry point; the CLI runs it in the foreground or
in a detached child that reports readiness over a pipe (see admin/cli.py).  Readiness is also
sent to systemd (``READY=1`` on $NOTIFY_SOCKET) when run as a Type=notify service.
"""
from __future__ import annotations

import errno
import fcntl
import functools
import gc
import json
import logging
import os
import signal
import socket
import subprocess
import sys
import time

import pyfuse3
import trio
import xxhash
from predictors import make_default_predictor

from . import buffers, cpuacct
from .fs import control
from .fs import loop as fuse_loop
from .admin import mounts
from .backends import open_backend
from .backends.s3 import describe_check_error
from .store.blockfiles import padded
from .store.blocks import BlockStore
from .store.writeback import WRITE_BACK_S
from .store.tiers import DiskTier, MemoryTier
from .admin.config import MountConfig
from .errors import BackendError, UserError, first_error
from .fs.operations import Operations
from .meta.lister import Lister
from .meta.rows import DB_NAME
from .namespace import Namespace
from .ahead.prefetch import Prefetcher
from .stats import Stats
from .gcwatch import GcWatch
from .fs.trace import TraceRing
from .write.journal import JOURNAL_DIR, LOG_NAME

log = logging.getLogger(__name__)

# Container allocations between two young-generation collections of the cyclic GC
# (CPython's default 700).  A cold small file allocates a few hundred (trio tasks,
# events, coroutines), so at 700 the collector ran every few files: gc_collect_main
# was 6.8 % of the trio thread's samples in bench.breakdown's cold files (py-spy
# --native).  Set once the mount serves, after gc.freeze(); cycles still go, in
# fewer, larger young collections (~2 MB of young objects at most).
GC_GEN0_THRESHOLD = 20_000
# Prefetched-but-unread bytes allowed, as a fraction of the memory tier: half keeps
# room for the blocks readers are consuming now (prefetch never evicts sooner data).
PREFETCH_BUDGET_FRACTION = 0.5
# The kernel's read-ahead for the mount (bdi read_ahead_kb).  FUSE starts at 128 KiB,
# which keeps one 128 KiB request in flight; 16 MiB lets the kernel send 1 MiB
# requests several at a time (measured on a sequential dd from the memory tier:
# see README "Performance").  Needs root; skipped with a debug line otherwise.
KERNEL_READAHEAD_KB = 16384
# The FUSE connection's background requests (/sys/fs/fuse/connections/N/max_background;
# the kernel's default 12, congestion at 3/4 of it): every read-ahead READ is one, and
# once 9 are queued the kernel skips the rest of its read-ahead (fs/fuse/file.c,
# fuse_readahead).  `python -m bench.tools.cachedpair --cache-root /dev/shm/x new:DIR
# old:DIR` (1 GiB, the cache on tmpfs, 2 rounds): 1734, 1517, 1908, 1833 against 1412,
# 1546, 1757, 1494 MB/s; with the cache on this VM's disk the disk bounds it first
# (bench/RESULTS.md, thirty-sixth sitting).  The kernel lets the user who mounted write
# them; fusectl is mounted only as root.
FUSE_MAX_BACKGROUND = 64
# ...and the kernel's own ratio for the congestion threshold (3/4 of it).
FUSE_CONGESTION_THRESHOLD = FUSE_MAX_BACKGROUND * 3 // 4
# Where the kernel's fusectl filesystem shows each FUSE connection's knobs.
FUSECTL = "/sys/fs/fuse/connections"
# Connections opened once the mount serves (see S3Backend.warm_connections): enough for
# the first burst of a job's loader workers.
WARM_CONNECTIONS = 32
# glibc malloc arenas (see _limit_malloc_arenas).
MALLOC_ARENAS = 2
# The interpreter's GIL switch interval (CPython's default 5 ms): how long the trio
# thread, back from a system call or a SQLite statement, may wait for the GIL behind a
# worker thread running Python.  Small files read from the disk cache (worker threads
# reading and checking records: bench.breakdown --size 1M --files 2000, "files disk",
# six runs against six at 5 ms, alternating) went at a median 1,002 against 865
# files/s, faster in 5 of 6 pairs, at 0.99 against 1.10 ms of daemon CPU per file;
# cold files, the big file and a checkpoint's writes moved within their spread
# (bench/RESULTS.md fortieth sitting).
GIL_SWITCH_INTERVAL_S = 0.0005


def check_mountpoint(path: str) -> str:
    mp = os.path.abspath(path)
    # the mount table first: a dead daemon's mount fails stat (ENOTCONN) and would
    # look like a missing directory
    e = mounts.find_mount(mp)
    if e is not None:
        raise UserError(f"mountpoint {mp} is busy: {e.fstype} {e.source} is mounted there; "
                        f"unmount it first (neuralcache umount {mp})")
    if not os.path.exists(mp):
        raise UserError(f"mountpoint {mp} does not exist: create it with mkdir -p {mp}")
    if not os.path.isdir(mp):
        raise UserError(f"mountpoint {mp} is not a directory")
    return mp


def cache_subdir(cfg: MountConfig) -> str:
    """One directory per source, so mounts of different sources can share --cache-dir
    without mixing blocks.  Not one per endpoint: the same bucket through another
    endpoint (a VPC endpoint, a proxy) is the same data, its blocks are keyed by
    version anyway, and its write journal must be found and finished whatever the
    endpoint (until 2026-12 the endpoint was part of the name: such a directory of
    this endpoint is taken over by ``_adopt_old_subdir``)."""
    return os.path.join(cfg.cache_dir, xxhash.xxh64_hexdigest(cfg.source.encode()))


def _adopt_old_subdir(cfg: MountConfig, sub: str) -> None:
    """Rename the directory an earlier version kept for (source, endpoint) to ``sub``
    if ``sub`` does not exist yet, so its cache and pending uploads are kept."""
    old = os.path.join(cfg.cache_dir, xxhash.xxh64_hexdigest(
        f"{cfg.source}\0{cfg.endpoint_url or ''}".encode()))
    if os.path.isdir(old) and not os.path.exists(sub):
        fd = _lock_cache(old)           # not while an older daemon still uses it
        try:
            os.rename(old, sub)
            log.info("cache directory %s renamed to %s (one per source now)", old, sub)
        finally:
            os.close(fd)


def _note_endpoint(cfg: MountConfig, sub: str) -> str | None:
    """Record the endpoint of this mount in ``sub``; the one recorded before, if other."""
    path = os.path.join(sub, "source.json")
    try:
        with open(path) as f:
            before = json.load(f).get("endpoint_url")
    except (OSError, ValueError, AttributeError):
        before = cfg.endpoint_url
    try:
        with open(path + ".tmp", "w") as f:
            json.dump({"source": cfg.source, "endpoint_url": cfg.endpoint_url}, f)
        os.replace(path + ".tmp", path)
    except OSError as exc:
        log.debug("cannot record the endpoint in %s: %s", path, exc)
    return before if before != cfg.endpoint_url else None


def _lock_cache(path: str) -> int:
    os.makedirs(path, mode=0o700, exist_ok=True)
    fd = os.open(os.path.join(path, "lock"), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        os.close(fd)
        raise UserError(f"cache directory {path} is in use by another NeuralCache mount "
                        "of the same source (or by one unmounted a moment ago, still "
                        f"writing its memory to the cache for up to {WRITE_BACK_S:.0f} s "
                        "or its uploads: `neuralcache umount` waits for it); give this "
                        "mount its own --cache-dir") from None
    return fd


def sd_notify(msg: str) -> None:
    """Tell systemd (Type=notify) about our state; no-op outside systemd."""
    addr = os.environ.get("NOTIFY_SOCKET")
    if not addr:
        return
    if addr.startswith("@"):
        addr = "\0" + addr[1:]
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as s:
            s.connect(addr)
            s.sendall(msg.encode())
    except OSError as exc:
        log.warning("sd_notify failed: %s", exc)


def _fuse_options(cfg: MountConfig) -> set[str]:
    fsname = "neuralcache:" + cfg.source.replace(",", "_").replace(" ", "_")
    opts = set(pyfuse3.default_options)
    opts |= {f"fsname={fsname}", "subtype=neuralcache", "noatime"}
    if cfg.allow_other:
        opts.add("allow_other")
    return opts


async def _check_backend(backend, cfg: MountConfig) -> None:
    try:
        await trio.to_thread.run_sync(backend.check)
    except UserError:
        raise
    except BackendError as exc:
        raise describe_check_error(exc, cfg.source, cfg.endpoint_url) from None


async def _serve(cfg: MountConfig, on_ready) -> None:
    cpuacct.set_loop_thread()
    mp = check_mountpoint(cfg.mountpoint)
    try:
        backend = open_backend(cfg.source, endpoint_url=cfg.endpoint_url, region=cfg.region,
                               concurrency=cfg.concurrency, profile=cfg.profile)
    except BackendError as exc:
        raise UserError(str(exc)) from None
    if cfg.manifest:
        from .meta.manifest import Manifest, ManifestBackend

        m = await trio.to_thread.run_sync(Manifest, cfg.manifest)
        if m.source and m.source != cfg.source:
            log.warning("manifest %s was written for %s, mounted for %s", cfg.manifest,
                        m.source, cfg.source)
        log.info("names from manifest %s (%d entries)", cfg.manifest, m.entries)
        backend = ManifestBackend(backend, m)
    await _check_backend(backend, cfg)
    sub = cache_subdir(cfg)
    _adopt_old_subdir(cfg, sub)
    lock_fd = _lock_cache(sub)
    try:
        await _serve_locked(cfg, on_ready, mp, backend, sub)
    finally:
        os.close(lock_fd)
        backend.close()


async def _open_journal(cfg, backend, ns: Namespace, sub: str):
    """The write layer of a --writable mount, after finishing what the journal holds
    from an earlier run (any mount of this source and cache does that, before it
    serves); None for a read-only mount."""
    if not cfg.writable and not os.path.exists(os.path.join(sub, JOURNAL_DIR, LOG_NAME)):
        return None
    from .write.layer import WriteLayer

    writes = WriteLayer(ns, None, backend, sub, sync_close=cfg.sync_close)
    sd_notify("STATUS=finishing uploads left in the write journal")
    before = _note_endpoint(cfg, sub)
    n = await writes.recover()
    if cfg.writable:
        await writes.measure_limits()
    if n and before is not None:
        log.warning("journal: the %d operations left by a mount through endpoint %s were "
                    "finished through %s", n, before or "(default)",
                    cfg.endpoint_url or "(default)")
    return writes if cfg.writable else None


async def _drain(writes) -> None:
    """After the unmount: wait for pending uploads (progress in the log); a signal
    stops waiting (they stay in the journal for the next mount)."""
    async def on_signal(cancel_scope):
        with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT, signal.SIGHUP) as sigs:
            async for signum in sigs:
                log.warning("signal %d: not waiting for pending uploads", signum)
                writes.skip_drain = True
                writes.queue.notify()
                return

    async with trio.open_nursery() as n:
        n.start_soon(on_signal, n.cancel_scope)
        await writes.drain()
        n.cancel_scope.cancel()


async def _write_back(store: BlockStore) -> None:
    """After the unmount: BlockStore.write_back within WRITE_BACK_S; a signal stops
    it (the blocks not written are fetched again when next read).  One log line says
    what it wrote."""
    t0 = time.monotonic()
    res = None

    async def on_signal(cancel_scope, task_status=trio.TASK_STATUS_IGNORED):
        with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT, signal.SIGHUP) as sigs:
            task_status.started()
            async for signum in sigs:
                log.warning("signal %d: not writing the rest of memory to the disk cache",
                            signum)
                cancel_scope.cancel()
                return

    try:
        async with trio.open_nursery() as n:
            await n.start(on_signal, n.cancel_scope)
            res = await store.write_back(WRITE_BACK_S)
            n.cancel_scope.cancel()
    except Exception:      # the cache is a cache: the unmount goes on
        log.exception("writing memory to the disk cache failed")
    blocks, nbytes = store.written_back
    if blocks or (res is not None and not res[2]):
        log.info("wrote %d blocks (%.1f MiB) held only in memory to the disk cache in "
                 "%.1f s%s", blocks, nbytes / 2**20, time.monotonic() - t0,
                 "" if res is not None and res[2] else
                 " (not all: time was up, a signal came or the disk refused them)")


async def _serve_locked(cfg, on_ready, mp, backend, sub) -> None:
    t0 = time.monotonic()
    stats = Stats()
    gcw = GcWatch()
    disk = DiskTier(sub, cfg.cache_size)
    try:
        nblocks = await trio.to_thread.run_sync(disk.load)
    except OSError as exc:
        raise UserError(f"cannot use cache directory {sub}: {exc}") from None
    ns = Namespace(os.path.join(sub, DB_NAME), cfg.metadata_cache_size)
    lister = Lister(ns, backend, ttl=cfg.metadata_ttl)
    writes = await _open_journal(cfg, backend, ns, sub)
    if writes is not None:
        writes.lister, lister.writes = lister, writes
    log.info("disk cache has %d blocks (loaded in %.1f s); directories are listed as "
             "they are used", nblocks, time.monotonic() - t0)
    bufs = buffers.recycler(padded(cfg.block_size))    # None: NEURALCACHE_RECYCLE=0
    mem = MemoryTier(cfg.memory_cache_size, release=bufs.give if bufs else None)
    disk.read_buffers = bufs
    if hasattr(backend, "read_buffers"):
        backend.read_buffers = bufs
    store = BlockStore(backend, mem, disk, stats, block_size=cfg.block_size,
                       concurrency=cfg.concurrency)
    if writes is not None:
        writes.store = store
    shared = None
    if cfg.shared_cache:
        from .store.shared import open_shared

        shared = open_shared(cfg, backend, lambda q: stats.latency_quantile(q, 0.1))
        await shared.check()
        store.shared = shared
    trace = TraceRing()
    predictor = make_default_predictor([])
    prefetcher = Prefetcher(ns, store, predictor,
                            budget_bytes=int(cfg.memory_cache_size * PREFETCH_BUDGET_FRACTION),
                            enabled=cfg.prefetch)
    lister.on_listed, prefetcher.lister = prefetcher.listed, lister
    # Epoch-aware eviction: blocks of files consumed this epoch go before unread ones.
    tracker = getattr(getattr(predictor, "epochset", None), "tracker", None)
    if tracker is not None and hasattr(tracker, "evict_rank"):
        disk.evict_rank, disk.spent = tracker.evict_rank, tracker.spent
        tracker.spent_floor = disk.limit
        tracker.ahead_waiting = lambda: store.spec.on_disk > 0   # (prefetched, unread)

    def snapshot() -> dict:
        extra = {"source": cfg.source, "mountpoint": mp,
                 "files": ns.files, "dataset_bytes": ns.total_bytes, **lister.stats(),
                 "hints": prefetcher.hints_set, "open_handles": ops.open_handles(),
                 "warm_opens_unseen": prefetcher.warm_opens_unseen,
                 "prefetch_plans": prefetcher.plans,
                 "prefetch_plans_empty": prefetcher.plans_empty,
                 "pages_dropped": ops.pages.dropped,
                 "disk_cache_writable": disk.writable,
                 "corrupt_blocks_dropped": disk.corrupt_blocks,
                 "disk_puts_declined": disk.declined,
                 "readahead": cfg.readahead, "prefetch": cfg.prefetch}
        extra.update(writes.stats() if writes is not None else {"writable": False})
        extra.update(gcw.stats())
        cpu = cpuacct.snapshot()
        if cpu is not None:
            extra["cpu_s"] = cpu
        if shared is not None:
            extra.update(shared.snapshot())
        if bufs is not None:
            extra.update(bufs.stats())
        if hasattr(backend, "native_stats"):
            extra.update(backend.native_stats())
        if hasattr(backend, "warm_connections"):
            extra["connections_warmed"] = backend.warmed
            extra["trio_connections_warmed"] = backend.trio_warmed
        if hasattr(predictor, "stats"):
            try:
                extra["predictor"] = predictor.stats()
            except Exception:  # stats must never fail because of a predictor
                log.exception("predictor stats failed")
        return stats.snapshot(cache_disk_bytes=disk.used, cache_disk_blocks=len(disk),
                              cache_mem_bytes=mem.used, cache_disk_limit=disk.limit,
                              cache_mem_limit=mem.limit,
                              backend_retries=getattr(backend, "retries", 0), extra=extra)

    def stats_json() -> bytes:
        return (json.dumps(snapshot(), indent=2) + "\n").encode()

    metrics = None
    if cfg.metrics_port:
        from .admin.metrics import Metrics

        metrics = Metrics(snapshot)
        try:
            metrics.serve(cfg.metrics_port, cfg.metrics_addr)
        except OSError as exc:
            todo = {errno.EADDRINUSE: "pick another --metrics-port",
                    errno.EACCES: "pick another --metrics-port (below 1024 needs root)"}
            raise UserError(f"cannot serve metrics on {cfg.metrics_addr}:{cfg.metrics_port}: "
                            f"{exc.strerror or exc}; "
                            f"{todo.get(exc.errno, 'check --metrics-addr')}") from None
        stats.read_hist = metrics.read_seconds
        stats.backend_hist = metrics.backend_seconds

    def hints_status() -> bytes:
        return f"# {prefetcher.hints_set} hinted paths; write paths, one per line\n".encode()

    controls = control.Control(stats=stats_json, trace=trace.dump,
                               apply_hints=prefetcher.set_hints, hints_status=hints_status,
                               uid=os.getuid(), gid=os.getgid(),
                               shared=cfg.allow_other,
                               sync_open=writes.sync_handle if writes is not None else None)
    ops = Operations(ns, lister, store, backend, stats, metadata_ttl=cfg.metadata_ttl,
                     readahead_bytes=cfg.readahead_size if cfg.readahead else 0,
                     trace=trace, controls=controls, prefetcher=prefetcher, writes=writes)
    controls.query = functools.partial(control.answer_query, ns, store, writes)
    try:
        pyfuse3.init(ops, mp, _fuse_options(cfg))
    except RuntimeError as exc:
        raise UserError(f"cannot mount on {mp}: {exc} (is /dev/fuse available and "
                        "fusermount3 installed?)") from None
    unmounted = closed = False
    try:
        async with trio.open_nursery() as outer:
            if writes is not None:          # the journal and uploads outlive the mount
                await outer.start(writes.run)
            async with trio.open_nursery() as n:
                await n.start(store.run)
                await n.start(lister.run)
                await n.start(ops.pages.run)
                if shared is not None:
                    await n.start(shared.run)
                n.start_soon(_on_signals)
                if os.environ.get("NEURALCACHE_TRACEMALLOC") in ("1", "census"):
                    n.start_soon(_memory_report_on_sigusr1,
                                 os.environ["NEURALCACHE_TRACEMALLOC"] == "1")
                if cfg.readahead:   # abandoned if the mount ends first: its stat
                    # would wait for a FUSE loop that no longer runs
                    n.start_soon(functools.partial(trio.to_thread.run_sync,
                                                   _tune_kernel_readahead, mp,
                                                   abandon_on_cancel=True))
                if hasattr(backend, "warm_connections"):    # after ready: not on the way
                    n.start_soon(trio.to_thread.run_sync, backend.warm_connections,
                                 min(cfg.concurrency, WARM_CONNECTIONS))
                if hasattr(backend, "warm_trio"):
                    n.start_soon(backend.warm_trio, min(cfg.concurrency, WARM_CONNECTIONS))
                log.info("serving %s on %s (ready in %.1f s)%s", cfg.source, mp,
                         time.monotonic() - t0, " writable" if writes else "")
                # What exists now (modules, botocore's models, the parts built above:
                # ~150k objects) lives as long as the mount: out of the cyclic
                # collector's sight, a full collection no longer stops every thread for
                # ~80 ms (the longest stat() during refreshes and hints parsing).
                gc.freeze()
                gc.set_threshold(GC_GEN0_THRESHOLD, *gc.get_threshold()[1:])
                gcw.install()
                on_ready(None)
                sd_notify("READY=1\nSTATUS=serving " + cfg.source)
                fuse_loop.install()
                await pyfuse3.main()
                n.cancel_scope.cancel()
            pyfuse3.close(unmount=True)
            closed = True
            sd_notify("STOPPING=1\nSTATUS=writing memory to the disk cache")
            await _write_back(store)
            if writes is not None:
                sd_notify("STOPPING=1\nSTATUS=waiting for pending uploads")
                await _drain(writes)
            outer.cancel_scope.cancel()
        unmounted = True
    finally:
        sd_notify("STOPPING=1")
        gcw.uninstall()
        if not closed:
            pyfuse3.close(unmount=True)
        if writes is not None:
            writes.journal.close()
        ns.close()
        if metrics is not None:
            metrics.close()
        log.info("unmounted %s (clean=%s)", mp, unmounted)


def _tune_kernel_readahead(mp: str) -> None:
    """Raise the mount's bdi read-ahead and its FUSE connection's background requests
    (``FUSE_MAX_BACKGROUND``); runs in a thread once the mount serves (the stat would
    deadlock before the FUSE loop runs).  Each is skipped with a debug line where it
    cannot be done (not root, no fusectl)."""
    try:
        dev = os.stat(mp).st_dev
    except OSError as exc:
        log.debug("cannot tune kernel read-ahead: %s", exc)
        return
    try:
        path = kernel_knob_paths(dev)[0]
        with open(path, "w") as f:
            f.write(str(KERNEL_READAHEAD_KB))
        log.debug("kernel read-ahead %s = %d KiB", path, KERNEL_READAHEAD_KB)
    except OSError as exc:
        log.debug("cannot tune kernel read-ahead: %s", exc)
    _tune_max_background(dev)


def kernel_knob_paths(dev: int) -> tuple[str, str]:
    """The mount on ``dev``'s bdi read_ahead_kb file and its FUSE connection's fusectl
    directory (named by the kernel's dev_t: major << 20 | minor)."""
    return (f"/sys/class/bdi/{os.major(dev)}:{os.minor(dev)}/read_ahead_kb",
            os.path.join(FUSECTL, str(os.major(dev) << 20 | os.minor(dev))))


def _tune_max_background(dev: int) -> None:
    """FUSE_MAX_BACKGROUND for the connection of the mount on ``dev``.  The fusectl
    filesystem is where the kernel offers it; systemd mounts it at boot, a container
    may not have it: then, as root, it is mounted (``mount -t fusectl``; nothing is
    changed but that the directory shows the kernel's FUSE connections).  Never
    raises: a mount that serves goes on serving with the kernel's 12."""
    conn = kernel_knob_paths(dev)[1]
    try:
        if not os.path.isdir(conn) and os.geteuid() == 0 and os.path.isdir(FUSECTL) \
                and not os.listdir(FUSECTL):
            r = subprocess.run(["mount", "-t", "fusectl", "fusectl", FUSECTL],
                               capture_output=True, text=True, timeout=10, check=False)
            if r.returncode != 0:
                log.debug("cannot mount fusectl: %s", r.stderr.strip())
        for name, value in (("max_background", FUSE_MAX_BACKGROUND),
                            ("congestion_threshold", FUSE_CONGESTION_THRESHOLD)):
            with open(os.path.join(conn, name), "w") as f:
                f.write(str(value))
        log.debug("FUSE connection %s: max_background %d", conn, FUSE_MAX_BACKGROUND)
    except (OSError, subprocess.SubprocessError) as exc:
        log.debug("cannot raise the FUSE connection's max_background: %s", exc)


async def _memory_report_on_sigusr1(trace: bool) -> None:
    """Debug aid: with NEURALCACHE_TRACEMALLOC=1 or =census, SIGUSR1 logs the daemon's
    RSS, the blocks Python's allocator holds and the 15 most numerous types of objects
    the garbage collector tracks (a census: no tracing, but it walks every tracked
    object on the trio thread, so the mount stops for a moment; the objects frozen when
    the mount began serving, daemon.py gc.freeze, are not counted); with =1 also what
    tracemalloc saw allocated (every allocation traced from the start: many times
    slower): the total, the 20 source lines that allocated most, the 8 largest call
    paths."""
    import collections
    import tracemalloc

    if trace:
        tracemalloc.start(8)
    with trio.open_signal_receiver(signal.SIGUSR1) as sigs:
        async for _ in sigs:
            with open("/proc/self/status") as f:
                rss = next((line.split()[1] for line in f if line.startswith("VmRSS")), "?")
            census = collections.Counter(type(o).__name__ for o in gc.get_objects())
            log.warning("memory: RSS %s kB, %d allocator blocks; tracked objects by "
                        "type:\n%s", rss, sys.getallocatedblocks(),
                        "\n".join(f"{n:10d} {t}" for t, n in census.most_common(15)))
            if not trace:
                continue
            snap = tracemalloc.take_snapshot()
            lines = snap.statistics("lineno")
            log.warning("memory: %.1f MB traced; by line:\n%s",
                        sum(s.size for s in lines) / 1e6,
                        "\n".join(f"{s.size / 1e6:8.1f} MB {s.count:9d} "
                                  f"{s.traceback[0]}" for s in lines[:20]))
            for stat in snap.statistics("traceback")[:8]:
                log.warning("memory: %.1f MB in %d blocks\n%s", stat.size / 1e6, stat.count,
                            "\n".join(stat.traceback.format()))


async def _on_signals() -> None:
    with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT, signal.SIGHUP) as sigs:
        async for signum in sigs:
            log.info("signal %d: unmounting", signum)
            pyfuse3.terminate()
            return


def _limit_malloc_arenas() -> None:
    """glibc gives each thread that allocates its own malloc arena (up to 8 x cores);
    with ~70 worker threads moving MiB-sized buffers that lets RSS drift far above the
    configured caches, so two arenas.  (Set while chasing the soak test's RSS; the leak
    itself was lru-dict's popitem.)  The mmap threshold is left to glibc: a fixed 64 KiB
    one made every block and every 1 MiB reply a fresh mmap, page-faulted and zeroed,
    which cost 0.5-3 CPU-s per GiB (`python -m bench.breakdown --files 0`, two runs
    each way, 1 GiB cold: 8.9 -> 5.9 and 3.9 -> 3.4 CPU-s/GiB; from the disk cache:
    2.6 -> 1.8 and 2.2 -> 1.6) without changing the soak test's peak RSS bound."""
    try:
        import ctypes

        libc = ctypes.CDLL("libc.so.6")
        M_ARENA_MAX = -8
        libc.mallopt(M_ARENA_MAX, MALLOC_ARENAS)
    except (OSError, AttributeError):
        pass


def serve(cfg: MountConfig, on_ready) -> None:
    """Mount and serve until unmounted.  ``on_ready(None)`` is called once serving;
    UserError is raised (before anything is mounted) for bad input."""
    _limit_malloc_arenas()
    sys.setswitchinterval(GIL_SWITCH_INTERVAL_S)
    try:
        trio.run(_serve, cfg, on_ready)
    except BaseExceptionGroup as group:     # a UserError raised in a nursery: itself
        raise first_error(group) from None

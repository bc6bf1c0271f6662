"""The mounts: local disk, rclone, s3fs and NeuralCache, each mounted fresh with an empty
cache (their tuning: bench/README.md, "Systems").

Mounts are read-only unless a scenario asks ``MountOptions(writable=True)`` (the
checkpoint scenario): neuralcache ``--writable``, rclone ``--vfs-cache-mode writes``
without ``--read-only``, s3fs without ``ro``; ``Mounted.sync()`` is then the system's own
barrier (``neuralcache sync MNT``), where it has one.  NeuralCache is driven only through
its documented CLI (DEVELOPING.md).
"""
from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

from bench.systems.base import (MOUNT_TIMEOUT_S, Mounted, MountOptions, System, SystemEnv,
                                SystemUnavailable, _fuse_dev, _wait_mounted, _wipe, unmount)
from bench.systems.cpu import find_pids
from bench.systems.pagecache import drop_page_cache, resident_bytes

# `neuralcache umount` (of a writable mount it waits for pending uploads first).
UMOUNT_TIMEOUT_S = 120.0
# s3fs needs multipart_size (10 MiB) x parallel_count (16) of free disk beyond
# ensure_diskfree to start, plus some slack: its smallest honourable cache limit.
S3FS_MIN_CACHE_MB = 10 * 16 + 16
# Free space s3fs keeps on its (tmpfs) cache filesystem when the cache is limited.
S3FS_RESERVE_MB = 8


def _seconds(value: float | None, default: float) -> str:
    """A duration for rclone's flags ("60s")."""
    return f"{value if value is not None else default:g}s"


class LocalSystem(System):
    name = "local"
    remote = False

    @contextlib.contextmanager
    def mount(self, opts=None):
        files = [p for p in self.env.data_dir.rglob("*") if p.is_file()]
        method = drop_page_cache(files, level=3)
        left = resident_bytes(files[:200])
        yield Mounted(self.name, self.env.data_dir, remote=False,
                      info={"page_cache_drop": method, "resident_after_drop": left})


class RcloneSystem(System):
    name = "rclone"

    def check(self):
        if not shutil.which("rclone"):
            raise SystemUnavailable("rclone not installed")

    def command(self, mnt: Path, cache: Path, conf: Path, log: Path,
                opts: MountOptions) -> list[str]:
        # Tuned as a fair user would for a read-only training set over a WAN: full VFS
        # cache, big read chunks and read-ahead, more transfers, long metadata caching.
        # Writable (checkpoints): "--vfs-cache-mode writes", rclone's mode for writing
        # through a mount (a file is written to the cache, uploaded after close).
        return ["rclone", "mount", f"bench:{self.env.bucket}", str(mnt),
                "--config", str(conf), "--cache-dir", str(cache),
                "--vfs-cache-mode", "writes" if opts.writable else "full",
                "--vfs-cache-max-size", f"{opts.cache_mb}M",
                "--vfs-cache-poll-interval", "1s",    # default 1m never evicts in a short run
                "--vfs-read-chunk-size", "16M", "--vfs-read-chunk-size-limit", "off",
                "--vfs-read-ahead", "64M", "--buffer-size", "16M",
                "--transfers", "16", "--checkers", "16",
                "--dir-cache-time", _seconds(opts.metadata_ttl_s, 3600),
                "--attr-timeout", _seconds(opts.metadata_ttl_s, 60),
                "--max-read-ahead", "1M", *([] if opts.writable else ["--read-only"]),
                "--no-modtime", "--log-file", str(log), "--log-level", "NOTICE"]

    @contextlib.contextmanager
    def mount(self, opts=None):
        opts, base, mnt, cache = self._prepare(opts)
        conf = base / "rclone.conf"
        conf.write_text(
            "[bench]\ntype = s3\nprovider = Other\n"
            f"access_key_id = {self.env.access_key}\nsecret_access_key = {self.env.secret_key}\n"
            f"endpoint = {self.env.endpoint}\nregion = {self.env.region}\n"
            "force_path_style = true\n")
        conf.chmod(0o600)
        log = base / "rclone.log"
        env = dict(os.environ)
        env.pop("AWS_CA_BUNDLE", None)  # rclone 1.60 fails when it is set
        cmd = self.command(mnt, cache, conf, log, opts)
        with self._foreground_mount(cmd, mnt, log, lambda: _wipe(cache), env=env) as m:
            yield m


class S3fsSystem(System):
    name = "s3fs"

    def check(self):
        if not shutil.which("s3fs"):
            raise SystemUnavailable("s3fs not installed")

    @contextlib.contextmanager
    def mount(self, opts=None):
        opts, base, mnt, cache = self._prepare(opts)
        pw = base / "passwd"
        pw.write_text(f"{self.env.access_key}:{self.env.secret_key}\n")
        pw.chmod(0o600)
        log = base / "s3fs.log"
        # s3fs has no cache size limit, only ensure_diskfree (it cleans its cache when
        # free space on the cache's filesystem would fall below it).  To cap the cache
        # without depending on other writers of the shared disk, a limited cache lives on
        # its own tmpfs of limit + S3FS_RESERVE_MB with ensure_diskfree=S3FS_RESERVE_MB.
        # s3fs refuses to start unless free - ensure_diskfree >= multipart_size (10 MiB) x
        # parallel_count, so the smallest limit it can honour is S3FS_MIN_CACHE_MB.
        extra = []
        limit = None
        if opts.cache_mb < MountOptions.cache_mb:
            limit = max(opts.cache_mb, S3FS_MIN_CACHE_MB)
            r = subprocess.run(["mount", "-t", "tmpfs", "-o",
                                f"size={limit + S3FS_RESERVE_MB}m,mode=0700",
                                "bench-s3fs-cache", str(cache)], capture_output=True, text=True)
            if r.returncode != 0:
                raise SystemUnavailable(f"tmpfs for the s3fs cache: {r.stderr.strip()}")
            extra.append(f"ensure_diskfree={S3FS_RESERVE_MB}")
        o = ",".join(extra + [
            f"url={self.env.endpoint}", "use_path_request_style",
            f"passwd_file={pw}", f"use_cache={cache}", f"endpoint={self.env.region}",
            "parallel_count=16", "multireq_max=32", *([] if opts.writable else ["ro"]),
            f"stat_cache_expire={int(opts.metadata_ttl_s or 3600)}",
            "max_stat_cache_size=200000", "enable_noobj_cache",
            f"logfile={log}", "dbglevel=warn",
        ])
        cmd = ["s3fs", self.env.bucket, str(mnt), "-f", "-o", o]

        def cleanup():
            if limit is not None:
                subprocess.run(["umount", str(cache)], capture_output=True)
            _wipe(cache)
        with self._foreground_mount(cmd, mnt, log, cleanup, cache_limit_mb=limit) as m:
            yield m


def code_revision(path: Path | None = None) -> str | None:
    """``git describe``-like id of the checkout at ``path`` (+ "-dirty"), None outside git.

    NeuralCache is usually an editable install of this checkout, so the daemon a mount
    starts runs whatever the working tree holds at that moment: record it per mount.
    """
    path = path or Path(__file__).resolve().parents[2]
    try:
        head = subprocess.run(["git", "-C", str(path), "rev-parse", "--short", "HEAD"],
                              capture_output=True, text=True, timeout=10).stdout.strip()
        dirty = subprocess.run(["git", "-C", str(path), "status", "--porcelain",
                                "--untracked-files=no", "--", "neuralcache", "predictors"],
                               capture_output=True, text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None
    return (head + ("-dirty" if dirty else "")) or None


# The repository this bench belongs to (what the mounts' code_version reports).
REPO = Path(__file__).resolve().parents[2]


def neuralcache_binary() -> str | None:
    cand = Path(sys.executable).parent / "neuralcache"
    if cand.exists():
        return str(cand)
    return shutil.which("neuralcache")


class NeuralCacheSystem(System):
    """Driven only through the documented CLI (DEVELOPING.md)."""

    name = "neuralcache"

    def __init__(self, env: SystemEnv, prefetch: bool = True, hints: bool = False):
        super().__init__(env)
        self.prefetch = prefetch
        self.hints = hints
        if not prefetch:
            self.name = "neuralcache-noprefetch"
        elif hints:
            self.name = "neuralcache-hints"

    def check(self):
        if not neuralcache_binary():
            raise SystemUnavailable("neuralcache CLI not installed (no console script)")

    def _env(self) -> dict:
        env = dict(os.environ)
        # The daemon runs this bench's tree: the console script alone imports the
        # editable install's, so a bench run from a worktree measured main's code.
        env["PYTHONPATH"] = os.pathsep.join(
            [str(REPO)] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
        env.update({"AWS_ACCESS_KEY_ID": self.env.access_key,
                    "AWS_SECRET_ACCESS_KEY": self.env.secret_key,
                    "AWS_DEFAULT_REGION": self.env.region})
        return env

    def _stats(self, mnt: Path) -> dict | None:
        # The control file holds the same JSON as `neuralcache stats --json` (DEVELOPING.md)
        # and costs no interpreter start-up; the CLI is the fallback.
        try:
            return json.loads((mnt / ".neuralcache" / "stats.json").read_bytes())
        except (OSError, ValueError):
            pass
        r = subprocess.run([neuralcache_binary(), "stats", str(mnt), "--json"],
                           capture_output=True, text=True, timeout=30, env=self._env())
        if r.returncode != 0:
            return None
        return json.loads(r.stdout)

    @contextlib.contextmanager
    def mount(self, opts=None):
        opts, base, mnt, cache = self._prepare(opts)
        exe = neuralcache_binary()
        log = base / "mount.log"
        cmd = [exe, "mount", f"s3://{self.env.bucket}", str(mnt),
               "--endpoint-url", self.env.endpoint, "--region", self.env.region,
               "--cache-dir", str(cache), "--cache-size", f"{opts.cache_mb}M",
               "--memory-cache-size", f"{opts.memory_cache_mb}M"]
        if not self.prefetch:
            cmd += ["--readahead", "off", "--prefetch", "off"]
        if opts.writable:
            cmd += ["--writable"]
        if opts.metadata_ttl_s is not None:
            cmd += ["--metadata-ttl", str(opts.metadata_ttl_s)]
        t0 = time.monotonic()
        with open(log, "ab") as lf:
            try:
                r = subprocess.run(cmd, env=self._env(), stdout=lf, stderr=lf,
                                   timeout=MOUNT_TIMEOUT_S, start_new_session=True)
            except subprocess.TimeoutExpired:
                unmount(mnt)
                raise SystemUnavailable(f"neuralcache mount timed out; see {log}")
        if r.returncode != 0:
            tail = log.read_text(errors="replace").strip().splitlines()[-1:] or ["?"]
            unmount(mnt)
            raise SystemUnavailable(f"neuralcache mount exited {r.returncode}: {tail[0]}")
        try:
            _wait_mounted(mnt, None, log, timeout=10)
            yield Mounted(self.name, mnt, remote=True, stats_fn=lambda: self._stats(mnt),
                          sync_fn=(lambda: self._sync(mnt)) if opts.writable else None,
                          info={"mount_s": time.monotonic() - t0, "cmd": cmd,
                                "hints": self.hints, "writable": opts.writable,
                                "daemon_pids": find_pids(str(mnt), "neuralcache"),
                                "fuse_dev": _fuse_dev(mnt), "code": code_revision()})
        finally:
            # a writable mount's umount waits for pending uploads first (then the cache,
            # journal included, is wiped: a scenario syncs before it lets go)
            with contextlib.suppress(subprocess.TimeoutExpired):
                subprocess.run([exe, "umount", str(mnt)], env=self._env(),
                               capture_output=True, timeout=UMOUNT_TIMEOUT_S)
            unmount(mnt)
            _wipe(cache)

    def _sync(self, mnt: Path) -> None:
        """``neuralcache sync MNT``: returns once everything written is on the remote."""
        r = subprocess.run([neuralcache_binary(), "sync", str(mnt)], env=self._env(),
                           capture_output=True, text=True)
        if r.returncode != 0:
            raise RuntimeError(f"neuralcache sync exited {r.returncode}: "
                               f"{(r.stderr or r.stdout).strip()[-200:]}")

"""The systems a benchmark run compares, each mounted fresh with an empty cache.

* ``link``                    not a filesystem: the emulator's ceiling (see workloads.link_fetch)
* ``local``                   the same files on local disk, page cache dropped before cold runs
* ``neuralcache``             ``neuralcache mount`` with default settings (CLI only)
* ``neuralcache-noprefetch``  ``--readahead off --prefetch off``
* ``neuralcache-hints``  default settings, and the workload hands each epoch's order to
  the mount first (neuralcache.hints.publish_order, what HintingSampler does)
* ``rclone``                  ``rclone mount`` with ``--vfs-cache-mode full``, read-ahead on
* ``s3fs``                    ``s3fs`` with ``use_cache`` and a raised ``parallel_count``
* the peers (bench/systems/peers.py): ``s3torchconnector``, ``mosaic``, ``litdata`` and their
  ``-tuned`` rows -- not mounts but *client* systems: libraries the workload calls

Mounts are read-only unless a scenario asks ``MountOptions(writable=True)`` (the
checkpoint scenario): neuralcache ``--writable``, rclone ``--vfs-cache-mode writes``
without ``--read-only``, s3fs without ``ro``; ``Mounted.sync()`` is then the system's own
barrier (``neuralcache sync MNT``), where it has one.

Every remote system reaches SeaweedFS through the same WAN proxy.  ``System.open()`` is
a context manager yielding a ``Mounted``: for a mount (``kind == "mount"``) its ``root``
and ``stats()``, for a client (``kind == "client"``) no root but ``client``, the object
a scenario asks for its own version of each workload.  It always unmounts / stops its
processes on exit, even on error or Ctrl-C.
"""
from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterator

from bench.systems.cpu import find_pids

# How long a FUSE mount may take to appear (s3fs/rclone: ~1 s; neuralcache lists first).
MOUNT_TIMEOUT_S = 60.0
# After fusermount -u, how long a daemon may take to exit before SIGTERM/SIGKILL.
EXIT_GRACE_S = 10.0
# `neuralcache umount` (of a writable mount it waits for pending uploads first).
UMOUNT_TIMEOUT_S = 120.0
# s3fs needs multipart_size (10 MiB) x parallel_count (16) of free disk beyond
# ensure_diskfree to start, plus some slack: its smallest honourable cache limit.
S3FS_MIN_CACHE_MB = 10 * 16 + 16
# Free space s3fs keeps on its (tmpfs) cache filesystem when the cache is limited.
S3FS_RESERVE_MB = 8

MOUNT_SYSTEMS = ["link", "local", "neuralcache", "neuralcache-hints", "neuralcache-noprefetch",
                 "rclone", "s3fs"]
# The client systems (bench/systems/peers.py, kept in step by tests/bench/test_peers.py).
PEER_SYSTEMS = ["s3torchconnector", "s3torchconnector-tuned", "mosaic", "mosaic-tuned",
                "litdata", "litdata-tuned"]
ALL_SYSTEMS = MOUNT_SYSTEMS + PEER_SYSTEMS


class SystemUnavailable(RuntimeError):
    """The system cannot run here (binary missing, mount failed): an error row, not a crash."""


@dataclass
class Mounted:
    """An opened system: a mount (``root``) or a client (``client``, no root)."""

    name: str
    root: Path | None
    remote: bool
    stats_fn: Callable[[], dict | None] = lambda: None
    info: dict = field(default_factory=dict)  # mount time, command line, cache dir, ...
    kind: str = "mount"                       # "mount" | "client"
    client: object = None                     # the peer's workloads (kind "client")
    sync_fn: Callable[[], None] | None = None  # a writable mount's barrier (neuralcache sync)

    def daemon_pids(self) -> list[int]:
        """The processes serving this system (their CPU counts with the workload's)."""
        return list(self.info.get("daemon_pids") or ([self.info["pid"]]
                                                     if self.info.get("pid") else []))

    def stats(self) -> dict | None:
        try:
            return self.stats_fn()
        except Exception:  # stats are best effort; never fail a measurement on them
            return None

    def sync(self) -> bool:
        """Wait until everything written through this mount is on the remote, with the
        system's own barrier; False if it has none (then closing a file is all it
        offers).  Raises if the barrier fails."""
        if self.sync_fn is None:
            return False
        self.sync_fn()
        return True


@dataclass
class MountOptions:
    """What a scenario may ask of a mount (sizes in MiB)."""

    cache_mb: int = 10240          # disk cache limit
    memory_cache_mb: int = 1024    # neuralcache memory tier
    writable: bool = False         # writes on (neuralcache --writable, rclone
                                   # --vfs-cache-mode writes, s3fs rw); read-only otherwise


# -- helpers ---------------------------------------------------------------------------------
def drop_page_cache(files: list[Path] | None = None, level: int = 3) -> str:
    """Drop the kernel page cache; returns the method that worked.

    ``echo LEVEL > /proc/sys/vm/drop_caches`` (after sync) when permitted, else
    posix_fadvise(DONTNEED) on each of ``files``.  "none" if neither was possible.
    """
    os.sync()
    try:
        with open("/proc/sys/vm/drop_caches", "w") as f:
            f.write(f"{level}\n")
        return "drop_caches"
    except OSError:
        pass
    if not files:
        return "none"
    done = 0
    for p in files:
        try:
            fd = os.open(p, os.O_RDONLY)
        except OSError:
            continue
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            done += 1
        except OSError:
            pass
        finally:
            os.close(fd)
    return "fadvise" if done else "none"


def resident_bytes(files: list[Path]) -> int | None:
    """Bytes of ``files`` in the page cache (``fincore``), None if unknown."""
    if not files or not shutil.which("fincore"):
        return None
    try:
        out = subprocess.run(["fincore", "-b", "-n", "-r", "-o", "RES", *map(str, files)],
                             capture_output=True, text=True, timeout=30).stdout
        return sum(int(x) for x in out.split())
    except (OSError, ValueError, subprocess.SubprocessError):
        return None


def abort_mount(m: Mounted) -> None:
    """Make every pending request on a (hung) FUSE mount fail, so blocked readers return.

    Writes to the connection's ``abort`` file in fusectl; failing that, kills the
    daemon (its pid is known for rclone/s3fs; for neuralcache the process whose command
    line names this mountpoint).  A client system has no mount: its ``abort()`` stops
    its loader processes instead.
    """
    if m.kind == "client":
        m.client.abort()
        return
    dev = m.info.get("fuse_dev")
    conns = Path("/sys/fs/fuse/connections")
    if dev is not None:
        if conns.is_dir() and not any(conns.iterdir()):
            subprocess.run(["mount", "-t", "fusectl", "none", str(conns)], capture_output=True)
        f = conns / str(os.minor(dev)) / "abort"
        try:
            f.write_text("1")
            return
        except OSError:
            pass
    pids = [m.info["pid"]] if m.info.get("pid") else []
    if not pids and m.root is not None:
        pids = find_pids(str(m.root), "neuralcache")
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def _fuse_dev(mnt: Path) -> int | None:
    try:
        return os.stat(mnt).st_dev
    except OSError:
        return None


def _is_mount(path: Path) -> bool:
    try:
        return os.path.ismount(path)
    except OSError:  # a dead FUSE endpoint ("Transport endpoint is not connected")
        return True


def _wait_mounted(mnt: Path, proc: subprocess.Popen | None, log: Path | None,
                  timeout: float = MOUNT_TIMEOUT_S) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if _is_mount(mnt):
            return
        if proc is not None and proc.poll() is not None:
            tail = log.read_text(errors="replace")[-800:] if log and log.exists() else ""
            raise SystemUnavailable(f"mount process exited {proc.returncode}: {tail.strip()}")
        time.sleep(0.05)
    raise SystemUnavailable(f"{mnt} not mounted after {timeout:.0f} s")


def unmount(mnt: Path) -> None:
    """Unmount ``mnt`` (fusermount3 -u, fusermount -u, then lazy); quiet if not mounted."""
    for attempt in range(20):
        if not _is_mount(mnt):
            return
        for cmd in (["fusermount3", "-u", str(mnt)], ["fusermount", "-u", str(mnt)]):
            if shutil.which(cmd[0]) and subprocess.run(
                    cmd, capture_output=True).returncode == 0:
                return
        time.sleep(0.25)
    subprocess.run(["umount", "-l", str(mnt)], capture_output=True)


def _stop(proc: subprocess.Popen | None) -> None:
    if proc is None or proc.poll() is not None:
        return
    try:
        proc.wait(timeout=EXIT_GRACE_S)
        return
    except subprocess.TimeoutExpired:
        pass
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=5)
            return
        except subprocess.TimeoutExpired:
            continue


def _wipe(cache: Path) -> None:
    """Empty a cache dir after its mount is gone (the disk is shared; caches are GBs)."""
    if not _is_mount(cache):
        shutil.rmtree(cache, ignore_errors=True)


def _fresh_dir(path: Path) -> Path:
    if _is_mount(path):
        unmount(path)
    shutil.rmtree(path, ignore_errors=True)
    path.mkdir(parents=True)
    return path


# -- the systems -------------------------------------------------------------------------------
class System:
    name = "?"
    kind = "mount"       # "mount": a filesystem root; "client": a library (peers.py)
    hints = False        # the workload publishes each epoch's order to the mount
    remote = True

    def __init__(self, env: "SystemEnv"):
        self.env = env

    def check(self) -> None:
        """Raise SystemUnavailable when this system cannot run on this machine."""

    @contextlib.contextmanager
    def mount(self, opts: MountOptions | None = None) -> Iterator[Mounted]:
        raise NotImplementedError

    def open(self, opts: MountOptions | None = None):
        """The system ready for a workload, fresh with an empty cache (a context
        manager yielding ``Mounted``): the mount, for a filesystem."""
        return self.mount(opts)

    @contextlib.contextmanager
    def _foreground_mount(self, cmd: list[str], mnt: Path, log: Path,
                          cleanup: Callable[[], None], env: dict | None = None,
                          **info) -> Iterator[Mounted]:
        """Run a FUSE daemon that stays in the foreground (rclone, s3fs) until its mount
        appears; on the way out unmount, stop it, then ``cleanup()`` (its cache)."""
        t0 = time.monotonic()
        proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL,
                                stderr=open(log, "ab"), start_new_session=True)
        try:
            _wait_mounted(mnt, proc, log)
            yield Mounted(self.name, mnt, remote=True,
                          info={"mount_s": time.monotonic() - t0, "cmd": cmd,
                                "hints": self.hints,
                                "pid": proc.pid, "fuse_dev": _fuse_dev(mnt), **info})
        finally:
            unmount(mnt)
            _stop(proc)
            cleanup()


@dataclass
class SystemEnv:
    """What the systems need to know about the run (filled by the runner)."""

    work_dir: Path                 # scratch: mountpoints, cache dirs, configs, logs
    data_dir: Path                 # local copy of every dataset (the "local" root)
    bucket: str
    endpoint: str                  # S3 endpoint through the WAN proxy
    access_key: str
    secret_key: str
    region: str = "us-east-1"
    direct_endpoint: str | None = None   # SeaweedFS itself (peers' one-off conversions)


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
                "--dir-cache-time", "1h", "--attr-timeout", "60s",
                "--max-read-ahead", "1M", *([] if opts.writable else ["--read-only"]),
                "--no-modtime", "--log-file", str(log), "--log-level", "NOTICE"]

    @contextlib.contextmanager
    def mount(self, opts=None):
        opts = opts or MountOptions()
        self.check()
        base = self.env.work_dir / "rclone"
        mnt = _fresh_dir(base / "mnt")
        cache = _fresh_dir(base / "cache")
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
        opts = opts or MountOptions()
        self.check()
        base = self.env.work_dir / "s3fs"
        mnt = _fresh_dir(base / "mnt")
        cache = _fresh_dir(base / "cache")
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
            "stat_cache_expire=3600", "max_stat_cache_size=200000", "enable_noobj_cache",
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
        opts = opts or MountOptions()
        self.check()
        exe = neuralcache_binary()
        base = self.env.work_dir / self.name
        mnt = _fresh_dir(base / "mnt")
        cache = _fresh_dir(base / "cache")
        log = base / "mount.log"
        cmd = [exe, "mount", f"s3://{self.env.bucket}", str(mnt),
               "--endpoint-url", self.env.endpoint, "--region", self.env.region,
               "--cache-dir", str(cache), "--cache-size", f"{opts.cache_mb}M",
               "--memory-cache-size", f"{opts.memory_cache_mb}M"]
        if not self.prefetch:
            cmd += ["--readahead", "off", "--prefetch", "off"]
        if opts.writable:
            cmd += ["--writable"]
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


def make_system(name: str, env: SystemEnv) -> System:
    if name == "local":
        return LocalSystem(env)
    if name == "rclone":
        return RcloneSystem(env)
    if name == "s3fs":
        return S3fsSystem(env)
    if name == "neuralcache":
        return NeuralCacheSystem(env, prefetch=True)
    if name == "neuralcache-noprefetch":
        return NeuralCacheSystem(env, prefetch=False)
    if name == "neuralcache-hints":
        return NeuralCacheSystem(env, prefetch=True, hints=True)
    if name in PEER_SYSTEMS:
        from bench.systems.peers import make_peer
        return make_peer(name, env)
    raise KeyError(f"unknown system {name!r} (link is measured by the runner)")

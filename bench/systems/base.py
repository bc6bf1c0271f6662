"""The interface every system meets, and the FUSE mount plumbing the mounts share.

``System.open()`` is a context manager yielding a ``Mounted``: for a mount (``kind ==
"mount"``) its ``root`` and ``stats()``, for a client (``kind == "client"``, peers.py) no
root but ``client``, the object a scenario asks for its own version of each workload.
It always unmounts / stops its processes on exit, even on error or Ctrl-C.  What a
scenario may ask of a mount is ``MountOptions``; what the systems know of the run,
``SystemEnv``.  The systems themselves are in mounts.py and peers.py, by name in
registry.py.
"""
from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterator

from bench.systems.cpu import find_pids

# How long a FUSE mount may take to appear (s3fs/rclone: ~1 s; neuralcache lists first).
MOUNT_TIMEOUT_S = 60.0
# After fusermount -u, how long a daemon may take to exit before SIGTERM/SIGKILL.
EXIT_GRACE_S = 10.0


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
    metadata_ttl_s: float | None = None   # how long listings are trusted (neuralcache
                                   # --metadata-ttl, rclone --dir-cache-time and
                                   # --attr-timeout, s3fs stat_cache_expire); None: each
                                   # system's bench default (300 s, 1 h, 3600 s)


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

    def _prepare(self, opts: MountOptions | None) -> tuple[MountOptions, Path, Path, Path]:
        """Before a mount: ``check()``; then ``opts`` (default ``MountOptions()``), this
        system's work dir, and a fresh (empty, unmounted) mountpoint and cache dir in it."""
        opts = opts or MountOptions()
        self.check()
        base = self.env.work_dir / self.name
        return opts, base, _fresh_dir(base / "mnt"), _fresh_dir(base / "cache")

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

"""``neuralcache mount`` without ``--foreground``: the daemon forked off the CLI, and the
wait until it serves (or says why it cannot) on a pipe."""
from __future__ import annotations

import logging
import os
import sys
import time
from typing import Callable

from ..errors import UserError
from .config import MountConfig

# After a daemon reported an error, how long (from the start of `mount`, at least 1 s)
# to wait for it to exit.  Serving has no such bound: a writable mount first finishes
# the uploads an earlier run left in its journal.
MOUNT_WAIT_S = 600.0


def start_daemon(cfg: MountConfig, serve_here: Callable[[MountConfig, int], int]) -> int:
    """Fork the daemon and wait until it serves (or says why not).  A fork, not a new
    interpreter: this process has imported only the light CLI, so the child starts
    single-threaded and pays for the daemon's imports once (a re-exec paid for
    Python's start and the CLI again: 0.5 s of every mount)."""
    r, w = os.pipe()
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid == 0:
        _daemon_child(cfg, serve_here, r, w)        # never returns
    os.close(w)
    line = b""
    deadline = time.monotonic() + MOUNT_WAIT_S
    with os.fdopen(r, "rb") as pipe:
        line = pipe.readline()   # EOF if the child dies
    if line.startswith(b"READY"):
        print(f"neuralcache: mounted {cfg.source} on {os.path.abspath(cfg.mountpoint)}")
        return 0
    if line.startswith(b"ERROR "):
        _wait_child(pid, max(1.0, deadline - time.monotonic()))
        raise UserError(line[6:].decode(errors="replace").strip())
    rc = _wait_child(pid, None)
    log_file = cfg.log_file or os.path.join(cfg.cache_dir, "neuralcache.log")
    raise UserError(f"the daemon exited (status {rc}) before the mount was ready; "
                    f"see {log_file}")


def _daemon_child(cfg: MountConfig, serve_here, r: int, w: int) -> None:
    """The forked daemon: its own session, no terminal, no descriptor of the caller's
    but the ready pipe; exits with the mount's status."""
    rc = 1
    try:
        os.close(r)
        os.setsid()
        null = os.open(os.devnull, os.O_RDWR)
        for fd in (0, 1, 2):
            os.dup2(null, fd)
        os.closerange(3, w)
        os.closerange(w + 1, os.sysconf("SC_OPEN_MAX"))
        rc = serve_here(cfg, w)
    except BaseException:   # reported through the pipe and the log by serve_here
        rc = 1
    finally:
        logging.shutdown()  # the log's last lines; then no parent code runs here again
        os._exit(rc)


def _wait_child(pid: int, timeout: float | None) -> int | None:
    """The daemon's exit status once it exits; None if it still runs after timeout."""
    deadline = None if timeout is None else time.monotonic() + timeout
    while True:
        done, status = os.waitpid(pid, 0 if deadline is None else os.WNOHANG)
        if done:
            return os.waitstatus_to_exitcode(status)
        if time.monotonic() > deadline:
            return None
        time.sleep(0.05)

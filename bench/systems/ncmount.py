"""The ``neuralcache`` CLI as the standalone bench scripts (soak, seqread) drive it.

    with mounted("s3://bucket", mnt, "--endpoint-url", url, env=env) as mnt:
        pid = stats(mnt)["pid"]

``python -m neuralcache`` of this interpreter (so a checkout's working tree is what
runs), only through its documented CLI and control directory (DEVELOPING.md).  A failing
command ends the script with its one-line error (SystemExit), as a user would see it.
The runner's systems (bench/systems/) have their own mount with error rows instead.
"""
from __future__ import annotations

import contextlib
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Iterator

CLI_TIMEOUT_S = 600


def nc(*args, env: dict) -> str:
    """Run ``neuralcache ARGS``; its stdout, or SystemExit with its stderr."""
    r = subprocess.run([sys.executable, "-m", "neuralcache", *map(str, args)], env=env,
                       capture_output=True, text=True, timeout=CLI_TIMEOUT_S)
    if r.returncode != 0:
        raise SystemExit(f"neuralcache {args[0]} failed: {r.stderr.strip()}")
    return r.stdout


@contextlib.contextmanager
def mounted(source: str, mnt: Path, *args, env: dict,
            timings: dict | None = None) -> Iterator[Path]:
    """``neuralcache mount SOURCE MNT ARGS`` (it returns once the mount serves); always
    ``neuralcache umount MNT`` on the way out, its seconds in ``timings["umount_s"]``
    (it waits for the daemon to exit: the write-back to the disk cache included)."""
    mnt.mkdir(parents=True, exist_ok=True)
    nc("mount", source, mnt, *args, env=env)
    try:
        yield mnt
    finally:
        t0 = time.monotonic()
        nc("umount", mnt, env=env)
        if timings is not None:
            timings["umount_s"] = time.monotonic() - t0


def stats(mnt: Path) -> dict:
    """The mount's live counters (``MNT/.neuralcache/stats.json``)."""
    return json.loads((mnt / ".neuralcache" / "stats.json").read_text())

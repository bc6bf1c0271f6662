"""A slow disk on demand: every write of this process and its children to the disk
holding a path, throttled with cgroup v1 ``blkio.throttle.write_bps_device`` (root).

    with throttled_writes(cache_dir, 100_000_000):
        ...   # mounts started here write their disk cache at 100 MB/s at most

What the disk tier does when the disk is slower than the link (skipped and late writes,
the write-back at unmount) shows only on such a disk; this VM's is faster than its link.
A machine without the v1 blkio hierarchy (cgroup v2 only) gets a one-line SystemExit.
"""
from __future__ import annotations

import contextlib
import os
from pathlib import Path
from typing import Iterator

BLKIO = Path("/sys/fs/cgroup/blkio")
GROUP = "neuralcache-bench-slowdisk"


def _disk_of(path: str | os.PathLike) -> str:
    """``MAJ:MIN`` of the whole disk holding ``path`` (a partition's parent disk: blkio
    throttles whole disks)."""
    dev = os.stat(path).st_dev
    node = Path(f"/sys/dev/block/{os.major(dev)}:{os.minor(dev)}")
    if (node / "partition").exists():
        return (node.resolve().parent / "dev").read_text().strip()
    return f"{os.major(dev)}:{os.minor(dev)}"


@contextlib.contextmanager
def throttled_writes(path: str | os.PathLike, bps: int) -> Iterator[str]:
    """Throttle writes to ``path``'s disk to ``bps`` bytes/s for this process and the
    processes it starts meanwhile; yields a one-line description."""
    if not (BLKIO / "cgroup.procs").exists():
        raise SystemExit("--throttle-writes needs the cgroup v1 blkio hierarchy at "
                         f"{BLKIO} (and root); this machine has none")
    disk = _disk_of(path)
    group = BLKIO / GROUP
    group.mkdir(exist_ok=True)
    rule = group / "blkio.throttle.write_bps_device"
    rule.write_text(f"{disk} {bps}\n")
    (group / "cgroup.procs").write_text(f"{os.getpid()}\n")
    try:
        yield f"writes to disk {disk} throttled to {bps / 1e6:.0f} MB/s (cgroup v1 blkio)"
    finally:
        (BLKIO / "cgroup.procs").write_text(f"{os.getpid()}\n")
        rule.write_text(f"{disk} 0\n")

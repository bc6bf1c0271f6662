"""What is mounted where (from /proc/self/mountinfo), for the CLI's checks."""
from __future__ import annotations

import os
import re
from dataclasses import dataclass

FSTYPE = "fuse.neuralcache"


@dataclass
class MountEntry:
    mountpoint: str
    fstype: str
    source: str


def _unescape(s: str) -> str:
    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), s)


def mount_table() -> list[MountEntry]:
    out = []
    try:
        with open("/proc/self/mountinfo") as f:
            for line in f:
                left, _, right = line.partition(" - ")
                parts = left.split()
                rparts = right.split()
                if len(parts) < 5 or len(rparts) < 2:
                    continue
                out.append(MountEntry(_unescape(parts[4]), rparts[0], _unescape(rparts[1])))
    except OSError:
        pass
    return out


def find_mount(path: str) -> MountEntry | None:
    real = os.path.abspath(path)
    for e in reversed(mount_table()):      # the last one mounted on a path is on top
        if e.mountpoint == real:
            return e
    return None

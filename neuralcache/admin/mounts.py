"""What is mounted where (from /proc/self/mountinfo), for the CLI's checks."""
from __future__ import annotations

import os
import re
from dataclasses import dataclass

FSTYPE = "fuse.neuralcache"
# The control directory at a mount's root (neuralcache/fs/control.py serves it); named
# here so that the CLI reaches it without importing the FUSE side (pyfuse3, trio).
CONTROL_DIR = ".neuralcache"


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


def query_files(mountpoint: str, what: str, paths: list[str]) -> list[str]:
    """Ask a mount about files through its control directory's ``query`` file
    (fs/control.py QueryHandle): ``what`` is "cached" (bytes held by the caches) or
    "version"; one answer per path ("-": not a file), MAX_QUERY_LINES at a time."""
    from ..fs.control import DIRNAME, MAX_QUERY_LINES

    out: list[str] = []
    qfile = os.path.join(mountpoint, DIRNAME, "query")
    for i in range(0, len(paths), MAX_QUERY_LINES):
        part = paths[i:i + MAX_QUERY_LINES]
        with open(qfile, "r+b", buffering=0) as f:
            f.write("".join(f"{what} {p}\n" for p in part).encode("utf-8", "surrogateescape"))
            f.seek(0)
            answer = b""
            while chunk := f.read(1 << 20):
                answer += chunk
        got = answer.decode("utf-8", "surrogateescape").splitlines()
        if len(got) != len(part):
            raise OSError(f"{qfile}: {len(got)} answers to {len(part)} questions")
        out += got
    return out

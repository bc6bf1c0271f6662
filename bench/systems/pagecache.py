"""The kernel page cache: drop it before a cold read, and ask what is still in it."""
from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path


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


def dirty_kb() -> int | None:
    """Dirty page-cache memory waiting for writeback, in kB (/proc/meminfo; None if
    unknown)."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("Dirty:"):
                    return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        pass
    return None


def read_into_cache(root: Path, chunk: int = 8 << 20) -> int:
    """Read every file under ``root`` once (into the page cache); returns the bytes read."""
    n = 0
    buf = bytearray(chunk)
    for p in sorted(root.rglob("*")):
        try:
            if not p.is_file():
                continue
            with open(p, "rb", buffering=0) as f:
                while k := f.readinto(buf):
                    n += k
        except OSError:
            continue
    return n


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

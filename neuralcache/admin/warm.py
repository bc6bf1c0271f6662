"""`neuralcache warm`: fetch files into a mount's cache ahead of a job.

Files are read through the mount (so the daemon caches them exactly as a job would)
by ``--jobs`` threads, with the kernel page cache released behind each file so warming
a large dataset does not evict the node's memory.  Progress is a bar with bytes, rate
and ETA on a terminal, one line every few seconds otherwise.  Ctrl-C stops at once;
the cache stays consistent (every block is written atomically).  ``--check`` asks
the mount's ``query`` control file instead and reports what is already cached.
"""
from __future__ import annotations

import os
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor

from ..fs import control
from ..errors import UserError
from .mounts import query_files
from .sizes import format_size

# Files read at once: enough to keep ~16 round trips in flight for small files while
# the daemon's own read-ahead covers large ones.
DEFAULT_JOBS = 16
CHUNK = 1 << 20
# How often a non-terminal progress line is printed.
LOG_EVERY_S = 5.0


def collect(mountpoint: str, paths: list[str], list_file: str | None) -> list[tuple[str, int]]:
    """(absolute path, size) of every file under ``paths`` (default: the whole mount)."""
    root = os.path.abspath(mountpoint)
    items: list[str] = list(paths)
    if list_file:
        try:
            src = sys.stdin if list_file == "-" else open(list_file, encoding="utf-8")
        except OSError as exc:
            raise UserError(f"cannot read --from-file {list_file}: "
                            f"{exc.strerror or exc}") from None
        with src:
            items += [ln.strip() for ln in src if ln.strip() and not ln.startswith("#")]
    if not items:
        items = [root]
    out: list[tuple[str, int]] = []
    for item in items:
        p = item if os.path.isabs(item) else os.path.join(root, item)
        p = os.path.abspath(p)
        if p != root and not p.startswith(root + os.sep):
            raise UserError(f"{item} is not inside the mount {root}")
        if os.path.isdir(p):
            for dirpath, dirnames, filenames in os.walk(p):
                dirnames[:] = [d for d in dirnames if d != control.DIRNAME]
                dirnames.sort()
                for f in sorted(filenames):
                    fp = os.path.join(dirpath, f)
                    out.append((fp, os.stat(fp).st_size))
        elif os.path.isfile(p):
            out.append((p, os.stat(p).st_size))
        else:
            raise UserError(f"{item}: no such file or directory in the mount")
    return out


class Progress:
    def __init__(self, total_bytes: int, total_files: int, stream=sys.stderr):
        self.total, self.files = total_bytes, total_files
        self.done = self.done_files = 0
        self.t0 = time.monotonic()
        self.stream = stream
        self.tty = stream.isatty()
        self._last = 0.0
        self._lock = threading.Lock()

    def add(self, nbytes: int, file_done: bool = False) -> None:
        with self._lock:
            self.done += nbytes
            self.done_files += file_done
            now = time.monotonic()
            if (self.tty and now - self._last >= 0.1) or now - self._last >= LOG_EVERY_S:
                self._last = now
                self.show()

    def line(self) -> str:
        el = max(time.monotonic() - self.t0, 1e-6)
        rate = self.done / el
        eta = (self.total - self.done) / rate if rate > 0 else float("inf")
        pct = self.done / self.total if self.total else 1.0
        eta_s = f"{eta:5.0f}s" if eta != float("inf") else "    ?"
        return (f"{format_size(self.done):>7} / {format_size(self.total)} "
                f"({pct:4.0%}) {self.done_files}/{self.files} files  "
                f"{format_size(rate)}/s  ETA {eta_s}")

    def show(self, final: bool = False) -> None:
        if self.tty:
            width = 24
            pct = self.done / self.total if self.total else 1.0
            bar = "#" * int(pct * width) + "-" * (width - int(pct * width))
            self.stream.write(f"\r[{bar}] {self.line()}" + ("\n" if final else ""))
        else:
            self.stream.write(self.line() + "\n")
        self.stream.flush()


def _read_one(path: str, progress: Progress, stop: threading.Event) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        off = 0
        while not stop.is_set():
            b = os.read(fd, CHUNK)
            if not b:
                break
            off += len(b)
            progress.add(len(b))
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        except OSError:
            pass
    finally:
        os.close(fd)
    progress.add(0, file_done=True)


def cached_bytes(mountpoint: str, paths: list[str]) -> list[int]:
    """Bytes of each file (absolute paths inside the mount) held by the caches."""
    root = os.path.abspath(mountpoint)
    got = query_files(root, "cached", [os.path.relpath(p, root) for p in paths])
    return [int(x) if x.isdigit() else 0 for x in got]


def warm(mountpoint: str, paths: list[str], list_file: str | None, jobs: int,
         check: bool) -> int:
    files = collect(mountpoint, paths, list_file)
    total = sum(s for _, s in files)
    if check:
        cached = cached_bytes(mountpoint, [p for p, _ in files])
        have = sum(min(c, s) for c, (_, s) in zip(cached, files))
        full = sum(1 for c, (_, s) in zip(cached, files) if c >= s)
        pct = have / total if total else 1.0
        print(f"{format_size(have)} of {format_size(total)} cached ({pct:.1%}); "
              f"{full} of {len(files)} files complete")
        return 0
    progress = Progress(total, len(files))
    stop = threading.Event()
    errors: list[str] = []
    pool = ThreadPoolExecutor(max(1, jobs), thread_name_prefix="warm")
    futures = [pool.submit(_read_one, p, progress, stop) for p, _ in files]
    try:
        for f, (p, _) in zip(futures, files):
            try:
                f.result()
            except OSError as exc:
                errors.append(f"{p}: {exc.strerror}")
    except KeyboardInterrupt:
        stop.set()
        for f in futures:
            f.cancel()
        pool.shutdown(wait=True)
        progress.show(final=True)
        print("warm: interrupted; what was fetched stays cached", file=sys.stderr)
        return 130
    pool.shutdown(wait=True)
    progress.show(final=True)
    for e in errors[:10]:
        print(f"warm: {e}", file=sys.stderr)
    if errors:
        print(f"warm: {len(errors)} files failed", file=sys.stderr)
        return 1
    return 0

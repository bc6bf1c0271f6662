"""Python API for sampler hints: tell a NeuralCache mount the order a job will read.

    from neuralcache.hints import publish_order
    publish_order("/mnt/imagenet", ["train/n01/img1.jpg", "train/n07/img9.jpg", ...])

Paths may be absolute (inside the mount) or relative to the mount root.  The mount
checks every path's form as it arrives and either takes the whole list or refuses it
with EINVAL, changing nothing; this function raises HintError then.  Paths are not
checked against the listing (a mount lists directories as they are used): one that
names nothing is skipped when its turn comes.
No FUSE, no trio: a job imports it without the daemon's dependencies.
"""
from __future__ import annotations

import errno
import os
from typing import Iterable

CONTROL_DIR = ".neuralcache"


class HintError(ValueError):
    """The mount refused the hints (a path is not a file in the mount), or the path
    is not a NeuralCache mount."""


def find_mount_root(path: str) -> str | None:
    """The NeuralCache mount containing ``path`` (the directory that has the control
    directory), or None."""
    p = os.path.abspath(path)
    while True:
        if os.path.isdir(os.path.join(p, CONTROL_DIR)):
            return p
        parent = os.path.dirname(p)
        if parent == p:
            return None
        p = parent


def _relative(root: str, path: str) -> str:
    if os.path.isabs(path):
        rel = os.path.relpath(path, root)
        if rel == os.pardir or rel.startswith(os.pardir + os.sep):
            raise HintError(f"{path} is not inside the mount {root}")
        return rel
    return path


def publish_order(mountpoint: str, paths: Iterable[str]) -> int:
    """Hand the upcoming read order to the mount; returns how many paths were sent."""
    root = find_mount_root(mountpoint)
    if root is None:
        raise HintError(f"{mountpoint} is not inside a NeuralCache mount")
    lines = [p if isinstance(p, str) else os.fspath(p) for p in paths]
    if any(p.startswith("/") for p in lines):      # absolute paths: make them relative
        lines = [_relative(root, p) for p in lines]
    text = "\n".join(lines)
    if "\x00" in text or len(lines) and text.count("\n") != len(lines) - 1:
        bad = next(p for p in lines if "\n" in p or "\x00" in p)
        raise HintError(f"path {bad!r} contains a newline or NUL")
    data = (text + "\n").encode("utf-8", "surrogateescape") if lines else b""
    try:
        with open(os.path.join(root, CONTROL_DIR, "hints"), "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())   # installed when this returns (close() may not wait)
    except OSError as exc:
        if exc.errno == errno.EINVAL:
            raise HintError("the mount refused the hints: every path must be relative to "
                            "the mount, without empty, '.' or '..' parts (the daemon log "
                            "names the first bad one)") from None
        raise
    return len(lines)


def clear(mountpoint: str) -> None:
    """Forget the hinted order (prediction from the access pattern takes over)."""
    publish_order(mountpoint, [])

"""Access events and the JSON Lines access-trace format (see DEVELOPING.md).

One event per line, keys exactly ``t, op, path, off, len, pid, size``::

    {"t": 12.345678, "op": "open", "path": "train/00017.tar", "off": 0, "len": 0, "pid": 4242, "size": 8388608}

``t`` is seconds (monotonic, from mount), ``path`` is relative to the mount root and
``size`` the object size. This module owns the parser and the writer.
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import IO, Iterable, Iterator

OPS = ("open", "read")
KEYS = ("t", "op", "path", "off", "len", "pid", "size")


@dataclass(frozen=True, slots=True)
class Event:
    t: float    # seconds, monotonic from mount
    op: str     # "open" | "read"
    path: str   # relative to the mount root
    off: int    # byte offset of a read (0 for open)
    len: int    # bytes read (0 for open)
    pid: int    # pid of the reader (FUSE request context)
    size: int   # object size in bytes


def _check_int(d: dict, key: str) -> int:
    v = d[key]
    if isinstance(v, bool) or not isinstance(v, int):
        raise ValueError(f"{key!r} must be an integer, got {v!r}")
    if v < 0:
        raise ValueError(f"{key!r} must be >= 0, got {v}")
    return v


def event_from_dict(d: object) -> Event:
    """Validate one decoded JSON object and build an Event (ValueError if malformed)."""
    if not isinstance(d, dict):
        raise ValueError("event must be a JSON object")
    missing = [k for k in KEYS if k not in d]
    if missing:
        raise ValueError(f"missing keys {missing}")
    extra = sorted(set(d) - set(KEYS))
    if extra:
        raise ValueError(f"unknown keys {extra}")
    t = d["t"]
    if isinstance(t, bool) or not isinstance(t, (int, float)) or not math.isfinite(t):
        raise ValueError(f"'t' must be a finite number, got {t!r}")
    op = d["op"]
    if op not in OPS:
        raise ValueError(f"'op' must be one of {OPS}, got {op!r}")
    path = d["path"]
    if not isinstance(path, str) or not path or "\0" in path:
        raise ValueError(f"'path' must be a non-empty string without NUL, got {path!r}")
    return Event(float(t), op, path, _check_int(d, "off"), _check_int(d, "len"),
                 _check_int(d, "pid"), _check_int(d, "size"))


def parse_line(line: str, lineno: int = 0) -> Event:
    """Parse one JSONL line; ValueError names the line number."""
    try:
        return event_from_dict(json.loads(line))
    except (ValueError, TypeError) as e:  # json.JSONDecodeError is a ValueError
        raise ValueError(f"trace line {lineno}: {e}") from None


def iter_events(lines: Iterable[str]) -> Iterator[Event]:
    """Parse JSON Lines; blank lines are skipped, anything else malformed raises."""
    for lineno, line in enumerate(lines, 1):
        if line.strip():
            yield parse_line(line, lineno)


def read_jsonl(path_or_file: str | IO[str]) -> list[Event]:
    if isinstance(path_or_file, str):
        with open(path_or_file, encoding="utf-8") as f:
            return list(iter_events(f))
    return list(iter_events(path_or_file))


def dumps(ev: Event) -> str:
    """One event as one JSON line (no trailing newline), keys in the documented order."""
    return json.dumps({"t": ev.t, "op": ev.op, "path": ev.path, "off": ev.off,
                       "len": ev.len, "pid": ev.pid, "size": ev.size}, ensure_ascii=False)


def write_jsonl(events: Iterable[Event], path_or_file: str | IO[str]) -> None:
    if isinstance(path_or_file, str):
        with open(path_or_file, "w", encoding="utf-8") as f:
            write_jsonl(events, f)
        return
    for ev in events:
        path_or_file.write(dumps(ev) + "\n")

"""Human size strings: ``512M``, ``20G``, ``1.5GiB``, ``4096`` (bytes).  Binary units."""
from __future__ import annotations

import re

from ..errors import UserError

_UNITS = {"": 1, "B": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}
_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([KMGT]?)(?:I?B)?\s*$", re.IGNORECASE)


def parse_size(text: str | int, what: str = "size") -> int:
    """Bytes in ``text``; raises UserError naming ``what`` on a bad string."""
    if isinstance(text, int):
        if text < 0:
            raise UserError(f"bad {what} {text!r}: must not be negative")
        return text
    m = _RE.match(str(text))
    if not m:
        raise UserError(f"bad {what} {text!r}: use a number with an optional unit, "
                        "e.g. 512M, 20G, 1.5T")
    value = float(m.group(1)) * _UNITS[m.group(2).upper()]
    return int(value)


def format_size(n: float) -> str:
    """``1536`` -> ``1.5K``; for messages and tables."""
    for unit in ("", "K", "M", "G", "T"):
        if abs(n) < 1024 or unit == "T":
            return f"{n:.0f}{unit}" if unit == "" else f"{n:.1f}{unit}"
        n /= 1024
    return f"{n:.1f}T"

"""Mount options: one table (``OPTIONS``) that the command line, ``-o key=value`` and
(later) config files all read, so every tunable is defined and documented once."""
from __future__ import annotations

import os
from dataclasses import dataclass, field, fields

from .blocks import DEFAULT_BLOCK_SIZE, DEFAULT_CONCURRENCY
from .errors import UserError
from .readahead import DEFAULT_MAX_BYTES
from .sizes import parse_size


def default_cache_dir() -> str:
    """/var/cache/neuralcache for root (the FHS place for a service's cache), else
    $XDG_CACHE_HOME/neuralcache or ~/.cache/neuralcache."""
    if os.geteuid() == 0:
        return "/var/cache/neuralcache"
    base = os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache")
    return os.path.join(base, "neuralcache")


@dataclass
class MountConfig:
    source: str = ""
    mountpoint: str = ""
    endpoint_url: str | None = None
    region: str | None = None
    cache_dir: str = field(default_factory=default_cache_dir)
    # Disk tier: 20 GiB fits ImageNet-scale shards of one job on a typical NVMe scratch.
    cache_size: int = 20 << 30
    # Memory tier: 1 GiB = 128 blocks of 8 MiB, enough for 8 sequential streams with
    # a full read-ahead window each, small next to a GPU node's RAM.
    memory_cache_size: int = 1 << 30
    # Metadata TTL: datasets are written once and read for days; 300 s bounds how long
    # a replaced object stays invisible while keeping re-listing rare.
    metadata_ttl: float = 300.0
    block_size: int = DEFAULT_BLOCK_SIZE
    concurrency: int = DEFAULT_CONCURRENCY
    readahead: bool = True
    readahead_size: int = DEFAULT_MAX_BYTES
    prefetch: bool = True
    allow_other: bool = False
    foreground: bool = False
    log_file: str | None = None
    debug: bool = False


# name -> (parser, help).  Flags are --name-with-dashes; -o uses name_with_underscores
# or dashes.  Booleans accept on/off/true/false/yes/no/1/0.
def _bool(v: str | bool) -> bool:
    if isinstance(v, bool):
        return v
    t = str(v).strip().lower()
    if t in ("1", "on", "true", "yes", ""):
        return True
    if t in ("0", "off", "false", "no"):
        return False
    raise UserError(f"bad on/off value {v!r}: use on or off")


def _positive_float(name):
    def parse(v):
        try:
            x = float(v)
        except ValueError:
            raise UserError(f"bad {name} {v!r}: expected a number of seconds") from None
        if x < 0:
            raise UserError(f"bad {name} {v!r}: must not be negative")
        return x
    return parse


def _positive_int(name):
    def parse(v):
        try:
            x = int(v)
        except ValueError:
            raise UserError(f"bad {name} {v!r}: expected a whole number") from None
        if x < 1:
            raise UserError(f"bad {name} {v!r}: must be at least 1")
        return x
    return parse


OPTIONS: dict[str, tuple] = {
    "endpoint_url": (str, "S3 endpoint URL for S3-compatible stores (default: AWS, or "
                          "$AWS_ENDPOINT_URL)"),
    "region": (str, "S3 region (default: from the AWS config, else us-east-1)"),
    "cache_dir": (os.path.expanduser, "directory of the persistent disk cache "
                                      "(default: /var/cache/neuralcache as root, else "
                                      "~/.cache/neuralcache)"),
    "cache_size": (lambda v: parse_size(v, "cache size"),
                   "disk cache limit, e.g. 20G (default 20G)"),
    "memory_cache_size": (lambda v: parse_size(v, "memory cache size"),
                          "memory cache limit, e.g. 1G (default 1G)"),
    "metadata_ttl": (_positive_float("metadata TTL"),
                     "seconds the listing is trusted before entries are revalidated "
                     "(default 300)"),
    "block_size": (lambda v: parse_size(v, "block size"),
                   "ranged GET and cache block size (default 8M)"),
    "concurrency": (_positive_int("concurrency"),
                    "backend requests in flight (default 32)"),
    "readahead": (_bool, "sequential read-ahead within files: on|off (default on)"),
    "readahead_size": (lambda v: parse_size(v, "read-ahead size"),
                       "largest read-ahead window per open file (default 64M)"),
    "prefetch": (_bool, "cross-file prefetch from predictions and hints: on|off "
                        "(default on)"),
    "allow_other": (_bool, "let other users access the mount (needs user_allow_other "
                           "in /etc/fuse.conf for non-root)"),
    "log_file": (os.path.expanduser, "daemon log file when in the background (default "
                                     "CACHE_DIR/neuralcache.log)"),
    "debug": (_bool, "debug logging"),
}


def parse_o_options(text: str) -> dict[str, object]:
    """``-o cache_size=10G,readahead=off,allow_other`` -> parsed values.

    mount(8) options that are not ours (rw, ro, _netdev, nofail, noauto, user, ...)
    are accepted and ignored so fstab lines work."""
    out: dict[str, object] = {}
    ignored = {"rw", "ro", "_netdev", "nofail", "noauto", "auto", "user", "users",
               "nouser", "defaults", "noexec", "exec", "nosuid", "suid", "nodev", "dev",
               "noatime", "relatime", "x-systemd.automount"}
    for item in filter(None, (s.strip() for s in text.split(","))):
        key, eq, value = item.partition("=")
        key = key.strip()
        if key in ignored or key.startswith("x-") or key.startswith("comment="):
            continue
        key = key.replace("-", "_")
        if key not in OPTIONS:
            raise UserError(f"unknown mount option {key!r}; see neuralcache mount --help")
        parser = OPTIONS[key][0]
        if not eq:
            if parser is not _bool:
                raise UserError(f"mount option {key} needs a value: -o {key}=VALUE")
            out[key] = True
        else:
            out[key] = parser(value)
    return out


def known_fields() -> set[str]:
    return {f.name for f in fields(MountConfig)}

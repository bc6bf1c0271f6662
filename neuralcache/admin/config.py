"""Mount options: one table (``OPTIONS``) that the command line, ``-o key=value`` and
(later) config files all read, so every tunable is defined and documented once."""
from __future__ import annotations

import os
from dataclasses import dataclass, field, fields

from ..store.blocks import DEFAULT_BLOCK_SIZE, DEFAULT_CONCURRENCY
from ..errors import UserError
from ..ahead.readahead import DEFAULT_MAX_BYTES
from ..meta.rows import DEFAULT_CACHE_BYTES
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
    # Metadata memory: SQLite's page cache over the table of listed entries
    # (meta/rows.py DEFAULT_CACHE_BYTES says why 32 MiB); the table itself is on disk
    # under --cache-dir (~135 bytes per listed entry).
    metadata_cache_size: int = DEFAULT_CACHE_BYTES
    # A listing brought by the user (meta/manifest.py): names come from it, never
    # from listing the source; entries never expire unless --metadata-ttl says so.
    manifest: str | None = None
    block_size: int = DEFAULT_BLOCK_SIZE
    concurrency: int = DEFAULT_CONCURRENCY
    readahead: bool = True
    readahead_size: int = DEFAULT_MAX_BYTES
    prefetch: bool = True
    allow_other: bool = False
    foreground: bool = False
    log_file: str | None = None
    debug: bool = False
    profile: str | None = None
    # Prometheus endpoint: off unless a port is given; loopback unless told otherwise
    # (metrics reveal dataset names and sizes).
    metrics_port: int | None = None
    metrics_addr: str = "127.0.0.1"
    # Writes (issue 12): off, so that a training-data mount cannot be damaged by
    # accident; a checkpoint mount asks for them.
    writable: bool = False
    # close() returns once the data is in the local journal (fsynced); --sync-close
    # makes it wait for the remote too, at the cost of the upload time per close.
    sync_close: bool = False
    # Shared tier (store/shared.py, docs/many-nodes.md): off unless a bucket is given;
    # endpoint, region and profile default to the AWS chain like the origin's (not to
    # the origin's own options: the shared bucket is in-region, the origin is not).
    shared_cache: str | None = None
    shared_cache_endpoint: str | None = None
    shared_cache_region: str | None = None
    shared_cache_profile: str | None = None
    # Leases on concurrent misses: on (N nodes missing one block cost ~1 origin fetch);
    # off only to measure what they save.
    shared_cache_leases: bool = True


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


def _number(name: str, kind: type, minimum: float, unit: str):
    """Parser for a number option: ``kind`` (int or float), at least ``minimum``."""
    def parse(v):
        try:
            x = kind(v)
        except ValueError:
            raise UserError(f"bad {name} {v!r}: expected {unit}") from None
        if x < minimum:
            raise UserError(f"bad {name} {v!r}: must "
                            + ("not be negative" if minimum == 0 else f"be at least {minimum}"))
        return x
    return parse


def _port(v):
    try:
        x = int(v)
    except ValueError:
        raise UserError(f"bad port {v!r}: expected a number 1-65535") from None
    if not 0 < x < 65536:
        raise UserError(f"bad port {v!r}: expected a number 1-65535")
    return x


def _shared_url(v: str) -> str:
    from ..store.shared import parse_shared_url

    parse_shared_url(v)      # one-line UserError if malformed
    return v


OPTIONS: dict[str, tuple] = {
    "endpoint_url": (str, "S3 endpoint URL for S3-compatible stores (default: AWS, or "
                          "$AWS_ENDPOINT_URL)"),
    "region": (str, "S3 region of the bucket (default: the one the bucket reports at "
                    "mount, else the AWS config's, else us-east-1; if given, it must "
                    "match what the bucket reports)"),
    "profile": (str, "AWS profile from ~/.aws/config (default: $AWS_PROFILE or the "
                     "default chain)"),
    "cache_dir": (os.path.expanduser, "directory of the persistent disk cache "
                                      "(default: /var/cache/neuralcache as root, else "
                                      "~/.cache/neuralcache)"),
    "cache_size": (lambda v: parse_size(v, "cache size"),
                   "disk cache limit, e.g. 20G (default 20G)"),
    "memory_cache_size": (lambda v: parse_size(v, "memory cache size"),
                          "memory cache limit, e.g. 1G (default 1G)"),
    "metadata_ttl": (_number("metadata TTL", float, 0, "a number of seconds"),
                     "seconds a directory's listing is trusted; then it is listed "
                     "again in the background while the old entries serve, and a file "
                     "opened is checked (one HEAD); also the kernel's entry and "
                     "attribute timeout (default 300; 0: entries never expire)"),
    "metadata_cache_size": (lambda v: parse_size(v, "metadata cache size"),
                            "memory for the metadata of listed directories (their "
                            "entries live in a table under --cache-dir, ~135 bytes each "
                            "on disk), e.g. 64M (default 32M)"),
    "manifest": (os.path.expanduser, "serve names from this manifest file (written by "
                                     "`neuralcache manifest export`) instead of listing "
                                     "the source; read-only, entries never expire unless "
                                     "--metadata-ttl is given"),
    "block_size": (lambda v: parse_size(v, "block size"),
                   "ranged GET and cache block size (default 8M)"),
    "concurrency": (_number("concurrency", int, 1, "a whole number"),
                    f"backend requests in flight (default {DEFAULT_CONCURRENCY})"),
    "readahead": (_bool, "sequential read-ahead within files: on|off (default on)"),
    "readahead_size": (lambda v: parse_size(v, "read-ahead size"),
                       "largest read-ahead window per open file (default 128M)"),
    "prefetch": (_bool, "cross-file prefetch from predictions and hints: on|off "
                        "(default on)"),
    "allow_other": (_bool, "let other users access the mount (needs user_allow_other "
                           "in /etc/fuse.conf for non-root)"),
    "log_file": (os.path.expanduser, "daemon log file when in the background (default "
                                     "CACHE_DIR/neuralcache.log)"),
    "debug": (_bool, "debug logging"),
    "metrics_port": (_port, "serve Prometheus metrics on this port (default: off)"),
    "metrics_addr": (str, "address for the metrics endpoint (default 127.0.0.1)"),
    "writable": (_bool, "allow writes (checkpoints): files go to a journal under "
                        "--cache-dir, close() returns once they are fsynced there, and "
                        "they are uploaded in the background (default: read-only; "
                        "-o rw is the same)"),
    "sync_close": (_bool, "with --writable, close() also waits until the file is on "
                          "the remote (default off)"),
    "shared_cache": (_shared_url, "s3://BUCKET[/PREFIX] of an in-region bucket shared by "
                                  "the cluster's nodes, read before the origin and "
                                  "written through (default: off)"),
    "shared_cache_endpoint": (str, "S3 endpoint of the shared cache bucket, e.g. a "
                                   "MinIO or SeaweedFS in the compute region (default: "
                                   "AWS)"),
    "shared_cache_region": (str, "region of the shared cache bucket (default: the one "
                                 "it reports)"),
    "shared_cache_profile": (str, "AWS profile for the shared cache bucket (default: "
                                  "$AWS_PROFILE or the default chain)"),
    "shared_cache_leases": (_bool, "one origin fetch per block when several nodes miss "
                                   "it at once: on|off (default on)"),
}


def parse_o_options(text: str) -> dict[str, object]:
    """``-o cache_size=10G,readahead=off,allow_other`` -> parsed values.

    ``rw`` turns writes on (``writable``), ``ro`` keeps the mount read-only; other
    mount(8) options that are not ours (_netdev, nofail, noauto, user, ...) are
    accepted and ignored so fstab lines work."""
    out: dict[str, object] = {}
    # mount(8)'s own words (fstab(5), mount(8) "FILESYSTEM-INDEPENDENT MOUNT OPTIONS")
    # that mean nothing to this filesystem
    ignored = {"_netdev", "nofail", "noauto", "auto", "user", "users", "nouser", "owner",
               "group", "defaults", "noexec", "exec", "nosuid", "suid", "nodev", "dev",
               "noatime", "atime", "relatime", "norelatime", "strictatime",
               "nostrictatime", "lazytime", "nolazytime", "nodiratime", "diratime",
               "async", "sync", "dirsync", "silent", "loud", "iversion", "noiversion",
               "mand", "nomand", "x-systemd.automount"}
    for item in filter(None, (s.strip() for s in text.split(","))):
        key, eq, value = item.partition("=")
        key = key.strip()
        if key in ignored or key.startswith("x-") or key == "comment":
            continue
        if key in ("rw", "ro") and not eq:
            out["writable"] = key == "rw"
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


def load_config_file(path: str) -> dict[str, object]:
    """A TOML file of mount options: ``source``, ``mountpoint`` and any key of OPTIONS
    (underscores or dashes).  Unknown keys are an error that names the key."""
    import tomllib

    try:
        with open(path, "rb") as f:
            doc = tomllib.load(f)
    except FileNotFoundError:
        raise UserError(f"config file {path} does not exist") from None
    except OSError as exc:
        raise UserError(f"cannot read config file {path}: {exc.strerror}") from None
    except tomllib.TOMLDecodeError as exc:
        raise UserError(f"config file {path} is not valid TOML: {exc}") from None
    out: dict[str, object] = {}
    for key, value in doc.items():
        name = key.replace("-", "_")
        if name in ("source", "mountpoint"):
            if not isinstance(value, str) or not value:
                raise UserError(f"{key} in {path} must be a non-empty string")
            out[name] = value
            continue
        if name not in OPTIONS:
            raise UserError(f"unknown key {key!r} in {path}; see neuralcache mount --help "
                            "for the options")
        if isinstance(value, (dict, list)):
            raise UserError(f"{key} in {path} must be a single value")
        parser = OPTIONS[name][0]
        out[name] = parser(value) if isinstance(value, bool) and parser is _bool \
            else parser(str(value).lower() if isinstance(value, bool) else str(value))
    return out


def check_url(flag: str, url: str | None) -> None:
    """An endpoint option's value is http(s)://HOST[:PORT], else a one-line error."""
    from urllib.parse import urlsplit
    if url is None:
        return
    try:
        parts = urlsplit(url)
        parts.port                       # (raises on a port that is not a number)
    except ValueError:
        parts = None
    if parts is None or parts.scheme not in ("http", "https") or not parts.hostname:
        raise UserError(f"bad {flag} {url!r}: expected http(s)://HOST[:PORT]")


def prepare_cache_dir(path: str) -> None:
    """Create the cache directory (0700) if missing; a one-line error if it cannot be
    used (a file, no such parent, read-only, no permission)."""
    try:
        os.makedirs(path, mode=0o700, exist_ok=True)
        ok = os.path.isdir(path) and os.access(path, os.W_OK | os.X_OK)
        why = "not a writable directory"
    except OSError as exc:
        ok, why = False, exc.strerror or str(exc)
    if not ok:
        raise UserError(f"cannot use cache directory {path}: {why}; pick another "
                        "--cache-dir")

"""The `neuralcache` command: mount, umount, stats, trace, warm, sync (and in their own
modules: shared-cache gc, manifest export).

One function per subcommand; ``main(argv=None)``.  UserError prints one line (no
traceback) and exits 1.
"""
from __future__ import annotations

import argparse
import json
import logging
import os
import shutil
import subprocess
import sys
import time

from .. import __version__
from . import mounts
from .config import (OPTIONS, MountConfig, check_url, load_config_file, parse_o_options,
                     prepare_cache_dir)
from ..errors import UserError
from .background import start_daemon
from .sizes import format_size
from ..store.writeback import WRITE_BACK_S

# How long `umount` waits for the daemon to exit after the unmount (cache writes are
# atomic, and a writable mount's uploads were waited for before unmounting, so this
# only bounds the wait for a tidy exit, which includes the daemon's WRITE_BACK_S).
UMOUNT_WAIT_S = 30.0
# `sync` and `umount` print a progress line this often while they wait (on a terminal).
PROGRESS_S = 2.0

log = logging.getLogger("neuralcache")


# -- mount ----------------------------------------------------------------------------
def _add_mount_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("source", nargs="?",
                   help="s3://BUCKET[/PREFIX] or a directory (e.g. an NFS mount)")
    p.add_argument("mountpoint", nargs="?", help="an existing directory")
    p.add_argument("--config", metavar="FILE",
                   help="TOML file with source, mountpoint and any option below but "
                        "-f (flags and -o override it; see systemd/example.toml)")
    for name, (_, help_text) in OPTIONS.items():
        flag = "--" + name.replace("_", "-")
        if name in ("readahead", "prefetch"):
            p.add_argument(flag, metavar="on|off", help=help_text)
        elif name in ("allow_other", "debug", "writable", "sync_close"):
            p.add_argument(flag, action="store_true", default=None, help=help_text)
        else:
            p.add_argument(flag, metavar=name.upper().split("_")[-1], help=help_text)
    p.add_argument("-f", "--foreground", action="store_true",
                   help="stay attached and log to stderr (default: return once mounted)")
    p.add_argument("-o", dest="options", action="append", default=[], metavar="OPTS",
                   help="mount(8)-style options key=value,...: any option above with "
                        "underscores (e.g. -o cache_size=10G,readahead=off)")


def build_config(args: argparse.Namespace) -> MountConfig:
    values: dict[str, object] = {}
    if args.config:
        values.update(load_config_file(args.config))
    source = args.source or values.pop("source", None)
    mountpoint = args.mountpoint or values.pop("mountpoint", None)
    values.pop("source", None)
    values.pop("mountpoint", None)
    if not source or not mountpoint:
        raise UserError("give SOURCE and MOUNTPOINT, on the command line or in --config")
    cfg = MountConfig(source=source, mountpoint=mountpoint, foreground=args.foreground)
    for text in args.options:
        values.update(parse_o_options(text))
    for name, (parser, _) in OPTIONS.items():
        v = getattr(args, name, None)
        if v is not None:
            values[name] = parser(v)
    for k, v in values.items():
        setattr(cfg, k, v)
    if cfg.source.startswith("s3://"):
        if not cfg.source[5:].split("/")[0]:
            raise UserError(f"bad source {cfg.source!r}: expected s3://BUCKET[/PREFIX]")
    elif "://" in cfg.source:
        raise UserError(f"bad source {cfg.source!r}: use s3://BUCKET[/PREFIX] or a "
                        "directory path")
    else:
        cfg.source = os.path.abspath(cfg.source)
    if cfg.memory_cache_size < cfg.block_size:
        raise UserError(f"--memory-cache-size must be at least the block size "
                        f"({format_size(cfg.block_size)})")
    if cfg.cache_size < cfg.block_size:
        raise UserError(f"--cache-size must be at least the block size "
                        f"({format_size(cfg.block_size)})")
    if cfg.block_size < 64 << 10 or cfg.block_size > 64 << 20:
        raise UserError("--block-size must be between 64K and 64M")
    if cfg.manifest:
        if cfg.writable:
            raise UserError("--manifest mounts are read-only (the manifest is a frozen "
                            "listing): drop --writable, or mount without --manifest")
        cfg.manifest = os.path.abspath(cfg.manifest)
        if not os.path.isfile(cfg.manifest):
            raise UserError(f"manifest {cfg.manifest} does not exist (write one with "
                            "neuralcache manifest export SOURCE FILE)")
        if "metadata_ttl" not in values:
            cfg.metadata_ttl = 0.0
    if cfg.endpoint_url is None and os.environ.get("AWS_ENDPOINT_URL"):
        cfg.endpoint_url = os.environ["AWS_ENDPOINT_URL"]
    for flag, url in (("--endpoint-url", cfg.endpoint_url),
                      ("--shared-cache-endpoint", cfg.shared_cache_endpoint)):
        check_url(flag, url)
    return cfg


def _setup_logging(cfg: MountConfig, to_file: str | None) -> None:
    level = logging.DEBUG if cfg.debug else logging.INFO
    fmt = "%(asctime)s %(levelname)s %(name)s: %(message)s"
    root = logging.getLogger()
    root.handlers.clear()
    if to_file:
        os.makedirs(os.path.dirname(to_file) or ".", mode=0o700, exist_ok=True)
        h: logging.Handler = logging.FileHandler(to_file)
    else:
        h = logging.StreamHandler(sys.stderr)
    h.setFormatter(logging.Formatter(fmt))
    root.addHandler(h)
    root.setLevel(level)
    # botocore at DEBUG logs signed requests; keep it out of our logs.
    for noisy in ("botocore", "boto3", "urllib3", "s3transfer"):
        logging.getLogger(noisy).setLevel(logging.WARNING)


def cmd_mount(args: argparse.Namespace) -> int:
    cfg = build_config(args)
    prepare_cache_dir(cfg.cache_dir)
    if cfg.foreground:
        return _mount_here(cfg, None)
    return start_daemon(cfg, _mount_here)


def _mount_here(cfg: MountConfig, ready_fd: int | None) -> int:
    from ..daemon import serve   # imports pyfuse3: only when mounting

    log_file = None
    if ready_fd is not None:
        log_file = cfg.log_file or os.path.join(cfg.cache_dir, "neuralcache.log")

    def report(line: str) -> None:
        if ready_fd is not None:
            try:
                os.write(ready_fd, (line + "\n").encode())
                os.close(ready_fd)
            except OSError:
                pass

    try:
        _setup_logging(cfg, log_file)
    except OSError as exc:
        msg = (f"cannot write the log file {exc.filename or log_file}: "
               f"{exc.strerror or exc}; check --log-file")
        report(f"ERROR {msg}")
        raise UserError(msg) from None

    def on_ready(_):
        if ready_fd is None:
            print(f"neuralcache: serving {cfg.source} on {os.path.abspath(cfg.mountpoint)}"
                  " (Ctrl-C to unmount)", file=sys.stderr, flush=True)
        report("READY")

    try:
        serve(cfg, on_ready)
    except UserError as exc:
        if ready_fd is not None:
            log.error("%s", exc)
        report(f"ERROR {exc}")
        raise
    except KeyboardInterrupt:
        return 0
    except Exception as exc:  # a bug: keep the traceback in the log, one line out
        log.exception("daemon failed")
        report(f"ERROR internal error: {type(exc).__name__}: {exc} (see the log)")
        raise UserError(f"internal error: {type(exc).__name__}: {exc}") from None
    return 0


# -- umount ----------------------------------------------------------------------------
def _daemon_pid(mp: str) -> int | None:
    try:
        with open(os.path.join(mp, mounts.CONTROL_DIR, "stats.json")) as f:
            return int(json.load(f)["pid"])
    except (OSError, ValueError, KeyError):
        return None


def cmd_umount(args: argparse.Namespace) -> int:
    target = args.mountpoint
    if args.config:
        target = target or load_config_file(args.config).get("mountpoint")
    if not target:
        raise UserError("give MOUNTPOINT, or --config with a mountpoint")
    mp = os.path.abspath(target)
    entry = mounts.find_mount(mp)
    if entry is None:
        if args.if_mounted:
            return 0
        raise UserError(f"{mp} is not mounted")
    if entry.fstype != mounts.FSTYPE:
        raise UserError(f"{mp} is not a NeuralCache mount (it is {entry.fstype} "
                        f"{entry.source}); use umount(8)")
    pid = _daemon_pid(mp)
    if _is_writable(mp):
        if args.force:
            _control(mp, "force")
        else:
            try:
                _sync_with_progress(mp, "sync")
            except UserError as exc:
                raise UserError(f"not unmounting {mp}: {exc}; the data stays in the journal: "
                                "fix the remote and try again, or `neuralcache umount --force` "
                                "(the next mount of this source and cache uploads it)") from None
    tool = shutil.which("fusermount3") or shutil.which("fusermount")
    cmd = [tool, "-u"] + (["-z"] if args.lazy else []) + [mp] if tool else \
        ["umount"] + (["-l"] if args.lazy else []) + [mp]
    res = subprocess.run(cmd, capture_output=True, text=True)
    if res.returncode != 0:
        msg = (res.stderr or res.stdout).strip()
        if "busy" in msg.lower():
            raise UserError(f"{mp} is busy: close the files and shells using it "
                            f"(see `fuser -vm {mp}`), or use --lazy")
        raise UserError(f"unmounting {mp} failed: {msg}")
    if pid:
        t0 = time.monotonic()
        said = not sys.stderr.isatty()
        while time.monotonic() < t0 + UMOUNT_WAIT_S and _alive(pid):
            if not said and time.monotonic() > t0 + PROGRESS_S:
                said = True
                print(f"neuralcache: waiting for the daemon of {mp} (pid {pid}) to exit; "
                      "after the unmount it writes blocks only its memory held to the "
                      f"disk cache, for up to {WRITE_BACK_S:.0f} s", file=sys.stderr,
                      flush=True)
            time.sleep(0.05)
    print(f"neuralcache: unmounted {mp}")
    return 0


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # a zombie counts as gone
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"
    except OSError:
        return False


# -- sync (a --writable mount) -----------------------------------------------------------
def _is_writable(mp: str) -> bool:
    try:
        with open(os.path.join(mp, mounts.CONTROL_DIR, "stats.json")) as f:
            return bool(json.load(f).get("writable"))
    except (OSError, ValueError):
        return False


def _control(mp: str, command: str) -> str:
    """``command`` through MOUNT/.neuralcache/sync; the answer (read when it is done)."""
    path = os.path.join(mp, mounts.CONTROL_DIR, "sync")
    try:
        fd = os.open(path, os.O_RDWR)
    except FileNotFoundError:
        raise UserError(f"{mp} is read-only (mount it with --writable)") from None
    except OSError as exc:
        raise UserError(f"cannot open {path}: {exc.strerror}") from None
    try:
        os.write(fd, command.encode())
        answer = os.pread(fd, 65536, 0).decode(errors="replace").strip()
    except OSError as exc:
        raise UserError(f"{command.split()[0]} on {mp} failed: {exc.strerror}") from None
    finally:
        os.close(fd)
    if answer.startswith("ok"):
        return answer[2:].strip()
    raise UserError(answer.removeprefix("error:").strip() or "no answer from the daemon")


def _sync_with_progress(mp: str, command: str) -> str:
    """``_control`` while a line of progress is printed every PROGRESS_S on a terminal."""
    import threading
    done = threading.Event()

    def progress() -> None:
        while not done.wait(PROGRESS_S):
            try:
                s = read_stats(mp)
            except UserError:
                return
            print(f"neuralcache: waiting for {s.get('upload_pending_ops', 0)} remote "
                  f"operations ({format_size(s.get('upload_pending_bytes', 0))} to upload, "
                  f"{s.get('upload_errors', 0)} errors so far)", file=sys.stderr, flush=True)

    t = threading.Thread(target=progress, daemon=True)
    if sys.stderr.isatty():
        t.start()
    try:
        return _control(mp, command)
    finally:
        done.set()


def cmd_sync(args: argparse.Namespace) -> int:
    mp = os.path.abspath(args.mountpoint)
    read_stats(mp)   # a live NeuralCache mount?
    if args.discard:
        path = args.discard
        if os.path.isabs(path):
            rel = os.path.relpath(os.path.abspath(path), mp)
            if rel == "." or rel.startswith(".."):
                raise UserError(f"{path} is not inside {mp}")
            path = rel
        answer = _control(mp, "discard " + path)
        print(f"neuralcache: {answer} of {path}; it now shows what the remote has")
        return 0
    t0 = time.monotonic()
    answer = _sync_with_progress(mp, "sync")
    print(f"neuralcache: everything written to {mp} is on the remote ({answer}, "
          f"{time.monotonic() - t0:.1f} s)")
    return 0


# -- stats / trace -----------------------------------------------------------------------
def read_stats(mp: str) -> dict:
    entry = mounts.find_mount(os.path.abspath(mp))
    if entry is None or entry.fstype != mounts.FSTYPE:
        raise UserError(f"{mp} is not a NeuralCache mount")
    try:
        with open(os.path.join(mp, mounts.CONTROL_DIR, "stats.json")) as f:
            return json.load(f)
    except OSError as exc:
        raise UserError(f"cannot read stats of {mp}: {exc.strerror} (is the daemon "
                        f"running? `neuralcache umount {mp}` cleans up a dead mount)") from None


def format_stats(s: dict) -> str:
    lat = s.get("backend_latency_ms", {})
    rows = [
        ("source", s.get("source", "")),
        ("served", format_size(s["bytes_served"])),
        ("fetched from remote", format_size(s["bytes_fetched"])),
        ("hit rate (bytes)", f"{s['hit_rate']:.1%}"),
        ("memory hits / misses", f"{s['mem_hits']} / {s['mem_misses']}"),
        ("disk hits / misses", f"{s['disk_hits']} / {s['disk_misses']}"),
        ("read-ahead used / fetched", f"{format_size(s['readahead_bytes_used'])} / "
                                      f"{format_size(s['readahead_bytes_fetched'])}"),
        ("prefetch used / fetched", f"{format_size(s['prefetch_bytes_used'])} / "
                                    f"{format_size(s['prefetch_bytes_fetched'])} "
                                    f"({format_size(s.get('prefetch_bytes_staged', 0))} "
                                    "of it staged on disk)"),
        ("ahead lost unread", f"{format_size(s.get('ahead_lost_memory_bytes', 0))} by "
                              f"memory, {format_size(s.get('ahead_lost_disk_bytes', 0))} "
                              "by disk"),
        ("prefetch precision", f"{s['prefetch_precision']:.1%}"),
        ("backend requests", f"{s['backend_requests']} ({s['backend_errors']} errors, "
                             f"{s['backend_retries']} retries)"),
        ("backend latency p50/p90/p99", f"{lat.get('p50', 0)} / {lat.get('p90', 0)} / "
                                        f"{lat.get('p99', 0)} ms"),
        ("disk cache", f"{format_size(s['cache_disk_bytes'])} of "
                       f"{format_size(s['cache_disk_limit'])} "
                       f"({s['cache_disk_blocks']} blocks)"),
        ("memory cache", f"{format_size(s['cache_mem_bytes'])} of "
                         f"{format_size(s['cache_mem_limit'])}"),
        ("uptime", f"{s['uptime_s']:.0f} s"),
    ]
    if s.get("writable"):
        rows[-1:-1] = [
            ("written / uploaded", f"{format_size(s['written_bytes'])} / "
                                   f"{format_size(s['uploaded_bytes'])} "
                                   f"({s['uploaded_files']} files)"),
            ("pending upload", f"{format_size(s['upload_pending_bytes'])} in "
                               f"{s['upload_pending_files']} files "
                               f"({s['upload_pending_ops']} remote operations, oldest "
                               f"{s['upload_oldest_pending_s']:.0f} s)"),
            ("upload errors", f"{s['upload_errors']} (retried until they pass)"),
        ]
    if "shared_hits" in s:      # --shared-cache (store/shared.py)
        rows[6:6] = [("shared hits / misses", f"{s['shared_hits']} / {s['shared_misses']} "
                      f"({format_size(s['shared_bytes_read'])} read, "
                      f"{format_size(s['shared_bytes_written'])} written)")]
    w = max(len(k) for k, _ in rows)
    return "\n".join(f"{k:<{w}}  {v}" for k, v in rows)


def cmd_stats(args: argparse.Namespace) -> int:
    s = read_stats(args.mountpoint)
    if args.watch:
        return watch_stats(args.mountpoint, s, args.interval)
    print(json.dumps(s, indent=2) if args.json else format_stats(s))
    return 0


def format_rates(prev: dict, cur: dict, dt: float) -> str:
    def rate(key):
        return max(0, cur[key] - prev[key]) / dt

    served, fetched = rate("bytes_served"), rate("bytes_fetched")
    hit_d = cur.get("demand_hit_bytes", 0) - prev.get("demand_hit_bytes", 0)
    srv_d = cur["bytes_served"] - prev["bytes_served"]
    hit = f"{hit_d / srv_d:6.1%}" if srv_d > 0 else "     -"
    lat = cur.get("backend_latency_ms", {})
    return (f"{time.strftime('%H:%M:%S')}  served {format_size(served):>7}/s  "
            f"fetched {format_size(fetched):>7}/s  hit {hit}  "
            f"reads {rate('reads'):7.0f}/s  opens {rate('opens'):6.0f}/s  "
            f"backend p50 {lat.get('p50', 0):6.1f} ms  "
            f"cache {format_size(cur['cache_disk_bytes'])}")


def watch_stats(mp: str, first: dict, interval: float) -> int:
    """Live view: one line per interval with rates since the previous line."""
    prev, t_prev = first, time.monotonic()
    print(format_stats(first))
    try:
        while True:
            time.sleep(interval)
            cur, now = read_stats(mp), time.monotonic()
            print(format_rates(prev, cur, now - t_prev), flush=True)
            prev, t_prev = cur, now
    except KeyboardInterrupt:
        return 0


def _positive(kind):
    """argparse type: a number above 0 (a ValueError: argparse's usage line, exit 2)."""
    def parse(text: str):
        v = kind(text)
        if not v > 0:
            raise ValueError(text)
        return v
    parse.__name__ = f"positive {kind.__name__}"   # argparse names it in the error
    return parse


def cmd_trace(args: argparse.Namespace) -> int:
    read_stats(args.mountpoint)   # checks it is a live NeuralCache mount
    with open(os.path.join(args.mountpoint, mounts.CONTROL_DIR, "trace"), "rb") as f:
        data = f.read()
    if args.out == "-":
        sys.stdout.buffer.write(data)
    else:
        try:
            with open(args.out, "wb") as f:
                f.write(data)
        except OSError as exc:
            raise UserError(f"cannot write {args.out}: {exc.strerror or exc}") from None
        print(f"neuralcache: wrote {data.count(10)} events to {args.out}")  # (lines)
    return 0


def cmd_warm(args: argparse.Namespace) -> int:
    from .warm import warm

    read_stats(args.mountpoint)   # a live NeuralCache mount?
    return warm(args.mountpoint, args.paths, args.from_file, args.jobs, args.check)


# -- entry point -------------------------------------------------------------------------
def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="neuralcache",
        description="Predictive read-ahead caching FUSE filesystem for ML training data "
                    "held in S3 or on a POSIX share.")
    p.add_argument("--version", action="version", version=f"neuralcache {__version__}")
    sub = p.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    m = sub.add_parser("mount", help="mount a bucket or directory (returns once serving)",
                       description="Mount SOURCE on MOUNTPOINT through the cache "
                                   "(read-only unless --writable).")
    _add_mount_args(m)
    m.set_defaults(func=cmd_mount)
    u = sub.add_parser("umount", help="unmount a NeuralCache mount",
                       description="Unmount and wait for the daemon to exit.")
    u.add_argument("mountpoint", nargs="?")
    u.add_argument("--config", metavar="FILE", help="take the mountpoint from this TOML file")
    u.add_argument("-z", "--lazy", action="store_true",
                   help="detach now even if files are open (umount -l)")
    u.add_argument("--if-mounted", action="store_true",
                   help="succeed quietly when nothing is mounted (for service scripts)")
    u.add_argument("--force", action="store_true",
                   help="a writable mount: unmount without waiting for pending uploads "
                        "(they stay in the journal; the next mount of this source and "
                        "cache uploads them before it serves)")
    u.set_defaults(func=cmd_umount)
    y = sub.add_parser("sync", help="wait until everything written to a writable mount "
                                    "is on the remote",
                       description="A barrier: returns once every file written (and "
                                   "renamed, deleted) so far is on the remote; exit 1 "
                                   "with one line if an upload keeps failing.")
    y.add_argument("mountpoint")
    y.add_argument("--discard", metavar="PATH",
                   help="instead, drop PATH's pending upload from the journal (the data "
                        "is lost; the name shows what the remote has)")
    y.set_defaults(func=cmd_sync)
    s = sub.add_parser("stats", help="print live counters of a mount")
    s.add_argument("mountpoint")
    s.add_argument("--json", action="store_true",
                   help="machine-readable (keys in docs/operations.md)")
    s.add_argument("--watch", action="store_true",
                   help="live view: rates every --interval seconds until Ctrl-C")
    s.add_argument("--interval", type=_positive(float), default=1.0,
                   help="seconds between lines (1)")
    s.set_defaults(func=cmd_stats)
    w = sub.add_parser("warm", help="fetch files into the cache ahead of a job",
                       description="Read files through the mount so they are cached "
                                   "before a job starts (default: the whole mount).")
    w.add_argument("mountpoint")
    w.add_argument("paths", nargs="*", help="files or directories, absolute or relative "
                                            "to the mount (default: everything)")
    w.add_argument("--from-file", metavar="FILE",
                   help="also warm the paths listed in FILE, one per line (- for stdin)")
    w.add_argument("-j", "--jobs", type=_positive(int), default=16,
                   help="files read at once (16)")
    w.add_argument("--check", action="store_true",
                   help="only report how much is already cached")
    w.set_defaults(func=cmd_warm)
    t = sub.add_parser("trace", help="dump the access trace of a mount (JSON Lines)")
    t.add_argument("mountpoint")
    t.add_argument("--out", required=True, help="output file, or - for stdout")
    t.set_defaults(func=cmd_trace)
    from .sharedgc import add_parser as add_shared_cache_parser
    add_shared_cache_parser(sub)
    from .manifest import add_parser as add_manifest_parser
    add_manifest_parser(sub)
    return p


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    try:
        try:        # (argparse prints --help / --version itself, then SystemExit)
            rc = (args := build_parser().parse_args(argv)).func(args)
        except UserError as exc:
            print(f"neuralcache: error: {exc}", file=sys.stderr)
            rc = 1
        except KeyboardInterrupt:
            rc = 130
        except SystemExit:
            sys.stdout.flush()
            raise
        sys.stdout.flush()              # (a closed pipe raises here, not at exit)
        return rc
    except BrokenPipeError:     # the reader went away (`... | head`): no traceback,
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # nor at exit
        return 1


def mount_helper(argv: list[str] | None = None) -> int:
    """``mount.fuse.neuralcache SOURCE MOUNTPOINT [-o OPTS] [-n] [-s] [-f] [-v]``: what
    mount(8) runs for ``mount -t fuse.neuralcache`` and fstab lines.  mount's own flags
    (-n no mtab, -s sloppy, -f fake, -v verbose) are accepted; -f does nothing."""
    argv = sys.argv[1:] if argv is None else list(argv)
    pos: list[str] = []
    opts: list[str] = []
    fake = False
    i = 0
    while i < len(argv):
        a = argv[i]
        if a == "-o" and i + 1 < len(argv):
            opts.append(argv[i + 1])
            i += 2
            continue
        if a.startswith("-o") and len(a) > 2:
            opts.append(a[2:])
        elif a in ("-n", "-s", "-v"):
            pass
        elif a == "-f":
            fake = True
        elif a.startswith("-"):
            print(f"mount.fuse.neuralcache: error: unknown flag {a}", file=sys.stderr)
            return 1
        else:
            pos.append(a)
        i += 1
    if len(pos) != 2:
        print("usage: mount.fuse.neuralcache SOURCE MOUNTPOINT [-o OPTIONS]", file=sys.stderr)
        return 1
    if fake:
        return 0
    # mount(8) passes "rw" to every helper unless told "ro", so here it cannot mean
    # "make it writable": an fstab line asks for writes with `writable`.
    opts = [",".join(o for o in text.split(",") if o.strip() != "rw") for text in opts]
    opts = [text for text in opts if text]
    # fuse's generic helper may pass the type prefix: "neuralcache#s3://bucket"
    source = pos[0].split("#", 1)[1] if pos[0].startswith("neuralcache#") else pos[0]
    args = ["mount", source, pos[1]]
    for o in opts:
        args += ["-o", o]
    return main(args)

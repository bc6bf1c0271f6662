"""``neuralcache manifest export SOURCE|MOUNT FILE``: write the listing of a bucket, a
directory or a NeuralCache mount as a manifest (meta/manifest.py has the format), for
``neuralcache mount --manifest FILE``: every node of a job then starts without
listing the source.  ``manifest show FILE`` prints what a manifest holds.

From SOURCE (s3://BUCKET[/PREFIX] or a directory), the source is listed directly,
a directory at a time, up to 64 listed ahead.  From a mount, the mount is walked (its
daemon lists what the walk touches) and the files' versions are asked of its ``query``
control file.  ``manifest import`` builds one from a
listing you already have (an S3 Inventory report as TSV).
"""
from __future__ import annotations

import argparse
import os
import sys
import time
from typing import Iterator

from ..errors import BackendError, UserError
from ..meta.manifest import Manifest, export, sorted_walk
from ..backends.base import ObjectInfo, valid_key
from . import mounts


def _walk_mount(mp: str):
    """Every file of a NeuralCache mount in key order."""
    def list_dir(key: str):
        path = os.path.join(mp, key)
        found, dirs = [], []
        with os.scandir(path) as it:
            for de in it:
                if not key and de.name == mounts.CONTROL_DIR:
                    continue
                k = f"{key}/{de.name}" if key else de.name
                if de.is_dir(follow_symlinks=False):
                    dirs.append(de.name)
                else:
                    found.append((k, de.stat()))
        versions = mounts.query_files(mp, "version", [k for k, _ in found])
        yield [ObjectInfo(k, st.st_size, v, st.st_mtime)
               for (k, st), v in zip(found, versions) if v != "-"], dirs

    return sorted_walk(list_dir)


def cmd_export(args: argparse.Namespace) -> int:
    t0 = time.monotonic()
    target = args.source
    entry = mounts.find_mount(os.path.abspath(target)) if "://" not in target else None
    if entry is not None and entry.fstype.endswith("neuralcache"):
        source = entry.source.removeprefix("neuralcache:")
        objects = _walk_mount(os.path.abspath(target))
    else:
        from ..backends import open_backend

        source = target if "://" in target else os.path.abspath(target)
        backend = open_backend(source, endpoint_url=args.endpoint_url, region=args.region,
                               profile=args.profile)
        try:
            backend.check()
        except BackendError as exc:
            raise UserError(f"cannot list {source}: {exc}") from None
        objects = sorted_walk(backend.list_dir)
    try:
        n = export(objects, args.file, source)
    except BackendError as exc:
        raise UserError(f"listing {source} failed: {exc}") from None
    except OSError as exc:
        raise UserError(f"cannot write {args.file}: {exc.strerror or exc}") from None
    size = os.path.getsize(args.file)
    print(f"neuralcache: wrote {n} entries of {source} to {args.file} ({size} bytes) in "
          f"{time.monotonic() - t0:.1f} s", file=sys.stderr)
    return 0


def read_listing(lines) -> Iterator[ObjectInfo]:
    """``KEY<TAB>SIZE[<TAB>MTIME[<TAB>VERSION]]`` lines (an S3 Inventory report or a
    listing of your own turned into TSV), keys in byte order."""
    last = None
    for n, line in enumerate(lines, 1):
        line = line.rstrip("\n")
        if not line:
            continue
        parts = line.split("\t")
        try:
            key, size = parts[0], int(parts[1])
            mtime = float(parts[2]) if len(parts) > 2 and parts[2] else 0.0
        except (IndexError, ValueError):
            raise UserError(f"line {n}: expected KEY<TAB>SIZE[<TAB>MTIME[<TAB>VERSION]], "
                            f"got {line[:80]!r}") from None
        if not valid_key(key):
            raise UserError(f"line {n}: {key[:80]!r} cannot be a path in a mount")
        if last is not None and key <= last:
            raise UserError(f"line {n}: {key[:80]!r} is out of order: sort the listing by "
                            "key in byte order first (LC_ALL=C sort -t $'\\t' -k1,1)")
        last = key
        yield ObjectInfo(key, size, parts[3] if len(parts) > 3 else "", mtime)


def cmd_import(args: argparse.Namespace) -> int:
    t0 = time.monotonic()
    src = sys.stdin if args.listing == "-" else None
    try:
        f = src or open(args.listing, encoding="utf-8", errors="surrogateescape")
    except OSError as exc:
        raise UserError(f"cannot read {args.listing}: {exc.strerror}") from None
    with f:
        try:
            n = export(read_listing(f), args.file, args.source or "")
        except OSError as exc:
            raise UserError(f"cannot write {args.file}: {exc.strerror or exc}") from None
    print(f"neuralcache: wrote {n} entries to {args.file} in {time.monotonic() - t0:.1f} s",
          file=sys.stderr)
    return 0


def cmd_show(args: argparse.Namespace) -> int:
    m = Manifest(args.file)
    print(f"source {m.source}\nentries {m.entries}")
    if args.list:
        for o in m.all():
            print(f"{o.key}\t{o.size}\t{o.mtime}\t{o.version}")
    return 0


def add_parser(sub) -> None:
    p = sub.add_parser("manifest", help="write or inspect a listing to mount from",
                       description="A manifest is a compressed listing (key, size, mtime, "
                                   "version) that `mount --manifest FILE` serves names "
                                   "from, without listing the source.")
    msub = p.add_subparsers(dest="manifest_command", metavar="ACTION")
    msub.required = True
    e = msub.add_parser("export", help="write the listing of SOURCE or a mount to FILE")
    e.add_argument("source", help="s3://BUCKET[/PREFIX], a directory, or a NeuralCache "
                                  "mountpoint")
    e.add_argument("file", help="the manifest to write")
    e.add_argument("--endpoint-url", help="S3 endpoint (default: AWS or $AWS_ENDPOINT_URL)",
                   default=os.environ.get("AWS_ENDPOINT_URL"))
    e.add_argument("--region", help="S3 region of the bucket")
    e.add_argument("--profile", help="AWS profile")
    e.set_defaults(func=cmd_export)
    i = msub.add_parser("import", help="write a manifest from a listing of your own",
                        description="LISTING has one object per line, KEY<TAB>SIZE"
                                    "[<TAB>MTIME[<TAB>VERSION]], sorted by key in byte order "
                                    "(e.g. an S3 Inventory report turned into TSV); - reads "
                                    "stdin.  A missing VERSION (ETag) means reads do not pin "
                                    "one.")
    i.add_argument("listing", help="the TSV listing, or - for stdin")
    i.add_argument("file", help="the manifest to write")
    i.add_argument("--source", help="the source it lists, e.g. s3://BUCKET (recorded; a "
                                    "mount of another source logs a warning)")
    i.set_defaults(func=cmd_import)
    s = msub.add_parser("show", help="print a manifest's source and entry count")
    s.add_argument("file")
    s.add_argument("--list", action="store_true", help="also every entry, tab-separated")
    s.set_defaults(func=cmd_show)

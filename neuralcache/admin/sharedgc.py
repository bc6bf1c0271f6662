"""``neuralcache shared-cache gc``: delete old objects of a shared tier, for stores
without lifecycle rules (a lifecycle rule is the better way where the store has one:
docs/many-nodes.md).

What it deletes: every object under ``PREFIX/nc2/`` (blocks and claims) and under an
older release's layout, ``PREFIX/nc1/`` (blocks and leases) -- nothing else under the
prefix -- whose last write is older than ``--older-than``.  A block object is
written when a node fetches the block from the origin, never refreshed on reads (S3
has no access time), so the age counts from that write: a block still in use is deleted too, and the
next node that needs it fetches it from the origin once and writes it through again.
Deleting while nodes run is safe: a missing block is a miss.
"""
from __future__ import annotations

import argparse
import re
import time

from ..errors import BackendError, UserError
from typing import TYPE_CHECKING

if TYPE_CHECKING:     # imported when used: the CLI starts without boto3 (0.2 s)
    from ..store.shared import SharedBucket
from .sizes import format_size

_AGE = re.compile(r"(\d+(?:\.\d+)?)([smhdw]?)")
_UNIT_S = {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}
# Keys per DeleteObjects request: the S3 maximum.
DELETE_BATCH = 1000


def parse_age(text: str) -> float:
    """``7d``, ``12h``, ``30m``, ``90s``, ``2w`` or plain seconds -> seconds."""
    m = _AGE.fullmatch(text.strip().lower())
    if not m:
        raise UserError(f"bad age {text!r}: use a number with a unit s, m, h, d or w, "
                        "e.g. 7d or 12h")
    return float(m.group(1)) * _UNIT_S[m.group(2)]


def gc(url: str, older_than_s: float, *, endpoint_url: str | None = None,
       region: str | None = None, profile: str | None = None,
       dry_run: bool = False) -> tuple[int, int]:
    """Delete (or with ``dry_run`` count) the old objects; (objects, bytes)."""
    from ..store.shared import SharedBucket, parse_shared_url
    from ..store.sharedobj import LAYOUTS

    bucket, prefix = parse_shared_url(url)
    sb = SharedBucket(bucket, prefix, endpoint_url=endpoint_url, region=region,
                      profile=profile, concurrency=4)
    cutoff = time.time() - older_than_s
    count = size = 0
    batch: list[str] = []

    def flush() -> None:
        if batch and not dry_run:
            sb._call(f"delete {len(batch)} objects from s3://{bucket}/{sb.prefix}",
                     lambda: _delete(sb, bucket, batch))
        batch.clear()

    try:
        sb.check()
        for root in (sb.prefix + layout + "/" for layout in LAYOUTS):
            token = None
            while True:
                kw = dict(Bucket=bucket, Prefix=root, MaxKeys=1000)
                if token:
                    kw["ContinuationToken"] = token
                resp = sb._call(f"list s3://{bucket}/{root}",
                                lambda kw=kw: sb._client.list_objects_v2(**kw))
                for o in resp.get("Contents", []):
                    if o["LastModified"].timestamp() < cutoff:
                        count += 1
                        size += int(o["Size"])
                        batch.append(o["Key"])
                        if len(batch) >= DELETE_BATCH:
                            flush()
                if not resp.get("IsTruncated"):
                    break
                token = resp["NextContinuationToken"]
        flush()
    except BackendError as exc:
        raise UserError(f"shared cache {url}: {exc}") from None
    finally:
        sb.close()
    return count, size


def _delete(sb: SharedBucket, bucket: str, keys: list[str]) -> None:
    resp = sb._client.delete_objects(Bucket=bucket, Delete={
        "Objects": [{"Key": k} for k in keys], "Quiet": True})
    errors = resp.get("Errors") or []
    if errors:
        e = errors[0]
        raise UserError(f"could not delete {len(errors)} of {len(keys)} objects, e.g. "
                        f"{e.get('Key')}: {e.get('Code')} {e.get('Message', '')}".rstrip())


def cmd_gc(args: argparse.Namespace) -> int:
    from ..store.sharedobj import LAYOUTS

    age = parse_age(args.older_than)
    n, size = gc(args.url, age, endpoint_url=args.endpoint_url, region=args.region,
                 profile=args.profile, dry_run=args.dry_run)
    verb = "would delete" if args.dry_run else "deleted"
    print(f"neuralcache: {verb} {n} objects ({format_size(size)}) older than "
          f"{args.older_than} from " + " and ".join(
              f"{args.url.rstrip('/')}/{layout}/" for layout in reversed(LAYOUTS)))
    return 0


def add_parser(sub) -> None:
    """``neuralcache shared-cache gc ...`` under the CLI's subcommands."""
    p = sub.add_parser("shared-cache", help="maintain a shared cache bucket (--shared-cache)",
                       description="Maintain the in-region bucket that mounts share with "
                                   "--shared-cache.")
    ssub = p.add_subparsers(dest="action", metavar="ACTION")
    ssub.required = True
    g = ssub.add_parser(
        "gc", help="delete shared cache objects older than an age",
        description="Delete the shared cache's objects (everything under PREFIX/nc2/ "
                    "and, from older releases, PREFIX/nc1/; nothing else) last written "
                    "more than AGE ago.  A block is "
                    "written when a node fetches it from the origin, not when it is read, "
                    "so a block still in use is deleted too and fetched from the origin "
                    "once more by the next node that needs it.  Safe while mounts run.  "
                    "Where the store has "
                    "lifecycle rules, an expiration rule on PREFIX/nc2/ does the same "
                    "without this command.")
    g.add_argument("url", metavar="s3://BUCKET[/PREFIX]", help="the --shared-cache of the mounts")
    g.add_argument("--older-than", required=True, metavar="AGE",
                   help="age of the last write, e.g. 7d, 12h, 30m, 90s")
    g.add_argument("--endpoint-url", metavar="URL", help="S3 endpoint of the bucket "
                   "(default: AWS), as --shared-cache-endpoint")
    g.add_argument("--region", help="region of the bucket (default: the one it reports)")
    g.add_argument("--profile", help="AWS profile (default: $AWS_PROFILE or the default chain)")
    g.add_argument("--dry-run", action="store_true",
                   help="only count what would be deleted")
    g.set_defaults(func=cmd_gc)

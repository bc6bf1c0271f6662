"""The trees of the ``namespace`` scenario, made in code and kept between runs.

* ``imagenet`` on local disk: DIRS x FILES empty files named like ImageNet-1k's train
  set (``train/n01440764/n01440764_10026.JPEG``), the POSIX source;
* the same shape, fewer directories, as objects of a bucket, and a COCO-like flat
  directory (``flat/000000391895.jpg``), in a SeaweedFS of the scenario's own whose
  data directory is kept under ``--data-dir`` (boto3 fills a bucket at a few hundred
  objects/s on 2 cores, obstore at ~700: filling 200k objects takes minutes, once);
* a manifest of many entries, from a generated listing (``neuralcache manifest
  import``).

Each tree is written completely, then a marker file records its shape: a run finding
the marker skips the work.
"""
from __future__ import annotations

import asyncio
import json
import os
from pathlib import Path

# Sizes: (full, --quick).  ImageNet-1k train: 1,000 classes, 1,281,167 images.
SIZES = {
    "posix_dirs": (1000, 100), "posix_files": (1281, 128),
    "s3_dirs": (80, 20), "s3_files": (1281, 128),
    "flat": (100_000, 5000),
    "manifest": (10_000_000, 500_000),
}
# Bytes per object in the bucket (the namespace scenario reads no data; sizes show
# in `ls -l`): a small JPEG's worth would only slow the fill.
OBJECT_BYTES = 100
# Object puts in flight while filling (obstore, async).
FILL_INFLIGHT = 128


def size(name: str, quick: bool) -> int:
    return SIZES[name][1 if quick else 0]


def imagenet_keys(dirs: int, files: int, top: str = "train"):
    for d in range(dirs):
        wnid = f"n{1440764 + d * 9973:08d}"
        for i in range(files):
            yield f"{top}/{wnid}/{wnid}_{10026 + i * 7}.JPEG"


def flat_keys(n: int, top: str = "flat"):
    for i in range(n):
        yield f"{top}/{391895 + i * 13:012d}.jpg"


def _done(marker: Path, shape: dict) -> bool:
    try:
        return json.loads(marker.read_text()) == shape
    except (OSError, ValueError):
        return False


def posix_tree(root: Path, dirs: int, files: int) -> Path:
    """DIRS x FILES empty files under ``root/train`` (kept: a marker names the shape)."""
    marker = root / ".complete"
    shape = {"dirs": dirs, "files": files}
    if not _done(marker, shape):
        for key in imagenet_keys(dirs, files):
            p = root / key
            if not p.parent.is_dir():
                p.parent.mkdir(parents=True, exist_ok=True)
            os.close(os.open(p, os.O_WRONLY | os.O_CREAT, 0o644))
        marker.write_text(json.dumps(shape))
    return root


def fill_bucket(sw, bucket: str, keys: list[str], marker: Path) -> int:
    """Put ``keys`` into ``bucket`` (obstore, FILL_INFLIGHT at once) unless the marker
    says this exact set is there; returns how many were put."""
    shape = {"bucket": bucket, "n": len(keys), "first": keys[0], "last": keys[-1]}
    if _done(marker, shape):
        return 0
    from obstore import put_async
    from obstore.store import S3Store

    s3 = sw.client()
    try:
        s3.create_bucket(Bucket=bucket)
    except Exception:   # noqa: BLE001 -- already there from an interrupted fill
        pass
    store = S3Store(bucket, endpoint=sw.endpoint, access_key_id=sw.access_key,
                    secret_access_key=sw.secret_key, region="us-east-1",
                    virtual_hosted_style_request=False, client_options={"allow_http": True})
    body = b"x" * OBJECT_BYTES

    async def main():
        sem = asyncio.Semaphore(FILL_INFLIGHT)

        async def one(k):
            async with sem:
                await put_async(store, k, body)
        await asyncio.gather(*(one(k) for k in keys))

    asyncio.run(main())
    marker.write_text(json.dumps(shape))
    return len(keys)


def manifest(path: Path, n: int, source: str, cli: list[str]) -> Path:
    """A manifest of ``n`` ImageNet-shaped entries (1,281 per directory), built by the
    product's own ``neuralcache manifest import`` from a generated listing."""
    marker = path.with_suffix(".complete")
    shape = {"n": n}
    if not _done(marker, shape):
        import subprocess

        p = subprocess.Popen([*cli, "manifest", "import", "-", str(path),
                              "--source", source], stdin=subprocess.PIPE, text=True)
        try:
            lines, count = [], 0
            for k in imagenet_keys(-(-n // 1281), 1281, top="m"):
                if count == n:
                    break
                lines.append(f"{k}\t{OBJECT_BYTES}\t1700000000\t{'0' * 32}\n")
                count += 1
                if len(lines) == 65536:
                    p.stdin.write("".join(lines))
                    lines = []
            p.stdin.write("".join(lines))
            p.stdin.close()
        finally:
            if p.wait() != 0:
                raise RuntimeError(f"neuralcache manifest import exited {p.returncode}")
        marker.write_text(json.dumps(shape))
    return path

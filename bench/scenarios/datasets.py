"""Benchmark datasets, generated in code and deterministic from a seed.

Every dataset lives under its own key prefix; the same bytes go to a local directory
(the local-disk baseline, ``DATA/<prefix>/...``) and to the S3 bucket (key
``<prefix>/...``).  Content of a file depends only on (seed, dataset name, relative
path), so two runs with one seed produce identical bytes, and a manifest (size and
xxh3-64 of every file) lets workloads verify what they read.

Datasets (sizes: full / ``--quick``):

* ``shards``   WebDataset-style tar shards, ~8 MB / ~4 MB each, samples are a
  ``KEY.jpg`` (JPEG-sized random payload, 60-140 KB) and a ``KEY.cls`` label.
* ``train``    the same shard format for the training-loop workload.
* ``samples``  ImageNet-like file-per-sample tree: ``nCLASS/IDX.jpg`` of ~100 KB.
* ``bigfile``  one large file (1 GiB / 64 MiB), e.g. model weights.
* ``overflow`` tar shards of 2 MiB totalling twice the scenario's cache size.
* ``fio``      ``fio/JOB.N`` files read by the fio jobs (one per job and job number).
"""
from __future__ import annotations

import concurrent.futures as cf
import io
import json
import os
import tarfile
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable, Iterator

import numpy as np
import xxhash

JPEG_HEAD = b"\xff\xd8\xff\xe0\x00\x10JFIF\x00\x01\x01\x00\x00\x01\x00\x01\x00\x00"

# Objects at least this big are uploaded with multipart (parallel parts).
MULTIPART_MIN = 64 << 20
UPLOAD_THREADS = 16


def _rng(seed: int, *parts: object) -> np.random.Generator:
    key = xxhash.xxh3_64_intdigest(":".join(map(str, (seed, *parts))).encode())
    return np.random.default_rng(key)


def payload(seed: int, name: str, rel: str, size: int) -> bytes:
    """``size`` deterministic random-ish bytes (a JPEG header, then noise)."""
    body = _rng(seed, name, rel, "payload").bytes(size)
    return (JPEG_HEAD + body[len(JPEG_HEAD):])[:size] if size >= len(JPEG_HEAD) else body


def _tar_shard(seed: int, name: str, rel: str, nsamples: int, first_key: int,
               size_lo: int, size_hi: int, nclasses: int) -> bytes:
    rng = _rng(seed, name, rel, "shard")
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.USTAR_FORMAT) as tar:
        for i in range(nsamples):
            key = f"{first_key + i:08d}"
            size = int(rng.integers(size_lo, size_hi))
            label = int(rng.integers(0, nclasses))
            for member, data in ((f"{key}.jpg", payload(seed, name, f"{rel}/{key}", size)),
                                 (f"{key}.cls", b"%d\n" % label)):
                ti = tarfile.TarInfo(member)
                ti.size = len(data)
                ti.mtime = 0
                ti.mode = 0o644
                tar.addfile(ti, io.BytesIO(data))
    return buf.getvalue()


@dataclass
class Dataset:
    """One dataset: a prefix, a kind and its parameters (all JSON-able)."""

    name: str
    kind: str                       # shards | samples | blob
    params: dict = field(default_factory=dict)

    # -- enumeration ------------------------------------------------------------
    def files(self, seed: int) -> Iterator[tuple[str, Callable[[], bytes]]]:
        """(path relative to the dataset prefix, function producing the bytes)."""
        p = self.params
        if self.kind == "shards":
            per = p["samples_per_shard"]
            for i in range(p["shards"]):
                rel = f"shard-{i:05d}.tar"
                yield rel, (lambda rel=rel, i=i: _tar_shard(
                    seed, self.name, rel, per, i * per, p["sample_lo"], p["sample_hi"],
                    p.get("classes", 1000)))
        elif self.kind == "samples":
            rng = _rng(seed, self.name, "sizes")
            sizes = rng.integers(p["size_lo"], p["size_hi"], p["files"])
            for i in range(p["files"]):
                rel = f"n{i % p['classes']:04d}/{i:06d}.jpg"
                yield rel, (lambda rel=rel, s=int(sizes[i]): payload(seed, self.name, rel, s))
        elif self.kind == "blob":
            pats = p.get("pattern", "data.{i}")
            for pat in [pats] if isinstance(pats, str) else pats:
                for i in range(p.get("count", 1)):
                    rel = pat.format(i=i)
                    yield rel, (lambda rel=rel: payload(seed, self.name, rel, p["size"]))
        else:
            raise ValueError(f"unknown dataset kind {self.kind!r}")

    def signature(self, seed: int) -> dict:
        return {"seed": seed, **asdict(self)}


def standard(name: str, quick: bool, cache_mb: int | None = None) -> Dataset:
    """The benchmark's datasets at full or quick size."""
    if name == "shards":
        # 128 shards (~1 GB): at 32 (258 MB) a mount's cold epoch took under a second
        # and its ratio to the libraries moved between 0.70x and 1.16x from run to
        # run (bench/RESULTS.md, issue 20).
        return Dataset("shards", "shards", {"shards": 8 if quick else 128,
                                            "samples_per_shard": 40 if quick else 80,
                                            "sample_lo": 60_000, "sample_hi": 140_000})
    if name == "train":
        return Dataset("train", "shards", {"shards": 6 if quick else 32,
                                           "samples_per_shard": 64 if quick else 128,
                                           "sample_lo": 60_000, "sample_hi": 140_000})
    if name == "samples":
        return Dataset("samples", "samples", {"files": 128 if quick else 1000,
                                              "classes": 8 if quick else 25,
                                              "size_lo": 80_000, "size_hi": 120_000})
    if name == "bigfile":
        return Dataset("bigfile", "blob", {"size": (64 << 20) if quick else (1 << 30),
                                           "pattern": "weights.bin"})
    if name == "overflow":
        # Shards of 2 MiB, so that the cache holds more blocks (128) than the disk
        # tier's eviction looks at (store/disk.py EVICT_SCAN, 64), as a real cache of
        # thousands of blocks does: with 8 MiB shards it held 32, all in reach, and the
        # scenario could not show that the epoch-aware eviction had acted as LRU.
        cache_mb = cache_mb or (16 if quick else 256)
        shard_kb = 512 if quick else 2048
        nshards = 2 * cache_mb * 1024 // shard_kb
        return Dataset("overflow", "shards", {"shards": nshards,
                                              "samples_per_shard": shard_kb * 10 // 1024,
                                              "sample_lo": 80_000, "sample_hi": 120_000,
                                              "cache_mb": cache_mb})
    if name == "fio":
        # One file per fio job and job number (filename_format=$jobname.$jobnum), so
        # each job reads files no earlier job has cached: both cold on one mount.
        return Dataset("fio", "blob", {"size": (8 << 20) if quick else (128 << 20),
                                       "count": 4, "pattern": ["rand128k.{i}", "seq1m.{i}"]})
    raise KeyError(name)


# -- materialising: local directory + manifest -----------------------------------------
def write_atomic(path: Path, data: bytes) -> None:
    """Write ``path`` (and its parents) so that it is never seen half written."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "wb") as f:
        f.write(data)
    os.replace(tmp, path)


def materialize(ds: Dataset, data_dir: Path, seed: int = 0, threads: int = 2) -> dict:
    """Write ``ds`` under ``data_dir/ds.name`` (skipped when an identical copy exists).

    Returns the manifest ``{"signature": .., "files": {rel: {"size", "xxh3"}}}``.
    """
    root = Path(data_dir) / ds.name
    mpath = Path(data_dir) / f".manifest-{ds.name}.json"
    sig = ds.signature(seed)
    if mpath.exists():
        try:
            man = json.loads(mpath.read_text())
            if man["signature"] == sig and all(
                    (root / rel).is_file() and (root / rel).stat().st_size == m["size"]
                    for rel, m in man["files"].items()):
                return man
        except (ValueError, KeyError, OSError):
            pass
    root.mkdir(parents=True, exist_ok=True)

    def make(item):
        rel, gen = item
        data = gen()
        write_atomic(root / rel, data)
        return rel, {"size": len(data), "xxh3": xxhash.xxh3_64_hexdigest(data)}

    with cf.ThreadPoolExecutor(threads) as ex:
        files = dict(ex.map(make, ds.files(seed)))
    man = {"signature": sig, "files": files}
    mpath.write_text(json.dumps(man))
    return man


def total_bytes(manifest: dict) -> int:
    return sum(m["size"] for m in manifest["files"].values())


# -- uploading to S3 -----------------------------------------------------------------------
def upload(ds: Dataset, manifest: dict, data_dir: Path, s3, bucket: str,
           threads: int = UPLOAD_THREADS) -> int:
    """Put the local copy into ``bucket`` under ``ds.name/``; returns bytes uploaded.

    Objects already present with the right size are skipped (a persistent server).
    """
    from boto3.s3.transfer import TransferConfig

    have: dict[str, int] = {}
    for page in s3.get_paginator("list_objects_v2").paginate(Bucket=bucket,
                                                            Prefix=ds.name + "/"):
        for o in page.get("Contents", []):
            have[o["Key"]] = o["Size"]
    root = Path(data_dir) / ds.name
    todo = [(rel, m["size"]) for rel, m in manifest["files"].items()
            if have.get(f"{ds.name}/{rel}") != m["size"]]
    cfg = TransferConfig(multipart_threshold=MULTIPART_MIN, multipart_chunksize=16 << 20,
                         max_concurrency=threads)

    def put(item):
        rel, size = item
        key = f"{ds.name}/{rel}"
        if size >= MULTIPART_MIN:
            s3.upload_file(str(root / rel), bucket, key, Config=cfg)
        else:
            s3.put_object(Bucket=bucket, Key=key, Body=(root / rel).read_bytes())
        return size

    big = [t for t in todo if t[1] >= MULTIPART_MIN]
    small = [t for t in todo if t[1] < MULTIPART_MIN]
    n = sum(put(t) for t in big)
    with cf.ThreadPoolExecutor(threads) as ex:
        n += sum(ex.map(put, small))
    return n


# -- tar parsing shared by workloads -------------------------------------------------------
def iter_tar_samples(f, chunk: int = 1 << 20) -> Iterator[tuple[str, bytes, int | None]]:
    """Stream a WebDataset shard: yields (key, jpg bytes, label) per sample."""
    tar = tarfile.open(fileobj=f, mode="r|", bufsize=chunk)
    cur_key, jpg, label = None, None, None
    for ti in tar:
        if not ti.isfile():
            continue
        key, _, ext = ti.name.rpartition(".")
        data = tar.extractfile(ti).read()
        if key != cur_key and cur_key is not None:
            yield cur_key, jpg, label
            jpg, label = None, None
        cur_key = key
        if ext == "jpg":
            jpg = data
        elif ext == "cls":
            label = int(data)
    if cur_key is not None:
        yield cur_key, jpg, label

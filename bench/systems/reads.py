"""How every workload reads through a system and checks what it read.

Sequential readers read ``READ_CHUNK`` (1 MiB) at a time; the file-per-sample readers
are ``SAMPLE_THREADS`` (8); an epoch's order is ``shuffled(files, seed)``; every byte is
checked against the manifest's xxh3-64.  A mount that takes hints gets the epoch's order
first (``publish_hints``, what ``neuralcache.torch.HintingSampler`` does).  The mounts'
workloads (bench/scenarios/) and the peers' own (peers.py) share these.
"""
from __future__ import annotations

import random
from pathlib import Path

import xxhash

READ_CHUNK = 1 << 20     # sequential readers read 1 MiB at a time
SAMPLE_THREADS = 8       # "8 parallel readers" of the file-per-sample workload


def read_hashed(path: Path, chunk: int = READ_CHUNK) -> tuple[int, str]:
    """Read ``path`` to the end in ``chunk`` reads; (bytes read, xxh3_64 hex digest)."""
    h = xxhash.xxh3_64()
    n = 0
    with open(path, "rb", buffering=0) as f:
        while b := f.read(chunk):
            h.update(b)
            n += len(b)
    return n, h.hexdigest()


def read_verify(path: Path, expect: str | None, chunk: int = READ_CHUNK) -> tuple[int, bool]:
    """Read ``path`` to the end; (bytes read, xxh3 matched or nothing to check)."""
    n, got = read_hashed(path, chunk)
    return n, (expect is None or got == expect)


def shuffled(files: list[str], seed: int) -> list[str]:
    """``files`` sorted, then shuffled by ``seed`` (an epoch's read order)."""
    out = sorted(files)
    random.Random(seed).shuffle(out)
    return out


def publish_hints(root: Path, ds_name: str, order: list[str]) -> None:
    """What a sampler wrapper does (neuralcache.torch.HintingSampler): hand the epoch's
    order to the mount before reading it.  Timed as part of the epoch."""
    from neuralcache.hints import publish_order

    publish_order(str(root), [f"{ds_name}/{rel}" for rel in order])

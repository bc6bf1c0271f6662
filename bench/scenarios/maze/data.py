"""The maze training set on disk, written two ways, and the PyTorch datasets that read it.

Layout under ``out_dir`` (the same bytes whether it is a local directory or one the
harness then uploads to S3)::

    manifest.json                    config + {relative path: {"size", "xxh64"}} for every file
    mazes/000/000000.bin ...         one small file per maze (the demo's default layout)
    shards/shard-000000.tar ...      WebDataset-style tar shards, members NNNNNN.tokens

A record (one ``.bin`` file, or one ``.tokens`` tar member; the bytes are identical)::

    b"NCMZ" | u8 version | u8 rows | u8 cols | u8 answer format (0 path, 1 walk) | u32 index
    | u16 n_tokens | u16 prompt_len
    | n_tokens x u16 token ids (little endian) | zero padding up to ``pad_to`` bytes (optional)

Everything is a pure function of (seed, rows, cols, n_train, shard_size, pad_to): two
``write_dataset`` calls with the same arguments produce byte-identical trees (tar members
carry mtime 0, uid/gid 0, empty owner names).
"""
from __future__ import annotations

import io
import json
import os
import random
import struct
import tarfile
from pathlib import Path

import xxhash

from bench.scenarios.datasets import write_atomic

from . import mazes

MAGIC = b"NCMZ"
VERSION = 1
HEADER = struct.Struct("<4sBBBBIHH")  # 16 bytes
MANIFEST = "manifest.json"
FILES_DIR = "mazes"
SHARDS_DIR = "shards"
PER_DIR = 1000  # files per subdirectory of mazes/


def file_relpath(i: int) -> str:
    return f"{FILES_DIR}/{i // PER_DIR:03d}/{i:06d}.bin"


def shard_relpath(k: int) -> str:
    return f"{SHARDS_DIR}/shard-{k:06d}.tar"


def member_name(i: int) -> str:
    return f"{i:06d}.tokens"


def encode_record(index: int, maze: mazes.Maze, pad_to: int = 0,
                  fmt: str = mazes.DEFAULT_FORMAT) -> bytes:
    toks = mazes.to_tokens(maze, fmt)
    body = HEADER.pack(MAGIC, VERSION, maze.rows, maze.cols, mazes.FORMATS.index(fmt), index, len(toks),
                       mazes.prompt_length(maze.rows, maze.cols))
    body += struct.pack(f"<{len(toks)}H", *toks)
    if pad_to > len(body):
        body += bytes(pad_to - len(body))
    return body


def decode_record(buf: bytes) -> tuple[int, list[int], int]:
    """-> (index, tokens, prompt_len); raises ValueError on a damaged record."""
    if len(buf) < HEADER.size:
        raise ValueError(f"record too short ({len(buf)} bytes)")
    magic, ver, _rows, _cols, _z, index, ntok, plen = HEADER.unpack_from(buf)
    if magic != MAGIC or ver != VERSION:
        raise ValueError("not a maze record")
    end = HEADER.size + 2 * ntok
    if len(buf) < end:
        raise ValueError("truncated record")
    return index, list(struct.unpack_from(f"<{ntok}H", buf, HEADER.size)), plen


def training_tasks(seed: int, rows: int, cols: int, n: int, eval_seed: int):
    """Yield (index, maze) for the training set, skipping any task equal to an eval task.

    Returns the skipped stream indices through the generator's StopIteration value.
    """
    banned = {m.key() for m in mazes.eval_set(rows, cols, eval_seed)}
    j = 0
    skipped = []
    produced = 0
    while produced < n:
        m = mazes.make_task(seed, mazes.TRAIN, j, rows, cols)
        if m.key() in banned:
            skipped.append(j)
        else:
            yield produced, m
            produced += 1
        j += 1
    return skipped


def _tarinfo(name: str, size: int) -> tarfile.TarInfo:
    ti = tarfile.TarInfo(name)
    ti.size = size
    ti.mtime = 0
    ti.mode = 0o644
    ti.uid = ti.gid = 0
    ti.uname = ti.gname = ""
    return ti


def write_dataset(out_dir, *, seed: int = 0, rows: int = 5, cols: int = 5, n_train: int = 50_000,
                  layouts=("files", "shards"), shard_size: int = 2048, pad_to: int = 0,
                  eval_seed: int = 1_000_003, fmt: str = mazes.DEFAULT_FORMAT) -> dict:
    """Write the training set under out_dir and return the manifest (also written)."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    files: dict[str, dict] = {}

    def put(rel: str, data: bytes) -> None:
        write_atomic(out / rel, data)
        files[rel] = {"size": len(data), "xxh64": xxhash.xxh64_hexdigest(data)}

    gen = training_tasks(seed, rows, cols, n_train, eval_seed)
    shard_buf: io.BytesIO | None = None
    shard_tar: tarfile.TarFile | None = None
    n_shards = 0
    skipped: list[int] = []
    while True:
        try:
            i, maze = next(gen)
        except StopIteration as stop:
            skipped = stop.value or []
            break
        rec = encode_record(i, maze, pad_to, fmt)
        if "files" in layouts:
            put(file_relpath(i), rec)
        if "shards" in layouts:
            if shard_tar is None:
                shard_buf = io.BytesIO()
                shard_tar = tarfile.open(fileobj=shard_buf, mode="w", format=tarfile.USTAR_FORMAT)
            shard_tar.addfile(_tarinfo(member_name(i), len(rec)), io.BytesIO(rec))
            if (i + 1) % shard_size == 0 or i + 1 == n_train:
                shard_tar.close()
                put(shard_relpath(n_shards), shard_buf.getvalue())
                n_shards += 1
                shard_tar = None
    manifest = {
        "format": "neuralcache-maze", "version": VERSION,
        "seed": seed, "rows": rows, "cols": cols, "n_train": n_train,
        "eval_seed": eval_seed, "n_eval": 64,
        "skipped_eval_collisions": skipped,
        "answer_format": fmt,
        "prompt_len": mazes.prompt_length(rows, cols),
        "vocab_size": mazes.vocab_size(rows, cols),
        "pad_to": pad_to, "layouts": list(layouts),
        "shard_size": shard_size, "n_shards": n_shards,
        "total_bytes": sum(f["size"] for f in files.values()),
        "files": dict(sorted(files.items())),
    }
    write_atomic(out / MANIFEST, json.dumps(manifest, indent=1).encode())
    return manifest


def load_manifest(root) -> dict:
    with open(Path(root) / MANIFEST, "rb") as f:
        return json.loads(f.read())


def verify(root, manifest: dict | None = None) -> list[str]:
    """Return the relative paths whose size or xxh64 differ from the manifest."""
    manifest = manifest or load_manifest(root)
    bad = []
    for rel, meta in manifest["files"].items():
        try:
            data = (Path(root) / rel).read_bytes()
        except OSError:
            bad.append(rel)
            continue
        if len(data) != meta["size"] or xxhash.xxh64_hexdigest(data) != meta["xxh64"]:
            bad.append(rel)
    return bad


# ---- readers (torch is imported lazily so the writer works without it) ----------------
def _sample(buf: bytes) -> dict:
    index, toks, plen = decode_record(buf)
    return {"index": index, "tokens": toks, "prompt_len": plen,
            "digest": xxhash.xxh64_intdigest(buf), "nbytes": len(buf)}


def collate(samples: list[dict]):
    """Right-pad to the longest sequence; labels are -100 except on the path tokens."""
    import torch

    length = max(len(s["tokens"]) for s in samples)
    x = torch.full((len(samples), length), mazes.PAD, dtype=torch.long)
    y = torch.full((len(samples), length), -100, dtype=torch.long)
    for r, s in enumerate(samples):
        t = torch.tensor(s["tokens"], dtype=torch.long)
        x[r, :len(t)] = t
        y[r, s["prompt_len"]:len(t)] = t[s["prompt_len"]:]
    return {"input_ids": x, "labels": y,
            "index": [s["index"] for s in samples],
            "digest": [s["digest"] for s in samples],
            "nbytes": sum(s["nbytes"] for s in samples)}


def file_dataset(root, n: int):
    """Map-style dataset: item i is the file mazes/.../i.bin under root, read whole."""
    from torch.utils.data import Dataset

    class MazeFiles(Dataset):
        def __init__(self):
            self.root = str(root)
            self.n = n

        def __len__(self):
            return self.n

        def __getitem__(self, i):
            with open(os.path.join(self.root, file_relpath(i)), "rb") as f:
                return _sample(f.read())

    return MazeFiles()


def shard_dataset(root, n_shards: int, seed: int, shuffle_buffer: int = 256):
    """Infinite iterable over the tar shards, WebDataset-style.

    Epoch e: the shard list is shuffled from (seed, e); worker w of W streams shards
    w, w+W, ... of that order (sequential reads through tarfile's stream mode) and passes
    members through a seeded shuffle buffer. Every stream is a function of the seed and the
    worker id, and the DataLoader takes batches from workers round-robin, so the batch
    sequence is deterministic for a given number of workers.
    """
    from torch.utils.data import IterableDataset, get_worker_info

    class MazeShards(IterableDataset):
        def __iter__(self):
            info = get_worker_info()
            wid, nw = (info.id, info.num_workers) if info else (0, 1)
            if n_shards < nw:
                raise ValueError(f"{n_shards} shards cannot feed {nw} workers")
            rng = random.Random(f"shards:{seed}:{wid}")
            buf: list[dict] = []
            epoch = 0
            while True:
                for k in shard_order(n_shards, seed, epoch)[wid::nw]:
                    with open(os.path.join(str(root), shard_relpath(k)), "rb") as f:
                        with tarfile.open(fileobj=f, mode="r|") as tar:
                            for ti in tar:
                                data = tar.extractfile(ti).read()
                                buf.append(_sample(data))
                                if len(buf) >= shuffle_buffer:
                                    yield buf.pop(rng.randrange(len(buf)))
                epoch += 1

    return MazeShards()


def shard_order(n_shards: int, seed: int, epoch: int) -> list[int]:
    order = list(range(n_shards))
    random.Random(f"shard-order:{seed}:{epoch}").shuffle(order)
    return order

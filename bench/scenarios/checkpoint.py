"""The ``checkpoint`` scenario: save a checkpoint through each system, make it durable on
the remote, and reload it cold (issue 12's bench).

    python -m bench run --scenario checkpoint [--quick] [--systems link,local,neuralcache,...]

The checkpoint (``Payload``) is 1 GiB (``--quick``: 128 MiB): a state dict of 16 random
float32 tensors written with ``torch.save`` when torch is importable, else plain bytes in
8 MiB writes.  ``torch.save`` puts a random id into every file, so no two saves are the
same bytes: each save hashes (xxh3-64) what it writes as it writes it, and that digest is
what the remote copy must match.

Per system, mounted writable (``MountOptions(writable=True)``) with an empty cache:

* ``save``: ``torch.save`` into ``MNT/checkpoint/SYSTEM/model.pt`` (open, write, close;
  s3torchconnector: into ``S3Checkpoint.writer(uri)``): the time until it returns;
* ``durable``: from the start of the save until the remote holds it: local ``fsync``; a
  mount with a barrier runs it (``neuralcache sync MNT``); then, for every remote system,
  the object is polled straight at SeaweedFS (not through the link) until it is there with
  its size (rclone uploads after close; s3fs and S3Checkpoint upload in close, so the
  first poll finds it).  Untimed, the object's bytes are checked against the digest;
* ``reload``: in a second pass, each system mounted fresh again (empty cache, page cache
  dropped): ``torch.load`` and every tensor compared (xxh3) with the one saved.
A digest that does not match is an error row.

The ``link`` rows: ``durable`` = a boto3 multipart upload of the same bytes through the
WAN proxy (8 MiB parts, 32 in flight, connections opened before the clock): the upload
ceiling; ``reload`` = the ranged-GET download of that object (``link_fetch``).
Each system's ratios (close / local's close, durable / link upload, reload MB/s / link
download MB/s) are fields of its rows and one note per system.
"""
from __future__ import annotations

import concurrent.futures as cf
import importlib.util
import os
import random
import shutil
import time
from pathlib import Path

import xxhash

from bench.systems.base import MountOptions, Mounted
from bench.systems.link import LINK_RANGE, link_fetch
from bench.systems.pagecache import drop_page_cache
from bench.systems.reads import read_hashed

SCENARIO = "checkpoint"
PREFIX = "checkpoint"          # keys: checkpoint/SYSTEM/model.pt; local: DATA/checkpoint/...
FILE = "model.pt"
FULL_BYTES = 1 << 30
QUICK_BYTES = 128 << 20
TENSORS = 16                   # the state dict: 16 float32 tensors [rows, 1024]
WRITE = 8 << 20                # without torch: plain bytes in 8 MiB writes
POLL_S = 0.05                  # how often the bucket is asked whether the object is there
# Link upload ceiling: parts in flight.  512 MiB through the 60 ms proxy, 8 MiB parts,
# here: 8 / 16 / 32 / 64 in flight gave 93-153 / 124-149 / 157-159 / 74-152 MB/s (two
# checksum settings; SeaweedFS on the same 2 cores makes any one run noisy).
UPLOAD_CONCURRENCY = 32


class _Tee:
    """A write-only file object: hashes (xxh3-64) and counts what it passes to ``f``."""

    def __init__(self, f):
        self.f = f
        self.h = xxhash.xxh3_64()
        self.n = 0

    def write(self, b) -> int:
        self.h.update(b)
        self.f.write(b)
        n = memoryview(b).nbytes
        self.n += n
        return n

    def flush(self) -> None:
        self.f.flush()

    def writable(self) -> bool:
        return True


class Payload:
    """The checkpoint: ``save(f)`` writes it to a binary file object and returns
    ``{"bytes", "xxh3"}`` of what it wrote; ``load(src)`` (a path or a readable file
    object) reads it back and returns how many tensors (or streams) differ."""

    def __init__(self, nbytes: int, seed: int):
        self.torch = importlib.util.find_spec("torch") is not None
        self.nbytes = nbytes
        if self.torch:
            import torch
            g = torch.Generator().manual_seed(seed)
            rows = nbytes // TENSORS // 4 // 1024
            self.state = {f"layers.{i}.weight": torch.rand(rows, 1024, generator=g)
                          for i in range(TENSORS)}
            self.digests = {k: xxhash.xxh3_64_hexdigest(t.numpy())
                            for k, t in self.state.items()}
        else:
            rnd = random.Random(seed)
            self.chunks = [rnd.randbytes(WRITE) for _ in range(nbytes // WRITE)]
            h = xxhash.xxh3_64()
            for c in self.chunks:
                h.update(c)
            self.digest = h.hexdigest()

    def describe(self) -> str:
        if self.torch:
            import torch
            t = next(iter(self.state.values()))
            return (f"a state dict of {TENSORS} random float32 tensors {list(t.shape)} "
                    f"({self.nbytes / 2**20:.0f} MiB), torch.save / torch.load "
                    f"(torch {torch.__version__}, weights_only=True)")
        return (f"{self.nbytes / 2**20:.0f} MiB of random bytes in {WRITE >> 20} MiB writes "
                "and reads (torch not importable)")

    def save(self, f) -> dict:
        tee = _Tee(f)
        if self.torch:
            import torch
            torch.save(self.state, tee)
        else:
            for c in self.chunks:
                tee.write(c)
        return {"bytes": tee.n, "xxh3": tee.h.hexdigest()}

    def load(self, src) -> int:
        if self.torch:
            import torch
            got = torch.load(src, map_location="cpu", weights_only=True)
            bad = sum(k not in got or xxhash.xxh3_64_hexdigest(got[k].numpy()) != d
                      for k, d in self.digests.items())
            return bad + len(set(got) - set(self.digests))
        f = open(src, "rb", buffering=0) if isinstance(src, (str, Path)) else src
        try:
            h = xxhash.xxh3_64()
            n = 0
            while b := f.read(WRITE):
                h.update(b)
                n += len(b)
        finally:
            if f is not src:
                f.close()
        return int(h.hexdigest() != self.digest or n != self.nbytes)

    def blob(self) -> tuple[bytes, str]:
        """One save into memory (the link row's bytes) and its digest."""
        import io
        buf = io.BytesIO()
        d = self.save(buf)
        return buf.getvalue(), d["xxh3"]


def _key(system: str) -> str:
    return f"{PREFIX}/{system}/{FILE}"


def _clock(fn, unit: str, nbytes: int, marks: dict | None = None) -> dict:
    """``fn()`` timed; a row's seconds (= value), unit and bytes, plus what fn returns.
    ``marks`` gets the start and end (``time.monotonic()``)."""
    t0 = time.monotonic()
    out = fn() or {}
    t1 = time.monotonic()
    if marks is not None:
        marks.update(t0=t0, t1=t1)
    return {"seconds": t1 - t0, "value": t1 - t0, "unit": unit, "bytes": nbytes, **out}


# Row fields that describe reads (Ctx.measure adds them); a write phase drops them so
# that the table's MB/s and x link columns stay those of reads.
_READ_FIELDS = ("mbps", "byte_hit_rate_est", "hit_rate", "served_by_page_cache",
                "prefetch_precision")
_CPU = ("cpu_s", "cpu_client_s", "cpu_daemon_s")
_LINK = {"link_bytes_up": "bytes_up", "link_bytes_down": "bytes_down",
         "link_connections": "connections"}


def _write_row(r: dict) -> dict:
    r = {k: v for k, v in r.items() if k not in _READ_FIELDS}
    r["write_mbps"] = r["bytes"] / max(r["seconds"], 1e-9) / 1e6
    return r


def _object_digest(s3, bucket: str, key: str) -> tuple[int, str]:
    """Size and xxh3-64 of an object, read straight from SeaweedFS."""
    body = s3.get_object(Bucket=bucket, Key=key)["Body"]
    h = xxhash.xxh3_64()
    n = 0
    for b in body.iter_chunks(WRITE):
        h.update(b)
        n += len(b)
    return n, h.hexdigest()


def _mismatch(got: tuple[int, str], nbytes: int, digest: str, where: str) -> str | None:
    if got == (nbytes, digest):
        return None
    return (f"{where}: {got[0]} bytes xxh3 {got[1]} != written {nbytes} bytes xxh3 "
            f"{digest}")


def _wait_in_bucket(ctx, key: str, nbytes: int) -> dict:
    """Poll SeaweedFS (not through the link) until ``key`` is there with ``nbytes``."""
    t0 = time.monotonic()
    polls = 0
    while True:
        polls += 1
        try:
            if ctx.s3.head_object(Bucket=ctx.bucket, Key=key)["ContentLength"] == nbytes:
                return {"polls": polls, "polled_s": time.monotonic() - t0}
        except Exception as exc:   # 404 until it lands
            if getattr(exc, "response", {}).get("Error", {}).get("Code") not in (
                    "404", "NoSuchKey", "NotFound"):
                raise
        if time.monotonic() - t0 > ctx.timeout_s:
            raise TimeoutError(f"{key} not in the bucket with {nbytes} bytes after "
                               f"{ctx.timeout_s:.0f} s")
        time.sleep(POLL_S)


def _durable(ctx, m: Mounted, path: Path | None, key: str, nbytes: int) -> dict:
    """Make the save durable the system's way; what it took."""
    if not m.remote:
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
        fd = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
        return {"durable_by": "fsync"}
    t0 = time.monotonic()
    barrier = m.sync()
    out = {"durable_by": "sync" if barrier else "close", "sync_s": time.monotonic() - t0}
    out.update(_wait_in_bucket(ctx, key, nbytes))
    if out["polls"] > 1:
        out["durable_by"] = "upload after close (polled)"
    return out


def _save_rows(ctx, m: Mounted, payload: Payload) -> list[dict]:
    """save (until close returns) and durable (until the remote has it), then check the
    bytes that landed."""
    key = _key(m.name)
    path = None
    if m.kind == "client":
        ck = m.client.checkpoint()
        uri = m.client.uri(key)

        def save():
            with ck.writer(uri) as w:
                return payload.save(w)
    else:
        path = m.root / key
        path.parent.mkdir(parents=True, exist_ok=True)

        def save():
            with open(path, "wb") as f:
                return payload.save(f)
    # Every save starts with nothing dirty on the machine: the system before it (and
    # SeaweedFS storing its upload) can leave a GiB of dirty pages whose writeback
    # throttles this save (the kernel's dirty limits), which made close() times depend
    # on the order of the systems (bench/RESULTS.md, "Round 2, seventh sitting").
    os.sync()
    # durable counts from the start of the save to the end of the wait, including the
    # harness's own moment between the two measurements (uploads go on meanwhile), and
    # every byte the link carried in that span
    p0, ms, mw = ctx.proxy.stats(), {}, {}
    s = _write_row(ctx.measure(m, "save", lambda: _clock(save, "s close", payload.nbytes,
                                                        ms)))
    w = ctx.measure(m, "durable", lambda: _clock(
        lambda: _durable(ctx, m, path, key, s["bytes"]), "s durable", s["bytes"], mw))
    p1 = ctx.proxy.stats()
    d = _write_row({**w, **{k: s.get(k, 0) + w.get(k, 0) for k in _CPU},
                    **{k: p1[v] - p0[v] for k, v in _LINK.items()},
                    "seconds": mw["t1"] - ms["t0"], "wait_s": w["seconds"],
                    "close_s": s["seconds"], "xxh3": s["xxh3"]})
    d["value"] = d["seconds"]
    got = (read_hashed(path, WRITE) if not m.remote
           else _object_digest(ctx.s3, ctx.bucket, key))
    err = _mismatch(got, s["bytes"], s["xxh3"], "the local file" if not m.remote
                    else f"s3://{ctx.bucket}/{key}")
    if err:
        return [s, {"phase": "durable", "error": err}]
    return [s, d]


def _reload_rows(ctx, m: Mounted, payload: Payload, nbytes: int) -> list[dict]:
    """The checkpoint this system saved, loaded through a fresh mount, verified."""
    key = _key(m.name)
    if m.kind == "client":
        ck = m.client.checkpoint()
        uri = m.client.uri(key)
        dropped = drop_page_cache()

        def load():
            with ck.reader(uri) as r:
                return payload.load(r)
    else:
        path = m.root / key
        dropped = drop_page_cache([path], level=3)

        def load():
            return payload.load(path)
    r = ctx.measure(m, "reload", lambda: _clock(lambda: {"verify_errors": load()},
                                                "MB/s", nbytes))
    r["reload_s"] = r["seconds"]
    r["value"] = r["mbps"]
    r["page_cache_drop"] = dropped
    if r["verify_errors"]:
        return [{"phase": "reload", "error": f"reloaded checkpoint differs from the one "
                 f"saved: {r['verify_errors']} tensors (or streams) with another xxh3"}]
    return [r]


def link_upload(s3, bucket: str, key: str, data: bytes,
                concurrency: int = UPLOAD_CONCURRENCY, part: int = LINK_RANGE) -> dict:
    """``data`` as one multipart upload through ``s3`` (the proxy), ``part``-byte parts,
    ``concurrency`` in flight, connections opened before the clock: the upload ceiling."""
    n = max(1, -(-len(data) // part))
    with cf.ThreadPoolExecutor(concurrency) as ex:
        list(ex.map(lambda _: s3.head_bucket(Bucket=bucket), range(concurrency)))
        t0 = time.monotonic()
        up = s3.create_multipart_upload(Bucket=bucket, Key=key)["UploadId"]

        def put(i):
            body = data[i * part:(i + 1) * part]
            r = s3.upload_part(Bucket=bucket, Key=key, UploadId=up, PartNumber=i + 1,
                               Body=body)
            # botocore >= 1.36 sends a CRC32 per part; completing then names it too
            return {"PartNumber": i + 1, "ETag": r["ETag"],
                    **{k: r[k] for k in ("ChecksumCRC32",) if r.get(k)}}
        parts = list(ex.map(put, range(n)))
        s3.complete_multipart_upload(Bucket=bucket, Key=key, UploadId=up,
                                     MultipartUpload={"Parts": parts})
    dt = time.monotonic() - t0
    return {"seconds": dt, "value": dt, "unit": "s upload", "bytes": len(data),
            "requests": n + 2, "parts_in_flight": concurrency}


def _link_rows(ctx, payload: Payload) -> list[dict]:
    """The link's upload (durable) and download (reload) of one save's bytes."""
    rows: list[dict] = []
    base = {"scenario": SCENARIO, "system": "link"}
    key = _key("link")
    data, digest = payload.blob()
    err = "upload failed"
    with ctx.failure_as_row(rows, base, "durable"):
        # untimed: SeaweedFS grows its volumes on the first big writes of a run (the link
        # row comes first; in a full run that halved its rate), so write once before
        warm = _key("link-warmup")
        t0 = time.monotonic()
        link_upload(ctx.s3, ctx.bucket, warm, data)
        warmup_s = time.monotonic() - t0
        ctx.s3.delete_object(Bucket=ctx.bucket, Key=warm)
        r = ctx.measure(None, "durable", lambda: link_upload(ctx.s3_link, ctx.bucket, key,
                                                             data))
        r["warmup_direct_s"] = warmup_s
        err = _mismatch(_object_digest(ctx.s3, ctx.bucket, key), len(data), digest,
                        f"s3://{ctx.bucket}/{key}")
        rows.append({**base, **({"phase": "durable", "error": err} if err else r)})
    if err:
        return rows
    manifest = {"files": {FILE: {"size": len(data), "xxh3": digest}}}
    data = None                        # 1 GiB: not needed for the download
    with ctx.failure_as_row(rows, base, "reload"):
        r = ctx.measure(None, "reload", lambda: link_fetch(
            ctx.s3_link, ctx.bucket, f"{PREFIX}/link", manifest))
        r["value"], r["unit"] = r["mbps"], "MB/s"
        rows.append({**base, **(r if not r["verify_errors"] else {
            "phase": "reload", "error": "the link download differs from the upload"})})
    return rows


def _clear(ctx) -> None:
    """Remove what an earlier run left (--keep-seaweed): durable = the new object."""
    pages = ctx.s3.get_paginator("list_objects_v2").paginate(Bucket=ctx.bucket,
                                                              Prefix=PREFIX + "/")
    for page in pages:
        for o in page.get("Contents", []):
            ctx.s3.delete_object(Bucket=ctx.bucket, Key=o["Key"])
    shutil.rmtree(Path(ctx.data_dir) / PREFIX, ignore_errors=True)


def _ratios(ctx, rows: list[dict]) -> None:
    """close / local close, durable / link upload, reload MB/s / link download: fields
    of the rows and one note per system."""
    def get(system, phase):
        return next((r for r in rows if r["system"] == system and r["phase"] == phase
                     and "error" not in r), None)
    up, down, local = get("link", "durable"), get("link", "reload"), get("local", "save")
    # local's close + fsync: where a journaled close() (NeuralCache's) stands like for like
    local_durable = get("local", "durable")
    for system in dict.fromkeys(r["system"] for r in rows if r["system"] != "link"):
        s, d, rl = get(system, "save"), get(system, "durable"), get(system, "reload")
        parts = []
        if s:
            if local:
                s["x_local_close"] = s["seconds"] / max(local["seconds"], 1e-9)
            if local_durable and system != "local":
                s["x_local_durable"] = s["seconds"] / max(local_durable["seconds"], 1e-9)
            vs = [f"{s[k]:.2f}x {what}" for k, what in (
                ("x_local_close", "local"), ("x_local_durable", "local close + fsync"))
                if k in s]
            parts.append(f"close {s['seconds']:.2f} s" + (f" ({', '.join(vs)})" if vs else ""))
        if d:
            if up and system != "local":
                d["x_link_upload"] = d["seconds"] / max(up["seconds"], 1e-9)
            parts.append(f"durable {d['seconds']:.2f} s"
                         + (f" ({d['x_link_upload']:.2f}x link upload)"
                            if "x_link_upload" in d else "")
                         + f" by {d['durable_by']}")
        if rl:
            if down:
                rl["x_link_download"] = rl["mbps"] / max(down["mbps"], 1e-9)
            parts.append(f"reload {rl['mbps']:.0f} MB/s"
                         + (f" ({rl['x_link_download']:.2f}x link download)"
                            if down else ""))
        if d and system != "local":
            parts.append(f"{d['link_bytes_up'] / 1e6:.0f} MB up the link")
        if parts:
            ctx.notes.append(f"checkpoint {system}: " + ", ".join(parts))


def scenario(ctx) -> list[dict]:
    """Checkpoint save + reload (1 GiB / 128 MiB): close, durable on the remote, cold reload."""
    payload = Payload(QUICK_BYTES if ctx.quick else FULL_BYTES, ctx.seed)
    _clear(ctx)
    link = ["link"] if "link" in ctx.systems else []
    ctx.notes.append(
        f"checkpoint: {payload.describe()}; mounts writable (neuralcache --writable, "
        "rclone --vfs-cache-mode writes, s3fs rw), s3torchconnector S3Checkpoint; durable = "
        "local fsync / neuralcache sync / the object in the bucket (polled at SeaweedFS); "
        "reload through a fresh mount, page cache dropped; every save hashed as written "
        "and checked in the bucket and after reload"
        + ("; link = boto3 multipart upload (durable) and ranged GETs (reload) of the "
           "same bytes" if link else ""))
    rows = _link_rows(ctx, payload) if link else []
    opts = MountOptions(writable=True)
    systems = [s for s in ctx.systems if s != "link"]
    saved = ctx.each_mounted(SCENARIO, systems, lambda c, m: _save_rows(c, m, payload),
                             opts=opts, phase="save", step="save")
    rows += saved
    durable = {r["system"]: r["bytes"] for r in saved
               if r.get("phase") == "durable" and "error" not in r}
    rows += ctx.each_mounted(SCENARIO, [s for s in systems if s in durable],
                             lambda c, m: _reload_rows(c, m, payload, durable[m.name]),
                             opts=opts, phase="reload", step="reload (fresh mount)")
    _ratios(ctx, rows)
    shutil.rmtree(Path(ctx.data_dir) / PREFIX, ignore_errors=True)   # the local copy
    return rows

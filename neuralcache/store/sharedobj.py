"""The shared tier's objects (store/shared.py): their names, the block format and the
bucket client.

``block_name`` hashes (source identity, full object key, version/ETag, block size, block
index); ``pack``/``unpack`` write and read ``b"NCS1" | u32 header length | header JSON |
data``; ``claim``/``parse_claim`` the claim a node puts at a block's name while it
fetches the block from the origin (``b"NCC1" | JSON``); ``SharedBucket`` is S3Backend's signing, region discovery and error table plus
whole-object GET, PUT (optionally create-only) and DELETE.  What the tier does with
them: store/shared.py's docstring.  Also: how every node names its origin
(``source_identity``) and what a claim says (``parse_claim``).
"""
from __future__ import annotations

import json
import struct

import urllib3
import xxhash

from ..backends import retry
from ..backends.s3 import _XML_CODE, S3Backend
from ..errors import Unavailable, UserError

MAGIC = b"NCS1"
_HEAD = struct.Struct("<4sI")
# Largest header accepted (JSON of a few names; keys are at most 1 KiB on S3).
MAX_HEADER = 16 << 10
# A block's name holds its claim until the block replaces it: "I am fetching this block
# from the origin" (JSON: node, wall-clock time, whether a cross-file prefetch took it).
CLAIM_MAGIC = b"NCC1"
# Top-level folder under the prefix; bump on format changes.  nc1 kept leases as objects
# of their own (PREFIX/nc1/leases/<h>) beside the blocks; nc2 puts the claim at the
# block's name (one object per block; a cold miss is one request).
LAYOUT = "nc2"
# Every layout a NeuralCache release has written (``shared-cache gc`` deletes them all:
# the blocks of an older release are never read by this one).
LAYOUTS = ("nc1", LAYOUT)


def parse_shared_url(url: str) -> tuple[str, str]:
    """``s3://BUCKET[/PREFIX]`` -> (bucket, prefix); one-line UserError otherwise."""
    if not url.startswith("s3://") or not url[5:].split("/")[0]:
        raise UserError(f"bad --shared-cache {url!r}: expected s3://BUCKET[/PREFIX]")
    bucket, _, prefix = url[5:].partition("/")
    return bucket, prefix.strip("/")


def block_name(source_id: str, key: str, version: str, block_size: int, index: int) -> str:
    h = xxhash.xxh3_128_hexdigest(
        f"{source_id}\0{key}\0{version}\0{block_size}\0{index}".encode("utf-8",
                                                                        "surrogateescape"))
    return h


def pack(header: dict, data: bytes) -> bytes:
    meta = json.dumps(header, sort_keys=True).encode()   # ensure_ascii: any key fits
    return b"".join((_HEAD.pack(MAGIC, len(meta)), meta, data))


def unpack(body: bytes) -> tuple[dict, memoryview]:
    """(header, data view) of a block object; ValueError naming what is wrong."""
    if len(body) < _HEAD.size:
        raise ValueError(f"{len(body)} bytes, shorter than the header")
    magic, n = _HEAD.unpack_from(body)
    if magic != MAGIC or n > MAX_HEADER or _HEAD.size + n > len(body):
        raise ValueError("not a NeuralCache shared block (bad magic or header length)")
    try:
        header = json.loads(bytes(memoryview(body)[_HEAD.size:_HEAD.size + n]))
    except ValueError:
        raise ValueError("unreadable header") from None
    if not isinstance(header, dict):
        raise ValueError("unreadable header")
    return header, memoryview(body)[_HEAD.size + n:]


def verified(body: bytes, want: dict, length: int) -> bytes | str:
    """The data of block object ``body`` if its header names the block ``want`` names
    (source, key, version, block size, index), it is ``length`` bytes and its xxh3
    matches; else what is wrong with it (a str)."""
    try:
        header, data = unpack(body)
        bad = [k for k in ("src", "key", "ver", "bs", "i") if header.get(k) != want[k]]
        if bad:
            raise ValueError(f"header names another block ({', '.join(bad)} differ)")
        if header.get("len") != length or len(data) != length:
            raise ValueError(f"{len(data)} bytes, header says {header.get('len')}, "
                             f"expected {length}")
        if header.get("xxh3") != xxhash.xxh3_64_hexdigest(data):
            raise ValueError("checksum mismatch")
    except ValueError as exc:
        return str(exc)
    return bytes(data)


class SharedBucket(S3Backend):
    """The shared bucket: S3Backend's signing, region discovery and error table, plus
    whole-object GET, PUT (optionally create-only) and DELETE.  Blocking; one attempt
    each (a miss is cheap: the caller goes to the origin)."""

    NATIVE_GETS = False       # whole-object GETs only: no obstore store to build

    def _request(self, method: str, name: str, headers=None, body: bytes | None = None):
        what = f"{method} shared {name}"
        try:
            resp = self._signed_get(name, dict(headers or {}), method=method, body=body)
        except urllib3.exceptions.HTTPError as exc:
            raise Unavailable(f"{what}: connection failed: {exc}") from None
        except Exception as exc:  # botocore credential errors and the like
            raise self._plain(self._classify(exc, what)) from None
        try:
            status = resp.status
            data = resp.read() if method == "GET" and status == 200 else resp.read(4096)
        except urllib3.exceptions.HTTPError as exc:
            raise Unavailable(f"{what}: connection failed: {exc}") from None
        finally:
            resp.release_conn()
        return status, data

    @staticmethod
    def _plain(err: BaseException) -> BaseException:
        return err.cause if isinstance(err, retry.Transient) else err

    def _fail(self, what: str, status: int, data: bytes) -> BaseException:
        code = m.group(1).decode() if (m := _XML_CODE.search(data)) else ""
        return self._plain(self._error(what, status, code))

    def get(self, name: str) -> bytes | None:
        status, data = self._request("GET", name)
        if status == 200:
            return data
        if status == 404:
            return None
        raise self._fail(f"GET shared {name}", status, data)

    def put(self, name: str, body: bytes, create_only: bool = False) -> bool:
        """Store ``body``; with ``create_only`` only if no object has the name (False if
        one has: HTTP 412)."""
        status, data = self._request("PUT", name, {"If-None-Match": "*"} if create_only
                                     else None, body)
        if status in (200, 201, 204):
            return True
        if create_only and status in (409, 412):   # 409: a concurrent create in flight
            return False
        raise self._fail(f"PUT shared {name}", status, data)

    def delete(self, name: str) -> None:
        status, data = self._request("DELETE", name)
        if status not in (200, 204, 404):
            raise self._fail(f"DELETE shared {name}", status, data)


def claim(node: str, t: float, prefetch: bool) -> bytes:
    """The body of a claim: ``node`` fetches the block since ``t`` (wall clock, s)."""
    return CLAIM_MAGIC + json.dumps({"node": node, "t": t, "prefetch": prefetch}).encode()


def parse_claim(body: bytes) -> dict | None:
    """A claim's fields ({"node", "t", "prefetch"}; missing ones are filled in) if
    ``body`` is a claim, else None (a block, or something else at the name)."""
    if not body.startswith(CLAIM_MAGIC):
        return None
    try:
        got = json.loads(body[len(CLAIM_MAGIC):])
    except ValueError:
        got = None
    if not isinstance(got, dict):
        got = {}
    t = got.get("t")
    return {"node": str(got.get("node", "?")), "prefetch": got.get("prefetch") is True,
            "t": float(t) if isinstance(t, (int, float)) else 0.0}


def source_identity(backend, endpoint_url: str | None, source: str) -> tuple[str, str]:
    """(source identity, key prefix) naming the origin the same way on every node: the
    endpoint (or "aws") and bucket for S3, the directory for a POSIX share; the key
    prefix joins the mount's prefix to each key, so mounts of s3://b and s3://b/sub
    share blocks."""
    if hasattr(backend, "bucket"):
        return f"{endpoint_url or 'aws'}|s3://{backend.bucket}", backend.prefix
    return f"file://{source}", ""

"""S3 backend: any S3-compatible endpoint, credentials from the standard AWS chain
(env vars, AWS_PROFILE, ~/.aws/config and credentials, instance metadata).

Listing, stat and the mount-time check go through a botocore client.  Ranged reads,
the hot path, are signed with botocore's SigV4 signer and sent with urllib3 directly:
a botocore GetObject costs ~2.7 ms of CPU, the direct request ~1.25 ms on 100 KB
objects (`python -m bench.micro get-cpu`), and a Python daemon serving 100 KB samples is CPU-bound on exactly
that.  GETs of at most 1 MiB go through obstore when it is installed (s3native.py:
about a third of that CPU again), falling back to this path on anything but a 404 or
412.  At 8 MiB (the block) nothing tried is cheaper per byte than this path: obstore,
awscrt's S3Client and s3torchconnector's mountpoint client cost 1.15-2.1x its CPU per
GiB (`python -m bench.micro get-big`).  All of it is blocking; callers run these
methods in worker threads.  Retries are ours (``neuralcache.backends.retry``);
botocore's own are off so that one policy applies.

Regions: botocore follows a bucket's region redirect, our hand-signed GETs do not, so
``check()`` learns the bucket's region (HeadBucket's ``x-amz-bucket-region``) and every
later request is signed (and on AWS addressed) for it; a ranged GET answered 301/307/400
with that header switches too.  ``--region`` pins the region: a bucket elsewhere fails
the mount check in one line.  Credentials are asked of the session per request, so a
refreshable provider's renewals are used.
"""
from __future__ import annotations

import logging
import os
import re
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Iterator
from urllib.parse import quote

import boto3
import trio
import urllib3
from botocore import exceptions as bex
from botocore.auth import S3SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.config import Config

from . import retry, s3native, s3trio
from ..buffers import RECYCLE_MIN, read_into
from ..errors import NotFound, PermissionDenied, Unavailable, UserError, VersionChanged
from .base import ObjectInfo, valid_key, walk_parallel
from .s3list import S3List
from .s3write import S3Writes

log = logging.getLogger(__name__)

# Socket timeouts.  Connect: a WAN round trip is ~60 ms, so 5 s means the endpoint is
# not there.  Read: the longest a healthy response pauses between packets (a server
# takes well under a second to start a ranged GET); a stalled connection is abandoned
# after this and retried on a new one, so one slow GET costs a reader ~5 s, not forever.
CONNECT_TIMEOUT_S = 5.0
READ_TIMEOUT_S = 5.0
# Threads listing directory prefixes in parallel at mount time (one round trip each).
LIST_WORKERS = 16
# One table for every error the remote answers, whether botocore raised it (listing,
# stat, the mount check) or a direct ranged GET got it: an error code, or else the HTTP
# status, names what happened.  5xx statuses not listed are transient too.
_ERROR_KINDS: dict[str, str] = {
    "NoSuchBucket": "no-bucket",
    **dict.fromkeys(("NoSuchKey", "NotFound", "NoSuchUpload", "404"), "not-found"),
    **dict.fromkeys(("PreconditionFailed", "412", "InvalidRange", "416"), "changed"),
    **dict.fromkeys(("AccessDenied", "InvalidAccessKeyId", "SignatureDoesNotMatch",
                     "InvalidToken", "ExpiredToken", "AllAccessDisabled", "AccountProblem",
                     "403"), "denied"),
    **dict.fromkeys(("PermanentRedirect", "TemporaryRedirect", "301", "307"), "region"),
    # AWS retry guidance plus throttling codes
    **dict.fromkeys(("InternalError", "ServiceUnavailable", "SlowDown", "RequestTimeout",
                     "RequestTimeTooSkewed", "Throttling", "ThrottlingException",
                     "RequestLimitExceeded", "408", "429", "500", "502", "503", "504"),
                    "transient"),
}
# Answers that may name the bucket's real region (x-amz-bucket-region): a redirect, or
# 400 AuthorizationHeaderMalformed when a request reached the right endpoint signed for
# the wrong region.
_REGION_STATUSES = (301, 307, 400)
_XML_CODE = re.compile(rb"<Code>([^<]{1,64})</Code>")
_XML_REGION = re.compile(rb"<Region>([a-z0-9-]{1,32})</Region>")
_XML_MESSAGE = re.compile(rb"<Message>([^<]{0,300})</Message>")
# Bucket names botocore's "auto" addressing puts in the host name (virtual-hosted):
# 3-63 lowercase letters, digits and hyphens, alphanumeric at both ends.  Names with
# dots go path style: the TLS wildcard *.s3.REGION.amazonaws.com covers one label.
_VIRTUAL_HOSTABLE = re.compile(r"[a-z0-9][a-z0-9-]{1,61}[a-z0-9]")


def _read_into(resp, into: memoryview) -> memoryview:
    """A response body of ``len(into)`` bytes (its Content-Length), received straight
    into ``into``: http.client's readinto fills it from the socket with no bytes object
    in between (urllib3's own readinto reads a bytes object and copies it).  What it
    got, as a view of ``into`` (short if the connection ended early: a short read); the
    stored bytes, an object's Content-Encoding not undone (as ``resp.read`` is told)."""
    # resp._fp: the http.client.HTTPResponse under urllib3's.  urllib3's own wrapper:
    # socket timeouts and resets come out as its HTTPErrors (a retry, as from read())
    # and a connection that failed mid-body is not reused
    with resp._error_catcher():
        return read_into(resp._fp.readinto, len(into), into=into)


def aws_object_base_url(bucket: str, region: str) -> str:
    """URL prefix of a bucket's objects on AWS, as botocore's "auto" addressing style
    chooses it: ``https://BUCKET.s3.REGION.amazonaws.com`` for DNS-compatible names
    without dots, else ``https://s3.REGION.amazonaws.com/BUCKET``.  us-east-1 uses the
    global host s3.amazonaws.com, as botocore does."""
    suffix = "amazonaws.com.cn" if region.startswith("cn-") else "amazonaws.com"
    host = f"s3.{suffix}" if region == "us-east-1" else f"s3.{region}.{suffix}"
    if _VIRTUAL_HOSTABLE.fullmatch(bucket):
        return f"https://{bucket}.{host}"
    return f"https://{host}/{quote(bucket, safe='')}"


class S3Backend(S3Writes, S3List):
    # Ranged reads of at most s3native.NATIVE_MAX_BYTES may go through obstore; a
    # subclass that never makes ranged reads (store/shared.py) switches it off.
    NATIVE_GETS = True
    # S3's limits (AWS docs, "Amazon S3 objects overview"): an object is at most 5 TiB,
    # a key at most 1,024 bytes of UTF-8.  A --writable mount refuses more up front
    # (EFBIG, ENAMETOOLONG) instead of accepting data it can never upload.
    max_object_size = 5 << 40
    max_key_bytes = 1024
    # A buffers.Recycler that ranged GETs of a block's size read into (the daemon sets
    # it); None: each body is a new bytes object.
    read_buffers = None

    def key_bytes(self, key: str) -> int:
        return len((self.prefix + key).encode("utf-8", "surrogateescape"))

    def __init__(self, bucket: str, prefix: str = "", *, endpoint_url: str | None = None,
                 region: str | None = None, concurrency: int = 32,
                 profile: str | None = None):
        self.bucket = bucket
        self.prefix = prefix.strip("/") + "/" if prefix.strip("/") else ""
        self.description = f"s3://{bucket}/{self.prefix}"
        self.endpoint_url = endpoint_url
        try:
            session = boto3.session.Session(profile_name=profile)
        except bex.ProfileNotFound:
            raise UserError(f"AWS profile {profile!r} not found in ~/.aws/config or "
                            "~/.aws/credentials") from None
        self._session = session
        self._config = Config(connect_timeout=CONNECT_TIMEOUT_S, read_timeout=READ_TIMEOUT_S,
                              # One attempt per botocore call: retries are ours
                              # (_call), counted and paced by retry.py.  botocore's
                              # "max_attempts" counts retries, not attempts (1 meant a
                              # hidden second try), so the total is what is set here.
                              retries={"total_max_attempts": 1, "mode": "standard"},
                              max_pool_connections=concurrency + LIST_WORKERS,
                              # No SHA-256 of upload bodies in the signature: botocore
                              # already skips it over https when a checksum header is
                              # sent, and signed it only for http endpoints, inside
                              # awscrt's signer holding the GIL (35 % of the daemon's
                              # GIL samples while a 1 GiB checkpoint was written; its
                              # FUSE writes waited for it).  Every PUT and part still
                              # carries botocore's CRC32 checksum, which the server
                              # verifies, so a damaged body is still refused.
                              s3={"addressing_style": "path" if endpoint_url else "auto",
                                  "payload_signing_enabled": False},
                              request_checksum_calculation="when_supported",
                              tcp_keepalive=True)
        # --region: the user's word, checked against the bucket's, never changed.
        # Otherwise the client's region (AWS config, else us-east-1) until check() or a
        # read learns the bucket's.
        self._pinned_region = region
        self._client = self._make_client(region or session.region_name or "us-east-1")
        self._lock = threading.Lock()          # the retries counter
        self._region_lock = threading.Lock()   # switching region
        self.retries = 0  # transient failures retried (read by stats)
        # Connections warm_connections opened (read by stats); None until it has run, so
        # a test or an operator can tell its requests from a job's.
        self.warmed: int | None = None
        self.trio_warmed: int | None = None    # the same, for warm_trio
        # (signing region, object URL prefix): one tuple, replaced whole, so a reader
        # never signs for one region and sends to another's URL.
        region_now = self._client.meta.region_name
        self._target = (region_now, self._object_base_url(region_now))
        self._pool = self._make_pool(concurrency)
        # Small GETs through obstore where it can serve them (s3native.py); None: every
        # read takes the Python path below.  Only once the region is settled (check(),
        # or a read that learned it): a GET signed for the wrong region is the Python
        # path's to make, once.
        self._native = None
        self._region_settled = False
        if (self.NATIVE_GETS and s3native.wanted()
                and s3native.NativeGets.usable(session, endpoint_url)):
            self._native = s3native.NativeGets(
                session, bucket, endpoint_url,
                virtual_hosted=not endpoint_url and bool(_VIRTUAL_HOSTABLE.fullmatch(bucket)))
        # Small GETs on the trio thread (s3trio.py, ``read_async``): the same rules.
        self._trio = s3trio.TrioGets(self._count_retry) \
            if self.NATIVE_GETS and s3trio.wanted() else None
        if self._trio is not None and self._target[1].startswith("https://"):
            self._trio.context()          # (the CA bundle read here, not on the trio thread)

    def _make_client(self, region: str):
        return self._session.client("s3", endpoint_url=self.endpoint_url, region_name=region,
                                    config=self._config)

    @property
    def region(self) -> str:
        """The region requests are signed for (and, on AWS, addressed to)."""
        return self._target[0]

    def _use_region(self, region: str, why: str) -> None:
        """Sign and address every later request for ``region`` (thread-safe; the first
        thread to learn it switches and logs, the others find it done)."""
        with self._region_lock:
            if self._target[0] == region:
                return
            old = self._target[0]
            self._client = self._make_client(region)   # in-flight calls keep the old one
            self._target = (region, self._object_base_url(region))
            self._region_settled = True
        log.info("bucket %r is in region %s (%s; was signing for %s)", self.bucket, region,
                 why, old)

    # -- the direct read path ---------------------------------------------------------
    def _object_base_url(self, region: str) -> str:
        """URL prefix of this bucket's objects: path style on a custom endpoint (what
        S3-compatible stores expect), botocore's "auto" choice on AWS."""
        if self.endpoint_url:
            return self.endpoint_url.rstrip("/") + "/" + quote(self.bucket, safe="")
        return aws_object_base_url(self.bucket, region)

    def _make_pool(self, concurrency: int):
        kw = dict(maxsize=concurrency + 8, block=False, retries=False,
                  timeout=urllib3.Timeout(connect=CONNECT_TIMEOUT_S, read=READ_TIMEOUT_S))
        if self._target[1].startswith("https://"):
            kw.update(cert_reqs="CERT_REQUIRED",
                      ca_certs=s3trio.ca_bundle())
        return urllib3.PoolManager(num_pools=4, **kw)

    def _signed_get(self, key: str, headers: dict[str, str], method: str = "GET",
                    target: tuple[str, str] | None = None, body: bytes | None = None):
        """One signed request (``body``: a PUT's payload, signed with it)."""
        region, base = target or self._target
        # Asked for per request: a refreshable provider (SSO, assume-role,
        # credential_process, instance metadata) renews them before they expire.
        creds = self._session.get_credentials()
        if creds is None:
            raise bex.NoCredentialsError()
        url = base + "/" + quote(self.prefix + key, safe="/~")
        req = AWSRequest(method=method, url=url, headers=headers, data=body)
        S3SigV4Auth(creds.get_frozen_credentials(), "s3", region).add_auth(req)
        return self._pool.request(method, url, headers=dict(req.headers.items()), body=body,
                                  preload_content=False, redirect=False)

    def _with_region(self, what: str, send, ok: tuple[int, ...],
                     into=None) -> tuple[int, bytes]:
        """``send(target)`` (a signed urllib3 request for (region, base URL)) and its
        answer, (status, body) for a status in ``ok``; a wrong-region answer switches
        region and sends once more; anything else raises the domain error.  ``into``
        (a writable view): a 206 body of exactly its length is read into it and the
        body returned is a view of it."""
        for _ in range(2):    # a second try only after learning the bucket's region
            target = self._target
            try:
                resp = send(target)
                try:
                    status = resp.status
                    if (into is not None and status == 206
                            and resp.headers.get("Content-Length") == str(len(into))):
                        data = _read_into(resp, into)
                    else:
                        # the stored bytes: an object's Content-Encoding (gzip) is
                        # its metadata, never undone here (urllib3 would: wrong bytes)
                        data = resp.read(decode_content=False) if status in ok \
                            else resp.read(4096)
                    found = resp.headers.get("x-amz-bucket-region")
                finally:
                    resp.release_conn()
            except urllib3.exceptions.HTTPError as exc:   # timeouts, resets, refused
                raise retry.Transient(Unavailable(f"{what}: connection failed: {exc}")) \
                    from None
            if status in ok:
                return status, data
            code = m.group(1).decode() if (m := _XML_CODE.search(data)) else ""
            if status in _REGION_STATUSES and not found and (m := _XML_REGION.search(data)):
                found = m.group(1).decode()
            if (status in _REGION_STATUSES and found and found != target[0]
                    and self._pinned_region is None):
                self._use_region(found, f"{what} was answered {status} {code}".rstrip())
                continue
            break
        message = m.group(1).decode(errors="replace") if (m := _XML_MESSAGE.search(data)) else ""
        raise self._error(what, status, code, message,
                          found=found if found != target[0] else None)

    def _direct_read(self, key: str, offset: int, length: int, version: str) -> bytes:
        headers = {"Range": f"bytes={offset}-{offset + length - 1}"}
        if version:
            headers["If-Match"] = f'"{version}"'
        what = f"read {key}@{offset}+{length}"
        bufs = self.read_buffers
        into = bufs.take(length) if bufs is not None and length >= RECYCLE_MIN else None
        status, data = self._with_region(
            what, lambda t: self._signed_get(key, headers, target=t), (200, 206), into)
        if status == 200 and offset == 0 and len(data) > length:
            data = data[:length]      # a server that ignored Range on a whole object
        if len(data) != length:
            raise retry.Transient(Unavailable(f"{what}: short read: {len(data)} bytes"))
        return data

    # -- error translation -------------------------------------------------------
    def _error(self, what: str, status: int | None, code: str = "", message: str = "",
               found: str | None = None) -> BaseException:
        """The domain error for an error answer (code and/or HTTP status), from the one
        table; ``retry.Transient`` wraps retryable ones.  ``found``: the region the
        answer says the bucket is in, if it differs from the one signed for."""
        kind = _ERROR_KINDS.get(code) or _ERROR_KINDS.get(str(status))
        if kind is None and status and status >= 500:
            kind = "transient"
        if found and kind in (None, "region"):
            kind = "region"
        if kind == "no-bucket":
            return NotFound(f"bucket {self.bucket!r} does not exist at "
                            f"{self.endpoint_url or 'AWS'}")
        if kind == "not-found":
            return NotFound(f"{what}: not found")
        if kind == "changed":
            return VersionChanged(f"{what}: object changed on the remote")
        if kind == "denied":
            return PermissionDenied(f"{what}: access denied ({code or status}); check the "
                                    "credentials (AWS_ACCESS_KEY_ID/AWS_PROFILE)")
        if kind == "transient":
            return retry.Transient(Unavailable(f"{what}: remote error {code or status}"))
        if kind == "region":
            where = f"region {found}" if found else "another region"
            fix = ("correct or drop --region" if self._pinned_region
                   else "pass --region with the bucket's region")
            return Unavailable(f"{what}: bucket {self.bucket!r} is in {where}, not "
                               f"{self.region} ({code or status}); {fix}")
        return Unavailable(f"{what}: {code or status}: {message}".rstrip(": "))

    def _classify(self, exc: BaseException, what: str) -> BaseException:
        """Domain error for a botocore exception; Transient wraps retryable ones."""
        if isinstance(exc, bex.ClientError):
            err = exc.response.get("Error", {})
            meta = exc.response.get("ResponseMetadata", {})
            found = meta.get("HTTPHeaders", {}).get("x-amz-bucket-region") or err.get("Region")
            return self._error(what, meta.get("HTTPStatusCode"), str(err.get("Code", "")),
                               err.get("Message", ""),
                               found=found if found != self.region else None)
        if isinstance(exc, bex.NoCredentialsError):
            return PermissionDenied("no AWS credentials found: set AWS_ACCESS_KEY_ID and "
                                    "AWS_SECRET_ACCESS_KEY, or AWS_PROFILE")
        if isinstance(exc, (bex.EndpointConnectionError, bex.ConnectTimeoutError)):
            return retry.Transient(Unavailable(
                f"{what}: cannot connect to {self.endpoint_url or 'S3'}"))
        if isinstance(exc, (bex.ReadTimeoutError, bex.ConnectionClosedError,
                            bex.ResponseStreamingError, bex.IncompleteReadError,
                            bex.HTTPClientError, ConnectionError, TimeoutError, OSError)):
            return retry.Transient(Unavailable(f"{what}: connection failed: {exc}"))
        return Unavailable(f"{what}: {type(exc).__name__}: {exc}")

    def _call(self, what: str, fn, *, attempts: int = retry.ATTEMPTS):
        def attempt():
            try:
                return fn()
            except (NotFound, PermissionDenied, Unavailable, VersionChanged):
                raise
            except retry.Transient:
                raise
            except Exception as exc:  # translated right here, nothing else escapes
                mapped = self._classify(exc, what)
                raise mapped from None

        def on_retry(n, cause):
            self._count_retry()
            log.debug("retry %d of %s: %s", n, what, cause)

        return retry.with_retries(attempt, attempts=attempts, on_retry=on_retry)

    # -- protocol ------------------------------------------------------------------
    def check(self) -> None:
        # Two quick attempts: a mount command should fail fast on a dead endpoint.
        self._call(f"list s3://{self.bucket}",
                   lambda: self._client.list_objects_v2(Bucket=self.bucket,
                                                        Prefix=self.prefix, MaxKeys=1),
                   attempts=2)
        # botocore follows a region redirect for the listing above; our ranged GETs do
        # not (they are signed by hand), so learn the bucket's region now.
        found = self._bucket_region()
        now = self.region
        if found is None:
            log.info("bucket %r: the server reports no region; signing for %s",
                     self.bucket, now)
        elif found == now:
            log.info("bucket %r is in region %s%s", self.bucket, found,
                     " (--region)" if self._pinned_region else "")
        elif self._pinned_region:
            raise UserError(f"bucket {self.bucket!r} is in region {found}, not "
                            f"{self._pinned_region} (--region): drop --region (the region "
                            "is found automatically) or correct it")
        else:
            self._use_region(found, "HeadBucket")
        self._region_settled = True

    def _bucket_region(self) -> str | None:
        """The region the server says the bucket is in (HeadBucket's
        x-amz-bucket-region, on success or on a 301/400/403 answer); None if it does
        not say (SeaweedFS, MinIO without a region) or cannot be asked."""
        def head():
            try:
                meta = self._client.head_bucket(Bucket=self.bucket)["ResponseMetadata"]
            except bex.ClientError as exc:
                meta = exc.response.get("ResponseMetadata", {})
                if "x-amz-bucket-region" not in meta.get("HTTPHeaders", {}):
                    raise
            return meta.get("HTTPHeaders", {}).get("x-amz-bucket-region") or None

        try:
            return self._call(f"find the region of s3://{self.bucket}", head, attempts=2)
        except (NotFound, PermissionDenied, Unavailable) as exc:
            log.warning("cannot find the region of bucket %r (%s); signing for %s",
                        self.bucket, exc, self.region)
            return None

    def _list_dir(self, prefix: str) -> tuple[list[ObjectInfo], list[str]]:
        objs: list[ObjectInfo] = []
        dirs: list[str] = []
        token = None
        while True:
            kw = dict(Bucket=self.bucket, Prefix=prefix, Delimiter="/", MaxKeys=1000)
            if token:
                kw["ContinuationToken"] = token
            resp = self._call(f"list s3://{self.bucket}/{prefix}",
                              lambda kw=kw: self._client.list_objects_v2(**kw))
            for o in resp.get("Contents", []):
                key = o["Key"][len(self.prefix):]
                if not key or key.endswith("/"):
                    continue  # the prefix itself or a "directory marker" object
                if not valid_key(key):
                    log.warning("skipping key that cannot be a path: %r", o["Key"])
                    continue
                objs.append(ObjectInfo(key, int(o["Size"]), o.get("ETag", "").strip('"'),
                                       o["LastModified"].timestamp()))
            dirs.extend(p["Prefix"] for p in resp.get("CommonPrefixes", []))
            if not resp.get("IsTruncated"):
                return objs, dirs
            token = resp["NextContinuationToken"]

    def list_all(self) -> Iterator[ObjectInfo]:
        """Breadth-first over '/'-delimited prefixes, LIST_WORKERS at a time."""
        return walk_parallel(self._list_dir, self.prefix, LIST_WORKERS)

    def probe(self, key: str) -> tuple[ObjectInfo | None, bool]:
        """Is ``key`` an object, a directory (a prefix of objects), or nothing?  A
        HEAD, then a one-key LIST of KEY/ (a lookup in a directory not listed yet)."""
        try:
            return self.stat(key), False
        except NotFound:
            pass
        resp = self._call(f"list s3://{self.bucket}/{self.prefix}{key}/",
                          lambda: self._client.list_objects_v2(
                              Bucket=self.bucket, Prefix=f"{self.prefix}{key}/", MaxKeys=1))
        return None, bool(resp.get("KeyCount") or resp.get("Contents"))

    def has_objects_under(self, key: str) -> bool:
        """Whether any object's key starts with ``key/``.  The lister asks when a
        listing shows ``key`` both as an object and as a prefix: SeaweedFS keeps a
        directory's entry after its last object is deleted, and a file written there
        since is the only thing under that name (S3 lists no empty prefix)."""
        resp = self._call(f"list s3://{self.bucket}/{self.prefix}{key}/",
                          lambda: self._client.list_objects_v2(
                              Bucket=self.bucket, Prefix=f"{self.prefix}{key}/", MaxKeys=1))
        return bool(resp.get("KeyCount") or resp.get("Contents"))

    def warm_connections(self, n: int) -> None:
        """Open ~n pooled connections now (n cheap requests at once), so the first reads
        of a job do not each pay a TCP handshake round trip on top of the GET."""
        def ping(_) -> bool:
            try:
                self._signed_get("", {}, method="HEAD").release_conn()
                return True
            except Exception:  # best effort: a failure here only costs a handshake later
                return False

        with ThreadPoolExecutor(n, thread_name_prefix="nc-warm") as pool:
            self.warmed = sum(pool.map(ping, range(n)))

    async def warm_trio(self, n: int) -> None:
        """``warm_connections`` for the small GETs' path on the trio thread (s3trio.py),
        once the region is settled (its GETs wait for that too)."""
        t = self._trio
        if t is None or not self._region_settled:
            self.trio_warmed = 0
            return
        self.trio_warmed = await t.warm(self._target[1], n)
        await trio.sleep(s3trio.IDLE_MAX_S)      # those no GET took: closed, not left
        t.prune()                                # in CLOSE_WAIT when the server drops them

    def stat(self, key: str) -> ObjectInfo:
        full = self.prefix + key
        r = self._call(f"stat {key}", lambda: self._client.head_object(Bucket=self.bucket,
                                                                        Key=full))
        return ObjectInfo(key, int(r["ContentLength"]), r.get("ETag", "").strip('"'),
                          r["LastModified"].timestamp())

    def read(self, key: str, offset: int, length: int, version: str) -> bytes:
        if length <= 0:
            return b""
        if (self._native is not None and self._region_settled
                and length <= s3native.NATIVE_MAX_BYTES):
            data = self._native.read(self.region, self.prefix + key, offset, length, version)
            if data is s3native.FAILED:          # the Python path below is its retry
                self._count_retry()
            elif data is not None:
                return data
        return self._call(f"read {key}@{offset}+{length}",
                          lambda: self._direct_read(key, offset, length, version))

    async def read_async(self, key: str, offset: int, length: int,
                         version: str) -> bytes | memoryview | None:
        """``read`` of at most s3trio.MAX_BYTES on the trio thread, or None: call
        ``read`` (in a thread) instead.  Never raises a domain error: an answer that
        means one (404, 412, a region redirect) is left to ``read``."""
        t = self._trio
        if t is None or not self._region_settled or not 0 < length <= s3trio.MAX_BYTES:
            return None
        creds = self._session.get_credentials()
        # a renewal (assume-role, SSO, instance metadata) is network I/O: the thread
        # path's to make, never the trio thread's
        if creds is None or (hasattr(creds, "refresh_needed") and creds.refresh_needed()):
            return None
        region, base = self._target
        data = await t.read(creds.get_frozen_credentials(), region,
                            base + "/" + quote(self.prefix + key, safe="/~"),
                            offset, length, version)
        if data is s3trio.FAILED:           # the thread path is its retry
            self._count_retry()
            return None
        return data

    def _count_retry(self) -> None:
        with self._lock:
            self.retries += 1

    def native_stats(self) -> dict:
        n, t = self._native, self._trio
        return {"native_gets": n.used if n else 0,
                "native_fallbacks": n.fell_back if n else 0,
                "trio_gets": t.used if t else 0,
                "trio_fallbacks": t.fell_back if t else 0}

    def close(self) -> None:
        try:
            if self._trio is not None:
                self._trio.close()
            self._pool.clear()
            self._client.close()
        except Exception:  # closing is best effort
            pass


def describe_check_error(exc: Exception, source: str, endpoint: str | None) -> UserError:
    """One-line, actionable message for a failed mount-time check."""
    where = endpoint or "AWS S3"
    if isinstance(exc, Unavailable):
        return UserError(f"cannot reach {where} for {source}: {exc}; check --endpoint-url "
                         "and the network")
    if isinstance(exc, NotFound):
        return UserError(f"{exc}; check the bucket name in {source}")
    if isinstance(exc, PermissionDenied):
        return UserError(f"access to {source} denied: {exc}")
    return UserError(f"cannot use {source}: {exc}")

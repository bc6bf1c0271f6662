"""Small ranged GETs through obstore (the Rust ``object_store`` client), beside the
Python path of s3.py.

Why only small ones: ``python -m bench.micro get-cpu`` (one thread, local SeaweedFS)
measured 0.18 ms of CPU per 100 KB GET with obstore against 0.52 ms for the SigV4 +
urllib3 path, but 4.74 ms against 2.63 ms per 8 MiB GET: the Rust client wins per
request and loses per byte.  A daemon serving 100 KB samples is CPU-bound on exactly
the per-request part, and obstore holds no GIL while it waits.  At the 8 MiB block
``python -m bench.micro get-big`` (1/8/32 in flight, direct and over the 60 ms link,
whole-process CPU) found no client cheaper per byte than the urllib3 path: median
0.51-0.63 CPU-s per GiB against 0.65-0.80 for obstore's zero-copy ``Bytes`` and
0.75-1.12 for awscrt's S3Client and the mountpoint-s3 client (bench/RESULTS.md, "The
8 MiB GET").

It changes no guarantee: the same key, byte range and ``If-Match`` version; a 404 is
NotFound and a 412 VersionChanged, as on the Python path; every other failure (a
connection error, 403, a region redirect, a short answer) returns None and the caller
asks the Python path, which knows the error table, the region rules and the retries.
After FAILS_BEFORE_PAUSE such failures in a row the native path rests for PAUSE_S, so a
remote in trouble costs one extra attempt per read only briefly.  Not used (the Python
path does all reads) when obstore is not installed, when ``NEURALCACHE_NATIVE_GET=0``,
for anonymous access, and for an https endpoint with a custom CA bundle
(``AWS_CA_BUNDLE``: obstore does not read it).
"""
from __future__ import annotations

import datetime as dt
import importlib.util
import logging
import os
import threading
import time

from ..errors import NotFound, VersionChanged

log = logging.getLogger(__name__)

# Largest GET that goes the native way: small files and the first block of a file;
# above this the Python path spends less CPU per byte (see above).  1 MiB sits between
# the 100 KB case where obstore wins 3x and the 8 MiB case where it loses 1.8x.
NATIVE_MAX_BYTES = 1 << 20
# Consecutive native failures (each then served by the Python path) before it rests,
# and for how long: a flaky link or a refusing endpoint costs at most this many extra
# attempts per PAUSE_S.
FAILS_BEFORE_PAUSE = 3
PAUSE_S = 60.0
# Whole-request timeout of a native GET of at most NATIVE_MAX_BYTES: the Python path's
# read timeout (s3.py READ_TIMEOUT_S), so a stalled answer costs no more than there.
TIMEOUT_S = 5.0
# How long obstore may reuse credentials from a refreshable provider (SSO, assume-role,
# credential_process) before it asks again; botocore renews them itself.
CREDENTIAL_REUSE_S = 10.0
# What read() returns for an attempt that failed (the Python path then serves it, and
# the backend counts it as a retry).
FAILED = object()


def wanted() -> bool:
    """obstore is importable and not switched off."""
    if os.environ.get("NEURALCACHE_NATIVE_GET", "1") == "0":
        return False
    return importlib.util.find_spec("obstore") is not None


class NativeGets:
    """obstore stores per signing region, for one bucket."""

    def __init__(self, session, bucket: str, endpoint_url: str | None,
                 virtual_hosted: bool):
        import obstore
        from obstore.exceptions import NotFoundError, PreconditionError

        self._obstore = obstore
        # obstore 0.12 raises the builtin FileNotFoundError for a 404 (NotFoundError
        # is deprecated); both are caught
        self._not_found = (FileNotFoundError, NotFoundError)
        self._changed = PreconditionError
        self._session = session
        self.bucket = bucket
        self.endpoint_url = endpoint_url
        self.virtual_hosted = virtual_hosted
        self._stores: dict[str, object] = {}
        self._lock = threading.Lock()
        self._fails = 0
        self._rest_until = 0.0
        self.used = 0            # GETs served natively (stats)
        self.fell_back = 0       # native attempts the Python path then served

    @staticmethod
    def usable(session, endpoint_url: str | None) -> bool:
        https = endpoint_url is None or endpoint_url.startswith("https://")
        if https and os.environ.get("AWS_CA_BUNDLE"):
            return False
        return session.get_credentials() is not None

    def _credentials(self):
        creds = self._session.get_credentials()
        f = creds.get_frozen_credentials()
        refreshable = hasattr(creds, "refresh_needed")
        return {"access_key_id": f.access_key, "secret_access_key": f.secret_key,
                "token": f.token,
                "expires_at": (dt.datetime.now(dt.timezone.utc)
                               + dt.timedelta(seconds=CREDENTIAL_REUSE_S))
                if refreshable else None}

    def _store(self, region: str):
        with self._lock:
            st = self._stores.get(region)
            if st is None:
                from obstore.store import S3Store
                kw = {"endpoint": self.endpoint_url} if self.endpoint_url else {}
                st = S3Store(self.bucket, region=region,
                             virtual_hosted_style_request=self.virtual_hosted,
                             credential_provider=self._credentials,
                             client_options={"allow_http": bool(self.endpoint_url) and
                                             self.endpoint_url.startswith("http://"),
                                             "timeout": dt.timedelta(seconds=TIMEOUT_S),
                                             "connect_timeout": dt.timedelta(seconds=5)},
                             retry_config={"max_retries": 0}, **kw)
                self._stores[region] = st
            return st

    def read(self, region: str, path: str, offset: int, length: int,
             version: str) -> bytes | object | None:
        """The bytes; None (resting) or FAILED (this attempt failed): ask the Python
        path.  Raises NotFound / VersionChanged."""
        if resting(self):
            return None
        opts: dict = {"range": (offset, offset + length)}
        if version:
            opts["if_match"] = f'"{version}"'
        try:
            data = bytes(self._obstore.get(self._store(region), path, options=opts).bytes())
        except self._not_found:
            raise NotFound(f"read {path}@{offset}+{length}: not found") from None
        except self._changed:
            raise VersionChanged(f"read {path}@{offset}+{length}: object changed on the "
                                 "remote") from None
        except Exception as exc:   # anything else: the Python path knows what it means
            self._failed(exc)
            return FAILED
        if len(data) != length:
            self._failed(f"{len(data)} bytes for {length}")
            return FAILED
        self._fails = 0
        self.used += 1
        return data

    def _failed(self, why) -> None:
        failed(self, why, "native GETs", "the Python path")


def resting(gets) -> bool:
    """Whether ``gets`` (either small-GET path) is resting after failures (``failed``)."""
    return bool(gets._rest_until) and time.monotonic() < gets._rest_until


def failed(gets, why, what: str, instead: str) -> None:
    """The rest rule of both small-GET paths (this one and s3trio.py's): one more
    failure of ``gets`` (its ``fell_back``, ``_fails``, ``_rest_until``); after
    FAILS_BEFORE_PAUSE in a row, ``instead`` serves every read for PAUSE_S."""
    gets.fell_back += 1
    gets._fails += 1
    if gets._fails >= FAILS_BEFORE_PAUSE:
        gets._fails = 0
        gets._rest_until = time.monotonic() + PAUSE_S
        log.info("%s failed %d times in a row (last: %s); %s serves every read for "
                 "%.0f s", what, FAILS_BEFORE_PAUSE,
                 str(why).splitlines()[0][:200] if str(why) else type(why).__name__,
                 instead, PAUSE_S)
    else:
        log.debug("%s: one failed (%s); %s serves it", what, why, instead)

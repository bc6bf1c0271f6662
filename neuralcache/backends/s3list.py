"""S3 listing of one directory (ListObjectsV2 with '/' as the delimiter), a page at a
time: the requests a mount makes as the job looks into directories (meta/lister.py).

A mixin of ``S3Backend`` (backends/s3.py): the request is signed by hand and sent with
urllib3 like the ranged reads, and the XML is parsed with ElementTree's C parser.
botocore's own ListObjectsV2 spends ~92 ms of CPU per 1,000-key page parsing it, this
~9 ms (`python /tmp` measurement in issue 19's note, 10 pages of 1,000 keys): holding
the GIL that long made every FUSE request wait while directories were listed.
Errors, retries and region switches go through the same table and policy as reads.
"""
from __future__ import annotations

import datetime as dt
import logging
import xml.etree.ElementTree as ET
from typing import Iterator
from urllib.parse import quote, unquote_plus

from . import retry
from .base import ObjectInfo, valid_key
from ..errors import Unavailable

log = logging.getLogger(__name__)

_PAGE_KEYS = 1000        # S3's maximum per page


def _iso(text: str) -> float:
    return dt.datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


class S3List:
    """Needs ``bucket``, ``prefix``, ``_pool``, ``_session``, ``_call`` and
    ``_with_region`` (S3Backend)."""

    def list_dir(self, key: str) -> Iterator[tuple[list[ObjectInfo], list[str]]]:
        """One directory, a page (up to 1,000 keys) at a time: (files, subdirectory
        names)."""
        prefix = self.prefix + (key + "/" if key else "")
        token = None
        while True:
            files, dirs, token = self._call(
                f"list s3://{self.bucket}/{prefix}",
                lambda t=token: self._list_page(prefix, t))
            yield files, dirs
            if token is None:
                return

    def _list_page(self, prefix: str, token: str | None
                   ) -> tuple[list[ObjectInfo], list[str], str | None]:
        from botocore.auth import S3SigV4Auth
        from botocore.awsrequest import AWSRequest
        from botocore import exceptions as bex

        params = {"list-type": "2", "prefix": prefix, "delimiter": "/",
                  "max-keys": str(_PAGE_KEYS), "encoding-type": "url"}
        if token:
            params["continuation-token"] = token
        query = "&".join(f"{quote(k, safe='~')}={quote(v, safe='~')}"
                         for k, v in sorted(params.items()))
        what = f"list s3://{self.bucket}/{prefix}"

        def send(target):
            region, base = target
            creds = self._session.get_credentials()
            if creds is None:
                raise bex.NoCredentialsError()
            url = base + "/?" + query
            req = AWSRequest(method="GET", url=url)
            S3SigV4Auth(creds.get_frozen_credentials(), "s3", region).add_auth(req)
            return self._pool.request("GET", url, headers=dict(req.headers.items()),
                                      preload_content=False, redirect=False)

        _, data = self._with_region(what, send, (200,))
        return self._parse_page(data, prefix)

    def _parse_page(self, data: bytes, prefix: str
                    ) -> tuple[list[ObjectInfo], list[str], str | None]:
        try:
            root = ET.fromstring(data)
        except ET.ParseError as exc:
            raise retry.Transient(Unavailable(f"listing {prefix}: bad XML: {exc}")) from None
        ns = root.tag[:root.tag.index("}") + 1] if root.tag.startswith("{") else ""
        encoded = root.findtext(f"{ns}EncodingType") == "url"
        dec = unquote_plus if encoded else (lambda s: s)     # as botocore decodes
        files: list[ObjectInfo] = []
        for e in root.iter(f"{ns}Contents"):
            k = dec(e.findtext(f"{ns}Key") or "")[len(self.prefix):]
            if not k or k.endswith("/"):
                continue  # the prefix itself or a "directory marker" object
            if not valid_key(k):
                log.debug("skipping key that cannot be a path: %r", k)
                continue
            files.append(ObjectInfo(k, int(e.findtext(f"{ns}Size") or 0),
                                    (e.findtext(f"{ns}ETag") or "").strip('"'),
                                    _iso(e.findtext(f"{ns}LastModified") or
                                         "1970-01-01T00:00:00+00:00")))
        dirs = []
        for e in root.iter(f"{ns}CommonPrefixes"):
            p = dec(e.findtext(f"{ns}Prefix") or "")[len(prefix):].rstrip("/")
            if p and valid_key(p):
                dirs.append(p)
        truncated = (root.findtext(f"{ns}IsTruncated") or "").lower() == "true"
        token = root.findtext(f"{ns}NextContinuationToken") if truncated else None
        return files, dirs, token

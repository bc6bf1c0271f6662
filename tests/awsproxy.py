"""An S3 front for SeaweedFS that behaves like AWS where the tests of issue 14 need it.

* Regions: ``regions`` maps bucket -> region.  A request for such a bucket whose SigV4
  credential scope (``Credential=AKID/DATE/REGION/s3/aws4_request``) names another
  region is answered as AWS does: ``301 PermanentRedirect`` with ``x-amz-bucket-region``
  (an XML error body, none for HEAD), or with ``wrong_region="malformed"``
  ``400 AuthorizationHeaderMalformed`` carrying the header and ``<Region>``.  HeadBucket
  in the right region gets a 200 with ``x-amz-bucket-region``.  Buckets not in the map
  pass through unchanged (like SeaweedFS, no region is reported).
* Expiring keys: an access key id ``EXP<unix-time>...`` is refused with
  ``400 ExpiredToken`` once that time has passed.
* It records every request (method, Host, path, bucket, key, scope region, access key
  id, status, addressing style) in ``requests``.

SeaweedFS checks signatures against the identities bench/seaweed.py always configures,
so clients' keys (e.g. the refreshable test's ever-new ``EXP...`` ids) would be refused:
the proxy re-signs every forwarded request with the server's real keys (botocore's
S3SigV4Auth, for us-east-1).  That is simpler than a second SeaweedServer set up
without identities, which bench/seaweed.py cannot do; the proxy does not check the
client's signature.
"""
from __future__ import annotations

import http.client
import re
import threading
import time
import uuid
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import unquote, urlsplit

from botocore.auth import S3SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.credentials import Credentials

_SCOPE = re.compile(r"Credential=([^/,\s]+)/\d{8}/([^/,\s]+)/s3/aws4_request")
_EXPIRY = re.compile(r"^EXP(\d+)")
# Hop-by-hop headers and the ones the re-signing replaces.
_DROP = {"host", "authorization", "x-amz-date", "x-amz-content-sha256",
         "x-amz-security-token", "connection", "keep-alive", "transfer-encoding",
         "content-length", "expect", "proxy-connection"}
_DROP_BACK = {"connection", "keep-alive", "transfer-encoding", "content-length", "server",
              "date"}


@dataclass
class Seen:
    method: str
    host: str
    path: str
    bucket: str
    key: str
    region: str | None      # the credential scope's region (None: unsigned)
    akid: str | None
    status: int
    style: str              # "path" or "virtual"
    t: float


class AwsProxy:
    def __init__(self, upstream: str, access_key: str, secret_key: str,
                 regions: dict[str, str] | None = None, wrong_region: str = "redirect"):
        u = urlsplit(upstream)
        self.upstream_host, self.upstream_port = u.hostname, u.port or 80
        self.creds = Credentials(access_key, secret_key)
        self.regions = dict(regions or {})
        self.wrong_region = wrong_region
        self.requests: list[Seen] = []
        self._lock = threading.Lock()
        self._local = threading.local()
        self._server: ThreadingHTTPServer | None = None

    # -- lifecycle -----------------------------------------------------------
    def start(self) -> "AwsProxy":
        proxy = self

        class Handler(_Handler):
            owner = proxy

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self.port = self._server.server_address[1]
        self.endpoint = f"http://127.0.0.1:{self.port}"
        threading.Thread(target=self._server.serve_forever, daemon=True,
                         name="awsproxy").start()
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    def __enter__(self) -> "AwsProxy":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    # -- queries for tests -----------------------------------------------------
    def seen(self, bucket: str | None = None) -> list[Seen]:
        with self._lock:
            return [s for s in self.requests if bucket is None or s.bucket == bucket]

    def clear(self) -> None:
        with self._lock:
            self.requests.clear()

    # -- forwarding ------------------------------------------------------------
    def _conn(self, fresh: bool = False) -> http.client.HTTPConnection:
        c = getattr(self._local, "conn", None)
        if c is None or fresh:
            if c is not None:
                c.close()
            c = http.client.HTTPConnection(self.upstream_host, self.upstream_port, timeout=30)
            self._local.conn = c
        return c

    def forward(self, method: str, path: str, headers: dict[str, str], body: bytes):
        url = f"http://{self.upstream_host}:{self.upstream_port}{path}"
        req = AWSRequest(method=method, url=url, data=body or None,
                         headers={k: v for k, v in headers.items() if k.lower() not in _DROP})
        S3SigV4Auth(self.creds, "s3", "us-east-1").add_auth(req)
        out = dict(req.headers.items())
        for attempt in (0, 1):    # a pooled upstream connection may have been closed
            try:
                conn = self._conn(fresh=attempt > 0)
                conn.request(method, path, body=body or None, headers=out)
                resp = conn.getresponse()
                data = resp.read()
                return resp.status, resp.getheaders(), data
            except (http.client.HTTPException, ConnectionError):
                if attempt:
                    raise
        raise AssertionError("unreachable")


def _error_xml(code: str, message: str, **extra: str) -> bytes:
    more = "".join(f"<{k}>{v}</{k}>" for k, v in extra.items())
    rid = uuid.uuid4().hex[:16].upper()
    return (f'<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>{code}</Code>'
            f"<Message>{message}</Message>{more}<RequestId>{rid}</RequestId>"
            f"<HostId>awsproxy</HostId></Error>").encode()


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    owner: AwsProxy

    def log_message(self, *args) -> None:   # quiet
        pass

    def do_GET(self): self._handle()
    def do_HEAD(self): self._handle()
    def do_PUT(self): self._handle()
    def do_POST(self): self._handle()
    def do_DELETE(self): self._handle()

    def _reply(self, status: int, headers: list[tuple[str, str]], body: bytes,
               length: str | None = None) -> None:
        self.send_response(status)
        for k, v in headers:
            if k.lower() not in _DROP_BACK:
                self.send_header(k, v)
        if self.command == "HEAD":
            self.send_header("Content-Length", length if length is not None else "0")
            self.end_headers()
        else:
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

    def _handle(self) -> None:
        p = self.owner
        n = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(n) if n else b""
        host = self.headers.get("Host", "")
        path = urlsplit(self.path).path
        hostname = host.rsplit(":", 1)[0]
        if hostname.endswith(".localhost"):      # virtual-hosted: BUCKET.localhost:PORT
            style = "virtual"
            bucket, key = hostname[:-len(".localhost")], path.lstrip("/")
            upstream_path = "/" + bucket + self.path
        else:                                    # path style: /BUCKET/KEY
            style = "path"
            bucket, _, key = path.lstrip("/").partition("/")
            upstream_path = self.path
        bucket, key = unquote(bucket), unquote(key)
        m = _SCOPE.search(self.headers.get("Authorization", ""))
        akid, region = (m.group(1), m.group(2)) if m else (None, None)
        want = p.regions.get(bucket)
        exp = _EXPIRY.match(akid or "")
        if exp and time.time() > int(exp.group(1)):
            status, headers = 400, [("Content-Type", "application/xml")]
            data = _error_xml("ExpiredToken", "The provided token has expired.")
        elif want is not None and region is not None and region != want:
            headers = [("x-amz-bucket-region", want), ("Content-Type", "application/xml")]
            if p.wrong_region == "malformed":
                status = 400
                data = _error_xml("AuthorizationHeaderMalformed",
                                  f"The authorization header is malformed; the region "
                                  f"'{region}' is wrong; expecting '{want}'", Region=want)
            else:
                status = 301
                data = _error_xml("PermanentRedirect",
                                  "The bucket you are attempting to access must be addressed "
                                  "using the specified endpoint. Please send all future "
                                  "requests to this endpoint.", Bucket=bucket,
                                  Endpoint=f"{bucket}.s3.{want}.amazonaws.com")
        else:
            status, headers, data = p.forward(self.command, upstream_path,
                                              dict(self.headers.items()), body)
            if want is not None and self.command == "HEAD" and not key and status == 200:
                headers.append(("x-amz-bucket-region", want))
        with p._lock:
            p.requests.append(Seen(self.command, host, path, bucket, key, region, akid,
                                   status, style, time.time()))
        if self.command == "HEAD":
            length = dict((k.lower(), v) for k, v in headers).get("content-length")
            self._reply(status, headers, b"", length if status < 300 else "0")
        else:
            self._reply(status, headers, data)

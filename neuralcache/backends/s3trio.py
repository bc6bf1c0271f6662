"""Small ranged GETs on the trio thread itself: SigV4-signed HTTP/1.1 over trio sockets,
beside the worker-thread paths of s3native.py (obstore) and s3.py (urllib3).

Why: a worker thread blocked in a GET costs hand-offs (trio -> thread -> the client's
runtime -> thread -> trio) and, with a hundred of them in flight, a convoy on the GIL.
``python -m bench.micro small-gets`` (2,000 GETs of 100 KB over the 60 ms link, whole
process CPU) measured 0.37-0.44 ms per GET for a worker thread blocking in obstore
against 0.14 for this path at 128 in flight, and 0.46-0.49 against 0.19-0.20 at 16
(bench/RESULTS.md, "thirty-eighth sitting").  On the trio thread the answers of many
sockets come back from one epoll wait, with no thread to wake.

It changes no guarantee: the same URL (the backend's region and addressing), byte range
and ``If-Match`` version.  Anything but a complete 200/206 answer of exactly the length
asked (a 404, a 412, a redirect, a 5xx, a reset, a timeout, chunked encoding) sends
the caller to the thread path, which knows the error table, the region rules and the
retries; so a 404 is still NotFound and a 412 VersionChanged.  After
s3native.FAILS_BEFORE_PAUSE failures in a row (any of these but a 404, 412 or 416)
this path rests for s3native.PAUSE_S (s3native.failed: the obstore path's rule).
Credentials a provider would have to renew (network I/O, which must not run on the trio
thread) also send the GET the thread path's way.  Off with ``NEURALCACHE_TRIO_GET=0``.
"""
from __future__ import annotations

import collections
import datetime as dt
import hashlib
import hmac
import ipaddress
import logging
import os
import socket
import ssl
import time
from urllib.parse import urlsplit

import trio

from . import s3native

log = logging.getLogger(__name__)

# Largest GET taken this way: s3native.py's bound (1 MiB), for the same reason: the
# per-request costs are what this path saves, and at the 8 MiB block the urllib3 path
# reads into recycled buffers (s3.py).
MAX_BYTES = s3native.NATIVE_MAX_BYTES
# How long a GET may go without a byte (connecting, or between two reads of its
# answer): s3.py's READ_TIMEOUT_S, the urllib3 path's socket timeout, so a stalled
# answer costs no more than there (the thread path then serves it), and a slow but
# moving one is not cut off.
TIMEOUT_S = 5.0
# An idle keep-alive connection older than this is closed rather than reused: servers
# drop idle ones (S3 after ~20 s, SeaweedFS after its idle timeout), and a GET sent on
# a dropped one is a wasted round trip.  urllib3 keeps no such clock; 15 s is under S3's.
IDLE_MAX_S = 15.0
# Idle connections kept per host; the block store's thread limiter (128 by default)
# bounds how many are in use.
IDLE_KEEP = 256
# Bytes of response head read at most (S3's are ~500).
HEAD_MAX = 16 << 10
# Room for the response head in the buffer a GET is received into (a longer head
# makes it grow).
HEAD_ROOM = 1 << 10
# An answer's body at least this long is handed on as a view of the buffer it was
# received into (a copy below it: its head and spare 1 KiB would be >3 % on top).
VIEW_MIN = 32 << 10
# How long a host name's addresses serve new connections before it is looked up again.
# Each connection looked its name up (getaddrinfo in a worker thread: a DNS query each,
# 32 at once when the mount warms its connections).  New connections take the
# addresses in turn, so they still spread over the several an S3 endpoint answers, as
# the AWS CRT's resolver does (it keeps addresses up to a max TTL, 30 s in its
# clients).  An address that refuses a connection, or does not take it within
# DIRECT_CONNECT_S, leaves the entry, and that connection is made by name.
DNS_TTL_S = 30.0
# How long a connection to one of a name's addresses may take before that address
# leaves the rotation and the connection is made by name (trio's happy eyeballs start
# the next address after 0.25 s): a TCP handshake is one round trip, 60 ms here and
# under 0.3 s between continents.
DIRECT_CONNECT_S = 0.5
# What read() returns for an attempt that failed in transport (the thread path then
# serves it, and the backend counts it as a retry).
FAILED = object()


def ca_bundle() -> str:
    """The CA certificates an https endpoint is checked against, by every GET path:
    ``AWS_CA_BUNDLE`` if set (as botocore reads it), else botocore's bundle."""
    from botocore.httpsession import get_cert_path
    return os.environ.get("AWS_CA_BUNDLE") or get_cert_path(True)


def wanted() -> bool:
    return os.environ.get("NEURALCACHE_TRIO_GET", "1") != "0"


class Signer:
    """AWS Signature V4 for a GET with an unsigned payload (what the AWS docs, "Signature
    Calculations for the Authorization Header", require: host and the x-amz-* headers;
    Range and If-Match need not be signed).  The day's signing key is kept."""

    def __init__(self):
        self._key: tuple = (None, None)
        self._second: tuple = (None, "")      # (this second, its x-amz-date)

    def _signing_key(self, secret: str, day: str, region: str) -> bytes:
        if self._key[0] != (secret, day, region):
            k = hmac.new(("AWS4" + secret).encode(), day.encode(), hashlib.sha256).digest()
            for part in (region, "s3", "aws4_request"):
                k = hmac.new(k, part.encode(), hashlib.sha256).digest()
            self._key = ((secret, day, region), k)
        return self._key[1]

    def headers(self, creds, region: str, host: str, path: str,
                now: dt.datetime | None = None) -> str:
        """The signing headers of ``GET path`` as HTTP header lines."""
        if now is None:
            second = int(time.time())
            if second != self._second[0]:
                self._second = (second, time.strftime("%Y%m%dT%H%M%SZ",
                                                      time.gmtime(second)))
            amz = self._second[1]
        else:
            amz = now.strftime("%Y%m%dT%H%M%SZ")
        day = amz[:8]
        signed = "host;x-amz-content-sha256;x-amz-date"
        canon = f"host:{host}\nx-amz-content-sha256:UNSIGNED-PAYLOAD\nx-amz-date:{amz}\n"
        if creds.token:
            signed += ";x-amz-security-token"
            canon += f"x-amz-security-token:{creds.token}\n"
        request = f"GET\n{path}\n\n{canon}\n{signed}\nUNSIGNED-PAYLOAD"
        scope = f"{day}/{region}/s3/aws4_request"
        to_sign = (f"AWS4-HMAC-SHA256\n{amz}\n{scope}\n"
                   f"{hashlib.sha256(request.encode()).hexdigest()}")
        sig = hmac.new(self._signing_key(creds.secret_key, day, region), to_sign.encode(),
                       hashlib.sha256).hexdigest()
        out = (f"x-amz-content-sha256: UNSIGNED-PAYLOAD\r\nx-amz-date: {amz}\r\n"
               f"Authorization: AWS4-HMAC-SHA256 Credential={creds.access_key}/{scope}, "
               f"SignedHeaders={signed}, Signature={sig}\r\n")
        if creds.token:
            out += f"x-amz-security-token: {creds.token}\r\n"
        return out


class _Conn:
    """One keep-alive connection: a trio socket, TLS-wrapped for https."""

    __slots__ = ("where", "sock", "tls", "idle_since")

    def __init__(self, where, sock, tls):
        self.where, self.sock, self.tls, self.idle_since = where, sock, tls, 0.0

    async def send(self, data: bytes) -> None:
        if self.tls is not None:
            await self.tls.send_all(data)
            return
        view = memoryview(data)
        while view:
            view = view[await self.sock.send(view):]

    async def recv_into(self, view: memoryview) -> int:
        if self.tls is None:
            return await self.sock.recv_into(view)
        chunk = await self.tls.receive_some(len(view))
        view[:len(chunk)] = chunk
        return len(chunk)

    def close(self) -> None:
        self.sock.close()


class _Failed(Exception):
    """A transport failure or an answer this path does not handle."""


class TrioGets:
    """Connections per (scheme, host, port), for one backend."""

    def __init__(self, on_retry=lambda: None):
        self._signer = Signer()
        # called for each GET sent again on a new connection after a reused one failed
        # before any answer byte (the backend's retries counter: a server's idle close
        # is rare, as idle connections go after IDLE_MAX_S; a link's reset is not)
        self._on_retry = on_retry
        self._idle: dict[tuple, collections.deque[_Conn]] = {}
        self._origins: dict[str, tuple] = {}   # "scheme://host:port" -> its parts
        self._ssl: ssl.SSLContext | None = None
        self._fails = 0
        self._rest_until = 0.0
        self._sweep_at = 0.0   # when _give_back next closes old idle connections
        # (hostname, port) -> [valid until, addresses, the next one's index] (DNS_TTL_S)
        self._addrs: dict[tuple[str, int], list] = {}
        # lookups under way: [done, the error it ended with]
        self._looking: dict[tuple[str, int], list] = {}
        self.lookups = 0       # names looked up (tests)
        self.used = 0          # GETs served this way (stats)
        self.fell_back = 0     # attempts the thread path then served

    def resting(self) -> bool:
        return s3native.resting(self)

    async def read(self, creds, region: str, url: str, offset: int, length: int,
                   version: str) -> bytes | memoryview | object | None:
        """The bytes (a memoryview from VIEW_MIN on); None (resting, or an answer the
        thread path is to interpret) or FAILED (a transport failure): ask the thread
        path (see the module doc)."""
        if self.resting():
            return None
        cut = url.index("/", url.index("//") + 2)
        (where, host, hostname), path = self._origin(url[:cut]), url[cut:]
        req = (f"GET {path} HTTP/1.1\r\nHost: {host}\r\n"
               f"Range: bytes={offset}-{offset + length - 1}\r\n"
               + (f'If-Match: "{version}"\r\n' if version else "")
               + self._signer.headers(creds, region, host, path) + "\r\n").encode()
        why = None
        with trio.move_on_after(TIMEOUT_S) as scope:
            try:
                # a reused connection the server dropped fails before any answer: then
                # once more on a new one (a GET is idempotent)
                for fresh in (False, True):
                    conn = None if fresh else self._take(where)
                    reused = conn is not None
                    if conn is None:
                        conn = await self._connect(where, hostname)
                    try:
                        status, data = await self._exchange(conn, req, length, reused,
                                                            scope)
                    except _Stale:
                        self._on_retry()
                        continue
                    # (a 200 is the whole object: the bytes asked only from offset 0)
                    if data is not None and (status == 206 or offset == 0):
                        self._fails = 0
                        self.used += 1
                        return data
                    if status in (404, 412, 416):   # the object's answer: the thread
                        self.fell_back += 1         # path raises NotFound /
                        return None                 # VersionChanged
                    # anything else (403, a redirect, 5xx, chunked) may be this path's
                    # doing: after a few in a row it rests, so an endpoint
                    # that always answers so costs no round trip per read for long
                    self._failed(f"answered {status}")
                    return None
            except (OSError, ValueError, _Failed, trio.BrokenResourceError) as exc:
                why = exc
        if scope.cancelled_caught:
            why = f"no byte for {TIMEOUT_S:.0f} s"
        self._failed(why or "connection dropped twice")
        return FAILED

    def _origin(self, origin: str) -> tuple:
        """(where: (scheme, hostname, port), the Host header, the hostname) of
        "scheme://host[:port]"."""
        known = self._origins.get(origin)
        if known is None:
            u = urlsplit(origin)
            default = 443 if u.scheme == "https" else 80
            # the Host header as botocore signs it and urllib3 sends it: no default port
            host = u.netloc if u.port not in (None, default) else \
                u.netloc.rsplit(":", 1)[0] if u.port else u.netloc
            known = self._origins[origin] = ((u.scheme, u.hostname, u.port or default),
                                             host, u.hostname)
        return known

    async def warm(self, url: str, n: int) -> int:
        """Open ``n`` connections to ``url``'s origin at once (TCP, and TLS for https) and
        keep them idle, so that a job's first GETs on this path take an open connection
        instead of each paying the handshake's round trips (S3Backend.warm_connections
        does the same for urllib3's pool, which serves the large reads).  Returns how
        many opened; one that fails, or takes over TIMEOUT_S, is left to the GETs."""
        cut = url.find("/", url.index("//") + 2)
        where, _, hostname = self._origin(url if cut < 0 else url[:cut])
        opened = 0

        async def one() -> None:
            nonlocal opened
            with trio.move_on_after(TIMEOUT_S):
                try:
                    conn = await self._connect(where, hostname)
                except Exception as exc:      # best effort: a GET opens its own
                    log.debug("warming a connection to %s failed: %s", hostname, exc)
                    return
                self._give_back(conn)         # (cancelled: close() at unmount)
                opened += 1
        async with trio.open_nursery() as nursery:
            for _ in range(n):
                nursery.start_soon(one)
        return opened

    def prune(self) -> None:
        """Close the idle connections over IDLE_MAX_S of every origin (``_give_back``
        does it as GETs come; this is for connections warmed and never taken)."""
        now = time.monotonic()
        for old in self._idle.values():
            while old and now - old[0].idle_since >= IDLE_MAX_S:
                old.popleft().close()

    def _take(self, where) -> _Conn | None:
        """The most recently used idle connection (the least likely to be dropped)."""
        idle = self._idle.get(where)
        now = time.monotonic()
        while idle:
            conn = idle.pop()
            if now - conn.idle_since < IDLE_MAX_S:
                return conn
            conn.close()
        return None

    def _give_back(self, conn: _Conn) -> None:
        now = time.monotonic()
        idle = self._idle.setdefault(conn.where, collections.deque())
        # idle connections over IDLE_MAX_S are closed, not left in CLOSE_WAIT: this
        # origin's now, every origin's once in IDLE_MAX_S (an old region's, after a
        # switch, which no GET takes again)
        if now >= self._sweep_at:
            self._sweep_at = now + IDLE_MAX_S
            self.prune()                   # every origin's
        else:
            while idle and now - idle[0].idle_since >= IDLE_MAX_S:
                idle.popleft().close()
        if len(idle) >= IDLE_KEEP:
            conn.close()
            return
        conn.idle_since = now
        idle.append(conn)

    async def _address(self, hostname: str, port: int) -> str:
        """The address a new connection to ``hostname`` takes (DNS_TTL_S): the next of
        the name's, in turn; an IP address is its own."""
        try:
            ipaddress.ip_address(hostname)
            return hostname
        except ValueError:
            pass
        key = (hostname, port)
        while (entry := self._addrs.get(key)) is None or time.monotonic() >= entry[0]:
            busy = self._looking.get(key)
            if busy is not None:      # one lookup at a time per name: its answer is
                await busy[0].wait()  # every waiter's, its failure too
                if busy[1] is not None:
                    raise OSError(f"{hostname}: {busy[1]}")
                continue
            busy = self._looking[key] = [trio.Event(), None]
            try:
                self.lookups += 1
                infos = await trio.socket.getaddrinfo(hostname, port,
                                                      type=socket.SOCK_STREAM)
                # (a link-local IPv6 address needs its scope: left to the name)
                addrs = list(dict.fromkeys(info[4][0] for info in infos
                                           if len(info[4]) < 4 or not info[4][3]))
                entry = self._addrs[key] = [time.monotonic() + DNS_TTL_S, addrs, 0]
            except BaseException as exc:
                busy[1] = exc if isinstance(exc, Exception) else "lookup cancelled"
                raise
            finally:
                del self._looking[key]
                busy[0].set()
            break
        addrs, i = entry[1], entry[2]
        if not addrs:
            return hostname
        entry[2] = (i + 1) % len(addrs)
        return addrs[i % len(addrs)]

    async def _connect(self, where, hostname: str) -> _Conn:
        # TCP_NODELAY is trio's default
        name, port = where[1], where[2]
        addr = await self._address(name, port)
        if addr == name:                   # an IP address, or no address to take
            stream = await trio.open_tcp_stream(name, port)
        else:
            stream = None
            with trio.move_on_after(DIRECT_CONNECT_S):
                try:
                    stream = await trio.open_tcp_stream(addr, port)
                except OSError:
                    pass
            if stream is None:
                # an address that refuses or does not answer (gone, a broken IPv6
                # route, a server on IPv4 only where the name has an IPv6 address too)
                # leaves the entry, which is looked up again once none is left; this
                # connection is made by name, every address tried in turn (happy
                # eyeballs)
                entry = self._addrs.get((name, port))
                if entry is not None and addr in entry[1]:
                    entry[1].remove(addr)
                    if not entry[1]:
                        del self._addrs[(name, port)]
                stream = await trio.open_tcp_stream(name, port)
        try:
            tls = None
            if where[0] == "https":
                tls = trio.SSLStream(stream, self.context(), server_hostname=hostname)
                await tls.do_handshake()
        except BaseException:
            stream.socket.close()
            raise
        return _Conn(where, stream.socket, tls)

    def context(self) -> ssl.SSLContext:
        """The TLS context (the CA bundle read from disk once: S3Backend asks for it at
        start, so that the trio thread never does)."""
        if self._ssl is None:
            self._ssl = ssl.create_default_context(cafile=ca_bundle())
        return self._ssl

    async def _exchange(self, conn: _Conn, req: bytes, length: int, reused: bool,
                        scope: trio.CancelScope):
        """Send ``req`` and read the answer: (status, the body, or None for an answer
        the thread path is to interpret).  The connection goes back to the pool only
        after a complete answer that keeps it open.  Each read that brings bytes moves
        ``scope``'s deadline (TIMEOUT_S)."""
        keep = False
        buf = bytearray(length + HEAD_ROOM)
        view = memoryview(buf)
        got = 0
        try:
            try:
                await conn.send(req)
                while True:
                    if got == len(buf):
                        if got >= HEAD_MAX + length:
                            raise _Failed("response head too long")
                        view.release()
                        buf.extend(bytes(4096))
                        view = memoryview(buf)
                    n = await conn.recv_into(view[got:])
                    if not n:
                        raise _Failed("connection closed mid-answer")
                    got += n
                    scope.deadline = trio.current_time() + TIMEOUT_S
                    end = buf.find(b"\r\n\r\n", 0, got)
                    if end >= 0:
                        break
            except (OSError, _Failed, trio.BrokenResourceError):
                if reused and got == 0:    # the server had dropped it: try a new one
                    raise _Stale() from None
                raise
            head = bytes(view[:end]).decode("latin-1").split("\r\n")
            parts = head[0].split(" ", 2)
            if len(parts) < 2 or not parts[0].startswith("HTTP/1."):
                raise _Failed(f"not an HTTP answer: {head[0][:80]!r}")
            status = int(parts[1])
            clen, close, plain = None, parts[0] == "HTTP/1.0", True
            for line in head[1:]:
                name, _, value = line.partition(":")
                name = name.strip().lower()
                if name == "content-length":
                    if clen is not None and int(value) != clen:
                        raise _Failed("two different Content-Lengths")
                    clen = int(value)
                elif name == "connection":
                    close = "close" in value.lower()
                elif name == "transfer-encoding":
                    # (Content-Encoding is the object's own metadata: S3 answers the
                    # stored bytes, which Content-Length counts, as the thread path reads)
                    plain = False
            if status not in (200, 206) or not plain:
                return status, None            # (the connection is closed below)
            if clen != length:
                raise _Failed(f"{clen} bytes for {length}")
            start, total = end + 4, end + 4 + clen
            if got > total:
                raise _Failed("more bytes than the answer's length")
            if total > len(buf):
                view.release()
                buf.extend(bytes(total - len(buf)))
                view = memoryview(buf)
            while got < total:
                n = await conn.recv_into(view[got:total])
                if not n:
                    raise _Failed("connection closed mid-answer")
                got += n
                scope.deadline = trio.current_time() + TIMEOUT_S
            keep = not close
            # A view, not a copy (the zero-fill and a copy of each answer: 7 % of the
            # trio thread's py-spy samples, bench.breakdown --py-spy 100, files cold;
            # the zero-fill is left), where the buffer is the body and HEAD_ROOM: the
            # memory tier counts the body only.  A copy for a body under VIEW_MIN, or
            # a buffer a long head made grow (and over-allocate).
            if clen < VIEW_MIN or len(buf) != length + HEAD_ROOM:
                return status, bytes(view[start:total])
            return status, view[start:total]
        finally:
            if keep:
                self._give_back(conn)
            else:
                conn.close()

    def _failed(self, why) -> None:
        s3native.failed(self, why, "GETs on the trio thread", "the thread path")

    def close(self) -> None:
        for idle in self._idle.values():
            for conn in idle:
                conn.close()
        self._idle.clear()


class _Stale(Exception):
    """A reused connection closed before any byte of the answer."""

"""The WAN proxy's core: a TCP proxy that delays, paces and (through faults.py) breaks
the bytes it carries -- the model is in the package docstring (bench/wan/__init__.py).

One asyncio event loop; per connection two ``_Side`` protocols (client, upstream) and
two ``_Pipe`` delivery queues (up, down) sharing the two ``_Link`` token buckets.
``WanProxy`` runs a ``ProxyCore`` in a background thread of this process.
"""
from __future__ import annotations

import asyncio
import collections
import random
import socket
import struct
import threading

from .faults import ConnFaults, FaultConfig

# Per-direction, per-connection bytes queued in the proxy before it stops reading the
# source (backpressure).  At 30 ms one way this allows ~1 GB/s per connection -- above
# anything these machines move through a Python proxy, so the window never limits.
MAX_INFLIGHT = 32 << 20
# Resume reading once the queue has drained below this.
RESUME_INFLIGHT = 16 << 20
# Socket buffer size asked for on both legs (the kernel may clamp it).
SOCK_BUF = 4 << 20
# Token bucket burst, in seconds of line rate (a real link's queue absorbs small bursts).
BURST_S = 0.005
# A timer that fires up to this early still delivers (loop clock granularity is ~1 ms).
EARLY_S = 0.0005


class _Link:
    """One direction of the shared bottleneck: a token bucket (None = unlimited)."""

    def __init__(self, mbit: float | None):
        self.rate = mbit * 1e6 / 8 if mbit else None  # bytes/s
        self.free_at = 0.0

    def depart(self, nbytes: int, now: float) -> float:
        """Time at which ``nbytes`` arriving ``now`` have left the bucket."""
        if self.rate is None:
            return now
        start = max(self.free_at, now - BURST_S)
        self.free_at = start + nbytes / self.rate
        return max(self.free_at, now)


class _Stats:
    def __init__(self):
        self.bytes_up = 0        # client -> upstream, delivered
        self.bytes_down = 0      # upstream -> client, delivered
        self.connections = 0
        self.active = 0
        self.resets = 0
        self.stalls = 0
        self.upstream_errors = 0

    def as_dict(self) -> dict:
        return dict(self.__dict__)


class _Pipe:
    """One direction of one connection: a timed delivery queue from src to dst."""

    def __init__(self, conn: "_Conn", link: _Link, up: bool):
        self.conn = conn
        self.link = link
        self.up = up
        self.q: collections.deque = collections.deque()  # (due, bytes | None=EOF)
        self.qbytes = 0
        self.src: asyncio.Transport | None = None
        self.dst: asyncio.Transport | None = None
        self.src_paused = False
        self.dst_paused = False
        self.timer: asyncio.TimerHandle | None = None
        self.not_before = 0.0   # no delivery before this (handshake, stalls)
        self.last_due = 0.0
        self.closed = False
        self.eof_fed = False

    # -- producer side -----------------------------------------------------------
    def feed(self, data: bytes | None) -> None:
        if self.closed or self.eof_fed:
            return
        if data is None:
            self.eof_fed = True
        conn = self.conn
        loop = conn.loop
        now = loop.time()
        size = len(data) if data else 0
        due = max(self.link.depart(size, now), self.not_before) + conn.proxy.one_way
        if conn.proxy.jitter:
            due = max(due + conn.rng.uniform(-conn.proxy.jitter, conn.proxy.jitter), now)
        due = max(due, self.last_due)
        self.last_due = due
        self.q.append((due, data))
        self.qbytes += size
        if self.qbytes > MAX_INFLIGHT and not self.src_paused and self.src is not None:
            self.src_paused = True
            self.src.pause_reading()
        if self.timer is None and not self.dst_paused and self.dst is not None:
            self.timer = loop.call_at(due, self.flush)

    def stall(self, seconds: float) -> None:
        """Hold everything not yet delivered (and all that follows) ``seconds`` longer."""
        now = self.conn.loop.time()
        self.not_before = max(self.not_before, now + seconds)
        if self.q:
            shifted = collections.deque((d + seconds, b) for d, b in self.q)
            self.q = shifted
            self.last_due = self.q[-1][0]
            self._reschedule()

    def _reschedule(self) -> None:
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
        if self.q and not self.dst_paused and self.dst is not None:
            self.timer = self.conn.loop.call_at(self.q[0][0], self.flush)

    # -- consumer side -----------------------------------------------------------
    def flush(self) -> None:
        self.timer = None
        if self.closed or self.dst is None or self.dst_paused:
            return
        conn = self.conn
        limit = conn.loop.time() + EARLY_S
        out = []
        eof = False
        q = self.q
        while q and q[0][0] <= limit:
            _, data = q.popleft()
            if data is None:
                eof = True
                break
            out.append(data)
        if out:
            n = sum(map(len, out))
            self.qbytes -= n
            conn.delivered(self, n)
            if self.closed:  # a fault fired inside delivered()
                return
            self.dst.write(out[0] if len(out) == 1 else b"".join(out))
        if eof:
            self.closed = True
            q.clear()
            try:
                if self.dst.can_write_eof():
                    self.dst.write_eof()
                else:
                    self.dst.close()
            except (OSError, RuntimeError):
                pass
            conn.half_closed()
            return
        if self.src_paused and self.qbytes < RESUME_INFLIGHT and self.src is not None:
            self.src_paused = False
            try:
                self.src.resume_reading()
            except RuntimeError:
                pass
        if q and not self.dst_paused:
            self.timer = conn.loop.call_at(q[0][0], self.flush)

    def set_dst_paused(self, paused: bool) -> None:
        self.dst_paused = paused
        if paused:
            if self.timer is not None:
                self.timer.cancel()
                self.timer = None
        else:
            self.flush()

    def close(self) -> None:
        self.closed = True
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
        self.q.clear()
        self.qbytes = 0


class _Side(asyncio.Protocol):
    """Protocol for one socket of a proxied connection (client side or upstream side)."""

    def __init__(self, conn: "_Conn", is_client: bool):
        self.conn = conn
        self.is_client = is_client
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport):
        self.transport = transport
        sock = transport.get_extra_info("socket")
        if sock is not None:
            for opt in (socket.SO_RCVBUF, socket.SO_SNDBUF):
                try:
                    sock.setsockopt(socket.SOL_SOCKET, opt, SOCK_BUF)
                except OSError:
                    pass
            try:
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            except OSError:
                pass
        transport.set_write_buffer_limits(high=SOCK_BUF, low=SOCK_BUF // 2)
        if self.is_client:
            self.conn.client_made(self)
        else:
            self.conn.upstream_made(self)

    def data_received(self, data):
        self.conn.data_from(self, data)

    def eof_received(self):
        self.conn.data_from(self, None)
        return True  # keep the other half open until the EOF is delivered

    def connection_lost(self, exc):
        self.conn.lost(self, exc)

    def pause_writing(self):
        self.conn.pipe_into(self).set_dst_paused(True)

    def resume_writing(self):
        self.conn.pipe_into(self).set_dst_paused(False)


class _Conn:
    """One proxied connection: two sides and two pipes."""

    def __init__(self, proxy: "ProxyCore", index: int):
        self.proxy = proxy
        self.loop = proxy.loop
        self.rng = random.Random(f"{proxy.seed}:{index}")
        self.up = _Pipe(self, proxy.link_up, up=True)
        self.down = _Pipe(self, proxy.link_down, up=False)
        self.client: _Side | None = None
        self.upstream: _Side | None = None
        self.done = False
        self.eofs = 0
        self.down_since_req = True  # the next client bytes start a new request
        self.faults = ConnFaults(proxy.faults, self.rng)

    # -- set-up ------------------------------------------------------------------
    def client_made(self, side: _Side) -> None:
        self.client = side
        st = self.proxy.stats
        st.connections += 1
        st.active += 1
        now = self.loop.time()
        # Handshake: the client's first byte leaves no earlier than one RTT after accept.
        self.up.not_before = now + 2 * self.proxy.one_way
        self.up.src = side.transport
        self.down.dst = side.transport
        self.loop.create_task(self._connect())

    async def _connect(self) -> None:
        host, port = self.proxy.upstream
        try:
            await self.loop.create_connection(lambda: _Side(self, False), host, port)
        except OSError:
            self.proxy.stats.upstream_errors += 1
            self.reset(count=False)

    def upstream_made(self, side: _Side) -> None:
        if self.done:
            side.transport.abort()
            return
        self.upstream = side
        self.up.dst = side.transport
        self.down.src = side.transport
        if self.up.q:
            self.up._reschedule()

    def pipe_into(self, side: _Side) -> _Pipe:
        return self.down if side.is_client else self.up

    # -- data --------------------------------------------------------------------
    def data_from(self, side: _Side, data: bytes | None) -> None:
        if self.done:
            return
        if side.is_client:
            if data and self.down_since_req:
                self.down_since_req = False
                if self.faults.new_request(self):
                    return
            self.up.feed(data)
        else:
            self.down.feed(data)

    def delivered(self, pipe: _Pipe, n: int) -> None:
        st = self.proxy.stats
        if pipe.up:
            st.bytes_up += n
            return
        st.bytes_down += n
        self.down_since_req = True
        self.faults.delivered_down(self, n)

    # -- teardown ------------------------------------------------------------------
    def reset(self, count: bool = True) -> None:
        """Abort both sides; the client sees ECONNRESET (SO_LINGER 0 => RST)."""
        if self.done:
            return
        if count:
            self.proxy.stats.resets += 1
        for side in (self.client, self.upstream):
            if side is None or side.transport is None:
                continue
            sock = side.transport.get_extra_info("socket")
            if sock is not None:
                try:
                    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                except OSError:
                    pass
            side.transport.abort()
        self._finish()

    def half_closed(self) -> None:
        self.eofs += 1
        if self.eofs >= 2:
            self.close()

    def close(self) -> None:
        if self.done:
            return
        for side in (self.client, self.upstream):
            if side is not None and side.transport is not None:
                side.transport.close()
        self._finish()

    def lost(self, side: _Side, exc) -> None:
        if self.done:
            return
        if exc is not None:
            # An abortive close on one side is passed on as an abort of the other.
            self.reset(count=False)
            return
        # Orderly close of one side: deliver what is queued, then close the other.
        (self.up if side.is_client else self.down).feed(None)

    def _finish(self) -> None:
        self.done = True
        self.up.close()
        self.down.close()
        self.proxy.stats.active -= 1


class ProxyCore:
    """The proxy's state on its event loop: the link, the faults, the counters."""

    def __init__(self, upstream: tuple[str, int], rtt_ms: float, mbit: float | None,
                 jitter_ms: float, faults: FaultConfig, seed: int):
        self.upstream = upstream
        self.one_way = rtt_ms / 2000.0
        self.jitter = jitter_ms / 1000.0
        self.link_up = _Link(mbit)
        self.link_down = _Link(mbit)
        self.faults = faults
        self.seed = seed
        self.stats = _Stats()
        self.loop: asyncio.AbstractEventLoop | None = None
        self._next = 0

    def factory(self) -> asyncio.Protocol:
        self._next += 1
        return _Side(_Conn(self, self._next), True)

    async def serve(self, host: str, port: int) -> asyncio.AbstractServer:
        self.loop = asyncio.get_running_loop()
        return await self.loop.create_server(self.factory, host, port, backlog=1024,
                                             reuse_address=True)


def parse_hostport(s: str) -> tuple[str, int]:
    host, _, port = s.rpartition(":")
    return (host or "127.0.0.1"), int(port)


class WanProxy:
    """The proxy in a background thread of this process.

    >>> with WanProxy("127.0.0.1:8333", rtt_ms=60) as p:
    ...     p.endpoint   # "http://127.0.0.1:<port>"
    ...     p.stats()    # {"bytes_up": .., "bytes_down": .., ...}
    """

    def __init__(self, upstream: str | tuple[str, int], listen_port: int = 0,
                 rtt_ms: float = 60.0, mbit: float | None = None, jitter_ms: float = 0.0,
                 reset_rate: float = 0.0, stall_rate: float = 0.0, stall_s: float = 1.0,
                 fault_unit: str = "request", seed: int = 0, host: str = "127.0.0.1"):
        up = parse_hostport(upstream) if isinstance(upstream, str) else tuple(upstream)
        self.core = ProxyCore(up, rtt_ms, mbit, jitter_ms,
                              FaultConfig(reset_rate, stall_rate, stall_s, fault_unit), seed)
        self.host = host
        self.port = listen_port
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None

    @property
    def endpoint(self) -> str:
        return f"http://{self.host}:{self.port}"

    def start(self) -> "WanProxy":
        ready = threading.Event()
        err: list[BaseException] = []

        def run():
            loop = asyncio.new_event_loop()
            self._loop = loop
            try:
                server = loop.run_until_complete(self.core.serve(self.host, self.port))
                self.port = server.sockets[0].getsockname()[1]
                self._stop = asyncio.Event()
                ready.set()
                loop.run_until_complete(self._stop.wait())
                server.close()
                loop.run_until_complete(server.wait_closed())
            except BaseException as exc:  # reported to start()
                err.append(exc)
                ready.set()
            finally:
                loop.close()

        self._thread = threading.Thread(target=run, name="wan-proxy", daemon=True)
        self._thread.start()
        ready.wait()
        if err:
            raise err[0]
        return self

    def stats(self) -> dict:
        return self.core.stats.as_dict()

    def stop(self) -> None:
        if self._thread is None:
            return
        if self._loop is not None and self._stop is not None:
            try:
                self._loop.call_soon_threadsafe(self._stop.set)
            except RuntimeError:
                pass
        self._thread.join(timeout=5)
        self._thread = None

    def __enter__(self) -> "WanProxy":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

"""The WAN proxy's core: a TCP proxy that delays, paces and (through faults.py) breaks
the bytes it carries -- the model is in the package docstring (bench/wan/__init__.py).

One thread runs one epoll loop (``ProxyCore.run``) over every connection (conn.py: per
connection two sockets and two delay lines whose bytes wait in kernel pipes).  A busy
source is read on a timer grid (every ``TICK_S``, one large splice) instead of on every
readiness event, so the per-byte cost stays near that of the kernel's own TCP work.
``WanProxy`` runs a ``ProxyCore`` in a background thread of this process.
"""
from __future__ import annotations

import heapq
import itertools
import json
import os
import select
import socket
import sys
import threading
import time
import traceback
from typing import Self

from .conn import _IN, _Conn, _Line, _Link, _now, _Pipe, _Sock, _tune
from .faults import FaultConfig

# Busy sources are read on a grid of this period (one splice per tick, all busy sources
# in the same wake-up).  A byte read on the grid is stamped when read, which can be up to
# a tick (plus the loop's ~1 ms timer resolution) after it arrived -- never before.
TICK_S = 0.001
# Empty pipes kept for reuse (a busy line chains and drains pipes all the time).
PIPE_POOL = 64


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


def _more_files() -> None:
    """Raise the soft limit on open files to the hard one: a busy line holds its bytes
    in flight in several pipes (two descriptors each)."""
    try:
        import resource
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        if soft != hard:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    except (ImportError, ValueError, OSError):
        pass


class ProxyCore:
    """The proxy's state and its epoll loop: the link, the faults, the counters.

    ``listen()`` (and optionally ``listen_control()``) bind; ``run()`` serves until
    ``stop()`` (callable from any thread or a signal handler).
    """

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
        self.cpu_clock = None       # () -> CPU seconds of the proxy (thread or process)
        self.conns: set[_Conn] = set()
        self._ep = select.epoll()
        self._handlers: dict[int, object] = {}
        self._timers: list = []
        self._pipes: list[_Pipe] = []     # empty pipes for reuse
        self._seq = itertools.count()
        self._next = 0
        self._addr = None
        self._listeners: list[socket.socket] = []
        self._wake_r, self._wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        self._ep.register(self._wake_r, _IN)
        self._handlers[self._wake_r] = self._on_wake
        self._stopping = False

    # -- counters ------------------------------------------------------------------------
    def stats_dict(self) -> dict:
        d = self.stats.as_dict()
        try:
            cpu = self.cpu_clock() if self.cpu_clock is not None else None
        except OSError:     # the proxy thread just ended
            cpu = None
        if cpu is not None:
            gib = (d["bytes_up"] + d["bytes_down"]) / (1 << 30)
            d["cpu_s"] = round(cpu, 4)
            d["cpu_s_per_gib"] = round(cpu / gib, 4) if gib > 0.01 else None
        return d

    # -- set-up --------------------------------------------------------------------------
    def upstream_addr(self):
        if self._addr is None:
            host, port = self.upstream
            fam, _, _, _, addr = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
            self._addr = (fam, addr)
        return self._addr

    def listen(self, host: str, port: int) -> int:
        """Bind the proxy's listening socket; returns its port."""
        _more_files()
        ls = socket.create_server((host, port), backlog=1024, reuse_port=False)
        ls.setblocking(False)
        self._listeners.append(ls)
        self._ep.register(ls.fileno(), _IN)
        self._handlers[ls.fileno()] = lambda ev: self._accept(ls)
        return ls.getsockname()[1]

    def listen_control(self, port: int) -> int:
        """A port answering each connection with the counters as JSON; returns it."""
        cs = socket.create_server(("127.0.0.1", port), backlog=64)
        cs.setblocking(False)
        self._listeners.append(cs)
        self._ep.register(cs.fileno(), _IN)
        self._handlers[cs.fileno()] = lambda ev: self._control(cs)
        return cs.getsockname()[1]

    def _accept(self, ls: socket.socket) -> None:
        while True:
            try:
                s, _ = ls.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError:   # out of file descriptors: stop accepting for a while
                self._ep.unregister(ls.fileno())
                self.call_later(0.1, lambda fd: self._ep.register(fd, _IN), ls.fileno())
                return
            s.setblocking(False)
            _tune(s)
            self._next += 1
            _Conn(self, self._next, s).start()

    def _control(self, cs: socket.socket) -> None:
        while True:
            try:
                s, _ = cs.accept()
            except OSError:
                return
            try:
                s.settimeout(1.0)
                s.sendall(json.dumps(self.stats_dict()).encode())
            except OSError:
                pass
            finally:
                s.close()

    # -- the loop ------------------------------------------------------------------------
    def set_interest(self, s: _Sock, mask: int) -> None:
        if s.mask == 0:
            self._ep.register(s.fd, mask)
            self._handlers[s.fd] = s.on_event
        elif mask == 0:
            self._ep.unregister(s.fd)
            self._handlers.pop(s.fd, None)
        else:
            self._ep.modify(s.fd, mask)
        s.mask = mask

    def forget(self, s: _Sock) -> None:
        if s.mask:
            try:
                self._ep.unregister(s.fd)
            except (OSError, ValueError):
                pass
            if self._handlers.get(s.fd) == s.on_event:
                del self._handlers[s.fd]
            s.mask = 0

    def new_pipe(self) -> _Pipe:
        return self._pipes.pop() if self._pipes else _Pipe()

    def free_pipe(self, pipe: _Pipe) -> None:
        """An empty pipe back to the pool (kept for the next line that needs one)."""
        if len(self._pipes) < PIPE_POOL:
            self._pipes.append(pipe)
        else:
            pipe.close()

    def call_at(self, when: float, fn, arg) -> None:
        heapq.heappush(self._timers, (when, next(self._seq), fn, arg))

    def call_later(self, delay: float, fn, arg=None) -> None:
        self.call_at(_now() + delay, fn, arg)

    def schedule_pull(self, line: _Line) -> None:
        """Next read of a busy source: the next point of the tick grid (all busy sources
        are read in the same wake-up)."""
        when = (int(_now() / TICK_S) + 1) * TICK_S
        if line.pull_at is None or when < line.pull_at:
            line.pull_at = when
            self.call_at(when, line.pull_timer, when)

    def _on_wake(self, ev) -> None:
        try:
            os.read(self._wake_r, 4096)
        except OSError:
            pass

    def stop(self) -> None:
        self._stopping = True
        try:
            os.write(self._wake_w, b"x")
        except OSError:
            pass

    def run(self) -> None:
        poll = self._ep.poll
        timers = self._timers
        handlers = self._handlers
        heappop = heapq.heappop
        try:
            while not self._stopping:
                if timers:
                    timeout = timers[0][0] - _now()
                    if timeout < 0:
                        timeout = 0
                else:
                    timeout = None
                for fd, ev in poll(timeout):
                    h = handlers.get(fd)
                    if h is not None:
                        try:
                            h(ev)
                        except Exception:
                            self._failed(h)
                if timers:
                    now = _now()
                    while timers and timers[0][0] <= now:
                        _, _, fn, arg = heappop(timers)
                        try:
                            fn(arg)
                        except Exception:
                            self._failed(fn)
        finally:
            self.close()

    def _failed(self, fn) -> None:
        """A bug in a handler: say so and drop that connection, keep serving the rest."""
        traceback.print_exc(file=sys.stderr)
        owner = getattr(fn, "__self__", None)
        conn = getattr(owner, "conn", None)
        if conn is not None:
            try:
                conn.reset(count=False)
            except Exception:
                traceback.print_exc(file=sys.stderr)

    def close(self) -> None:
        for conn in list(self.conns):
            conn.close()
        for ls in self._listeners:
            ls.close()
        self._listeners.clear()
        while self._pipes:
            self._pipes.pop().close()
        self._ep.close()
        for fd in (self._wake_r, self._wake_w):
            try:
                os.close(fd)
            except OSError:
                pass


def parse_hostport(s: str) -> tuple[str, int]:
    host, _, port = s.rpartition(":")
    return (host or "127.0.0.1"), int(port)


class ProxyHandle:
    """What ``WanProxy`` and ``WanProxyProcess`` share: the proxy's ``endpoint``, and
    ``start()`` / ``stop()`` as a context manager."""

    host: str
    port: int

    @property
    def endpoint(self) -> str:
        return f"http://{self.host}:{self.port}"

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


class WanProxy(ProxyHandle):
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

    def start(self) -> "WanProxy":
        self.port = self.core.listen(self.host, self.port)
        ready = threading.Event()

        def run():
            clk = time.pthread_getcpuclockid(threading.get_ident())
            self.core.cpu_clock = lambda: time.clock_gettime(clk)
            ready.set()
            try:
                self.core.run()
            finally:
                final = time.clock_gettime(clk)
                self.core.cpu_clock = lambda: final

        self._thread = threading.Thread(target=run, name="wan-proxy", daemon=True)
        self._thread.start()
        ready.wait()
        return self

    def stats(self) -> dict:
        """The counters; ``cpu_s`` is the proxy thread's CPU time, ``cpu_s_per_gib`` that
        per GiB carried (both directions)."""
        return self.core.stats_dict()

    def stop(self) -> None:
        if self._thread is None:
            return
        self.core.stop()
        self._thread.join(timeout=5)
        self._thread = None

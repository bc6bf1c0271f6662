"""One proxied connection: its two sockets (``_Sock``: client, upstream), its two delay
lines (``_Line``: up, down) and the bandwidth buckets (``_Link``) the lines leave through.

A delay line holds the bytes in flight in kernel pipes (``_Pipe``): ``os.splice`` moves
them socket -> pipe when they arrive and pipe -> socket when they are due, so the payload
is never copied into Python; the line itself only keeps records ``[due, nbytes, pipe]``
(``nbytes`` None = EOF).  A busy source is read on the core's timer grid instead of on
every readiness event.  The loop, timers and counters are the core's (core.py: a
connection knows it as ``conn.core``); the faults are faults.py's.
"""
from __future__ import annotations

import collections
import errno
import fcntl
import os
import random
import select
import socket
import struct
import time

from .faults import ConnFaults

# Per-direction, per-connection bytes held in the proxy before it stops reading the
# source (backpressure).  At 30 ms one way this allows ~1 GB/s per connection.
MAX_INFLIGHT = 32 << 20
# Resume reading once the line has drained below this.
RESUME_INFLIGHT = 16 << 20
# Socket buffer size asked for on both legs (the kernel may clamp it).
SOCK_BUF = 4 << 20
# Token bucket burst, in seconds of line rate (a real link's queue absorbs small bursts).
BURST_S = 0.005
# A read at least this large puts its source on the grid; a grid read below
# POLL_EXIT takes it back to readiness events (a quiet connection costs nothing).
POLL_ENTER = 64 << 10
POLL_EXIT = 16 << 10
# Pipe size asked for (each pipe slot holds up to one page fragment of a socket buffer,
# often 32 KiB, so a 1 MiB pipe holds several MB); a line chains more pipes as needed.
PIPE_SIZE = 1 << 20
# A line reads into a new pipe once its tail pipe holds half its size (see _Line.pull).
# With a bandwidth cap, a read is queued as pieces of this much line time (at least
# PIECE_MIN bytes), so the bytes leave paced rather than in one burst per read.
PIECE_S = 0.001
PIECE_MIN = 16 << 10

_SPLICE = os.SPLICE_F_NONBLOCK | os.SPLICE_F_MOVE
_IN, _OUT = select.EPOLLIN, select.EPOLLOUT
_ERRS = select.EPOLLERR | select.EPOLLHUP
_LINGER0 = struct.pack("ii", 1, 0)
_now = time.monotonic
_splice = os.splice


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


class _Pipe:
    """One kernel pipe of a delay line; ``count`` = bytes the line's records put in it."""

    __slots__ = ("r", "w", "count")

    size = PIPE_SIZE    # lowered once if the kernel refuses it

    def __init__(self):
        self.r, self.w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        self.count = 0
        try:
            fcntl.fcntl(self.w, fcntl.F_SETPIPE_SZ, _Pipe.size)
        except OSError:
            try:   # without CAP_SYS_RESOURCE: at most /proc/sys/fs/pipe-max-size
                with open("/proc/sys/fs/pipe-max-size") as f:
                    _Pipe.size = min(_Pipe.size, int(f.read()))
                fcntl.fcntl(self.w, fcntl.F_SETPIPE_SZ, _Pipe.size)
            except (OSError, ValueError):
                pass   # the default 64 KiB pipe; the line chains more of them

    def full(self) -> bool:
        """No free slot (a splice into it would fail with EAGAIN)."""
        p = select.poll()
        p.register(self.w, select.POLLOUT)
        return not p.poll(0)

    def close(self) -> None:
        for fd in (self.r, self.w):
            try:
                os.close(fd)
            except OSError:
                pass


class _Sock:
    """One socket of a proxied connection; its epoll interest follows the two lines."""

    __slots__ = ("sock", "fd", "conn", "src_of", "dst_of", "mask", "connecting")

    def __init__(self, sock: socket.socket, conn: "_Conn"):
        self.sock = sock
        self.fd = sock.fileno()
        self.conn = conn
        self.src_of: _Line | None = None   # the line this socket feeds
        self.dst_of: _Line | None = None   # the line that writes into this socket
        self.mask = 0
        self.connecting = False

    def update(self) -> None:
        """Register the interest the lines want now (none = not registered at all, so a
        hung-up socket nobody reads does not wake the loop)."""
        if self.conn.done:
            return
        if self.connecting:
            mask = _OUT
        else:
            src, dst = self.src_of, self.dst_of
            mask = ((_IN if src is not None and src.wants_events() else 0)
                    | (_OUT if dst is not None and dst.blocked else 0))
        if mask != self.mask:
            self.conn.core.set_interest(self, mask)

    def on_event(self, ev: int) -> None:
        conn = self.conn
        if conn.done:
            return
        if self.connecting:
            conn.upstream_connected(self)
            return
        if ev & (_IN | _ERRS) and self.mask & _IN:
            self.src_of.pull(False)
            if conn.done:
                return
        if ev & (_OUT | _ERRS) and self.mask & _OUT:
            line = self.dst_of
            line.blocked = False
            line.flush()
            if not conn.done:
                self.update()

    def abort(self) -> None:
        try:
            self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, _LINGER0)
        except OSError:
            pass
        self.sock.close()

    def shutdown_write(self) -> None:
        try:
            self.sock.shutdown(socket.SHUT_WR)
        except OSError:
            pass


class _Line:
    """One direction of one connection: a timed delivery queue from src to dst whose
    bytes wait in kernel pipes."""

    __slots__ = ("conn", "core", "link", "up", "q", "pipes", "qbytes", "src", "dst",
                 "ready", "not_before", "last_due", "eof_read", "done", "polled",
                 "paused", "blocked", "flush_at", "pull_at")

    def __init__(self, conn: "_Conn", link: _Link, up: bool):
        self.conn = conn
        self.core = conn.core
        self.link = link
        self.up = up
        self.q: collections.deque = collections.deque()  # [due, nbytes | None, pipe]
        self.pipes: collections.deque = collections.deque()  # write order; [-1] = tail
        self.qbytes = 0
        self.src: _Sock | None = None
        self.dst: _Sock | None = None
        self.ready = False          # dst can be written (upstream connected)
        self.not_before = 0.0       # no delivery before this (handshake, stalls)
        self.last_due = 0.0
        self.eof_read = False
        self.done = False           # EOF delivered (or the connection is gone)
        self.polled = False         # src read on the tick grid, not on readiness
        self.paused = False         # MAX_INFLIGHT reached: src not read
        self.blocked = False        # dst full: waiting for EPOLLOUT
        self.flush_at: float | None = None
        self.pull_at: float | None = None

    def wants_events(self) -> bool:
        return not (self.eof_read or self.polled or self.paused or self.done)

    # -- producer side -------------------------------------------------------------------
    def pull(self, from_grid: bool) -> None:
        """Read what the source has (one splice, normally) into the tail pipe."""
        conn = self.conn
        if conn.done or self.eof_read or self.done:
            return
        got = 0
        pipes = self.pipes
        while True:
            room = MAX_INFLIGHT - self.qbytes
            if room <= 0:
                self.paused = True          # flush() resumes below RESUME_INFLIGHT
                break
            if not pipes and not self._chain():
                break
            pipe = pipes[-1]
            try:
                n = _splice(self.src.fd, pipe.w, room, flags=_SPLICE)
            except BlockingIOError:
                if pipe.count and pipe.full() and self._chain():
                    continue                # the older pipes are only read from now on
                break                       # the source is drained (or no pipe to spare)
            except OSError:
                conn.reset(count=False)     # an abort on one side is passed on
                return
            now = _now()
            if n == 0:
                self.eof_read = True
                self._queue(None, None, now)
                break
            if self.up:
                if conn.down_since_req:
                    conn.down_since_req = False
                    if conn.faults.new_request(conn):
                        return              # reset: these bytes never leave
            elif not got:
                conn.faults.response_bytes(conn)
            pipe.count += n
            got += n
            self._queue(n, pipe, now)
            # The kernel caps one splice into a pipe at its free slots x 4 KiB (though a
            # slot often holds a 32 KiB fragment), so the tail pipe is changed for an
            # empty one long before it is full; after a big read the source likely has
            # more: read that into the new pipe.
            chain = _Pipe.size >> 1
            if pipe.count >= chain and self._chain() and n >= chain:
                continue
            break
        if conn.done:
            return
        # busy sources go on the grid, quiet ones back to readiness events
        if self.paused or self.eof_read:
            polled = False
        elif from_grid:
            polled = got >= POLL_EXIT
        else:
            polled = got >= POLL_ENTER
        if polled:
            self.core.schedule_pull(self)
        if polled != self.polled:
            self.polled = polled
            self.src.update()
        elif not polled and (self.paused or self.eof_read):
            self.src.update()

    def pull_timer(self, when: float) -> None:
        if self.pull_at != when:
            return
        self.pull_at = None
        if self.polled:
            self.pull(True)

    def _chain(self) -> bool:
        """A new tail pipe; without one (out of file descriptors) the source is not read
        for a while."""
        try:
            pipe = self.core.new_pipe()
        except OSError:
            if not self.paused:
                self.paused = True
                self.core.call_later(0.05, self._retry_pipe)
            return False
        self.pipes.append(pipe)
        return True

    def _retry_pipe(self, _=None) -> None:
        if self.paused and not self.conn.done and self.qbytes < RESUME_INFLIGHT:
            self.paused = False
            self.src.update()

    def _queue(self, n: int | None, pipe: _Pipe | None, now: float) -> None:
        core = self.core
        link = self.link
        ow = core.one_way
        jitter = core.jitter
        q = self.q
        was_empty = not q
        if n is None:
            pieces = (0,)
        elif link.rate is None or n <= PIECE_MIN:
            pieces = (n,)
        else:
            step = max(PIECE_MIN, int(link.rate * PIECE_S))
            pieces = [step] * (n // step) + ([n % step] if n % step else [])
        for size in pieces:
            due = max(link.depart(size, now), self.not_before) + ow
            if jitter:
                due = max(due + self.conn.rng.uniform(-jitter, jitter), now)
            if due < self.last_due:
                due = self.last_due
            self.last_due = due
            q.append([due, size if n is not None else None, pipe])
        if n:
            self.qbytes += n
        if was_empty and self.ready and not self.blocked:
            self.arm(q[0][0])

    def stall(self, seconds: float) -> None:
        """Hold everything not yet delivered (and all that follows) ``seconds`` longer."""
        self.not_before = max(self.not_before, _now() + seconds)
        if self.q:
            for rec in self.q:
                rec[0] += seconds
            self.last_due = self.q[-1][0]
            self.flush_at = None
            if self.ready and not self.blocked:
                self.arm(self.q[0][0])

    # -- consumer side -------------------------------------------------------------------
    def arm(self, due: float) -> None:
        if self.flush_at is None or due < self.flush_at:
            self.flush_at = due
            self.core.call_at(due, self.flush_timer, due)

    def flush_timer(self, when: float) -> None:
        if self.flush_at != when:
            return
        self.flush_at = None
        self.flush()

    def flush(self) -> None:
        """Deliver every record that is due (one splice per pipe)."""
        conn = self.conn
        if self.done or conn.done or not self.ready or self.blocked:
            return
        q = self.q
        now = _now()
        stats = self.core.stats
        while q and q[0][0] <= now:
            head = q[0]
            pipe = head[2]
            if pipe is None:                      # EOF
                self._deliver_eof()
                return
            total = 0
            for rec in q:
                if rec[2] is not pipe or rec[0] > now:
                    break
                total += rec[1]
            want = total
            if not self.up:
                budget = conn.faults.down_budget()
                if budget is not None:
                    if budget <= 0:
                        conn.reset()
                        return
                    want = min(total, budget)
            try:
                m = _splice(pipe.r, self.dst.fd, want, flags=_SPLICE)
            except BlockingIOError:
                m = 0
            except OSError:
                conn.reset(count=False)
                return
            if m:
                left = m
                while left:
                    rec = q[0]
                    if rec[1] <= left:
                        left -= rec[1]
                        q.popleft()
                    else:
                        rec[1] -= left
                        left = 0
                pipe.count -= m
                self.qbytes -= m
                if self.up:
                    stats.bytes_up += m
                else:
                    stats.bytes_down += m
                    conn.down_since_req = True
                    conn.faults.delivered_down(conn, m)
                    if conn.done:
                        return
                if pipe.count == 0 and len(self.pipes) > 1 and self.pipes[0] is pipe:
                    self.core.free_pipe(self.pipes.popleft())
            if m < want:                          # dst is full: wait until writable
                self.blocked = True
                self.dst.update()
                return
        if self.paused and self.qbytes < RESUME_INFLIGHT:
            self.paused = False
            self.src.update()
        if q:
            self.arm(q[0][0])

    def _deliver_eof(self) -> None:
        self.done = True
        self.q.clear()
        self.close_pipes()
        self.dst.shutdown_write()
        self.conn.half_closed()

    def close_pipes(self) -> None:
        self.flush_at = self.pull_at = None
        self.polled = False
        while self.pipes:
            self.pipes.popleft().close()   # may hold bytes: never reused
        self.qbytes = 0


class _Conn:
    """One proxied connection: two sockets and two delay lines (``core``: the ProxyCore)."""

    def __init__(self, core, index: int, client: socket.socket):
        self.core = core
        self.rng = random.Random(f"{core.seed}:{index}")
        self.done = False
        self.eofs = 0
        self.down_since_req = True  # the next client bytes start a new request
        self.up = _Line(self, core.link_up, up=True)
        self.down = _Line(self, core.link_down, up=False)
        self.client = _Sock(client, self)
        self.upstream: _Sock | None = None
        self.client.src_of = self.up
        self.client.dst_of = self.down
        self.up.src = self.client
        self.down.dst = self.client
        self.down.ready = True
        self.faults = ConnFaults(core.faults, self.rng)

    def start(self) -> None:
        core = self.core
        st = core.stats
        st.connections += 1
        st.active += 1
        # Handshake: the client's first byte leaves no earlier than one RTT after accept.
        self.up.not_before = _now() + 2 * core.one_way
        core.conns.add(self)
        self.client.update()
        try:
            fam, addr = core.upstream_addr()
            s = socket.socket(fam, socket.SOCK_STREAM)
        except OSError:
            core.stats.upstream_errors += 1
            self.reset(count=False)
            return
        _tune(s)
        s.setblocking(False)
        self.upstream = up = _Sock(s, self)
        up.src_of = self.down
        up.dst_of = self.up
        self.down.src = up
        self.up.dst = up
        err = s.connect_ex(addr)
        if err in (0, errno.EINPROGRESS):
            up.connecting = True
            up.update()
        else:
            core.stats.upstream_errors += 1
            self.reset(count=False)

    def upstream_connected(self, up: _Sock) -> None:
        err = up.sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
        if not err:
            try:
                up.sock.getpeername()
            except OSError as exc:
                if exc.errno == errno.ENOTCONN:
                    return                  # a stale event: still connecting
                err = exc.errno
        if err:
            self.core.stats.upstream_errors += 1
            self.reset(count=False)
            return
        up.connecting = False
        self.up.ready = True
        up.update()
        if self.up.q:
            self.up.arm(self.up.q[0][0])

    def half_closed(self) -> None:
        self.eofs += 1
        if self.eofs >= 2:
            self.close()

    def reset(self, count: bool = True) -> None:
        """Abort both sides; the client sees ECONNRESET (SO_LINGER 0 => RST)."""
        if self.done:
            return
        if count:
            self.core.stats.resets += 1
        self._finish(abort=True)

    def close(self) -> None:
        if not self.done:
            self._finish(abort=False)

    def _finish(self, abort: bool) -> None:
        self.done = True
        core = self.core
        for line in (self.up, self.down):
            line.done = True
            line.q.clear()
            line.close_pipes()
        for s in (self.client, self.upstream):
            if s is None:
                continue
            core.forget(s)
            if abort:
                s.abort()
            else:
                s.sock.close()
        core.conns.discard(self)
        core.stats.active -= 1


def _tune(sock: socket.socket) -> None:
    for opt in (socket.SO_RCVBUF, socket.SO_SNDBUF):
        try:
            sock.setsockopt(socket.SOL_SOCKET, opt, SOCK_BUF)
        except OSError:
            pass
    try:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    except OSError:
        pass

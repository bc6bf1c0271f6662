"""Behaviour of the WAN emulator (bench/wan/): delay, integrity, bandwidth, faults, counters."""
from __future__ import annotations

import hashlib
import os
import socket
import socketserver
import sys
import threading
import time

import pytest

from bench.wan import WanProxy, WanProxyProcess

PATTERN = os.urandom(1 << 20)


class _Handler(socketserver.StreamRequestHandler):
    """Tiny request/response protocol: 'get N' -> N bytes; 'put N' + N bytes -> sha1 hex."""

    def handle(self):
        while True:
            line = self.rfile.readline()
            if not line:
                return
            cmd, n = line.split()
            n = int(n)
            if cmd == b"get":
                left = n
                while left:
                    chunk = PATTERN[: min(left, len(PATTERN))]
                    self.wfile.write(chunk)
                    left -= len(chunk)
            elif cmd == b"put":
                h = hashlib.sha1()
                left = n
                while left:
                    chunk = self.rfile.read(min(left, 1 << 20))
                    h.update(chunk)
                    left -= len(chunk)
                self.wfile.write(h.hexdigest().encode() + b"\n")
            self.wfile.flush()


class _Server(socketserver.ThreadingTCPServer):
    daemon_threads = True
    allow_reuse_address = True

    def handle_error(self, request, client_address):
        """Quiet about a peer that went away (the fault tests reset connections on purpose); socketserver's default prints a
        traceback between lines of dashes into the test output."""
        if not isinstance(sys.exc_info()[1], (ConnectionError, BrokenPipeError)):
            super().handle_error(request, client_address)


@pytest.fixture(scope="module")
def upstream():
    srv = _Server(("127.0.0.1", 0), _Handler)
    t = threading.Thread(target=srv.serve_forever, daemon=True)
    t.start()
    yield f"127.0.0.1:{srv.server_address[1]}"
    srv.shutdown()
    srv.server_close()


def _recv_exact(sock: socket.socket, n: int) -> bytes:
    buf = bytearray()
    while len(buf) < n:
        chunk = sock.recv(min(n - len(buf), 1 << 20))
        if not chunk:
            raise EOFError(f"got {len(buf)} of {n}")
        buf += chunk
    return bytes(buf)


def _get(sock: socket.socket, n: int) -> bytes:
    sock.sendall(b"get %d\n" % n)
    return _recv_exact(sock, n)


def _expected(n: int) -> bytes:
    out = bytearray()
    while len(out) < n:
        out += PATTERN[: min(n - len(out), len(PATTERN))]
    return bytes(out)


def test_request_response_costs_one_rtt_and_new_connection_two(upstream):
    with WanProxy(upstream, rtt_ms=100) as p:
        t0 = time.monotonic()
        s = socket.create_connection(("127.0.0.1", p.port))
        _get(s, 10)
        first = time.monotonic() - t0
        t1 = time.monotonic()
        _get(s, 10)
        second = time.monotonic() - t1
        s.close()
    assert 0.19 <= first <= 0.35, first     # handshake RTT + request RTT
    assert 0.095 <= second <= 0.18, second  # one RTT on a kept-alive connection


def test_bytes_pass_unchanged_both_directions_with_jitter(upstream):
    payload = os.urandom(3 << 20) + b"tail"
    with WanProxy(upstream, rtt_ms=20, jitter_ms=5, seed=3) as p:
        with socket.create_connection(("127.0.0.1", p.port)) as s:
            s.sendall(b"put %d\n" % len(payload) + payload)
            digest = s.makefile("rb").readline().strip().decode()
            assert digest == hashlib.sha1(payload).hexdigest()
            n = (5 << 20) + 123
            assert _get(s, n) == _expected(n)


def test_byte_counters_per_direction(upstream):
    with WanProxy(upstream, rtt_ms=10) as p:
        with socket.create_connection(("127.0.0.1", p.port)) as s:
            _get(s, 1_000_000)
            _get(s, 234_567)
        time.sleep(0.05)
        st = p.stats()
    assert st["bytes_down"] == 1_234_567
    assert st["bytes_up"] == len(b"get 1000000\n") + len(b"get 234567\n")
    assert st["connections"] == 1


def test_bandwidth_cap_roughly_holds_and_is_shared(upstream):
    mbit = 40.0  # 5 MB/s per direction, shared by all connections
    n = 1_500_000
    with WanProxy(upstream, rtt_ms=10, mbit=mbit) as p:
        socks = [socket.create_connection(("127.0.0.1", p.port)) for _ in range(2)]
        _get(socks[0], 1000)  # warm the connections up (handshake out of the way)
        _get(socks[1], 1000)
        t0 = time.monotonic()
        threads = [threading.Thread(target=_get, args=(s, n)) for s in socks]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        dt = time.monotonic() - t0
        for s in socks:
            s.close()
    rate = 2 * n / dt / 1e6
    assert 0.75 * 5.0 <= rate <= 1.1 * 5.0, rate


def test_throughput_is_pipelined_not_stop_and_wait(upstream):
    # 24 MB over a 200 ms RTT link on one connection: stop-and-wait on 256 KiB reads
    # would need ~19 s; a pipelined proxy needs about one RTT plus transfer time.
    n = 24 << 20
    with WanProxy(upstream, rtt_ms=200) as p:
        with socket.create_connection(("127.0.0.1", p.port)) as s:
            _get(s, 10)
            t0 = time.monotonic()
            _get(s, n)
            dt = time.monotonic() - t0
    assert dt < 2.5, dt


def test_reset_fault_resets_the_connection(upstream):
    with WanProxy(upstream, rtt_ms=10, reset_rate=1.0, seed=1) as p:
        s = socket.create_connection(("127.0.0.1", p.port))
        with pytest.raises(ConnectionResetError):
            _get(s, 100)
            _get(s, 100)
        s.close()
        assert p.stats()["resets"] >= 1


def test_connection_unit_reset_cuts_a_response(upstream):
    with WanProxy(upstream, rtt_ms=10, reset_rate=1.0, fault_unit="connection", seed=2) as p:
        s = socket.create_connection(("127.0.0.1", p.port))
        with pytest.raises((ConnectionResetError, EOFError)):
            _get(s, 4 << 20)
        s.close()
        assert p.stats()["resets"] == 1


def test_faults_are_seeded(upstream):
    def run(seed):
        outcomes = []
        with WanProxy(upstream, rtt_ms=2, reset_rate=0.5, seed=seed) as p:
            for _ in range(8):
                with socket.create_connection(("127.0.0.1", p.port)) as s:
                    try:
                        _get(s, 10)
                        outcomes.append("ok")
                    except (ConnectionResetError, EOFError):
                        outcomes.append("reset")
        return outcomes

    a = run(7)
    assert a == run(7)
    assert "ok" in a and "reset" in a


def test_stall_fault_delays_the_response(upstream):
    with WanProxy(upstream, rtt_ms=20, stall_rate=1.0, stall_s=0.3) as p:
        with socket.create_connection(("127.0.0.1", p.port)) as s:
            _get(s, 10)
            t0 = time.monotonic()
            _get(s, 10)
            dt = time.monotonic() - t0
        assert p.stats()["stalls"] == 2
    assert 0.3 <= dt <= 0.45, dt


def test_subprocess_proxy_reports_counters(upstream):
    with WanProxyProcess(upstream, rtt_ms=20) as p:
        with socket.create_connection(("127.0.0.1", p.port)) as s:
            t0 = time.monotonic()
            assert _get(s, 50_000) == _expected(50_000)
            dt = time.monotonic() - t0
        st = p.stats()
    assert st["bytes_down"] == 50_000
    assert 0.035 <= dt <= 0.2, dt

"""Measure the WAN emulator's own ceiling: raw TCP bulk transfer through the proxy.

A threaded source server sends N bytes per request; client threads pull them through a
``WanProxyProcess`` over 1 and over K connections.  This is the proxy's limit without
S3 in the way (the per-scenario "link" rows measure S3 through the proxy).  Also printed:
the proxy process's own CPU seconds per GiB it carried during the transfer (issue 10:
the emulator must stay cheap, <= 0.3 CPU-s/GiB at link rate).

    python -m bench ceiling [--rtt-ms 60] [--mbit N] [--conns 1,16] [--mb 256]
"""
from __future__ import annotations

import socket
import socketserver
import sys
import threading
import time

from .process import WanProxyProcess

_BUF = memoryview(bytes(range(256)) * (4 << 12))  # 4 MiB of a fixed pattern


class _Source(socketserver.StreamRequestHandler):
    def handle(self):
        sock = self.request
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4 << 20)
        while True:
            line = self.rfile.readline()
            if not line:
                return
            left = int(line)
            while left:
                n = min(left, len(_BUF))
                sock.sendall(_BUF[:n])
                left -= n


class QuietServer(socketserver.ThreadingTCPServer):
    """A threaded TCP server for a test upstream (here and in tests/bench/test_wan.py)."""
    daemon_threads = True
    allow_reuse_address = True

    def handle_error(self, request, client_address):
        """Quiet about a peer that went away (a reader that stops early, a fault test's
        reset): socketserver's default prints a traceback between lines of dashes."""
        if not isinstance(sys.exc_info()[1], (ConnectionError, BrokenPipeError)):
            super().handle_error(request, client_address)


def _pull(port: int, nbytes: int, out: list, idx: int) -> None:
    with socket.create_connection(("127.0.0.1", port)) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4 << 20)
        buf = bytearray(4 << 20)
        mv = memoryview(buf)
        s.sendall(b"1\n")            # warm up: pay the handshake outside the timing
        s.recv_into(mv, 1)
        t0 = time.monotonic()
        s.sendall(b"%d\n" % nbytes)
        left = nbytes
        while left:
            got = s.recv_into(mv, min(left, len(buf)))
            if not got:
                raise EOFError("source closed early")
            left -= got
        out[idx] = (t0, time.monotonic())


def measure(rtt_ms: float = 60.0, conns: int = 1, total_mb: float = 256,
            mbit: float | None = None) -> dict:
    """MB/s moving ``total_mb`` through the proxy split over ``conns`` connections."""
    srv = QuietServer(("127.0.0.1", 0), _Source)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        with WanProxyProcess(f"127.0.0.1:{srv.server_address[1]}", rtt_ms=rtt_ms,
                             mbit=mbit) as proxy:
            per = int(total_mb * 1e6 / conns)
            st0 = proxy.stats()
            spans: list = [None] * conns
            threads = [threading.Thread(target=_pull, args=(proxy.port, per, spans, i))
                       for i in range(conns)]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            t0 = min(s[0] for s in spans)
            t1 = max(s[1] for s in spans)
            st = proxy.stats()
    finally:
        srv.shutdown()
        srv.server_close()
    return {"rtt_ms": rtt_ms, "conns": conns, "mbit": mbit, "bytes": per * conns,
            "seconds": t1 - t0, "mb_per_s": per * conns / (t1 - t0) / 1e6,
            "proxy_bytes_down": st["bytes_down"],
            "proxy_cpu_s_per_gib": _cpu_per_gib(st0, st)}


def _cpu_per_gib(before: dict, after: dict) -> float | None:
    """The proxy's CPU seconds per GiB carried between two stats() (None: no cpu_s)."""
    if "cpu_s" not in before or "cpu_s" not in after:
        return None
    carried = sum(after[k] - before[k] for k in ("bytes_up", "bytes_down"))
    return (after["cpu_s"] - before["cpu_s"]) / max(carried, 1) * (1 << 30)


def main(args) -> int:
    for c in args.conns:
        r = measure(args.rtt_ms, c, args.mb, args.mbit)
        cpu = r["proxy_cpu_s_per_gib"]
        print(f"proxy ceiling rtt={r['rtt_ms']:.0f}ms conns={c:3d} "
              f"{r['mb_per_s']:8.1f} MB/s ({r['bytes'] / 1e6:.0f} MB in {r['seconds']:.2f} s)"
              + (f", proxy {cpu:.2f} CPU-s/GiB" if cpu is not None else ""))
    return 0

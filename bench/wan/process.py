"""The WAN proxy as a process: ``python -m bench.wan ...`` (``main``) and
``WanProxyProcess``, which starts that command and reads its counters.

The subprocess prints one line ``listening PORT control CTLPORT ...`` when it serves; the
control port answers each connection with the counters as JSON (with ``cpu_s``, the
proxy process's CPU seconds since it started serving, and ``cpu_s_per_gib``, that per GiB
carried).  The benchmark runner uses the subprocess so the proxy never competes with
workload threads for the GIL.
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import time

from .core import ProxyCore, ProxyHandle, parse_hostport
from .faults import FaultConfig


class WanProxyProcess(ProxyHandle):
    """The proxy as a subprocess (``python -m bench.wan``); counters via a control port."""

    def __init__(self, upstream: str, rtt_ms: float = 60.0, mbit: float | None = None,
                 jitter_ms: float = 0.0, reset_rate: float = 0.0, stall_rate: float = 0.0,
                 stall_s: float = 1.0, fault_unit: str = "request", seed: int = 0,
                 listen_port: int = 0, log_path: str | None = None):
        self.args = ["--listen", str(listen_port), "--upstream", upstream,
                     "--rtt-ms", str(rtt_ms), "--jitter-ms", str(jitter_ms),
                     "--reset-rate", str(reset_rate), "--stall-rate", str(stall_rate),
                     "--stall-s", str(stall_s), "--fault-unit", fault_unit,
                     "--seed", str(seed), "--control-port", "0"]
        if mbit:
            self.args += ["--mbit", str(mbit)]
        self.host = "127.0.0.1"
        self.port = 0
        self.control_port = 0
        self.log_path = log_path
        self.proc: subprocess.Popen | None = None

    def start(self) -> "WanProxyProcess":
        # the checkout holding bench/ (bench/wan/process.py -> three levels up)
        here = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
        env = dict(os.environ)
        env["PYTHONPATH"] = here + os.pathsep + env.get("PYTHONPATH", "")
        err = open(self.log_path, "ab") if self.log_path else subprocess.DEVNULL
        self.proc = subprocess.Popen([sys.executable, "-m", "bench.wan", *self.args],
                                     stdout=subprocess.PIPE, stderr=err, env=env,
                                     start_new_session=True)
        line = self.proc.stdout.readline().decode()
        if not line.startswith("listening"):
            self.stop()
            raise RuntimeError(f"wan proxy did not start: {line!r}")
        parts = line.split()
        self.port = int(parts[1])
        self.control_port = int(parts[3])
        return self

    def stats(self) -> dict:
        with socket.create_connection(("127.0.0.1", self.control_port), timeout=5) as s:
            buf = b""
            while True:
                chunk = s.recv(65536)
                if not chunk:
                    break
                buf += chunk
        return json.loads(buf)

    def stop(self) -> None:
        if self.proc is None:
            return
        if self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
            try:
                self.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        if self.proc.stdout:
            self.proc.stdout.close()
        self.proc = None


def cpu_note(after: dict, before: dict | None = None) -> str | None:
    """One line for a run's notes: the emulator's own CPU per GiB it carried, from two
    ``stats()`` (or one: since the proxy started); None if they have no ``cpu_s``."""
    before = before or {}
    if "cpu_s" not in after:
        return None
    cpu = after["cpu_s"] - before.get("cpu_s", 0.0)
    gib = sum(after[k] - before.get(k, 0) for k in ("bytes_up", "bytes_down")) / (1 << 30)
    per = f"{cpu / gib:.2f} CPU-s per GiB carried" if gib > 0.01 else "idle"
    return f"WAN emulator: {per} ({cpu:.1f} CPU-s for {gib:.2f} GiB)"


# -- command line -----------------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m bench.wan",
                                 description="Userspace WAN emulator: a TCP proxy that adds "
                                             "delay, a bandwidth cap, jitter and faults.")
    ap.add_argument("--listen", type=int, required=True, help="port to listen on (0 = any)")
    ap.add_argument("--host", default="127.0.0.1", help="address to listen on")
    ap.add_argument("--upstream", required=True, help="HOST:PORT to forward to")
    ap.add_argument("--rtt-ms", type=float, default=60.0, help="round trip (half each way)")
    ap.add_argument("--mbit", type=float, default=None, help="bandwidth cap per direction")
    ap.add_argument("--jitter-ms", type=float, default=0.0, help="+- uniform one-way jitter")
    ap.add_argument("--reset-rate", type=float, default=0.0, help="probability of a reset")
    ap.add_argument("--stall-rate", type=float, default=0.0, help="probability of a stall")
    ap.add_argument("--stall-s", type=float, default=1.0, help="stall length in seconds")
    ap.add_argument("--fault-unit", choices=("request", "connection"), default="request")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--control-port", type=int, default=None,
                    help="serve the counters as JSON on this port (0 = any)")
    ap.add_argument("--stats-interval", type=float, default=0.0,
                    help="print the counters to stderr every N seconds")
    return ap


def serve(a: argparse.Namespace) -> None:
    core = ProxyCore(parse_hostport(a.upstream), a.rtt_ms, a.mbit, a.jitter_ms,
                     FaultConfig(a.reset_rate, a.stall_rate, a.stall_s, a.fault_unit), a.seed)
    port = core.listen(a.host, a.listen)
    ctl_port = core.listen_control(a.control_port) if a.control_port is not None else 0
    cpu0 = time.process_time()              # the whole process is the emulator; its CPU
    core.cpu_clock = lambda: time.process_time() - cpu0   # from here (not the start-up)
    print(f"listening {port} control {ctl_port} upstream {a.upstream} rtt_ms {a.rtt_ms}",
          flush=True)
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: core.stop())
    if a.stats_interval > 0:
        def report(_):
            print(json.dumps(core.stats_dict()), file=sys.stderr, flush=True)
            core.call_later(a.stats_interval, report)
        core.call_later(a.stats_interval, report)
    core.run()


def main(argv: list[str] | None = None) -> int:
    a = build_parser().parse_args(argv)
    serve(a)
    return 0

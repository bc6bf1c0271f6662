"""Start and stop a real SeaweedFS *cluster* (the in-region shared cache tier of issue 13),
optionally behind a WAN proxy.

Unlike ``SeaweedServer`` (one ``weed server`` process) every role is its own process:
one ``weed master``, ``VOLUME_SERVERS`` ``weed volume`` servers, one ``weed filer`` and
one ``weed s3`` gateway.  Replication ``001`` (two copies on two servers of the same
rack) means any one volume server can die without losing a block; three servers leave
two to grow new writable volumes on after one died.

Ports (weed's rule: gRPC = HTTP port + 10000; its unix sockets in /tmp are named by
port, so every instance needs its own block):  base = master, base+1.. = volumes,
base+VOLUME_SERVERS+1 = filer, +2 = s3.

    with SeaweedCluster(workdir, proxy_rtt_ms=1) as c:
        c.endpoint              # through the 1 ms proxy (c.direct_endpoint: not)
        c.client()              # boto3 client with the cluster's credentials
        c.kill_volume(0)        # SIGKILL one volume server (c.start_volume(0) again)
        c.kill_s3()             # SIGKILL the S3 gateway (c.start_s3() again)
        c.proxy.stats()         # the proxy's byte counters

``python -m bench.servers.cluster DIR`` runs one until Ctrl-C.
"""
from __future__ import annotations

import os
import signal
import subprocess
from pathlib import Path

from bench.wan import WanProxyProcess

from .seaweed import STOP_GRACE_S, SeaweedServer, free_port_block, weed_binary

VOLUME_SERVERS = 3
# Two copies on different servers of one rack ("001"): survives one lost server.
REPLICATION = "001"
# Small volumes (the default is 30 GB): a test cluster writes a few MB, and a smaller
# limit lets the master grow volumes often enough that losing a server is exercised.
VOLUME_SIZE_LIMIT_MB = 64
# Volumes per server (the all-in-one server needs -volume.max=100 for a second bucket;
# each bucket is a collection with its own volumes, replicated on two servers).
VOLUMES_PER_SERVER = 100


class SeaweedCluster(SeaweedServer):
    """master + VOLUME_SERVERS volume servers + filer + s3 gateway, each a process."""

    def __init__(self, workdir: str | os.PathLike, base_port: int | None = None,
                 proxy_rtt_ms: float | None = None, volumes: int = VOLUME_SERVERS):
        super().__init__(workdir, base_port or free_port_block(volumes + 3))
        self.volumes = volumes
        self._use_ports(self.base_port)
        self.proxy_rtt_ms = proxy_rtt_ms
        self.proxy: WanProxyProcess | None = None
        self.procs: dict[str, subprocess.Popen] = {}
        self.grace = STOP_GRACE_S

    def _use_ports(self, base: int) -> None:
        self.base_port = self.master_port = base
        self.filer_port = base + self.volumes + 1
        self.s3_port = base + self.volumes + 2
        self.direct_endpoint = self.endpoint = f"http://127.0.0.1:{self.s3_port}"

    # -- processes -------------------------------------------------------------------
    def _spawn(self, name: str, args: list[str]) -> None:
        log = open(self.workdir / f"{name}.log", "ab")
        try:
            self.procs[name] = subprocess.Popen([weed_binary(), *args], stdout=log,
                                                stderr=subprocess.STDOUT,
                                                start_new_session=True)
        finally:
            log.close()

    def _common(self, port: int) -> list[str]:
        return ["-ip=127.0.0.1", "-ip.bind=127.0.0.1", f"-port={port}",
                f"-port.grpc={port + 10000}"]

    def start_volume(self, i: int) -> None:
        d = self.workdir / f"volume{i}"
        d.mkdir(parents=True, exist_ok=True)
        self._spawn(f"volume{i}", ["volume", *self._common(self.master_port + 1 + i),
                                   f"-dir={d}", f"-max={VOLUMES_PER_SERVER}",
                                   f"-mserver=127.0.0.1:{self.master_port}",
                                   "-dataCenter=dc1", "-rack=rack1"])

    def kill_volume(self, i: int) -> None:
        """SIGKILL volume server ``i`` (a crash: no goodbye to the master)."""
        self._kill(f"volume{i}", signal.SIGKILL)

    def _spawn_s3(self) -> None:
        self._spawn("s3", ["s3", *self._common(self.s3_port),
                           f"-filer=127.0.0.1:{self.filer_port}",
                           f"-config={self.workdir / 's3.json'}",
                           "-port.iceberg=0", "-port.lance=0"])
        self.proc = self.procs["s3"]      # what SeaweedServer._wait_ready watches

    def kill_s3(self) -> None:
        """SIGKILL the S3 gateway (the tier is down: connections are refused; the proxy
        in front, if any, stays up).  ``start_s3()`` brings it back on the same port."""
        self._kill("s3", signal.SIGKILL)
        self.proc = None

    def start_s3(self) -> None:
        """Start the S3 gateway again (after ``kill_s3``) and wait until it serves."""
        self._spawn_s3()
        self._wait_ready()

    def start(self) -> "SeaweedCluster":
        """Start every process and wait until a bucket create + put succeeds.  If a
        process exits meanwhile (seen: a port taken between free_port_block's check and
        weed's bind) the cluster is started once more on other ports."""
        try:
            return self._start()
        except RuntimeError as exc:
            if "exited" not in str(exc):
                raise
            self._use_ports(free_port_block(self.volumes + 3))
            return self._start()

    def _start(self) -> "SeaweedCluster":
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.write_s3_config()
        (self.workdir / "master").mkdir(exist_ok=True)
        (self.workdir / "filer").mkdir(exist_ok=True)
        master = f"127.0.0.1:{self.master_port}"
        try:
            self._spawn("master", ["master", *self._common(self.master_port),
                                   f"-mdir={self.workdir / 'master'}",
                                   f"-defaultReplication={REPLICATION}",
                                   f"-volumeSizeLimitMB={VOLUME_SIZE_LIMIT_MB}"])
            for i in range(self.volumes):
                self.start_volume(i)
            self._spawn("filer", ["filer", *self._common(self.filer_port),
                                  f"-master={master}", f"-defaultReplicaPlacement={REPLICATION}",
                                  f"-defaultStoreDir={self.workdir / 'filer'}"])
            self._spawn_s3()
            try:
                self._wait_ready()
            except RuntimeError as exc:
                dead = [n for n, p in self.procs.items() if p.poll() is not None]
                if dead:
                    raise RuntimeError(f"weed {', '.join(dead)} exited (logs in "
                                       f"{self.workdir}): {exc}") from None
                raise
            if self.proxy_rtt_ms is not None:
                self.proxy = WanProxyProcess(f"127.0.0.1:{self.s3_port}",
                                             rtt_ms=self.proxy_rtt_ms).start()
                self.endpoint = self.proxy.endpoint
        except Exception:
            self.stop()
            raise
        return self

    def create_bucket(self, name: str) -> None:
        """Create a bucket and write one object to it: SeaweedFS grows a bucket's volumes
        on its first write (~0.2-2 s), which a caller with a short deadline (the shared
        tier's) would otherwise see as a stalled first request."""
        s3 = self.client()
        s3.create_bucket(Bucket=name)
        s3.put_object(Bucket=name, Key="probe", Body=b"ok")
        s3.delete_object(Bucket=name, Key="probe")

    def _kill(self, name: str, sig: int) -> None:
        p = self.procs.pop(name, None)
        if p is None or p.poll() is not None:
            return
        try:
            os.killpg(p.pid, sig)
        except ProcessLookupError:
            return
        try:
            p.wait(timeout=self.grace if sig != signal.SIGKILL else 10)
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait(timeout=10)

    def stop(self, grace: float | None = None) -> None:
        if self.proxy is not None:
            self.proxy.stop()
            self.proxy = None
            self.endpoint = self.direct_endpoint
        if grace is not None:
            self.grace = grace
        # the gateway and filer first, then the storage, the master last
        for name in ["s3", "filer", *[f"volume{i}" for i in range(self.volumes)], "master"]:
            self._kill(name, signal.SIGTERM if self.grace > 0 else signal.SIGKILL)
        self.proc = None


if __name__ == "__main__":   # manual use: python -m bench.servers.cluster DIR
    import argparse

    ap = argparse.ArgumentParser(description="run a SeaweedFS cluster (master, 3 volume "
                                             "servers, filer, s3 gateway)")
    ap.add_argument("workdir")
    ap.add_argument("--rtt-ms", type=float, default=None, help="put a WAN proxy in front")
    a = ap.parse_args()
    with SeaweedCluster(Path(a.workdir), proxy_rtt_ms=a.rtt_ms) as c:
        print(f"endpoint {c.endpoint} access_key {c.access_key} secret {c.secret_key}",
              flush=True)
        try:
            signal.pause()
        except KeyboardInterrupt:
            pass

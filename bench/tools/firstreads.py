"""How long a job's first reads take right after the mount: the first burst of a cold
epoch, whose GETs find no open connection unless the daemon opened some beforehand
(daemon.py WARM_CONNECTIONS: S3Backend.warm_connections for the thread path,
warm_trio for the small GETs on the trio thread).

    python -m bench.tools.firstreads [--files 32] [--readers 8] [--rounds 3]
                                     [--rtt-ms 60] CODE_DIR [CODE_DIR ...]

Starts SeaweedFS and the WAN proxy once; each round mounts every CODE_DIR in turn
(a checkout whose neuralcache/ the daemon runs; the order reversed every other round)
on a fresh cache, waits until its stats say the warm-up is done (at most 10 s; a tree
without the trio warm-up reports only ``connections_warmed``), then reads ``--files``
100 KB files with ``--readers`` threads, every byte checked (xxh3), and prints the
time.  The endpoint is an IP address, so no name is looked up.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import xxhash

FILE_BYTES = 100_000


def _stats(mp: Path) -> dict:
    return json.loads((mp / ".neuralcache" / "stats.json").read_text())


def _read_all(mp: Path, names: list[str], readers: int, want: dict[str, int]) -> float:
    def one(name: str) -> None:
        data = (mp / name).read_bytes()
        if xxhash.xxh3_64_intdigest(data) != want[name]:
            raise SystemExit(f"firstreads: wrong bytes in {name}")
    t0 = time.monotonic()
    with ThreadPoolExecutor(readers) as pool:
        list(pool.map(one, names))
    return time.monotonic() - t0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.tools.firstreads",
                                 description=__doc__.split("\n\n")[0])
    ap.add_argument("code", nargs="+", help="checkouts whose neuralcache/ to mount")
    ap.add_argument("--files", type=int, default=32)
    ap.add_argument("--readers", type=int, default=8)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--rtt-ms", type=float, default=60.0)
    a = ap.parse_args(argv)
    from bench.servers.seaweed import SeaweedServer
    from bench.wan.process import WanProxyProcess

    base = Path(tempfile.mkdtemp(prefix="firstreads-"))
    codes = [os.path.abspath(c) for c in a.code]
    times: dict[str, list[float]] = {c: [] for c in codes}
    try:
        with SeaweedServer(base / "sw") as sw:
            s3 = sw.client()
            s3.create_bucket(Bucket="first")
            want = {}
            for i in range(a.files * a.rounds * len(codes)):
                body = os.urandom(FILE_BYTES)
                name = f"f{i:05d}.bin"
                s3.put_object(Bucket="first", Key=name, Body=body)
                want[name] = xxhash.xxh3_64_intdigest(body)
            names = sorted(want)
            proxy = WanProxyProcess(f"127.0.0.1:{sw.s3_port}", rtt_ms=a.rtt_ms).start()
            try:
                for r in range(a.rounds):
                    for code in (codes if r % 2 == 0 else codes[::-1]):
                        batch, names = names[:a.files], names[a.files:]   # never read yet
                        times[code].append(_round(code, sw, proxy, base, batch,
                                                  a.readers, want))
            finally:
                proxy.stop()
    finally:
        shutil.rmtree(base, ignore_errors=True)
    for code, ts in times.items():
        print(f"{code}: the first {a.files} files in " +
              ", ".join(f"{t * 1000:.0f}" for t in ts) + " ms")
    return 0


def _round(code: str, sw, proxy, base: Path, names: list[str], readers: int,
           want: dict[str, int]) -> float:
    env = dict(os.environ, PYTHONPATH=code, **sw.env())
    nc = [sys.executable, "-m", "neuralcache"]
    mp, cache = base / "mnt", base / "cache"
    shutil.rmtree(cache, ignore_errors=True)
    mp.mkdir(exist_ok=True)
    r = subprocess.run(nc + ["mount", "s3://first", str(mp), "--cache-dir", str(cache),
                             "--endpoint-url", proxy.endpoint], env=env, cwd=code,
                       capture_output=True, text=True)
    if r.returncode != 0:
        raise SystemExit(f"firstreads: mount failed: {r.stderr.strip()}")
    try:
        t_end = time.monotonic() + 10
        while True:
            s = _stats(mp)
            if s.get("connections_warmed") is not None and \
                    s.get("trio_connections_warmed", 0) is not None:
                break
            if time.monotonic() > t_end:
                print(f"firstreads: {code}: the warm-up not done after 10 s; reading",
                      file=sys.stderr)
                break
            time.sleep(0.1)
        os.listdir(mp)                       # the listing: not part of the reads timed
        return _read_all(mp, names, readers, want)
    finally:
        subprocess.run(nc + ["umount", str(mp), "--force"], env=env, cwd=code,
                       capture_output=True)


if __name__ == "__main__":
    sys.exit(main())

"""One large object read cold, side by side: NeuralCache mounts (one or more sets of
mount options) against s3torchconnector, alternating in one run, with the CPU of every
process on the machine over each read (the store, the WAN emulator, the daemon, the
reader, kernel threads).

    python -m bench.tools.bigpair [--size 1G] [--rounds 2] [--variant NAME=ARGS ...]
                                  [--no-s3t] [--s3t-fresh]

Why beside ``bench run --scenario bigfile``: there every system runs once per run, so
a ratio is one pair of numbers on a shared 2-core VM whose speed drifts by the minute;
here each system reads the object ``2 x rounds`` times, in the order A B .. Z Z .. B A
per round (two systems: A B B A), and the per-process CPU shows what the machine spent
its two cores on (a cold read over the emulated link is CPU-bound: SeaweedFS alone takes
~1.1-1.8 CPU-s per GiB it serves).

Before each read, as ``bench run`` does (``Ctx.fresh_start``): dirty pages written
back, the page cache dropped, SeaweedFS's files read back in (a hot store).  Each
NeuralCache read is a fresh mount with an empty cache.  s3torchconnector reads through
``S3IterableDataset`` in 1 MiB reads, as bench/systems/peers.py does, in this process
after one untimed read: its CRT client is slow and CPU-heavy on the first object a
process reads (``--s3t-fresh`` measures that case instead: each read in a new process
that has imported s3torchconnector already, like a job that loads its weights once at
start; the process's start-up and imports are not timed).  Every read, the untimed one
included, is checked by xxh3.
"""
from __future__ import annotations

import argparse
import collections
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import xxhash

from neuralcache.admin.sizes import parse_size

from bench.servers.seaweed import SeaweedServer
from bench.systems import cpu
from bench.systems.mounts import REPO
from bench.systems.ncmount import mounted, stats
from bench.systems.pagecache import drop_page_cache, read_into_cache
from bench.wan import WanProxyProcess

BUCKET, KEY = "bench", "big"
CHUNK = 1 << 20


def proc_cpu(me: int) -> dict[int, tuple[str, float]]:
    """pid -> (role, CPU seconds so far) of every process; Python processes are named
    by what they run (the daemon, the emulator, this reader, an s3torchconnector
    reader), kernel worker threads are pooled as ``kworker``."""
    out = {}
    for pid, name, fields in cpu.processes():
        try:
            if pid == me:                        # whatever it is called (pytest)
                name = "reader"
            elif name.startswith(("python", "neuralcache")):
                with open(f"/proc/{pid}/cmdline") as f:
                    cl = f.read().split("\0")
                name = ("daemon" if "neuralcache" in cl else "wan" if "bench.wan" in cl
                        else "s3t reader" if "--s3t-child" in cl else "python")
            elif name.startswith(("kworker", "ksoftirqd", "migration", "rcu_", "cpuhp")):
                name = name.split("/")[0]        # per-CPU kernel threads pooled
            out[pid] = (name, (int(fields[11]) + int(fields[12])) / cpu.TICK)
        except (OSError, ValueError, IndexError):
            pass          # a process that exited meanwhile
    return out


def cpu_by_role(a: dict, b: dict) -> dict[str, float]:
    """CPU seconds per role between two ``proc_cpu`` snapshots (processes that exited
    meanwhile are not counted)."""
    c: collections.Counter = collections.Counter()
    for pid, (name, t) in b.items():
        c[name] += t - a.get(pid, (name, 0.0))[1]
    return {k: round(v, 2) for k, v in c.most_common() if v >= 0.01}


def switches(pid: int) -> int:
    """Context switches of all of ``pid``'s threads so far (a thread's wake-ups)."""
    n = 0
    for t in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{t}/status") as f:
                n += sum(int(line.split()[1]) for line in f
                         if line.startswith(("voluntary_ctxt", "nonvoluntary_ctxt")))
        except OSError:
            pass          # a thread that exited meanwhile
    return n


def split_variant(spec: str) -> tuple[list[str], dict[str, str]]:
    """A --variant's ARGS: mount options, and NAME=VALUE words (upper case) that go
    into the daemon's environment instead (e.g. NEURALCACHE_RECYCLE=0)."""
    args, env = [], {}
    for word in spec.split():
        name, eq, value = word.partition("=")
        if eq and name.isupper() and name.replace("_", "").isalnum():
            env[name] = value
        else:
            args.append(word)
    return args, env


def read_mount(path: Path) -> tuple[int, str]:
    h, n = xxhash.xxh3_64(), 0
    with open(path, "rb", buffering=0) as f:
        while b := f.read(CHUNK):
            h.update(b)
            n += len(b)
    return n, h.hexdigest()


def read_s3t(endpoint: str) -> tuple[int, str]:
    from s3torchconnector import S3ClientConfig, S3IterableDataset
    ds = S3IterableDataset.from_objects([f"s3://{BUCKET}/{KEY}"], region="us-east-1",
                                        endpoint=endpoint,
                                        s3client_config=S3ClientConfig(force_path_style=True))
    h, n = xxhash.xxh3_64(), 0
    for reader in ds:
        while b := reader.read(CHUNK):
            h.update(b)
            n += len(b)
    return n, h.hexdigest()


class S3tChild:
    """A new process that has imported s3torchconnector and waits; made before the
    clock starts (interpreter start-up and imports are not the read).  ``read`` makes
    its one read (its first object): bytes, xxh3 and the CPU seconds of the read in
    that process."""

    def __init__(self, endpoint: str):
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join([str(REPO)] + ([env["PYTHONPATH"]]
                                                      if env.get("PYTHONPATH") else []))
        self.p = subprocess.Popen([sys.executable, "-m", "bench.tools.bigpair",
                                   "--s3t-child", endpoint], stdin=subprocess.PIPE,
                                  stdout=subprocess.PIPE, text=True, env=env)
        if self.p.stdout.readline().strip() != "ready":
            self.close()
            raise SystemExit("bigpair: the s3torchconnector reader did not start")

    def read(self) -> tuple[int, str, float]:
        try:
            out, _ = self.p.communicate("go\n", timeout=600)
        finally:
            self.close()
        if self.p.returncode != 0 or len(out.split()) != 3:
            raise SystemExit(f"bigpair: the s3torchconnector reader failed "
                             f"(exit {self.p.returncode})")
        n, digest, cpu_s = out.split()
        return int(n), digest, float(cpu_s)

    def close(self) -> None:
        if self.p.poll() is None:
            self.p.kill()
            self.p.wait()


def own_cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--size", default="1G", help="object size (default 1G)")
    ap.add_argument("--rounds", type=int, default=2,
                    help="rounds of A B .. Z Z .. B A (default 2: each system reads 4 times)")
    ap.add_argument("--rtt-ms", type=float, default=60.0, help="emulated round trip (60)")
    ap.add_argument("--variant", action="append", default=[], metavar="NAME=ARGS",
                    help="a NeuralCache mount with extra options and environment, e.g. "
                         "'ra64=--readahead-size 64M' or 'fresh=NEURALCACHE_RECYCLE=0' "
                         "(default: one, 'nc', as shipped)")
    ap.add_argument("--no-s3t", action="store_true", help="NeuralCache variants only")
    ap.add_argument("--s3t-fresh", action="store_true",
                    help="each s3torchconnector read in a new process (its first object)")
    ap.add_argument("--out", default=None, help="directory for bigpair.json")
    ap.add_argument("--s3t-child", metavar="ENDPOINT", help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.s3t_child:
        import s3torchconnector  # noqa: F401  (its imports are start-up, not the read)
        print("ready", flush=True)
        sys.stdin.readline()
        c0 = own_cpu()
        n, digest = read_s3t(a.s3t_child)
        print(n, digest, own_cpu() - c0)
        return 0
    size = parse_size(a.size)
    variants = {}
    for v in a.variant or ["nc="]:
        name, eq, spec = v.partition("=")
        if not eq or not name or name == "s3t" or name in variants:
            raise SystemExit(f"bigpair: --variant {v!r}: give NAME=ARGS, each NAME once "
                             "and not 's3t' (e.g. 'ra64=--readahead-size 64M')")
        variants[name] = spec
    systems = list(variants) + ([] if a.no_s3t else ["s3t"])
    if len(systems) < 2:
        raise SystemExit("bigpair: nothing to compare: give two --variant or drop --no-s3t")
    work = Path(tempfile.mkdtemp(prefix="nc-bigpair-"))
    results: dict[str, list[dict]] = {s: [] for s in systems}
    try:
        with SeaweedServer(work / "sw") as sw:
            env = dict(os.environ, **sw.env())
            os.environ.update(sw.env())
            c = sw.client()
            c.create_bucket(Bucket=BUCKET)
            data = os.urandom(min(size, 64 << 20))
            data = (data * -(-size // len(data)))[:size]
            want = xxhash.xxh3_64_hexdigest(data)
            c.put_object(Bucket=BUCKET, Key=KEY, Body=data)
            del data
            with WanProxyProcess(f"127.0.0.1:{sw.s3_port}", rtt_ms=a.rtt_ms) as px:
                endpoint = px.endpoint
                if "s3t" in systems and not a.s3t_fresh:    # the CRT's first object,
                    if read_s3t(endpoint) != (size, want):   # untimed
                        raise SystemExit("bigpair: s3torchconnector's first read was wrong")
                order = (systems + systems[::-1]) * a.rounds
                for k, who in enumerate(order):
                    if drop_page_cache(level=3) != "drop_caches":
                        raise SystemExit("bigpair: cannot drop the page cache (run as root)")
                    read_into_cache(work / "sw" / "data")
                    ctx = child = None
                    if who == "s3t" and a.s3t_fresh:
                        child = S3tChild(endpoint)          # started before the clock
                    if who != "s3t":
                        cache = work / f"cache{k}"
                        args, extra_env = split_variant(variants[who])
                        ctx = mounted(f"s3://{BUCKET}", work / "mnt", "--endpoint-url",
                                      endpoint, "--region", "us-east-1", "--cache-dir",
                                      cache, "--cache-size", str(2 * size), *args,
                                      env={**env, **extra_env})
                        mnt = ctx.__enter__()
                    try:
                        pid = stats(mnt)["pid"] if ctx else None
                        s0 = switches(pid) if pid else 0
                        m0 = cpu.machine_busy(), cpu.machine_total()
                        c0, t0 = proc_cpu(os.getpid()), time.monotonic()
                        child_cpu = None
                        if who != "s3t":
                            n, got = read_mount(mnt / KEY)
                        elif child is not None:
                            n, got, child_cpu = child.read()
                        else:
                            n, got = read_s3t(endpoint)
                        dt = time.monotonic() - t0
                        c1 = proc_cpu(os.getpid())
                        m1 = cpu.machine_busy(), cpu.machine_total()
                        woke = switches(pid) - s0 if pid else None
                        made = stats(mnt).get("buffers_made") if ctx else None
                    finally:
                        if child is not None:
                            child.close()
                        if ctx is not None:
                            ctx.__exit__(None, None, None)
                            shutil.rmtree(cache, ignore_errors=True)
                    if n != size or got != want:
                        raise SystemExit(f"bigpair: {who} read {n} bytes, xxh3 {got}: "
                                         f"expected {size}, {want}")
                    row = {"mbps": n / dt / 1e6, "seconds": dt,
                           "machine_busy_s": round(m1[0] - m0[0], 2),
                           "machine_all_s": round(m1[1] - m0[1], 2),
                           "cpu": cpu_by_role(c0, c1)}
                    if child_cpu is not None:      # it exited: not in the snapshots
                        row["cpu"] = dict(sorted({**row["cpu"], "s3t reader": round(
                            child_cpu, 2)}.items(), key=lambda kv: -kv[1]))
                    if made is not None:        # fresh 8 MiB read buffers (page faults)
                        row["buffers_made"] = made
                        row["daemon_switches"] = woke
                    results[who].append(row)
                    top = ", ".join(f"{r}={v:.2f}" for r, v in list(row["cpu"].items())[:7])
                    extra = (f" | daemon: {made} buffers made, {woke} switches"
                             if made is not None else "")
                    print(f"{who:>10} {row['mbps']:6.0f} MB/s  busy {row['machine_busy_s']:.2f}"
                          f" of {row['machine_all_s']:.2f} core-s | {top}{extra}", flush=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print()
    print(f"{size / 2**30:.2f} GiB object, {a.rtt_ms:g} ms,"
          f" order {' '.join(systems + systems[::-1])} x {a.rounds}"
          f"{', s3torchconnector in a new process per read' if a.s3t_fresh else ''}")
    med = {s: statistics.median(r["mbps"] for r in rows) for s, rows in results.items()}
    base = systems[-1]
    for s, rows in results.items():
        gib = size / 2**30
        roles = {role for r in rows for role in r["cpu"]}
        by_role = {role: statistics.median(r["cpu"].get(role, 0.0) / gib for r in rows)
                   for role in roles}              # a read without the role counts 0
        total = statistics.median(sum(r["cpu"].values()) / gib for r in rows)
        parts = ", ".join(f"{k} {v:.2f}" for k, v in sorted(
            by_role.items(), key=lambda kv: -kv[1]) if v >= 0.01)
        print(f"{s:>10}  median {med[s]:5.0f} MB/s ({min(r['mbps'] for r in rows):.0f}-"
              f"{max(r['mbps'] for r in rows):.0f}), {med[s] / med[base]:.2f}x {base}; "
              f"CPU-s per GiB: {total:.2f} ({parts})")
    if a.out:
        Path(a.out).mkdir(parents=True, exist_ok=True)
        (Path(a.out) / "bigpair.json").write_text(json.dumps(
            {"size": size, "rtt_ms": a.rtt_ms, "rounds": a.rounds, "variants": variants,
             "s3t_fresh": a.s3t_fresh, "results": results}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())

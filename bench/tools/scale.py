"""A job reading the 1.28 M-file ImageNet tree through a fresh mount: the daemon's RSS
every 10 s, its CPU, and the longest stat() of a file seen for the first time while the
lister crawls the tree and the predictors' catalog grows to 1.28 M files.

    python -m bench.tools.scale TREE CODE_DIR LABEL [SECONDS | epoch [N]] [-- MOUNT_ARG...]

For SECONDS (150): 8 threads open and read random files of random classes (with
replacement: ~60 % distinct after 150 s), and a prober stat()s a random file every
20 ms.  Prints one JSON line: RSS samples (MB), files opened and per second, the
daemon's CPU-s, the longest stat()s with when they came (s after the start), p99,
stat()s over 200 ms, and the daemon's garbage-collector pauses (``gc_*`` of its
stats, when the checkout has them).  With ``epoch [N]``: instead, N (1) shuffled passes
over every file by 8 threads (ImageNet epochs, each in its own order), and for each the
daemon's RSS at its end, files per second, CPU per file, the longest open()+read()s
with when they came (s after the epoch's start), p99, those over 200 ms, and the
collector's pauses so far.  The files are empty, so from the second epoch on every open
is warm and the predictors never see it: no epoch boundary is measured here (`bench.tools.predscale` measures them).

TREE: DATA_DIR/namespace/posix as `python -m bench run --scenario namespace --data-dir
DATA_DIR` leaves it (empty files: what is measured is the per-file state and the
requests, not data); CODE_DIR: a checkout whose neuralcache/ the daemon runs (a
"before" is `git worktree add DIR REV`).  Mounted with --cache-size 1G and a metadata
TTL of an hour, and any MOUNT_ARGs after ``--`` (``--prefetch off``: the daemon
without its predictors).
"""
import gc
import json
import os
import random
import subprocess
import sys
import threading
import time

from bench.systems.cpu import cpu_seconds


def rss_mb(pid: int) -> float:
    with open(f"/proc/{pid}/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmRSS")) / 1024


def daemon_gc(mnt: str) -> dict:
    """The daemon's garbage-collector pauses so far (neuralcache/gcwatch.py), when the
    checkout reports them."""
    with open(f"{mnt}/.neuralcache/stats.json") as f:
        snap = json.load(f)
    return {k: v for k, v in snap.items() if k.startswith("gc_")}


def one_epoch(mnt: str, pid: int, paths: list[str], seed: int) -> dict:
    """8 threads, each its share of one shuffled order.  (Executor.map over the 1.28 M
    paths made 1.28 M futures up front, and this process's own garbage collection over
    them stopped every thread for 1.5-1.9 s: opens timed here, not the daemon's.)"""
    order = paths[:]
    random.Random(seed).shuffle(order)
    lat: list[list[float]] = [[] for _ in range(8)]
    slow: list[tuple[float, float]] = []

    def worker(i: int) -> None:
        mine = lat[i]
        for p in order[i::8]:
            t = time.monotonic()
            with open(f"{mnt}/{p}", "rb") as f:
                f.read()
            dt = time.monotonic() - t
            mine.append(dt)
            if dt > 0.05:
                slow.append((dt, t - t0))

    gc.collect()
    gc.freeze()         # the lists above are not this process's garbage to walk
    c0, t0 = cpu_seconds(pid), time.monotonic()
    threads = [threading.Thread(target=worker, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    s = time.monotonic() - t0
    all_lat = sorted(x for mine in lat for x in mine)
    gc.unfreeze()
    return {"files": len(order), "epoch_s": round(s, 1), "files_per_s": round(len(order) / s),
            "daemon_cpu_us_per_file": round((cpu_seconds(pid) - c0) / len(order) * 1e6, 1),
            "rss_end_mb": round(rss_mb(pid), 1),
            "open_worst_ms_at_s": [(round(x * 1e3), round(t, 1))
                                   for x, t in sorted(slow, reverse=True)[:8]],
            "open_p99_ms": round(all_lat[int(len(all_lat) * .99)] * 1e3, 1),
            "opens_over_200ms": sum(1 for x in all_lat if x > 0.2), **daemon_gc(mnt)}


def main(argv=None) -> int:
    args = sys.argv[1:] if argv is None else argv
    extra = args[args.index("--") + 1:] if "--" in args else []
    args = args[:args.index("--")] if "--" in args else args
    epoch = len(args) > 3 and args[3] == "epoch"
    try:
        if len(args) not in ((3, 4, 5) if epoch else (3, 4)):
            raise ValueError
        epochs = int(args[4]) if len(args) > 4 else 1
        seconds = float(args[3]) if len(args) > 3 and not epoch else 150.0
    except ValueError:
        print("usage: " + __doc__.split("\n\n")[1].strip(), file=sys.stderr)
        return 2
    src, code, label = args[:3]
    mnt, cache = f"/tmp/scale-{label}", f"/tmp/scale-{label}-cache"
    os.makedirs(mnt, exist_ok=True)
    env = dict(os.environ, PYTHONPATH=code)
    nc = [sys.executable, "-m", "neuralcache"]
    dirs = sorted(os.listdir(f"{src}/train"))
    names = {d: sorted(os.listdir(f"{src}/train/{d}")) for d in dirs}
    r = subprocess.run(nc + ["mount", src, mnt, "--cache-dir", cache, "--metadata-ttl", "3600",
                             "--cache-size", "1G", *extra], env=env, cwd=code,
                       capture_output=True, text=True, timeout=900)
    if r.returncode != 0:
        print(r.stderr, file=sys.stderr)
        return 1
    try:
        pid = json.load(open(f"{mnt}/.neuralcache/stats.json"))["pid"]
        out = {"label": label, "code": code, "rss_mount_mb": round(rss_mb(pid), 1), "rss": []}
        if epoch:
            paths = [f"train/{d}/{n}" for d in dirs for n in names[d]]
            out["epochs"] = [one_epoch(mnt, pid, paths, seed) for seed in range(epochs)]
            print(json.dumps(out), flush=True)
            return 0
        stop = time.monotonic() + seconds
        counts = [0] * 8
        lat: list[tuple[float, float]] = []

        def reader(i: int) -> None:
            rnd = random.Random(i)
            while time.monotonic() < stop:
                d = rnd.choice(dirs)
                with open(f"{mnt}/train/{d}/{rnd.choice(names[d])}", "rb") as f:
                    f.read()
                counts[i] += 1

        def prober() -> None:
            rnd = random.Random(99)
            while time.monotonic() < stop:
                d = rnd.choice(dirs)
                t = time.monotonic()
                os.stat(f"{mnt}/train/{d}/{rnd.choice(names[d])}")
                lat.append((time.monotonic() - t, t - t0))
                time.sleep(0.02)

        c0, t0 = cpu_seconds(pid), time.monotonic()
        threads = [threading.Thread(target=reader, args=(i,)) for i in range(8)]
        threads.append(threading.Thread(target=prober))
        for t in threads:
            t.start()
        while time.monotonic() < stop:
            time.sleep(10)
            out["rss"].append(round(rss_mb(pid)))
        for t in threads:
            t.join()
        worst = sorted(lat, reverse=True)[:8]
        ms = sorted(x for x, _ in lat)
        out.update(files=sum(counts), files_per_s=round(sum(counts) / (time.monotonic() - t0)),
                   daemon_cpu_s=round(cpu_seconds(pid) - c0, 1), rss_end_mb=round(rss_mb(pid), 1),
                   stat_worst_ms_at_s=[(round(x * 1e3), round(t)) for x, t in worst],
                   stat_p99_ms=round(ms[int(len(ms) * .99)] * 1e3, 1) if ms else None,
                   stats_over_200ms=sum(1 for x in ms if x > 0.2), **daemon_gc(mnt))
        print(json.dumps(out), flush=True)
        return 0
    finally:
        subprocess.run(nc + ["umount", mnt], env=env, cwd=code, capture_output=True, timeout=600)
        subprocess.run(["rm", "-rf", cache])


if __name__ == "__main__":
    sys.exit(main())

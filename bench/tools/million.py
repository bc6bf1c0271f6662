"""Before/after on the namespace scenario's 1.28 M-file POSIX tree: mount time, daemon
RSS after mount and after stat-ing files, and the longest stat() of never-seen files
over WINDOW seconds with --metadata-ttl TTL (code before 996136b re-listed the whole
tree every TTL on the trio thread; later code refreshes directories in the background).

    python -m bench.tools.million TREE CODE_DIR LABEL [find | lookups]

With ``find``: the time of `find MNT/train -type f` right after mount instead (the
walk the lister's crawl-ahead serves).  With ``lookups``: the daemon's CPU per LOOKUP
answered from the table: 20 directories listed (a stat() of one file each), then a
stat() of each of their other 25,600 files in a shuffled order (no readdir, so no
readdirplus gave the kernel any of them ahead: each stat() is a LOOKUP).

TREE: DATA_DIR/namespace/posix as `python -m bench run --scenario namespace --data-dir
DATA_DIR` leaves it; CODE_DIR: a checkout whose neuralcache/ the daemon runs (the
"before" is `git worktree add DIR 9016e36`).
"""
import json, os, random, subprocess, sys, time

from bench.systems.cpu import cpu_seconds
src, code, label = sys.argv[1], sys.argv[2], sys.argv[3]
mode = sys.argv[4] if len(sys.argv) > 4 else "stats"
if mode not in ("stats", "find", "lookups"):
    sys.exit("usage: python -m bench.tools.million TREE CODE_DIR LABEL [find | lookups]")
TTL, WINDOW = 30, 75
mnt, cache = f"/tmp/nsba-{label}", f"/tmp/nsba-{label}-cache"
os.makedirs(mnt, exist_ok=True)
env = dict(os.environ, PYTHONPATH=code)
nc = [sys.executable, "-m", "neuralcache"]
def rss(pid):
    with open(f"/proc/{pid}/status") as f:
        return next(int(l.split()[1]) for l in f if l.startswith("VmRSS")) / 1024
def lookups(pid):
    """The ``lookups`` mode (above)."""
    dirs = sorted(os.listdir(f"{src}/train"))[:20]
    names = {d: sorted(os.listdir(f"{src}/train/{d}")) for d in dirs}
    for d in dirs:                              # listed by a lookup's wait
        os.stat(f"{mnt}/train/{d}/{names[d][0]}")
    todo = [(d, n) for d in dirs for n in names[d][1:]]
    random.Random(1).shuffle(todo)
    time.sleep(1)
    c0, t0 = cpu_seconds(pid), time.monotonic()
    for d, n in todo:
        os.stat(f"{mnt}/train/{d}/{n}")
    t1, c1 = time.monotonic(), cpu_seconds(pid)
    print(json.dumps({"label": label, "code": code, "stats": len(todo),
                      "wall_s": round(t1 - t0, 2), "daemon_cpu_s": round(c1 - c0, 2),
                      "daemon_cpu_us_per_stat": round((c1 - c0) / len(todo) * 1e6, 1)}))
t0 = time.monotonic()
r = subprocess.run(nc + ["mount", src, mnt, "--cache-dir", cache, "--metadata-ttl", str(TTL)], env=env, cwd=code, capture_output=True, text=True, timeout=900)
mount_s = time.monotonic() - t0
assert r.returncode == 0, r.stderr
try:
    pid = json.load(open(f"{mnt}/.neuralcache/stats.json"))["pid"]
    rss_mount = rss(pid)
    if mode == "lookups":
        lookups(pid)
        sys.exit(0)
    if mode == "find":
        t1 = time.monotonic()
        r = subprocess.run(["find", f"{mnt}/train", "-type", "f"], capture_output=True,
                           text=True, timeout=900, check=True)
        print(json.dumps({"label": label, "code": code, "find_s": round(time.monotonic() - t1, 1),
                          "files": r.stdout.count("\n"), "rss_after_find_mb": round(rss(pid), 1)}))
        sys.exit(0)
    dirs = sorted(os.listdir(f"{mnt}/train"))
    rnd = random.Random(0)
    lat = []
    t_start = time.monotonic()
    end = t_start + WINDOW
    n = 0
    while time.monotonic() < end:
        d = rnd.choice(dirs)
        p = f"{mnt}/train/{d}/{d}_{10026 + 7 * rnd.randrange(1281)}.JPEG"
        t1 = time.monotonic(); os.stat(p); t2 = time.monotonic(); n += 1
        lat.append((t2 - t1, t1 - t_start))
    worst = sorted(lat, reverse=True)[:5]     # (seconds, when in the window)
    over = {ms: sum(1 for x, _ in lat if x > ms / 1e3) for ms in (50, 200)}
    lat = sorted(x for x, _ in lat)
    out = {"label": label, "code": code, "mount_s": round(mount_s, 2), "rss_mount_mb": round(rss_mount, 1),
           "rss_after_stats_mb": round(rss(pid), 1), "stats": n, "stat_max_ms": round(lat[-1] * 1e3, 1),
           "stat_p99_ms": round(lat[int(len(lat) * .99)] * 1e3, 2),
           "over_50ms": over[50], "over_200ms": over[200],
           "worst_ms_at_s": [(round(x * 1e3), round(t, 1)) for x, t in worst],
           "ttl_s": TTL, "window_s": WINDOW}
    print(json.dumps(out))
finally:
    subprocess.run(nc + ["umount", mnt], env=env, cwd=code, capture_output=True, timeout=600)
    subprocess.run(["rm", "-rf", cache])

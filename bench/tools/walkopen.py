"""A job that walks the 1.28 M-file ImageNet tree through the mount before it reads
(as torchvision's ImageFolder lists every class first), then opens files of random
classes: how long the first opens take while the predictors' catalog takes in every
directory the walk listed.

    python -m bench.tools.walkopen TREE CODE_DIR LABEL [OPENS]

Mounts TREE (empty files, as `bench.tools.scale` uses it; --metadata-ttl 3600), lists
train/ and scandir()s each class through the mount, waits 2 s, then opens and reads
OPENS (400) random files one at a time.  Prints one JSON line: the walk's seconds and
files, the first 5 opens (ms, s after the first), the 6 longest, the opens' seconds and
the daemon's longest garbage-collector pause.  CODE_DIR: a checkout whose neuralcache/
the daemon runs (a "before" is `git worktree add DIR REV`).
"""
import json
import os
import random
import subprocess
import sys
import time


def main(argv=None) -> int:
    args = sys.argv[1:] if argv is None else argv
    try:
        src, code, label = args[:3]
        opens = int(args[3]) if len(args) > 3 else 400
        if len(args) > 4:
            raise ValueError
    except ValueError:
        print("usage: " + __doc__.split("\n\n")[1].strip(), file=sys.stderr)
        return 2
    mnt, cache = f"/tmp/walkopen-{label}", f"/tmp/walkopen-{label}-cache"
    os.makedirs(mnt, exist_ok=True)
    env = dict(os.environ, PYTHONPATH=code)
    nc = [sys.executable, "-m", "neuralcache"]
    r = subprocess.run(nc + ["mount", src, mnt, "--cache-dir", cache, "--metadata-ttl",
                             "3600", "--cache-size", "1G"], env=env, cwd=code,
                       capture_output=True, text=True, timeout=900)
    if r.returncode != 0:
        print(r.stderr, file=sys.stderr)
        return 1
    try:
        out: dict = {"label": label, "code": code}
        t = time.monotonic()
        classes = sorted(os.listdir(f"{mnt}/train"))
        files = {d: [e.name for e in os.scandir(f"{mnt}/train/{d}")] for d in classes}
        out["walk_s"] = round(time.monotonic() - t, 1)
        out["files"] = sum(map(len, files.values()))
        time.sleep(2)
        rnd, lat, t0 = random.Random(1), [], time.monotonic()
        for _ in range(opens):
            d = rnd.choice(classes)
            t = time.monotonic()
            with open(f"{mnt}/train/{d}/{rnd.choice(files[d])}", "rb") as f:
                f.read()
            lat.append((round((time.monotonic() - t) * 1e3, 1), round(t - t0, 2)))
        out["first5_ms_at_s"] = lat[:5]
        out["worst_ms_at_s"] = sorted(lat, reverse=True)[:6]
        out["opens_s"] = round(time.monotonic() - t0, 2)
        with open(f"{mnt}/.neuralcache/stats.json") as f:
            snap = json.load(f)
        out["gc_pause_longest_ms"] = snap.get("gc_pause_longest_ms")
        print(json.dumps(out), flush=True)
        return 0
    finally:
        subprocess.run(nc + ["umount", mnt], env=env, cwd=code, capture_output=True,
                       timeout=600)
        subprocess.run(["rm", "-rf", cache])


if __name__ == "__main__":
    sys.exit(main())

"""The disk tier holding a whole ImageNet-sized dataset: its index's memory, and what a
restart (the mount's start-up scan, which the mount waits for) costs in time and
memory.  No FUSE, no network: the tier itself, as the daemon builds it.

    python -m bench.tools.diskscale DIR CODE_DIR LABEL [BLOCKS [SIZE]]

Stores BLOCKS (1,281,000) blocks of SIZE (1,000) bytes under DIR/LABEL (one block per
file, keys named as ImageNet's train/ files; a 1,000-byte record takes a 4 KiB page:
~5.2 GB of disk), then in a new process loads that directory as a mount's start-up
does and reads 20,000 random blocks back (each checked).  Prints one JSON line: puts per
second and the writer's RSS growth; the load's seconds, its peak RSS growth and the RSS
growth it keeps; microseconds per get.  Deletes DIR/LABEL at the end.

CODE_DIR: a checkout whose neuralcache/ is measured (a "before" is `git worktree add
DIR REV`).
"""
import json
import os
import shutil
import subprocess
import sys
import textwrap
import time

CHILD = textwrap.dedent("""
    import json, os, random, resource, sys, time
    from neuralcache.store.disk import DiskTier
    from neuralcache.store.memory import BlockKey
    root, phase, n, size = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
    def rss():
        with open("/proc/self/status") as f:
            return next(int(l.split()[1]) for l in f if l.startswith("VmRSS")) / 1024
    def peak():
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    def key(i):
        return f"train/n{i // 1281:08d}/n{i // 1281:08d}_{i % 1281:05d}.JPEG"
    def data(i):
        return i.to_bytes(8, "little") * (size // 8) + bytes(size % 8)
    r0 = rss()
    disk = DiskTier(root, 1 << 50)
    t0 = time.monotonic()
    got = disk.load()
    load_s = time.monotonic() - t0
    out = {}
    if phase == "put":
        t0 = time.monotonic()
        for i in range(n):
            assert disk.put(BlockKey(key(i), "v1", 0), data(i))
        s = time.monotonic() - t0
        out = {"puts_per_s": round(n / s), "put_rss_growth_mb": round(rss() - r0)}
    else:
        out = {"loaded_blocks": got, "load_s": round(load_s, 2),
               "load_peak_rss_growth_mb": round(peak() - r0),
               "load_rss_growth_mb": round(rss() - r0)}
        rnd = random.Random(1)
        idx = [rnd.randrange(n) for _ in range(20000)]
        t0 = time.monotonic()
        for i in idx:
            b = disk.get(BlockKey(key(i), "v1", 0))
            assert b is not None and bytes(b) == data(i), i
        out["get_us"] = round((time.monotonic() - t0) / len(idx) * 1e6, 1)
    print(json.dumps(out))
""")


def main(argv=None) -> int:
    args = sys.argv[1:] if argv is None else argv
    try:
        if len(args) not in (3, 4, 5):
            raise ValueError
        blocks = int(args[3]) if len(args) > 3 else 1_281_000
        size = int(args[4]) if len(args) > 4 else 1000
    except ValueError:
        print("usage: " + __doc__.split("\n\n")[1].strip(), file=sys.stderr)
        return 2
    base, code, label = args[:3]
    root = os.path.join(base, label)
    shutil.rmtree(root, ignore_errors=True)
    env = dict(os.environ, PYTHONPATH=code)
    out = {"label": label, "code": code, "blocks": blocks, "size": size}
    try:
        for phase in ("put", "load"):
            r = subprocess.run([sys.executable, "-c", CHILD, root, phase, str(blocks),
                                str(size)], env=env, cwd=code, capture_output=True,
                               text=True, timeout=3600)
            if r.returncode != 0:
                print(r.stderr, file=sys.stderr)
                return 1
            out.update(json.loads(r.stdout.strip().splitlines()[-1]))
        print(json.dumps(out), flush=True)
        return 0
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())

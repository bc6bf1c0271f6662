"""The daemon's predictors fed shuffled epochs over ImageNet's 1.28 M files, without
FUSE: their memory per epoch and the longest single ``observe`` (an epoch boundary's
work, done on the daemon's trio thread while every request waits).

    python -m bench.tools.predscale CODE_DIR LABEL [EPOCHS] [grow]

The ensemble the daemon builds (``make_default_predictor``) over a packed catalog of
1,000 directories x 1,281 files, as the prefetcher's is at that size; EPOCHS (3)
shuffled passes of opens by 8 pids (each path a new str object, as each of the daemon's
opens makes one), a ``predict(64)`` every 2,000 opens.  Prints one
JSON line per epoch: seconds, RSS growth since the catalog was built (MB), the observes
over 50 ms (ms, at which open of the epoch: 0 is its first), the tracker's epoch.
With ``grow``, the catalog grows during epoch 1 as the daemon's does while its crawl
lists the tree: it starts with 40 directories and gains 40 more every 4,000 opens, each
time a new catalog over the same directory segments plus the new ones (the prefetcher
keeps each directory's segment); the slowest ``set_catalog`` is printed too.
(`bench.tools.scale` cannot show a boundary: its files are empty, so a second epoch's
opens are warm and the daemon's predictor never sees them.)

CODE_DIR: a checkout whose predictors/ is measured (a "before" is `git worktree add
DIR REV`).
"""
import os
import subprocess
import sys
import textwrap

CHILD = textwrap.dedent("""
    import json, sys, time
    import numpy as np
    from predictors import make_default_predictor
    from predictors.events import Event
    from predictors.packed import DirSegment, PackedCatalog
    label, epochs, grow = sys.argv[1], int(sys.argv[2]), sys.argv[3] == "grow"
    def rss():
        with open("/proc/self/status") as f:
            return next(int(l.split()[1]) for l in f if l.startswith("VmRSS")) / 1024
    D, F = 1000, 1281
    segs = [DirSegment(f"train/n{d:08d}/",
                       [(f"n{d:08d}_{i:05d}.JPEG", 110_000) for i in range(F)])
            for d in range(D)]
    ndirs = 40 if grow else D
    p = make_default_predictor(PackedCatalog(segs[:ndirs]))
    set_worst = 0.0
    r0, t = rss(), 0.0
    for e in range(epochs):
        order = np.random.default_rng(e).permutation(D * F)
        slow = []
        t0 = time.monotonic()
        for k in range(D * F):
            d, i = divmod(int(order[k]), F)
            path = f"train/n{d:08d}/n{d:08d}_{i:05d}.JPEG"   # a new str per open, as
            t += 0.0002                                      # the daemon's are
            a = time.perf_counter()
            p.observe(Event(t, "open", path, 0, 0, 1 + k % 8, 110_000))
            dt = time.perf_counter() - a
            if dt > 0.05:
                slow.append((round(dt * 1e3), k))
            if k % 2000 == 0:
                p.predict(64)
            if k % 4000 == 3999 and ndirs < D:
                ndirs += 40
                a = time.perf_counter()
                p.set_catalog(PackedCatalog(segs[:ndirs]))
                set_worst = max(set_worst, time.perf_counter() - a)
        print(json.dumps({"label": label, "epoch": e + 1,
                          "s": round(time.monotonic() - t0, 1),
                          "rss_growth_mb": round(rss() - r0),
                          "observes_over_50ms_ms_at": slow[:8],
                          "set_catalog_worst_ms": round(set_worst * 1e3, 1),
                          "tracker_epoch": p.epochset.tracker.epoch}), flush=True)
""")


def main(argv=None) -> int:
    args = sys.argv[1:] if argv is None else argv
    try:
        grow = bool(args) and args[-1] == "grow"
        if grow:
            args = args[:-1]
        if len(args) not in (2, 3):
            raise ValueError
        epochs = int(args[2]) if len(args) > 2 else 3
    except ValueError:
        print("usage: " + __doc__.split("\n\n")[1].strip(), file=sys.stderr)
        return 2
    code, label = args[:2]
    return subprocess.run([sys.executable, "-c", CHILD, label, str(epochs),
                           "grow" if grow else "whole"],
                          env=dict(os.environ, PYTHONPATH=code), cwd=code).returncode


if __name__ == "__main__":
    sys.exit(main())

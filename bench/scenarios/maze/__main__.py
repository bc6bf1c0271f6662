"""`python -m bench.maze prepare OUT_DIR [--seed S] [--quick] [--layouts files,shards] [--pad-to N]`

Writes the maze training set (see README.md) and prints a one-line JSON summary.
"""
from __future__ import annotations

import argparse
import json
import sys
import time

from . import prepare


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.maze")
    sub = p.add_subparsers(dest="cmd", required=True)
    pp = sub.add_parser("prepare", help="write the training set (files and/or shards) + manifest")
    pp.add_argument("out_dir")
    pp.add_argument("--seed", type=int, default=0)
    pp.add_argument("--quick", action="store_true", help="the small --quick data set")
    pp.add_argument("--layouts", default="files,shards")
    pp.add_argument("--pad-to", type=int, default=0, help="pad each record to N bytes")
    pp.add_argument("--n-train", type=int, default=None, help="override the number of mazes")
    a = p.parse_args(argv)
    layouts = tuple(x for x in a.layouts.split(",") if x)
    if not set(layouts) <= {"files", "shards"}:
        print(f"bench.maze: unknown layout in {a.layouts!r}", file=sys.stderr)
        return 1
    extra = {"n_train": a.n_train} if a.n_train else {}
    t = time.perf_counter()
    m = prepare(a.out_dir, a.seed, a.quick, layouts=layouts, pad_to=a.pad_to, **extra)
    print(json.dumps({"out_dir": a.out_dir, "n_train": m["n_train"], "n_shards": m["n_shards"],
                      "files": len(m["files"]), "total_bytes": m["total_bytes"],
                      "seconds": round(time.perf_counter() - t, 2)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())

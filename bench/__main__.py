"""python -m bench run|ceiling|list  -- see bench/README.md."""
from __future__ import annotations

import argparse
import sys


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench",
                                 description="NeuralCache side-by-side benchmark over an "
                                             "emulated WAN")
    sub = ap.add_subparsers(dest="cmd", required=True)

    r = sub.add_parser("run", help="run scenarios on every system through the WAN proxy")
    r.add_argument("--scenario", default="all",
                   help="comma-separated scenario names, or 'all' = the built-in seven (see 'list')")
    r.add_argument("--systems", default="all",
                   help="comma-separated: link,local,neuralcache,neuralcache-hints,"
                        "neuralcache-noprefetch,rclone,s3fs and the peers s3torchconnector,"
                        "mosaic,litdata (+ -tuned) (default all; neuralcache-hints runs only "
                        "where hints are published, a peer only where it has a workload, "
                        "see 'list')")
    r.add_argument("--rtt-ms", type=float, default=60.0, help="round trip time (default 60)")
    r.add_argument("--mbit", type=float, default=None, help="bandwidth cap per direction")
    r.add_argument("--jitter-ms", type=float, default=0.0, help="link jitter (+- ms one way)")
    r.add_argument("--reset-rate", type=float, default=0.0,
                   help="link faults: probability of a connection reset per request")
    r.add_argument("--stall-rate", type=float, default=0.0,
                   help="link faults: probability of a stalled response per request")
    r.add_argument("--stall-s", type=float, default=1.0, help="stall length (s)")
    r.add_argument("--quick", action="store_true", help="small datasets (< 3 min in total)")
    r.add_argument("--out", default="bench/out", help="results dir (default bench/out)")
    r.add_argument("--work-dir", default=None, help="scratch dir (default OUT/work)")
    r.add_argument("--data-dir", default=None,
                   help="local dataset copies, reused across runs (default WORK/data)")
    r.add_argument("--seed", type=int, default=0, help="dataset and shuffle seed")
    r.add_argument("--timeout", type=float, default=None,
                   help="per system and scenario watchdog in seconds")
    r.add_argument("--keep-seaweed", action="store_true",
                   help="keep the SeaweedFS data dir after the run and reuse the one a "
                        "previous --keep-seaweed run kept (skips the upload); without it "
                        "the data dir is removed at the end")

    c = sub.add_parser("ceiling", help="measure the WAN proxy's own ceiling (raw TCP)")
    c.add_argument("--rtt-ms", type=float, default=60.0)
    c.add_argument("--mbit", type=float, default=None)
    c.add_argument("--conns", type=lambda s: [int(x) for x in s.split(",")], default=[1, 16])
    c.add_argument("--mb", type=float, default=512, help="MB moved per measurement")

    sub.add_parser("list", help="list scenarios and systems")

    a = ap.parse_args(argv)
    if a.cmd == "run":
        from bench.runner import run
        return run(a)
    if a.cmd == "ceiling":
        from bench.wan.ceiling import main as ceiling_main
        return ceiling_main(a)
    from bench.scenarios.registry import DEFAULT, HINTED, HINTS_SYSTEM, SCENARIOS
    from bench.systems.registry import ALL_SYSTEMS
    for name, fn in SCENARIOS.items():
        extra = "" if name in DEFAULT else "  [not in 'all']"
        doc = (fn.__doc__ or "").strip().splitlines() or ["-"]
        print(f"{name:12} {doc[0]}{extra}")
    print("systems:", ", ".join(ALL_SYSTEMS))
    print(f"{HINTS_SYSTEM} runs only in: {', '.join(HINTED)} (the scenarios that publish hints)")
    return 0


if __name__ == "__main__":
    sys.exit(main())

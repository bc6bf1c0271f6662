"""Two of ``python -m bench.micro``'s measurements (their use: bench/tools/micro.py's
docstring): ``warm-opens``, the prefetch path's CPU per warm open, and
``shared-requests``, the shared tier's CPU per request on each side."""
from __future__ import annotations

import os
import tempfile
import time

MB = 1 << 20


def warm_opens(n_files: int, n_opens: int) -> None:
    from neuralcache.store.blocks import BlockStore
    from neuralcache.store.tiers import MemoryTier
    from neuralcache.namespace import Namespace
    from neuralcache.ahead.prefetch import Prefetcher
    from neuralcache.stats import Stats
    from predictors.ensemble import make_default_predictor

    keys = [f"samples/{i % 10}/{i:06d}.bin" for i in range(n_files)]
    ns = Namespace()
    for k in keys:
        ns.put_file(k, 100_000, "v", 0.0)

    def run(at_once: bool) -> float:
        pf = Prefetcher(ns, BlockStore(None, MemoryTier(1 << 20), None, Stats()),
                        make_default_predictor([(k, 100_000) for k in sorted(keys)]),
                        budget_bytes=1 << 20)
        c0 = time.process_time()
        for j in range(n_opens):
            pf.on_open(keys[(j * 7919) % n_files], 100_000, 100 + j % 8, warm=True)
            if at_once:
                pf._flush_deferred()
        return (time.process_time() - c0) / n_opens * 1e6

    for rnd in (1, 2):
        print(f"round {rnd}: warm open, predictor observes at once {run(True):6.1f} us CPU, "
              f"deferred {run(False):6.1f} us CPU ({n_opens} opens of {n_files} files)")


def shared_requests(n: int) -> None:
    from bench.servers.seaweed import SeaweedServer
    from bench.systems.cpu import cpu_seconds
    from neuralcache.store.sharedobj import SharedBucket, claim

    with SeaweedServer(tempfile.mkdtemp(prefix="nc-micro-")) as sw:
        sw.client().create_bucket(Bucket="micro")
        os.environ.update(sw.env())
        b = SharedBucket("micro", "p", endpoint_url=sw.endpoint)
        body, small = os.urandom(MB), claim("node", time.time(), False)
        kinds = [("GET of a missing block", n, lambda i: b.get(f"none/{i}")),
                 ("claim won (create-only PUT)", n, lambda i: b.put(f"c/{i}", small, True)),
                 ("claim refused (412)", n, lambda i: b.put(f"c/{i}", small, True)),
                 ("GET of a claim", n, lambda i: b.get(f"c/{i}")),
                 ("PUT of a 1 MiB block", n // 4, lambda i: b.put(f"b/{i}", body)),
                 ("GET of a 1 MiB block", n // 4, lambda i: b.get(f"b/{i}"))]
        for name, k, fn in kinds:
            s0, c0, t0 = cpu_seconds(sw.proc.pid), time.process_time(), time.perf_counter()
            for i in range(k):
                fn(i)
            s1, c1, t1 = cpu_seconds(sw.proc.pid), time.process_time(), time.perf_counter()
            print(f"{name:30} client {(c1 - c0) / k * 1e3:5.2f} ms CPU, SeaweedFS "
                  f"{(s1 - s0) / k * 1e3:5.2f} ms CPU, {(t1 - t0) / k * 1e3:5.2f} ms wall")

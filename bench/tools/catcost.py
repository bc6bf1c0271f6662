"""The predictors' cost per open over a plain catalog against a packed one of the same
files (neuralcache/ahead/prefetch.py CATALOG_CHEAP_FILES), without FUSE.

    python -m bench.tools.catcost [FILES]

FILES (50,000) in directories of 1,000, as the prefetcher builds either catalog; the
default ensemble observes 20,000 opens of a shuffled epoch and predicts 16 after every
4th.  Prints, in the order plain, packed, plain, packed: the catalog's build (the
plain one's; the packed one's directories are packed beforehand, as the prefetcher
keeps them), ``set_catalog`` and the microseconds per open.
"""
import random
import sys
import time

from predictors import make_default_predictor
from predictors.base import Catalog
from predictors.events import Event
from predictors.packed import DirSegment, PackedCatalog

OPENS = 20_000


def main(argv=None) -> int:
    args = sys.argv[1:] if argv is None else argv
    try:
        n = int(args[0]) if args else 50_000
        if len(args) > 1 or n < OPENS:
            raise ValueError
    except ValueError:
        print(f"usage: python -m bench.tools.catcost [FILES >= {OPENS}]", file=sys.stderr)
        return 2
    segs = [DirSegment(f"train/c{d:05d}/", [(f"f{i:05d}.JPEG", 110_000)
                                            for i in range(min(1000, n - d * 1000))])
            for d in range((n + 999) // 1000)]
    t = time.perf_counter()
    packed = PackedCatalog(segs)
    t_packed = time.perf_counter() - t
    t = time.perf_counter()
    plain = Catalog(sorted(packed.entries()))
    t_plain = time.perf_counter() - t
    order = list(plain.paths)
    random.Random(1).shuffle(order)
    for name, cat, build in (("plain", plain, t_plain), ("packed", packed, t_packed)) * 2:
        pr = make_default_predictor([])
        t = time.perf_counter()
        pr.set_catalog(cat)
        t_set = time.perf_counter() - t
        t = time.perf_counter()
        for i, p in enumerate(order[:OPENS]):
            pr.observe(Event(i * 0.001, "open", "".join(p), 0, 0, 1, 110_000))
            if i % 4 == 0:
                pr.predict(16)
        per = (time.perf_counter() - t) / OPENS
        print(f"{name:6s} {len(cat):,} files: build {build * 1e3:.1f} ms, set_catalog "
              f"{t_set * 1e3:.1f} ms, {per * 1e6:.1f} us per open")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""SQLite statements per request on the trio thread: N LOOKUP-shaped calls
(``Namespace.child`` of a name not yet met, then ``Namespace.remember``, as
``Operations.lookup`` makes them) and N WRITE-shaped node updates
(``WriteLayer._sync_node``, which every FUSE WRITE of a --writable mount makes), counted
with SQLite's trace callback, and their time per call on an idle thread.

    python -m bench.tools.gilstmts [N]
    PYTHONPATH=CODE_DIR python bench/tools/gilstmts.py [N]      (another checkout)

Why statements and not time: Python's sqlite3 releases the GIL around each statement
and must take it back after, so beside threads busy in Python (the lister's scans, the
uploads) each statement can wait a switch interval (5 ms) -- bench.tools.gilinsert
shows it for a listing page.  Timed beside spinning threads the same code here gave
medians from 0.04 to 57 ms per call from run to run (bench/RESULTS.md, twelfth
sitting): the count is what a change moves for sure.
"""
import sys
import time
from types import SimpleNamespace

from neuralcache.namespace import Namespace
from neuralcache.write.layer import WriteLayer

FILES = 1281


def run(n: int) -> dict[str, tuple[float, float]]:
    """what -> (statements per call, median ms per call)."""
    ns = Namespace()
    try:
        ns.rows.insert([(100 + i, 1, f"f{i:05d}.JPEG", 0, 110_000, 1.0, "v1", 1.0, 0.0, i)
                        for i in range(FILES)])
        stmts = [0]
        ns.rows.db.set_trace_callback(lambda sql: stmts.__setitem__(0, stmts[0] + 1))
        layer = SimpleNamespace(ns=ns)

        def lookup(i):
            ns.remember(ns.child(1, f"f{i:05d}.JPEG"))

        def write(i):
            WriteLayer._sync_node(layer, SimpleNamespace(
                inode=100 + i, unlinked=False, size=(i + 1) << 20, version="w1",
                mtime=time.time()))

        out = {}
        for what, call in (("LOOKUP", lookup), ("WRITE", write)):
            stmts[0], times = 0, []
            for i in range(n):
                t0 = time.perf_counter()
                call(i)
                times.append(time.perf_counter() - t0)
            out[what] = (stmts[0] / n, sorted(times)[n // 2] * 1e3)
        return out
    finally:
        ns.close()


def main() -> None:
    n = min(FILES, int(sys.argv[1]) if len(sys.argv) > 1 else FILES)
    import neuralcache
    print(f"code: {neuralcache.__file__}; {n} calls each")
    for what, (st, ms) in run(n).items():
        print(f"{what:7s} {st:.3f} statements per call, {ms:.3f} ms median")


if __name__ == "__main__":
    main()

"""Why meta/rows.py inserts a listing page as one multi-row statement: the time to add a
1,281-row page (an ImageNet class directory) to the namespace's table, with
executemany and with multi-row INSERTs, alone and beside THREADS threads busy in
Python (what the lister's scans are to the trio thread).

    python -m bench.tools.gilinsert [THREADS] [PAGES]

Python's sqlite3 releases the GIL around each statement it steps and must take it
back after; beside busy threads every retake waits a switch interval (5 ms) or more,
so executemany's 1,281 steps take seconds where one multi-row statement takes a couple
of retakes.
"""
import os
import sys
import tempfile
import threading
import time

from neuralcache.meta.rows import Rows  # the schema and pragmas in use

ROWS = 1281


def page(d: int, first_ino: int) -> list[tuple]:
    return [(first_ino + i, d + 10, f"n{d:04d}_{i:05d}.JPEG", 0, 110_000, 1.0, "v1", 1.0,
             0.0, i) for i in range(ROWS)]


def executemany(db, rows):
    db.execute("BEGIN")
    db.executemany("INSERT OR IGNORE INTO e(ino, parent, name, dir, size, mtime, version, "
                   "checked, ctime, seq) VALUES (?,?,?,?,?,?,?,?,?,?)", rows)
    db.execute("COMMIT")


def run(how: str, busy: int, pages: int) -> list[float]:
    with tempfile.TemporaryDirectory() as tmp:
        rows = Rows(os.path.join(tmp, "meta.db"))
        stop = False

        def burn():
            x = 0
            while not stop:
                x += 1

        ts = [threading.Thread(target=burn) for _ in range(busy)]
        for t in ts:
            t.start()
        out = []
        try:
            for d in range(pages):
                p = page(d, 1 + d * ROWS)
                t0 = time.perf_counter()
                executemany(rows.db, p) if how == "executemany" else rows.insert(p)
                out.append(time.perf_counter() - t0)
        finally:
            stop = True
            for t in ts:
                t.join()
            rows.close()
        return out


def main() -> None:
    busy = int(sys.argv[1]) if len(sys.argv) > 1 else 2
    pages = int(sys.argv[2]) if len(sys.argv) > 2 else 3
    print(f"{ROWS}-row pages, {pages} each; ms per page (median / max)")
    for how in ("executemany", "multi-row"):
        for n in (0, busy):
            t = sorted(run(how, n, pages))
            print(f"{how:12s} beside {n} busy threads: {t[len(t) // 2] * 1e3:9.1f} / "
                  f"{t[-1] * 1e3:9.1f}", flush=True)


if __name__ == "__main__":
    main()

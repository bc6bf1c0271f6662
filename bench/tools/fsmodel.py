"""The write path against a reference model (issue 18): random sequences of file
system calls run on a ``--writable`` mount and on a local directory side by side, and
after every step the two must agree (every call's result or errno, every read's bytes,
the listing, every file's size and content), also after the mount is unmounted and
mounted again from a fresh cache (what the remote holds).  This is how Mountpoint-s3
tests its semantics.  A seeded generator drives it (each sequence is
``random.Random(seed)``: a failure names its seed and its last calls, and the same
seed replays it); the calls are weighted towards creating, writing and reopening
files, which hypothesis's uniform rule choice rarely strung together (a first try with
its RuleBasedStateMachine missed the reopen bug in 240 steps).

    python -m bench.tools.fsmodel --seeds 200 --steps 80          # its own SeaweedFS, ~30 min
    python -m bench.tools.fsmodel --seeds 17-17 --steps 80        # replay one seed

The mount reaches SeaweedFS through the WAN emulator (60 ms by default), so uploads
take a while after close(): the files a sequence touches are often still only in the
journal when the next call comes, the state where the write path's bugs lived.

tests/test_write_model.py runs the same machine at a size that fits CI.

What the model allows for, where the mount is S3 and says so (README): directories
exist only as parents of files on the remote, so an empty directory does not outlive
the mount (both sides drop them at a remount: SeaweedFS keeps an emptied directory's
entry, which a fresh mount shows); modes, owners, link counts and times are not
compared.
"""
from __future__ import annotations

import argparse
import errno
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

# The universe of paths: few names in few directories, so that operations collide
# (a rename over an open file, an rmdir of a directory a file was just created in).
DIRS = ["", "d", "d/e"]
NAMES = ["a", "b"]
PATHS = [f"{d}/{n}" if d else n for d in DIRS for n in NAMES] + [d for d in DIRS if d]
# Offsets and lengths (Model.step): mostly within the first 64 KiB, sometimes past one
# 8 MiB upload part (a multipart upload, a stream, a copy on write of a large file).
MIB = 1 << 20
MODES = {"w": os.O_WRONLY | os.O_CREAT | os.O_TRUNC, "w+": os.O_RDWR | os.O_CREAT | os.O_TRUNC,
         "r": os.O_RDONLY, "r+": os.O_RDWR, "a": os.O_WRONLY | os.O_CREAT | os.O_APPEND,
         "a+": os.O_RDWR | os.O_CREAT | os.O_APPEND, "x": os.O_WRONLY | os.O_CREAT | os.O_EXCL}


def outcome(fn, *args):
    """("ok", result) or ("err", errno name): what both sides must agree on."""
    try:
        return "ok", fn(*args)
    except OSError as exc:
        return "err", errno.errorcode.get(exc.errno, exc.errno)


def tree(root: Path) -> dict[str, object]:
    """path -> "dir" or (size, bytes) for everything under ``root``."""
    out: dict[str, object] = {}
    for dirpath, dirnames, filenames in os.walk(root):
        rel = os.path.relpath(dirpath, root)
        dirnames[:] = [d for d in dirnames if not (rel == "." and d == ".neuralcache")]
        for d in dirnames:
            out[os.path.normpath(os.path.join(rel, d))] = "dir"
        for f in filenames:
            p = os.path.join(dirpath, f)
            with open(p, "rb") as fh:
                data = fh.read()
            out[os.path.normpath(os.path.join(rel, f))] = (os.stat(p).st_size, data)
    return out


def prune_empty_dirs(root: Path) -> None:
    """What S3 keeps of a tree: directories only as parents of files."""
    for dirpath, dirnames, filenames in os.walk(root, topdown=False):
        if Path(dirpath) != root and not os.listdir(dirpath):
            os.rmdir(dirpath)


class WritableMount:
    """``neuralcache mount SOURCE MNT --writable`` through the CLI, remounted on demand
    with a fresh cache directory (so what it shows after a remount is the remote's)."""

    def __init__(self, source: str, workdir: Path, env: dict, args: list[str]):
        self.source, self.workdir, self.env, self.args = source, workdir, env, args
        self.mnt = workdir / "mnt"
        self.generation = 0

    def _cli(self, *args) -> None:
        r = subprocess.run([sys.executable, "-m", "neuralcache", *map(str, args)],
                           env=self.env, capture_output=True, text=True, timeout=600)
        if r.returncode != 0:
            raise AssertionError(f"neuralcache {args[0]}: {r.stderr.strip()}")

    def mount(self) -> Path:
        self.generation += 1
        self.mnt.mkdir(parents=True, exist_ok=True)
        self._cli("mount", self.source, self.mnt, "--writable", "--cache-dir",
                  self.workdir / f"cache-{self.generation}", *self.args)
        return self.mnt

    def unmount(self) -> None:
        self._cli("umount", self.mnt)     # waits for the uploads: the remote is complete


class Model:
    """One sequence: the same calls on ``target``'s mount (under a fresh directory) and
    on a reference directory under ``scratch``, chosen by ``random.Random(seed)``."""

    # How often each call is picked (of their sum): creates, writes and reopens most,
    # so that files exist and change while their uploads run; a remount is slow (it
    # drains the uploads) and rare.
    WEIGHTS = {"open": 14, "reopen": 10, "write": 20, "read": 8, "ftruncate": 5,
               "truncate": 4, "fsync": 3, "close": 6, "rename": 8, "unlink": 5,
               "mkdir": 5, "rmdir": 4, "remount": 2}

    def __init__(self, target: WritableMount, scratch: Path, seed: int):
        self.target, self.seed = target, seed
        self.rnd = random.Random(seed)
        self.case = f"case-{seed}-{time.monotonic_ns()}"
        self.ref = Path(tempfile.mkdtemp(dir=scratch))
        os.mkdir(self.target.mnt / self.case)
        os.mkdir(self.ref / self.case)
        self.open: dict[int, tuple[int, int, str]] = {}     # handle -> fds, path
        self.next = 0
        self.log: list[str] = []

    # -- the calls ---------------------------------------------------------------------
    def both(self, path: str) -> tuple[str, str]:
        return str(self.target.mnt / self.case / path), str(self.ref / self.case / path)

    def same(self, what: str, fn, *pairs):
        got = outcome(fn, *[p[0] for p in pairs])
        want = outcome(fn, *[p[1] for p in pairs])
        if got != want:
            self.fail(f"{what}: mount {_brief(got)}, reference {_brief(want)}")
        return got

    def do_open(self, path=None, mode=None) -> None:
        path = path or self.rnd.choice(PATHS)
        mode = mode or self.rnd.choice(sorted(MODES))
        m, r = self.both(path)
        fm = outcome(os.open, m, MODES[mode] | os.O_CLOEXEC, 0o644)
        fr = outcome(os.open, r, MODES[mode] | os.O_CLOEXEC, 0o644)
        self.log.append(f"open {path} {mode}")
        if fm[0] != fr[0] or (fm[0] == "err" and fm[1] != fr[1]):
            for f in (fm, fr):
                if f[0] == "ok":
                    os.close(f[1])
            self.fail(f"open {path} {mode}: mount {fm!r}, reference {fr!r}")
        if fm[0] == "ok":
            self.next += 1
            self.open[self.next] = (fm[1], fr[1], path)
            if mode != "x":          # what the new descriptor reads, before anything else
                self.on_handle(self.next, "read-all", os.pread, 1 << 25, 0)

    def handle(self) -> int | None:
        return self.rnd.choice(sorted(self.open)) if self.open else None

    def on_handle(self, h: int, what: str, fn, *args) -> None:
        fm, fr, path = self.open[h]
        self.log.append(f"{what} {path} (h{h}) {[a if not isinstance(a, bytes) else len(a) for a in args]}")
        got, want = outcome(fn, fm, *args), outcome(fn, fr, *args)
        if got != want:
            self.fail(f"{what} {path}: mount {_brief(got)}, reference {_brief(want)}")

    def step(self) -> None:
        op = self.rnd.choices(list(self.WEIGHTS), weights=list(self.WEIGHTS.values()))[0]
        rnd, h = self.rnd, self.handle()
        off = rnd.choice([rnd.randrange(70_000), rnd.randrange(70_000), 8 * MIB - 3, 9 * MIB])
        n = rnd.choice([rnd.randrange(20_000), rnd.randrange(20_000), 65_536, MIB + 5])
        if op == "open" or (h is None and op in ("reopen", "write", "read", "ftruncate",
                                                 "fsync", "close")):
            self.do_open()
        elif op == "reopen":               # fsx's -c: close, open again (uploading)
            path = self.open[h][2]
            self.close(h)
            self.do_open(path, rnd.choice(["r", "r+", "a", "a+", "w+"]))
        elif op == "write":
            self.on_handle(h, "pwrite", os.pwrite, rnd.randbytes(n), off)
        elif op == "read":
            self.on_handle(h, "pread", os.pread, n, off)
        elif op == "ftruncate":
            self.on_handle(h, "ftruncate", os.ftruncate, off)
        elif op == "fsync":
            self.on_handle(h, "fsync", os.fsync)
        elif op == "close":
            self.close(h)
        elif op == "remount":
            self.remount()
        else:
            a, b = rnd.choice(PATHS), rnd.choice(PATHS)
            self.log.append(f"{op} {a}" + (f" {b}" if op == "rename" else ""))
            if op == "truncate":
                self.same(f"truncate {a} {off}", os.truncate, self.both(a), (off, off))
            elif op == "rename":
                self.same(f"rename {a} {b}", os.rename, self.both(a), self.both(b))
            else:
                self.same(f"{op} {a}", getattr(os, op), self.both(a))
        self.check_trees()

    def close(self, h: int) -> None:
        fm, fr, path = self.open.pop(h)
        self.log.append(f"close {path} (h{h})")
        got, want = outcome(os.close, fm), outcome(os.close, fr)
        if got != want:
            self.fail(f"close {path}: mount {got!r}, reference {want!r}")

    def remount(self) -> None:
        """Everything closed, unmounted (uploads drained), mounted from a fresh cache:
        the mount now shows what the remote holds."""
        self.log.append("remount")
        self.close_all()
        self.target.unmount()
        self.target.mount()
        prune_empty_dirs(self.ref / self.case)
        # A store may keep a directory's entry after its last object is deleted
        # (SeaweedFS does; S3 does not): which empty directories a fresh mount shows
        # is the store's, so they go on both sides (docs/conformance.md).
        if (self.target.mnt / self.case).is_dir():
            prune_empty_dirs(self.target.mnt / self.case)
        for root in (self.ref, self.target.mnt):
            (root / self.case).mkdir(exist_ok=True)

    def check_trees(self) -> None:
        got, want = tree(self.target.mnt / self.case), tree(self.ref / self.case)
        if got != want:
            diff = sorted(k for k in set(got) | set(want) if got.get(k) != want.get(k))
            show = {k: (_brief(got.get(k)), _brief(want.get(k))) for k in diff[:6]}
            self.fail(f"mount and reference differ (mount, reference): {show}")

    def fail(self, what: str) -> None:
        steps = "\n  ".join(self.log[-40:])
        raise AssertionError(f"seed {self.seed}, step {len(self.log)}: {what}\n"
                             f"last calls:\n  {steps}")

    def close_all(self) -> None:
        for fm, fr, _ in self.open.values():
            for fd in (fm, fr):
                try:
                    os.close(fd)
                except OSError:
                    pass
        self.open.clear()

    def run(self, steps: int) -> None:
        try:
            for _ in range(steps):
                self.step()
            self.remount()                  # what the remote holds at the end
            self.check_trees()
        finally:
            self.close_all()
            shutil.rmtree(self.ref, ignore_errors=True)


def _brief(v):
    if isinstance(v, tuple) and len(v) == 2 and isinstance(v[1], (bytes, int)) \
            and not isinstance(v[1], bool):
        return f"{v[0]} {len(v[1]) if isinstance(v[1], bytes) else v[1]}" + \
            (" bytes" if isinstance(v[1], bytes) else "")
    return v


def run(target: WritableMount, scratch: Path, seeds, steps: int) -> None:
    """Run one sequence per seed against a mounted ``target``; AssertionError (with
    the seed and the last calls) on the first difference."""
    for seed in seeds:
        t0 = time.monotonic()
        Model(target, scratch, seed).run(steps)
        print(f"fsmodel: seed {seed}: {steps} calls agree ({time.monotonic() - t0:.0f} s)",
              flush=True)


def parse_seeds(text: str) -> range:
    """"N" (seeds 0..N-1) or "A-B" (A..B)."""
    a, sep, b = text.partition("-")
    return range(int(a), int(b) + 1) if sep else range(int(a))


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description="the write path against a reference model")
    ap.add_argument("--seeds", type=parse_seeds, default=parse_seeds("200"),
                    help="N sequences (seeds 0..N-1), or A-B (default 200)")
    ap.add_argument("--steps", type=int, default=80, help="calls per sequence (80)")
    ap.add_argument("--rtt-ms", type=float, default=60.0, help="the link's round trip (60)")
    ap.add_argument("--work-dir", default=None,
                    help="where the run's directory is made (default: the system's temp)")
    args = ap.parse_args(argv)
    from bench.servers.seaweed import SeaweedServer
    from bench.wan import WanProxyProcess

    if args.work_dir:             # a fresh run directory inside it: reruns start clean
        os.makedirs(args.work_dir, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="nc-fsmodel-", dir=args.work_dir))
    with SeaweedServer(work / "seaweed") as sw, \
            WanProxyProcess(f"127.0.0.1:{sw.s3_port}", rtt_ms=args.rtt_ms) as link:
        sw.client().create_bucket(Bucket="fsmodel")
        env = dict(os.environ, **sw.env())
        target = WritableMount("s3://fsmodel", work, env, ["--endpoint-url", link.endpoint])
        target.mount()
        try:
            t0 = time.monotonic()
            run(target, work, args.seeds, args.steps)
            print(f"fsmodel: {len(args.seeds)} sequences of {args.steps} calls agree with "
                  f"the reference ({time.monotonic() - t0:.0f} s)")
        finally:
            target.unmount()


if __name__ == "__main__":
    main()

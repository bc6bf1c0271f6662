"""The write path against a reference model (issue 18): random sequences of file
system calls run on a ``--writable`` mount and on a local directory side by side, and
after every step the two must agree (every call's result or errno, every read's bytes,
the listing, every file's size and content), also after the mount is unmounted and
mounted again from a fresh cache (what the remote holds).  This is how Mountpoint-s3
tests its semantics; hypothesis's stateful testing drives it and shrinks a failure to
a short sequence.

    python -m bench.fsmodel --examples 100 --steps 60      # its own SeaweedFS, ~15 min

tests/test_write_model.py runs the same machine at a size that fits CI.

What the model allows for, where the mount is S3 and says so (README): directories
exist only as parents of files on the remote, so an empty directory does not outlive
the mount (the reference drops them at a remount); modes, owners, link counts and
times are not compared.
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

from hypothesis import HealthCheck, settings, strategies as st
from hypothesis.stateful import (Bundle, RuleBasedStateMachine, consumes, invariant, rule,
                                 run_state_machine_as_test)

# The universe of paths: few names in few directories, so that operations collide
# (a rename over an open file, an rmdir of a directory a file was just created in).
DIRS = ["", "d", "d/e", "f"]
NAMES = ["a", "b", "c"]
PATHS = [f"{d}/{n}" if d else n for d in DIRS for n in NAMES] + [d for d in DIRS if d]
# Offsets and lengths: mostly within the first 64 KiB, sometimes past one 8 MiB
# upload part (a multipart upload, a stream, a copy on write of a large file).
MIB = 1 << 20
OFFSETS = st.one_of(st.integers(0, 70_000), st.sampled_from([8 * MIB - 3, 9 * MIB]))
LENGTHS = st.one_of(st.integers(0, 20_000), st.sampled_from([65_536, MIB + 5]))
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


class WriteModel(RuleBasedStateMachine):
    """Set ``target`` (a WritableMount, mounted) and ``scratch`` (a directory for the
    references) before running."""

    target: WritableMount
    scratch: Path
    handles = Bundle("handles")

    def __init__(self):
        super().__init__()
        self.root = self.target.mnt
        self.ref = Path(tempfile.mkdtemp(dir=self.scratch))
        self.case = f"case-{time.monotonic_ns()}"
        os.mkdir(self.root / self.case)
        os.mkdir(self.ref / self.case)
        self.open: dict[int, tuple[int, int]] = {}
        self.next = 0

    def both(self, path: str) -> tuple[str, str]:
        return str(self.root / self.case / path), str(self.ref / self.case / path)

    def same(self, what: str, fn, *pairs):
        got = outcome(fn, *[p[0] for p in pairs])
        want = outcome(fn, *[p[1] for p in pairs])
        assert got == want, f"{what}: mount {got!r}, reference {want!r}"
        return got

    # -- rules -----------------------------------------------------------------------
    @rule(target=handles, path=st.sampled_from(PATHS), mode=st.sampled_from(sorted(MODES)))
    def open_file(self, path, mode):
        m, r = self.both(path)
        fm, fr = outcome(os.open, m, MODES[mode], 0o644), outcome(os.open, r, MODES[mode], 0o644)
        if fm[0] == "ok":
            os.set_inheritable(fm[1], False)
        assert fm[0] == fr[0] and (fm[0] == "ok" or fm[1] == fr[1]), \
            f"open {path} {mode}: mount {fm!r}, reference {fr!r}"
        if fm[0] != "ok":
            return -1
        self.next += 1
        self.open[self.next] = (fm[1], fr[1])
        return self.next

    @rule(h=handles, off=OFFSETS, n=LENGTHS, seed=st.integers(0, 2**16))
    def write(self, h, off, n, seed):
        if h not in self.open:
            return
        data = random.Random(seed).randbytes(n)
        fm, fr = self.open[h]
        got, want = outcome(os.pwrite, fm, data, off), outcome(os.pwrite, fr, data, off)
        assert got == want, f"pwrite {n}@{off}: mount {got!r}, reference {want!r}"

    @rule(h=handles, off=OFFSETS, n=LENGTHS)
    def read(self, h, off, n):
        if h in self.open:
            fm, fr = self.open[h]
            got, want = outcome(os.pread, fm, n, off), outcome(os.pread, fr, n, off)
            assert got == want, f"pread {n}@{off}: mount {got[0]} {len(got[1]) if got[0] == 'ok' else got[1]}, " \
                                f"reference {want[0]} {len(want[1]) if want[0] == 'ok' else want[1]}"

    @rule(h=handles, size=OFFSETS)
    def ftruncate(self, h, size):
        if h in self.open:
            fm, fr = self.open[h]
            got, want = outcome(os.ftruncate, fm, size), outcome(os.ftruncate, fr, size)
            assert got == want, f"ftruncate {size}: mount {got!r}, reference {want!r}"

    @rule(h=handles)
    def fsync(self, h):
        if h in self.open:
            fm, fr = self.open[h]
            got, want = outcome(os.fsync, fm), outcome(os.fsync, fr)
            assert got == want, f"fsync: mount {got!r}, reference {want!r}"

    @rule(h=consumes(handles))
    def close(self, h):
        fds = self.open.pop(h, None)
        if fds is not None:
            got, want = outcome(os.close, fds[0]), outcome(os.close, fds[1])
            assert got == want, f"close: mount {got!r}, reference {want!r}"

    @rule(path=st.sampled_from(PATHS), size=OFFSETS)
    def truncate(self, path, size):
        self.same(f"truncate {path} {size}", os.truncate, self.both(path), (size, size))

    @rule(src=st.sampled_from(PATHS), dst=st.sampled_from(PATHS))
    def rename(self, src, dst):
        self.same(f"rename {src} {dst}", os.rename, self.both(src), self.both(dst))

    @rule(path=st.sampled_from(PATHS))
    def unlink(self, path):
        self.same(f"unlink {path}", os.unlink, self.both(path))

    @rule(path=st.sampled_from(PATHS))
    def mkdir(self, path):
        self.same(f"mkdir {path}", os.mkdir, self.both(path))

    @rule(path=st.sampled_from(PATHS))
    def rmdir(self, path):
        self.same(f"rmdir {path}", os.rmdir, self.both(path))

    @rule()
    def remount(self):
        """Everything closed, unmounted (uploads drained), mounted from a fresh cache:
        the mount now shows what the remote holds."""
        self.close_all()
        self.target.unmount()
        self.target.mount()
        prune_empty_dirs(self.ref / self.case)
        if not (self.ref / self.case).exists():
            os.mkdir(self.ref / self.case)
        if not (self.root / self.case).exists():
            os.mkdir(self.root / self.case)

    # -- after every step ------------------------------------------------------------
    @invariant()
    def trees_agree(self):
        got, want = tree(self.root / self.case), tree(self.ref / self.case)
        if got != want:
            diff = sorted(k for k in set(got) | set(want) if got.get(k) != want.get(k))
            show = {k: (_brief(got.get(k)), _brief(want.get(k))) for k in diff[:6]}
            raise AssertionError(f"mount and reference differ (mount, reference): {show}")

    def close_all(self):
        for fm, fr in self.open.values():
            for fd in (fm, fr):
                try:
                    os.close(fd)
                except OSError:
                    pass
        self.open.clear()

    def teardown(self):
        self.close_all()
        shutil.rmtree(self.ref, ignore_errors=True)


def _brief(v):
    if isinstance(v, tuple):
        return f"{v[0]} bytes"
    return v


def run(target: WritableMount, scratch: Path, examples: int, steps: int,
        derandomize: bool = False) -> None:
    """Run the machine against a mounted ``target``; AssertionError on a difference."""
    WriteModel.target, WriteModel.scratch = target, scratch
    run_state_machine_as_test(WriteModel, settings=settings(
        max_examples=examples, stateful_step_count=steps, deadline=None,
        derandomize=derandomize, database=None, print_blob=True,
        suppress_health_check=list(HealthCheck)))


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description="the write path against a reference model")
    ap.add_argument("--examples", type=int, default=100, help="sequences to run (100)")
    ap.add_argument("--steps", type=int, default=60, help="steps per sequence (60)")
    ap.add_argument("--work-dir", default=None, help="scratch space (a temporary dir)")
    args = ap.parse_args(argv)
    from bench.seaweed import SeaweedServer

    work = Path(args.work_dir or tempfile.mkdtemp(prefix="nc-fsmodel-"))
    with SeaweedServer(work / "seaweed") as sw:
        sw.client().create_bucket(Bucket="fsmodel")
        env = dict(os.environ, **sw.env())
        target = WritableMount("s3://fsmodel", work, env, ["--endpoint-url", sw.endpoint])
        target.mount()
        try:
            t0 = time.monotonic()
            run(target, work, args.examples, args.steps)
            print(f"fsmodel: {args.examples} sequences of up to {args.steps} steps agree "
                  f"with the reference ({time.monotonic() - t0:.0f} s)")
        finally:
            target.unmount()


if __name__ == "__main__":
    main()

"""Shared fixtures: one real SeaweedFS S3 server per test session, datasets made in
code, and a helper that mounts NeuralCache through its real CLI."""
from __future__ import annotations

import contextlib
import os
import random
import shutil
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
import xxhash

from bench.servers.seaweed import SeaweedServer

NEURALCACHE = [sys.executable, "-m", "neuralcache"]


def fuse_available() -> bool:
    return os.path.exists("/dev/fuse") and shutil.which("fusermount3") is not None


needs_fuse = pytest.mark.skipif(not fuse_available(), reason="needs /dev/fuse and fusermount3")


@pytest.fixture(scope="session", autouse=True)
def no_mount_outlives_the_session(tmp_path_factory):
    """At the end of the session, lazily unmount any FUSE mount a test left under this
    session's temporary directory (a test killed mid-way, a daemon that hung), so that
    no later run finds a dead mountpoint.  Mounts of other sessions are not touched."""
    yield
    base = os.path.realpath(tmp_path_factory.getbasetemp())
    with open("/proc/self/mountinfo") as f:
        left = [line.split()[4] for line in f
                if " - fuse" in line and line.split()[4].startswith(base + "/")]
    for mp in sorted(left, key=len, reverse=True):
        print(f"conftest: {mp} was still mounted at the session's end: unmounting")
        subprocess.run(["fusermount3", "-u", "-z", mp], check=False)


@pytest.fixture(scope="session")
def seaweed(tmp_path_factory):
    sw = SeaweedServer(tmp_path_factory.mktemp("seaweed"))
    sw.start()
    try:
        yield sw
    finally:
        sw.stop()


@pytest.fixture(scope="session")
def s3(seaweed):
    return seaweed.client()


@pytest.fixture(scope="session")
def seaweed_writes(tmp_path_factory):
    """A second server for the write tests (test_write*.py).  Every bucket is a
    SeaweedFS collection of 7 volumes and bench/servers/seaweed.py allows 100, so one server
    holds 14 buckets, and the rest of the suite already uses them up."""
    with SeaweedServer(tmp_path_factory.mktemp("seaweed-write")) as sw:
        yield sw


def new_bucket(s3) -> str:
    name = "t-" + uuid.uuid4().hex[:12]
    s3.create_bucket(Bucket=name)
    return name


def delete_bucket(s3, name: str) -> None:
    """Empty and delete a bucket: a SeaweedFS bucket holds 7 of the server's 100
    volumes until it is deleted."""
    for page in s3.get_paginator("list_objects_v2").paginate(Bucket=name):
        for o in page.get("Contents", []):
            s3.delete_object(Bucket=name, Key=o["Key"])
    s3.delete_bucket(Bucket=name)


def eventually(check, timeout: float = 5.0, every: float = 0.05):
    """``check()`` until it is true (returned), else the last value after ``timeout``
    (for what the daemon does right after a close(): FUSE's RELEASE is asynchronous)."""
    deadline = time.monotonic() + timeout
    while True:
        v = check()
        if v or time.monotonic() > deadline:
            return v
        time.sleep(every)


def payload(seed: int, size: int) -> bytes:
    return random.Random(seed).randbytes(size)


def digest(b: bytes) -> str:
    return xxhash.xxh3_128_hexdigest(b)


def upload_tree(s3, bucket: str, files: dict[str, bytes], prefix: str = "") -> None:
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(16) as pool:
        list(pool.map(lambda kv: s3.put_object(Bucket=bucket, Key=prefix + kv[0],
                                               Body=kv[1]), files.items()))


def read_tree(root: Path) -> dict[str, bytes]:
    """Every file under ``root`` (a mount), by path relative to it."""
    out = {}
    for dirpath, _, filenames in os.walk(root):
        for f in filenames:
            p = Path(dirpath) / f
            out[str(p.relative_to(root))] = p.read_bytes()
    return out


def cli_env(seaweed=None, **extra) -> dict[str, str]:
    env = dict(os.environ)
    if seaweed is not None:
        env.update(seaweed.env())
    env.update(extra)
    return env


def run_cli(*args, env=None, timeout=120) -> subprocess.CompletedProcess:
    return subprocess.run(NEURALCACHE + [str(a) for a in args], env=env, timeout=timeout,
                          capture_output=True, text=True)


def is_mounted(path) -> bool:
    real = os.path.abspath(path)
    with open("/proc/self/mountinfo") as f:
        return any(line.split()[4] == real for line in f)


@contextlib.contextmanager
def small_tmpfs(tmp_path: Path, size: str):
    """A tmpfs of ``size`` under ``tmp_path`` (a disk that fills on demand); the test
    is skipped without root."""
    if os.geteuid() != 0:
        pytest.skip("needs root to mount a small tmpfs")
    where = tmp_path / "tmpfs"
    where.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(where)],
                   check=True)
    try:
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)])


@contextlib.contextmanager
def mounted(source: str, mountpoint, *, env=None, cache_dir=None, args=()):
    """Mount with the real CLI (background mode); always unmount afterwards."""
    mountpoint = Path(mountpoint)
    mountpoint.mkdir(parents=True, exist_ok=True)
    cmd = ["mount", source, mountpoint]
    if cache_dir is not None:
        cmd += ["--cache-dir", cache_dir]
    cmd += list(args)
    res = run_cli(*cmd, env=env)
    assert res.returncode == 0, f"mount failed: {res.stderr}{res.stdout}"
    try:
        yield mountpoint
    finally:
        if is_mounted(mountpoint):
            r = run_cli("umount", mountpoint, env=env)
            if r.returncode != 0:       # e.g. a failed test left uploads pending
                r = run_cli("umount", mountpoint, "--force", env=env)
            if r.returncode != 0:
                subprocess.run(["fusermount3", "-u", "-z", str(mountpoint)])
        deadline = time.monotonic() + 10
        while is_mounted(mountpoint) and time.monotonic() < deadline:
            time.sleep(0.1)

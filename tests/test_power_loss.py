"""Power loss under the write journal (issue 18): the cache directory lives on
tests/crashfs.py, a FUSE disk that keeps only what was fsynced (file data, and
directory entries only once their directory was fsynced).  The daemon is killed with
SIGKILL, the disk loses power, and a new mount through another endpoint must put every
acknowledged close() and rename() on the remote under its final name, byte-exact."""
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import cli_env, is_mounted, mounted, needs_fuse, new_bucket, payload, run_cli
from test_e2e import stats
from test_write import RefusingProxy, digests, in_bucket

pytestmark = [needs_fuse, pytest.mark.e2e]

CRASHFS = [sys.executable, str(Path(__file__).with_name("crashfs.py"))]


@pytest.fixture(scope="module")
def seaweed(seaweed_writes):
    return seaweed_writes


class Disk:
    """A crashfs mount: ``cut()`` loses power (and unmounts), ``boot()`` comes back."""

    def __init__(self, where: Path):
        self.mp = where / "disk"
        self.image = where / "disk.image"
        self.mp.mkdir()
        self.proc = None
        self.dropped = None

    def boot(self) -> None:
        self.proc = subprocess.Popen(CRASHFS + [str(self.mp), "--image", str(self.image)],
                                     stdout=subprocess.PIPE, text=True)
        assert self.proc.stdout.readline().strip() == "ready"
        deadline = time.monotonic() + 10
        while not is_mounted(self.mp):
            assert time.monotonic() < deadline, "crashfs did not mount"
            time.sleep(0.05)

    def cut(self) -> None:
        self.proc.send_signal(signal.SIGUSR1)
        line = self.proc.stdout.readline()
        assert line.startswith("power cut"), line
        self.dropped = line
        self.proc.wait(timeout=30)
        assert not is_mounted(self.mp)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        if is_mounted(self.mp):
            subprocess.run(["fusermount3", "-u", "-z", str(self.mp)])


@pytest.fixture
def disk(tmp_path):
    d = Disk(tmp_path)
    d.boot()
    yield d
    d.stop()


def test_power_loss_keeps_every_acknowledged_close_and_rename(seaweed, disk, tmp_path):
    s3 = seaweed.client()
    bucket = new_bucket(s3)
    env = cli_env(seaweed)
    s3.put_object(Bucket=bucket, Key="old/a.bin", Body=payload(1, 50_000))
    s3.put_object(Bucket=bucket, Key="old/b.bin", Body=payload(2, 60_000))
    cache = disk.mp / "cache"
    acked: dict[str, bytes] = {"old/b.bin": payload(2, 60_000)}
    with RefusingProxy(seaweed.endpoint, seaweed.access_key, seaweed.secret_key) as proxy:
        with mounted(f"s3://{bucket}", tmp_path / "mnt", env=env, cache_dir=cache,
                     args=["--endpoint-url", proxy.endpoint, "--writable"]) as mp:
            pid = stats(mp)["pid"]
            first = payload(3, 3 << 20)
            (mp / "uploaded.bin").write_bytes(first)       # reaches the remote
            assert run_cli("sync", mp, env=env).returncode == 0
            proxy.refuse = True                            # from here on, all pending
            # the checkpoint pattern: a temporary name, then rename over the final one
            for step in range(3):
                data = payload(10 + step, 2 << 20)
                with open(mp / "ckpt.tmp", "wb") as f:
                    f.write(data)
                os.rename(mp / "ckpt.tmp", mp / "ckpt.pt")
                acked["ckpt.pt"] = data
            (mp / "runs").mkdir()
            for i in range(5):
                data = payload(20 + i, 100_000 + i)
                (mp / "runs" / f"log-{i}.txt").write_bytes(data)
                acked[f"runs/log-{i}.txt"] = data
            os.rename(mp / "uploaded.bin", mp / "runs" / "moved.bin")   # remote copy
            acked["runs/moved.bin"] = first
            os.rename(mp / "old" / "a.bin", mp / "a-renamed.bin")
            acked["a-renamed.bin"] = payload(1, 50_000)
            os.unlink(mp / "runs" / "log-4.txt")
            del acked["runs/log-4.txt"]
            fd = os.open(mp / "open-at-crash.bin", os.O_WRONLY | os.O_CREAT)
            os.write(fd, b"x" * 1000)                  # never closed: not promised
            os.kill(pid, signal.SIGKILL)
            try:
                os.close(fd)
            except OSError:
                pass                                   # the daemon is gone
            subprocess.run(["fusermount3", "-u", "-z", str(mp)])
            assert in_bucket(s3, bucket).keys() == {"uploaded.bin", "old/a.bin",
                                                    "old/b.bin"}
        disk.cut()
    lost = disk.dropped      # "power cut: dropped {...}": the cut must lose something
    assert "'entries_changed_since_fsync': 0" not in lost, lost
    assert "'files_changed_since_fsync': 0" not in lost, lost
    disk.boot()
    # the same source and cache directory, the server's own endpoint: recovery runs
    # before the mount reports ready
    with mounted(f"s3://{bucket}", tmp_path / "mnt", env=env, cache_dir=cache,
                 args=["--endpoint-url", seaweed.endpoint, "--writable"]) as mp:
        got = in_bucket(s3, bucket)
        assert "open-at-crash.bin" not in got or got["open-at-crash.bin"] == b"x" * 1000
        got.pop("open-at-crash.bin", None)
        assert digests(got) == digests(acked)
        assert stats(mp)["upload_pending_ops"] == 0

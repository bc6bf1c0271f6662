"""The control directory's mode bits tell the truth: what `ls -l` shows another user is
what the mount lets that user do (real mounts; the other user is `nobody` via setpriv)."""
import json
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest

from conftest import cli_env, eventually, mounted, needs_fuse, new_bucket, upload_tree

pytestmark = [needs_fuse, pytest.mark.e2e,
              pytest.mark.skipif(os.getuid() != 0 or not shutil.which("setpriv"),
                                 reason="needs root and setpriv to act as another user")]

FILES = {"d/a.bin": b"a" * 1000, "d/b.bin": b"b" * 2000}


def as_nobody(*cmd) -> subprocess.CompletedProcess:
    return subprocess.run(["setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups",
                           *cmd], capture_output=True, text=True, timeout=30)


@pytest.fixture
def world_dir():
    """A mountpoint parent that other users can traverse (pytest's tmp_path is 0700)."""
    d = Path(tempfile.mkdtemp(prefix="nc-ctl-"))
    d.chmod(0o755)
    try:
        yield d
    finally:
        shutil.rmtree(d, ignore_errors=True)


@pytest.fixture(scope="module")
def bucket(s3):
    b = new_bucket(s3)
    upload_tree(s3, b, FILES)
    return b


def modes(ctl: Path) -> dict:
    return {p: oct(os.stat(ctl / p).st_mode & 0o777) for p in ("", "stats.json", "hints",
                                                                 "trace")}


def test_allow_other_lets_other_users_read_stats_and_write_hints(seaweed, bucket, world_dir):
    with mounted(f"s3://{bucket}", world_dir / "mnt", env=cli_env(seaweed),
                 cache_dir=world_dir / "c",
                 args=["--endpoint-url", seaweed.endpoint, "--allow-other"]) as mp:
        ctl = mp / ".neuralcache"
        assert modes(ctl) == {"": "0o555", "stats.json": "0o444", "hints": "0o622",
                              "trace": "0o400"}
        r = as_nobody("cat", str(ctl / "stats.json"))
        assert r.returncode == 0, r.stderr
        assert json.loads(r.stdout)["source"] == f"s3://{bucket}"
        r = as_nobody("sh", "-c", f"printf 'd/b.bin\\nd/a.bin\\n' > '{ctl}/hints'")
        assert r.returncode == 0, r.stderr
        assert eventually(lambda: json.loads((ctl / "stats.json").read_text())["hints"] == 2)
        r = as_nobody("cat", str(ctl / "trace"))          # 0400: the owner's only
        assert r.returncode != 0 and "Permission denied" in r.stderr
        r = as_nobody("cat", str(mp / "d/a.bin"))
        assert r.returncode == 0 and r.stdout == FILES["d/a.bin"].decode()


def test_without_allow_other_everything_is_owner_only(seaweed, bucket, world_dir):
    with mounted(f"s3://{bucket}", world_dir / "mnt", env=cli_env(seaweed),
                 cache_dir=world_dir / "c", args=["--endpoint-url", seaweed.endpoint]) as mp:
        ctl = mp / ".neuralcache"
        assert modes(ctl) == {"": "0o500", "stats.json": "0o400", "hints": "0o600",
                              "trace": "0o400"}
        r = as_nobody("cat", str(ctl / "stats.json"))
        assert r.returncode != 0 and "Permission denied" in r.stderr

"""The write path against a reference model (bench/tools/fsmodel.py): random sequences of
create, write at random offsets, read, truncate, rename, unlink, mkdir, rmdir, close
and reopen, fsync and remount on a --writable mount of a real SeaweedFS bucket and on
a local directory, compared after every step.  CI runs a fixed set of seeds;
`python -m bench.tools.fsmodel` runs many more."""
import os

import pytest

from bench.tools import fsmodel
from bench.wan import WanProxyProcess
from conftest import cli_env, needs_fuse, new_bucket

pytestmark = [needs_fuse, pytest.mark.e2e]

SEEDS = fsmodel.parse_seeds(os.environ.get("NEURALCACHE_MODEL_SEEDS", "8"))
STEPS = int(os.environ.get("NEURALCACHE_MODEL_STEPS", "60"))


def test_writable_mount_agrees_with_a_local_directory(seaweed_writes, tmp_path):
    """Through a 60 ms link, so that uploads are still running when the next calls
    come (without it every file was on the remote within a millisecond of close() and
    the model missed the reopen bug of issue 18)."""
    sw = seaweed_writes
    bucket = new_bucket(sw.client())
    with WanProxyProcess(f"127.0.0.1:{sw.s3_port}", rtt_ms=60) as link:
        target = fsmodel.WritableMount(f"s3://{bucket}", tmp_path, cli_env(sw),
                                       ["--endpoint-url", link.endpoint])
        target.mount()
        try:
            fsmodel.run(target, tmp_path, SEEDS, STEPS)
        finally:
            target.unmount()

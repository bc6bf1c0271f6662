"""The write path against a reference model (bench/fsmodel.py): random sequences of
create, write at random offsets, read, truncate, rename, unlink, mkdir, rmdir, close
and reopen, fsync and remount on a --writable mount of a real SeaweedFS bucket and on
a local directory, compared after every step.  CI runs a fixed set of sequences
(derandomized); `python -m bench.fsmodel` runs many more."""
import os

import pytest

from bench import fsmodel
from conftest import cli_env, needs_fuse, new_bucket

pytestmark = [needs_fuse, pytest.mark.e2e]

EXAMPLES = int(os.environ.get("NEURALCACHE_MODEL_EXAMPLES", "6"))
STEPS = int(os.environ.get("NEURALCACHE_MODEL_STEPS", "40"))


def test_writable_mount_agrees_with_a_local_directory(seaweed_writes, tmp_path):
    sw = seaweed_writes
    bucket = new_bucket(sw.client())
    target = fsmodel.WritableMount(f"s3://{bucket}", tmp_path, cli_env(sw),
                                   ["--endpoint-url", sw.endpoint])
    target.mount()
    try:
        fsmodel.run(target, tmp_path, EXAMPLES, STEPS, derandomize=True)
    finally:
        target.unmount()

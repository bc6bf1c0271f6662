"""A few training steps through a real NeuralCache mount of a SeaweedFS bucket: the
DataLoader (2 workers) sees exactly the bytes it sees from local disk, and the loss
curve is identical; the job's read order reaches the mount as hints."""
import json
import os
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("safetensors")

from bench.scenarios.maze import data, training  # noqa: E402
from conftest import cli_env, mounted, needs_fuse, new_bucket, upload_tree  # noqa: E402

STEPS = 4


@needs_fuse
@pytest.mark.e2e
@pytest.mark.parametrize("layout", ["files", "shards"])
def test_training_through_mount_sees_local_bytes(seaweed, s3, tmp_path, layout):
    local = tmp_path / "local"
    data.write_dataset(local, seed=0, rows=4, cols=4, n_train=192, shard_size=64)
    files = {str(p.relative_to(local)): p.read_bytes()
             for p in local.rglob("*") if p.is_file()}
    bucket = new_bucket(s3)
    upload_tree(s3, bucket, {f"data/{k}": v for k, v in files.items()})
    kw = dict(layout=layout, steps=STEPS, batch_size=8, workers=2, seed=1, preset="tiny",
              threads=1, window=2, hints=True)
    want = training.train(local, out=tmp_path / "out-local", **kw)
    with mounted(f"s3://{bucket}", tmp_path / "mnt", env=cli_env(seaweed),
                 cache_dir=tmp_path / "cache",
                 args=["--endpoint-url", seaweed.endpoint]) as mp:
        # the data root is below the mount root: the hints go to the mount's control dir
        got = training.train(Path(mp) / "data", out=tmp_path / "out-mount", **kw)
        assert json.loads((Path(mp) / ".neuralcache" / "stats.json").read_text())["hints"] > 0
    assert got["hints"].startswith("ok"), got["hints"]
    assert want["hints"].startswith("not sent"), want["hints"]
    assert got["bytes_read"] == want["bytes_read"] > 0
    assert got["bytes_digest"] == want["bytes_digest"]
    assert got["loss_curve"] == want["loss_curve"]
    assert len(got["loss_curve"]) == STEPS
    assert os.path.isfile(tmp_path / "out-mount" / "checkpoint" / "model.safetensors")

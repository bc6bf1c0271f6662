"""Workloads read through a root directory and catch corrupted bytes (local dir, no mounts)."""
from __future__ import annotations

import pytest

from bench.scenarios import bigfile, samples, shards, train
from bench.scenarios.datasets import Dataset, materialize

SHARDS = Dataset("shards", "shards", {"shards": 4, "samples_per_shard": 6,
                                      "sample_lo": 2000, "sample_hi": 5000})
TREE = Dataset("samples", "samples", {"files": 20, "classes": 4,
                                      "size_lo": 1000, "size_hi": 2000})
BLOB = Dataset("bigfile", "blob", {"size": 3 << 20, "pattern": "weights.bin"})


@pytest.fixture()
def data(tmp_path):
    return tmp_path, {d.name: materialize(d, tmp_path, seed=1) for d in (SHARDS, TREE, BLOB)}


def _corrupt(path):
    b = bytearray(path.read_bytes())
    b[len(b) // 2] ^= 0xFF
    path.write_bytes(bytes(b))


def test_clean_reads_verify(data):
    root, man = data
    r = shards.shards_epoch(root, "shards", man["shards"], seed=3)
    assert r["verify_errors"] == 0 and r["files"] == 4 and r["unit"] == "MB/s"
    r = samples.samples_epoch(root, "samples", man["samples"], seed=3, threads=4)
    assert r["verify_errors"] == 0 and r["files"] == 20 and r["unit"] == "files/s"
    r = bigfile.bigfile_read(root, "bigfile", man["bigfile"])
    assert r["verify_errors"] == 0 and r["bytes"] == 3 << 20


def test_corruption_is_reported(data):
    root, man = data
    _corrupt(root / "shards" / "shard-00002.tar")
    _corrupt(root / "samples" / "n0001" / "000001.jpg")
    _corrupt(root / "bigfile" / "weights.bin")
    assert shards.shards_epoch(root, "shards", man["shards"], 3)["verify_errors"] == 1
    assert samples.samples_epoch(root, "samples", man["samples"], 3)["verify_errors"] == 1
    assert bigfile.bigfile_read(root, "bigfile", man["bigfile"])["verify_errors"] == 1


def test_train_standin_counts_samples_and_windows(data):
    root, man = data
    r = train.train_run(root, "shards", man["shards"], seed=0, window=2, compute_s=0.0,
                        use_torch=False)
    assert r["samples"] == 24 and r["verify_errors"] == 0 and r["loader"] == "stand-in"
    assert r["bytes"] == sum(m["size"] for m in man["shards"]["files"].values())
    assert r["windows"] and r["windows"][-1]["batch"] == r["batches"]


def test_read_into_cache_reads_every_file_under_the_root(tmp_path):
    from bench.systems.pagecache import read_into_cache
    (tmp_path / "a" / "b").mkdir(parents=True)
    (tmp_path / "a" / "b" / "x.dat").write_bytes(b"x" * (9 << 20))
    (tmp_path / "y.idx").write_bytes(b"y" * 100)
    (tmp_path / "empty").write_bytes(b"")
    assert read_into_cache(tmp_path) == (9 << 20) + 100
    assert read_into_cache(tmp_path / "missing") == 0


def test_warm_epochs_repeat_until_the_minimum_time_and_sum():
    seeds = []

    def epoch(seconds):
        def run(n):
            seeds.append(n)
            return {"seconds": seconds, "bytes": 10, "files": 2, "verify_errors": n == 3,
                    "readers": 8, "value": 0.0, "unit": "files/s"}
        return run

    r = samples.warm_epochs(epoch(samples.WARM_MIN_S / 4))       # fast: 4 epochs
    assert seeds == [2, 3, 4, 5] and r["epochs"] == 4 and r["files"] == 8
    assert r["verify_errors"] == 1 and r["readers"] == 8
    assert r["value"] == 8 / samples.WARM_MIN_S
    seeds.clear()
    assert samples.warm_epochs(epoch(samples.WARM_MIN_S * 3))["epochs"] == 1  # slow: one
    seeds.clear()
    assert samples.warm_epochs(epoch(0.0))["epochs"] == samples.WARM_MAX_EPOCHS


def test_warm_epochs_run_until_the_time_or_the_count():
    def epochs(seconds):
        seeds = []

        def epoch(seed):
            seeds.append(seed)
            return {"seconds": seconds, "bytes": 100, "files": 2, "verify_errors": seed == 3,
                    "value": 0.0, "unit": "MB/s"}
        return epoch, seeds
    fast, seeds = epochs(0.3)
    r = shards.warm_epochs(fast, min_s=1.0, most=5)
    # 0.3 s each: four to pass 1 s, each a new order; the sums and their rate
    assert seeds == [2, 3, 4, 5] and r["epochs"] == 4
    assert r["bytes"] == 400 and r["files"] == 8 and r["verify_errors"] == 1
    assert r["seconds"] == pytest.approx(1.2) and r["value"] == pytest.approx(400 / 1.2 / 1e6)
    tiny, seeds = epochs(0.01)
    assert shards.warm_epochs(tiny, min_s=1.0, most=5)["epochs"] == 5 and len(seeds) == 5
    slow, seeds = epochs(2.0)
    assert shards.warm_epochs(slow, min_s=1.0, most=5)["epochs"] == 1 and seeds == [2]

"""Dataset generators are deterministic from the seed and produce what they promise."""
from __future__ import annotations

import io
import json

import xxhash

from bench.scenarios.datasets import Dataset, iter_tar_samples, materialize, standard

SMALL_SHARDS = Dataset("s", "shards", {"shards": 3, "samples_per_shard": 5,
                                       "sample_lo": 1000, "sample_hi": 3000})
SMALL_TREE = Dataset("t", "samples", {"files": 12, "classes": 3,
                                      "size_lo": 500, "size_hi": 900})


def _contents(ds, seed):
    return {rel: gen() for rel, gen in ds.files(seed)}


def test_same_seed_same_bytes_other_seed_other_bytes():
    for ds in (SMALL_SHARDS, SMALL_TREE, Dataset("b", "blob", {"size": 10_000})):
        a, b, c = _contents(ds, 1), _contents(ds, 1), _contents(ds, 2)
        assert a == b
        assert a.keys() == c.keys()
        assert all(a[k] != c[k] for k in a)


def test_shards_are_webdataset_tars_with_labels():
    shards = _contents(SMALL_SHARDS, 0)
    assert sorted(shards) == ["shard-00000.tar", "shard-00001.tar", "shard-00002.tar"]
    samples = list(iter_tar_samples(io.BytesIO(shards["shard-00001.tar"])))
    assert [k for k, _, _ in samples] == [f"{i:08d}" for i in range(5, 10)]
    for _, jpg, label in samples:
        assert jpg[:2] == b"\xff\xd8" and 1000 <= len(jpg) < 3000
        assert 0 <= label < 1000


def test_tree_has_class_dirs_and_sizes():
    tree = _contents(SMALL_TREE, 0)
    assert len(tree) == 12
    assert {k.split("/")[0] for k in tree} == {"n0000", "n0001", "n0002"}
    assert all(500 <= len(v) < 900 for v in tree.values())


def test_materialize_writes_manifest_and_reuses_it(tmp_path):
    man = materialize(SMALL_TREE, tmp_path, seed=5)
    for rel, m in man["files"].items():
        data = (tmp_path / "t" / rel).read_bytes()
        assert len(data) == m["size"] and xxhash.xxh3_64_hexdigest(data) == m["xxh3"]
    mtime = (tmp_path / "t" / "n0000" / "000000.jpg").stat().st_mtime_ns
    assert materialize(SMALL_TREE, tmp_path, seed=5) == man
    assert (tmp_path / "t" / "n0000" / "000000.jpg").stat().st_mtime_ns == mtime
    again = materialize(SMALL_TREE, tmp_path, seed=6)   # other seed: regenerated
    assert again["files"].keys() == man["files"].keys() and again != man
    assert json.loads((tmp_path / ".manifest-t.json").read_text()) == again


def test_standard_overflow_is_twice_the_cache():
    ds = standard("overflow", quick=True, cache_mb=16)
    p = ds.params
    approx = p["shards"] * p["samples_per_shard"] * (p["sample_lo"] + p["sample_hi"]) / 2
    assert 1.8 * (16 << 20) <= approx <= 2.2 * (16 << 20)

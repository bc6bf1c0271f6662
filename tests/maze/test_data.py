"""The on-disk dataset: deterministic bytes, manifest, eval disjointness, record format."""
import json
import tarfile

import xxhash

from bench.scenarios.maze import data, mazes


def _tree_bytes(root):
    return {p.relative_to(root).as_posix(): p.read_bytes()
            for p in sorted(root.rglob("*")) if p.is_file()}


def test_same_seed_same_bytes_other_seed_other_bytes(tmp_path):
    a, b, c = tmp_path / "a", tmp_path / "b", tmp_path / "c"
    ma = data.write_dataset(a, seed=3, n_train=300, shard_size=100)
    data.write_dataset(b, seed=3, n_train=300, shard_size=100)
    data.write_dataset(c, seed=4, n_train=300, shard_size=100)
    ta, tb, tc = _tree_bytes(a), _tree_bytes(b), _tree_bytes(c)
    assert ta == tb
    assert ta[data.file_relpath(0)] != tc[data.file_relpath(0)]
    assert ma["n_shards"] == 3
    assert len([k for k in ta if k.startswith("mazes/")]) == 300


def test_manifest_hashes_and_verify(tmp_path):
    m = data.write_dataset(tmp_path, seed=0, n_train=120, shard_size=50)
    on_disk = json.loads((tmp_path / data.MANIFEST).read_text())
    assert on_disk == m
    for rel, meta in m["files"].items():
        buf = (tmp_path / rel).read_bytes()
        assert meta == {"size": len(buf), "xxh64": xxhash.xxh64_hexdigest(buf)}
    assert data.verify(tmp_path) == []
    (tmp_path / data.file_relpath(7)).write_bytes(b"junk")
    assert data.verify(tmp_path) == [data.file_relpath(7)]


def test_shards_hold_the_same_records_as_files(tmp_path):
    m = data.write_dataset(tmp_path, seed=1, n_train=130, shard_size=64)
    assert m["n_shards"] == 3
    seen = []
    for k in range(m["n_shards"]):
        with tarfile.open(tmp_path / data.shard_relpath(k)) as tar:
            for ti in tar:
                assert ti.mtime == 0 and ti.uid == 0 and ti.uname == ""
                i = int(ti.name.split(".")[0])
                assert ti.name == data.member_name(i)
                assert tar.extractfile(ti).read() == (tmp_path / data.file_relpath(i)).read_bytes()
                seen.append(i)
    assert seen == list(range(130))


def test_record_round_trip_and_padding():
    m = mazes.make_task(0, mazes.TRAIN, 5, 5, 5)
    rec = data.encode_record(5, m)
    idx, toks, plen = data.decode_record(rec)
    assert (idx, toks, plen) == (5, mazes.to_tokens(m), mazes.prompt_length(5, 5))
    padded = data.encode_record(5, m, pad_to=4096)
    assert len(padded) == 4096 and data.decode_record(padded)[1] == toks
    for bad in (b"", b"XXXX" + rec[4:], rec[:20]):
        try:
            data.decode_record(bad)
        except ValueError:
            continue
        raise AssertionError("accepted a bad record")


def test_eval_set_disjoint_from_training():
    ev = {m.key() for m in mazes.eval_set(5, 5)}
    tr = {m.key() for _, m in data.training_tasks(0, 5, 5, 5000, 1_000_003)}
    assert not ev & tr


def test_eval_collision_is_skipped():
    """On a 2x3 grid (450 distinct tasks) collisions are near certain; the writer must skip every eval task."""
    ev = {m.key() for m in mazes.eval_set(2, 3)}
    gen = data.training_tasks(0, 2, 3, 200, 1_000_003)
    got = []
    try:
        while True:
            got.append(next(gen)[1])
    except StopIteration as stop:
        skipped = stop.value
    assert len(got) == 200 and skipped
    assert not {m.key() for m in got} & ev

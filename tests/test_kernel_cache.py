"""End-to-end: small files the prefetcher fetched are put into the kernel page cache at
open (fs/push.py), so their reads send no READ request; every byte read
is compared with the source, including across remote replacements."""
import time

import pytest

from conftest import (cli_env, digest, eventually, mounted, needs_fuse, new_bucket,
                      payload, upload_tree)
from test_e2e import s3_mount, stats

pytestmark = [needs_fuse, pytest.mark.e2e]

# fewer than ahead/prefetch.py SIBLINGS_MAX_FILES: the first open starts them all
FILES = {f"c/img{i:02d}.jpg": payload(600 + i, 40_000 + 997 * i) for i in range(12)}


def _prefetched(mp, nbytes: int):
    return lambda: stats(mp)["prefetch_bytes_fetched"] >= nbytes


def test_prefetched_small_files_are_pushed_and_read_exactly(seaweed, s3, tmp_path):
    bucket = new_bucket(s3)
    upload_tree(s3, bucket, FILES)
    names = sorted(FILES)
    with s3_mount(seaweed, bucket, tmp_path, "--metadata-ttl", "60") as mp:
        assert digest((mp / names[0]).read_bytes()) == digest(FILES[names[0]])
        rest = sum(len(FILES[n]) for n in names[1:])
        assert eventually(_prefetched(mp, rest), timeout=20.0), stats(mp)
        before = stats(mp)
        for n in names[1:]:
            assert digest((mp / n).read_bytes()) == digest(FILES[n]), n
        after = stats(mp)
        pushed = after["pushed_files"] - before["pushed_files"]
        reads = after["reads"] - before["reads"]      # (READs of stats.json not counted)
        assert pushed == len(names) - 1, after
        assert reads == 0, after            # the kernel served them all
        assert after["push_errors"] == 0
        # a second pass: the page cache is kept, nothing is pushed again
        for n in names:
            assert digest((mp / n).read_bytes()) == digest(FILES[n]), n
        again = stats(mp)
        assert again["pushed_files"] == after["pushed_files"]
        # positioned reads of a pushed file: every offset, from the kernel
        with open(mp / names[5], "rb", buffering=0) as f:
            data = FILES[names[5]]
            for off in (0, 1, 4095, 4096, len(data) - 1, len(data)):
                f.seek(off)
                assert f.read(5000) == data[off:off + 5000], off


def test_a_pushed_file_replaced_on_the_remote_reads_one_whole_version(seaweed, s3,
                                                                        tmp_path):
    """A pushed file replaced by a shorter and then a longer version: every read is one
    whole version (never the old bytes past the new length, or cut to the old size),
    and the newest one comes within a few TTLs."""
    bucket = new_bucket(s3)
    upload_tree(s3, bucket, FILES)
    names = sorted(FILES)
    key = names[3]
    versions = [FILES[key], payload(700, 9_000), payload(701, 150_000)]
    with s3_mount(seaweed, bucket, tmp_path, "--metadata-ttl", "1") as mp:
        (mp / names[0]).read_bytes()
        assert eventually(_prefetched(mp, sum(len(FILES[n]) for n in names[1:])),
                          timeout=20.0), stats(mp)
        assert (mp / key).read_bytes() == versions[0]
        assert stats(mp)["pushed_files"] >= 1
        for i in (1, 2):
            s3.put_object(Bucket=bucket, Key=key, Body=versions[i])
            time.sleep(1.2)
            seen = []

            def newest() -> bool:
                got = (mp / key).read_bytes()
                seen.append(len(got))
                assert got in versions[:i + 1], f"{len(got)} bytes, not a whole version"
                return got == versions[i]

            assert eventually(newest, timeout=10.0, every=0.3), seen


def test_a_small_file_not_in_memory_is_loaded_by_its_open(seaweed, s3, tmp_path):
    """Loading at open (fs/push.py PUSH_LOADS, on by default): a small file the prefetcher has not
    fetched is loaded by its open and pushed, so its read sends no READ either; one
    deleted on the remote since it was listed fails at open (ENOENT) and leaves no
    handle behind."""
    bucket = new_bucket(s3)
    # more files than a directory's siblings are loaded at once for (SIBLINGS_MAX_FILES)
    files = {f"big/s{i:03d}.bin": payload(800 + i, 30_000 + 101 * i) for i in range(40)}
    upload_tree(s3, bucket, files)
    names = sorted(files)
    env = dict(cli_env(seaweed), NEURALCACHE_PUSH_LOADS="1")
    with mounted(f"s3://{bucket}", tmp_path / "mnt", env=env, cache_dir=tmp_path / "cache",
                 args=["--endpoint-url", seaweed.endpoint, "--metadata-ttl", "60"]) as mp:
        for n in names:
            (mp / n).stat()                     # listed and looked up, nothing read
        gone = names[-1]
        s3.delete_object(Bucket=bucket, Key=gone)
        before = stats(mp)
        for n in names[:-1][::-3]:              # backwards: no sequence to predict
            assert digest((mp / n).read_bytes()) == digest(files[n]), n
        after = stats(mp)
        assert after["reads"] - before["reads"] == 0, after
        assert after["pushed_files"] - before["pushed_files"] == len(names[:-1][::-3])
        with pytest.raises(FileNotFoundError):
            open(mp / gone, "rb")
        eventually(lambda: stats(mp)["open_handles"] == 0)   # RELEASE is asynchronous
        s = stats(mp)
        assert s["open_handles"] == 0 and s["read_errors"] == 1, s
        assert s["push_errors"] == 0

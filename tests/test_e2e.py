"""End-to-end: real FUSE mounts (through the CLI) of a real SeaweedFS bucket and of a
POSIX directory; every byte read is compared with the source by xxhash."""
import errno
import json
import os
import signal
import subprocess
import threading
import time
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from neuralcache.store.tiers import stored_blocks

from conftest import (NEURALCACHE, cli_env, digest, eventually, is_mounted, mounted,
                      needs_fuse, new_bucket, payload, read_tree, run_cli, upload_tree)

pytestmark = [needs_fuse, pytest.mark.e2e]

MB = 1 << 20
DATASET = {
    "train/shard-000.tar": payload(100, 9 * MB + 12345),     # > one 8 MiB block
    "train/shard-001.tar": payload(101, 3 * MB),
    "train/class a/img 001.jpg": payload(102, 100_000),
    "train/class a/img 002.jpg": payload(103, 99_999),
    "train/classü/x.jpg": payload(104, 1),
    "val/empty.bin": b"",
    "README.txt": b"a generated dataset\n",
}


@pytest.fixture(scope="module")
def dataset_bucket(seaweed, s3):
    b = new_bucket(s3)
    upload_tree(s3, b, DATASET)
    return b


@pytest.fixture
def env(seaweed):
    return cli_env(seaweed)


def s3_mount(seaweed, bucket, tmp_path, *args, cache="cache"):
    return mounted(f"s3://{bucket}", tmp_path / "mnt", env=cli_env(seaweed),
                   cache_dir=tmp_path / cache,
                   args=["--endpoint-url", seaweed.endpoint, *args])


def stats(mp) -> dict:
    return json.loads((Path(mp) / ".neuralcache" / "stats.json").read_text())


@pytest.fixture(params=["s3", "posix"])
def any_mount(request, tmp_path):
    if request.param == "s3":
        sw = request.getfixturevalue("seaweed")
        bucket = request.getfixturevalue("dataset_bucket")
        with s3_mount(sw, bucket, tmp_path) as mp:
            yield mp
    else:
        src = tmp_path / "src"
        for k, v in DATASET.items():
            (src / k).parent.mkdir(parents=True, exist_ok=True)
            (src / k).write_bytes(v)
        with mounted(str(src), tmp_path / "mnt", cache_dir=tmp_path / "cache") as mp:
            yield mp


def test_listing_stat_and_every_byte(any_mount):
    mp = any_mount
    got = read_tree(mp)
    assert set(got) == set(DATASET)                     # control dir hidden from walks
    for k, v in DATASET.items():
        assert digest(got[k]) == digest(v), k
        st_ = os.stat(mp / k)
        assert st_.st_size == len(v) and oct(st_.st_mode & 0o777) == "0o444"
    assert sorted(os.listdir(mp / "train")) == sorted(["class a", "classü", "shard-000.tar",
                                                        "shard-001.tar"])
    s = stats(mp)
    assert s["bytes_served"] >= sum(len(v) for v in DATASET.values())
    assert s["files"] == len(DATASET)


def test_read_only(any_mount):
    mp = any_mount
    with pytest.raises(OSError) as e:
        open(mp / "README.txt", "wb")
    assert e.value.errno in (errno.EROFS, errno.EACCES)
    with pytest.raises(OSError) as e:
        os.mkdir(mp / "newdir")
    assert e.value.errno in (errno.EROFS, errno.EACCES)
    with pytest.raises(FileNotFoundError):
        open(mp / "no" / "such")


def test_random_reads_match_source(seaweed, dataset_bucket, tmp_path):
    key = "train/shard-000.tar"
    src = DATASET[key]
    with s3_mount(seaweed, dataset_bucket, tmp_path, "--block-size", "1M") as mp:
        fd = os.open(mp / key, os.O_RDONLY)
        try:
            @settings(max_examples=60, deadline=None,
                      suppress_health_check=[HealthCheck.function_scoped_fixture])
            @given(off=st.integers(0, len(src) + 10), size=st.integers(0, 3 * MB))
            def check(off, size):
                assert digest(os.pread(fd, size, off)) == digest(src[off:off + size])
            check()
        finally:
            os.close(fd)


def test_concurrent_readers(seaweed, dataset_bucket, tmp_path):
    errors = []

    def reader(i):
        try:
            for k in sorted(DATASET)[i % 3:] + sorted(DATASET):
                with open(mp / k, "rb") as f:
                    chunk = bytearray()
                    while b := f.read(65536 + i * 4096):
                        chunk += b
                if digest(bytes(chunk)) != digest(DATASET[k]):
                    errors.append(k)
        except Exception as exc:  # collected and asserted below
            errors.append(repr(exc))

    with s3_mount(seaweed, dataset_bucket, tmp_path, "--block-size", "1M") as mp:
        threads = [threading.Thread(target=reader, args=(i,)) for i in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        s = stats(mp)
    assert errors == []
    # single flight: the data crossed the link about once, not 8 times
    assert s["bytes_fetched"] < 2 * sum(len(v) for v in DATASET.values())


def test_replaced_object_never_mixes_versions(seaweed, s3, tmp_path):
    bucket = new_bucket(s3)
    old, new = payload(1, 4 * MB), payload(2, 4 * MB + 7)
    s3.put_object(Bucket=bucket, Key="w.bin", Body=old)
    with s3_mount(seaweed, bucket, tmp_path, "--metadata-ttl", "1",
                  "--block-size", "1M", "--readahead", "off") as mp:
        f = open(mp / "w.bin", "rb", buffering=0)
        first = f.read(MB)
        assert first == old[:MB]
        s3.put_object(Bucket=bucket, Key="w.bin", Body=new)
        # the open handle keeps its version: old bytes, or ESTALE, never new ones
        try:
            rest = f.read()
            assert first + rest == old
        except OSError as e:
            assert e.errno == errno.ESTALE
        f.close()
        # Past the TTL the directory is re-listed in the background while the old entry
        # keeps serving (stale-while-revalidate): each read is one whole version, and
        # the new one comes within a few TTLs.
        seen = []

        def new_version_read() -> bool:
            seen.append(digest((mp / "w.bin").read_bytes()))
            assert seen[-1] in (digest(old), digest(new))
            return seen[-1] == digest(new)

        time.sleep(1.0)
        assert eventually(new_version_read, timeout=10.0, every=0.3), seen
        assert os.stat(mp / "w.bin").st_size == len(new)


def test_restart_with_warm_disk_cache(seaweed, dataset_bucket, tmp_path):
    with s3_mount(seaweed, dataset_bucket, tmp_path) as mp:
        first = read_tree(mp)
        time.sleep(0.5)
    with s3_mount(seaweed, dataset_bucket, tmp_path) as mp:
        again = read_tree(mp)
        s = stats(mp)
    assert {k: digest(v) for k, v in again.items()} == {k: digest(v) for k, v in first.items()}
    assert s["bytes_fetched"] == 0 and s["disk_hits"] > 0


def test_corrupted_cache_block_is_refetched(seaweed, dataset_bucket, tmp_path):
    with s3_mount(seaweed, dataset_bucket, tmp_path) as mp:
        read_tree(mp)
        time.sleep(0.5)
    blocks = [b for sub in (tmp_path / "cache").iterdir() if (sub / "blocks").is_dir()
              for b in stored_blocks(str(sub))]
    assert blocks
    for path, off, n in blocks:            # flip the last data byte of every block
        with open(path, "r+b") as f:
            f.seek(off + n - 1)
            b = f.read(1)[0]
            f.seek(off + n - 1)
            f.write(bytes([b ^ 0xFF]))
    with s3_mount(seaweed, dataset_bucket, tmp_path) as mp:
        got = read_tree(mp)
        s = stats(mp)
    assert {k: digest(v) for k, v in got.items()} == {k: digest(v) for k, v in DATASET.items()}
    assert s["corrupt_blocks_dropped"] == len(blocks)
    assert s["bytes_fetched"] > 0


def test_stats_and_trace_commands(seaweed, dataset_bucket, tmp_path, env):
    with s3_mount(seaweed, dataset_bucket, tmp_path) as mp:
        (mp / "README.txt").read_bytes()             # pushed at open: no READ
        (mp / "train/shard-001.tar").read_bytes()    # larger than a push: READs
        r = run_cli("stats", mp, "--json", env=env)
        assert r.returncode == 0, r.stderr
        s = json.loads(r.stdout)
        for key in ("bytes_served", "bytes_fetched", "mem_hits", "mem_misses", "disk_hits",
                    "disk_misses", "hit_rate", "readahead_bytes_fetched",
                    "readahead_bytes_used", "prefetch_precision", "backend_requests",
                    "backend_latency_ms", "cache_disk_bytes", "cache_mem_bytes"):
            assert key in s
        for op in ("lookup", "open", "read", "release"):
            assert s["fuse_requests"][op] >= 1, s["fuse_requests"]
        assert sum(s["fuse_read_sizes"].values()) == s["reads"] >= 1
        r = run_cli("stats", mp, env=env)
        assert r.returncode == 0 and "hit rate" in r.stdout
        out = tmp_path / "trace.jsonl"
        r = run_cli("trace", mp, "--out", out, env=env)
        assert r.returncode == 0, r.stderr
        events = [json.loads(line) for line in out.read_text().splitlines()]
        assert {"t", "op", "path", "off", "len", "pid", "size"} <= set(events[0])
        assert any(e["op"] == "open" and e["path"] == "README.txt" for e in events)
        assert any(e["op"] == "read" and e["path"] == "README.txt" for e in events)
        # what reads the output goes away first (`... --out - | head`): no traceback
        quiet = {k: v for k, v in env.items() if k != "PYTHONUNBUFFERED"}  # (review)
        for cmd in (["trace", mp, "--out", "-"], ["stats", mp]):
            p = subprocess.Popen(NEURALCACHE + [str(a) for a in cmd], env=quiet,
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE)
            p.stdout.close()
            err = p.stderr.read().decode()
            assert p.wait(timeout=60) == 1 and "Traceback" not in err, (cmd, err)


def test_hints_accept_good_refuse_bad(seaweed, dataset_bucket, tmp_path):
    with s3_mount(seaweed, dataset_bucket, tmp_path) as mp:
        hints = mp / ".neuralcache" / "hints"
        hints.write_text("train/shard-001.tar\ntrain/class a/img 001.jpg\n")
        assert eventually(lambda: stats(mp)["hints"] == 2)    # installed at release
        with pytest.raises(OSError) as e:
            hints.write_text("train/shard-001.tar\nno/../file\n")
        assert e.value.errno == errno.EINVAL
        assert stats(mp)["hints"] == 2           # a bad hint changes nothing
        # a path that names nothing (yet) is taken: directories are listed as they are
        # used, and it is skipped when its turn comes
        hints.write_text("train/shard-001.tar\nno/such/file\ntrain/shard-000.tar\n")
        assert eventually(lambda: stats(mp)["hints"] == 3)
        assert (mp / "train/shard-000.tar").read_bytes()


def test_mount_errors_are_one_line_and_leave_nothing_mounted(seaweed, s3, dataset_bucket,
                                                             tmp_path, env):
    mp = tmp_path / "mnt"
    mp.mkdir()
    cases = [
        (["mount", "s3://no-such-bucket", mp, "--endpoint-url", seaweed.endpoint], env,
         "does not exist"),
        (["mount", f"s3://{dataset_bucket}", mp, "--endpoint-url", seaweed.endpoint],
         cli_env(seaweed, AWS_ACCESS_KEY_ID="bad", AWS_SECRET_ACCESS_KEY="bad"), "denied"),
        (["mount", f"s3://{dataset_bucket}", mp, "--endpoint-url", "http://127.0.0.1:9"],
         env, "cannot reach"),
        (["mount", f"s3://{dataset_bucket}", tmp_path / "missing", "--endpoint-url",
          seaweed.endpoint], env, "does not exist"),
        (["mount", f"s3://{dataset_bucket}", mp, "--cache-size", "big"], env, "cache size"),
    ]
    for argv, e, word in cases:
        r = run_cli(*argv, "--cache-dir", tmp_path / "c", env=e, timeout=60)
        assert r.returncode == 1, (argv, r.stdout, r.stderr)
        assert r.stderr.count("\n") == 1 and word in r.stderr, (argv, r.stderr)
        assert "Traceback" not in r.stderr
        assert not is_mounted(mp)
    # busy: a second mount on the same mountpoint
    with s3_mount(seaweed, dataset_bucket, tmp_path):
        r = run_cli("mount", f"s3://{dataset_bucket}", mp, "--endpoint-url",
                    seaweed.endpoint, "--cache-dir", tmp_path / "c2", env=env)
        assert r.returncode == 1 and "busy" in r.stderr
    r = run_cli("umount", tmp_path, env=env)
    assert r.returncode == 1 and "not mounted" in r.stderr


def test_umount_after_daemon_killed(seaweed, dataset_bucket, tmp_path, env):
    with s3_mount(seaweed, dataset_bucket, tmp_path) as mp:
        pid = stats(mp)["pid"]
        os.kill(pid, signal.SIGKILL)
        time.sleep(0.3)
        with pytest.raises(OSError):
            os.listdir(mp)                     # "transport endpoint is not connected"
        r = run_cli("umount", mp, env=env)
        assert r.returncode == 0, r.stderr
        assert not is_mounted(mp)
    # and it mounts again on the same cache
    with s3_mount(seaweed, dataset_bucket, tmp_path) as mp:
        assert (mp / "README.txt").read_bytes() == DATASET["README.txt"]


def test_an_open_that_finds_a_new_version_never_reads_it_short(seaweed, s3, tmp_path):
    """The kernel's size comes from the lookup just before open(); when the open's own
    check (one HEAD past the TTL) finds a new, longer version, the kernel must not read
    it only up to the old length.  The directory is large enough (2 listing pages) that
    the HEAD answers before the background re-listing does."""
    from concurrent.futures import ThreadPoolExecutor

    bucket = new_bucket(s3)
    old, new = payload(3, MB), payload(4, MB + 4099)
    with ThreadPoolExecutor(16) as pool:
        list(pool.map(lambda i: s3.put_object(Bucket=bucket, Key=f"d/other{i:05d}",
                                              Body=b"x"), range(1500)))
    s3.put_object(Bucket=bucket, Key="d/w.bin", Body=old)
    with s3_mount(seaweed, bucket, tmp_path, "--metadata-ttl", "1") as mp:
        assert (mp / "d" / "w.bin").read_bytes() == old
        s3.put_object(Bucket=bucket, Key="d/w.bin", Body=new)
        time.sleep(1.3)                    # the entry, the listing and the attrs expire
        got = (mp / "d" / "w.bin").read_bytes()
        assert got == old or got == new, f"{len(got)} bytes, new version's: {got[:16] == new[:16]}"


@pytest.mark.skipif(os.geteuid() != 0, reason="the kernel's knobs need root")
def test_the_mount_raises_the_kernels_read_ahead_and_background_requests(tmp_path):
    """As root the daemon raises the mount's bdi read-ahead and its FUSE connection's
    background requests (mounting fusectl where it is not), so that the kernel keeps
    more than 9 read-ahead READs in flight; a sequential read is still exact."""
    from neuralcache import daemon
    src = tmp_path / "src"
    src.mkdir()
    data = payload(121, 40 * MB + 77)
    (src / "big.bin").write_bytes(data)
    with mounted(str(src), tmp_path / "mnt", cache_dir=tmp_path / "cache") as mp:
        dev = os.stat(mp).st_dev
        bdi = Path(f"/sys/class/bdi/{os.major(dev)}:{os.minor(dev)}/read_ahead_kb")
        conn = Path(daemon.FUSECTL) / str(os.major(dev) << 20 | os.minor(dev))

        if not os.access(bdi, os.W_OK) or not os.path.isdir(daemon.FUSECTL):
            pytest.skip("/sys is read-only here (a container)")

        def knobs():
            try:
                return (int(bdi.read_text()), int((conn / "max_background").read_text()),
                        int((conn / "congestion_threshold").read_text()))
            except OSError:
                return None
        want = (daemon.KERNEL_READAHEAD_KB, daemon.FUSE_MAX_BACKGROUND,
                daemon.FUSE_CONGESTION_THRESHOLD)
        assert eventually(lambda: knobs() == want) and knobs() == want, knobs()
        assert daemon.FUSE_MAX_BACKGROUND > 12          # the kernel's default
        with open(mp / "big.bin", "rb", buffering=0) as f:
            got = bytearray()
            while b := f.read(MB):
                got += b
        assert digest(bytes(got)) == digest(data)


def test_a_sequential_read_keeps_only_its_window_in_memory_and_reuses_buffers(
        seaweed, s3, tmp_path):
    """A cold sequential read lets the blocks it left behind go from the memory tier
    (the page cache and the disk tier hold them) and fetches into their buffers again
    (buffers.Recycler); at its close the file, read whole, leaves nothing in memory,
    however the kernel's first parallel READs arrived; every byte is exact, on the
    first read and on a second read after the file's pages were dropped (served from
    the disk tier into recycled buffers)."""
    bucket = new_bucket(s3)
    data = payload(120, 72 * MB + 4321)
    s3.put_object(Bucket=bucket, Key="big.bin", Body=data)

    def mem():
        # the memory tier less the blocks whose disk write a full write queue skipped:
        # memory holds their only copy (store/blocks.py consumed; none on an idle disk)
        s = stats(mp)
        return s["cache_mem_bytes"] - 2 * MB * s["disk_writes_skipped"], s

    with s3_mount(seaweed, bucket, tmp_path, "--block-size", "2M",
                  "--readahead-size", "8M") as mp:
        for rnd in range(2):
            with open(mp / "big.bin", "rb", buffering=0) as f:
                got = bytearray()
                while b := f.read(MB):
                    got += b
                    if len(got) == 60 * MB:
                        # mid-file: what the stream left within SEQ_SLACK (32 MiB) of
                        # its furthest read, its read-ahead (8 MiB) and a block at each
                        # end; the kernel's own read-ahead runs ahead of the reader
                        held, s = mem()
                        assert held <= 44 * MB, (rnd, {k: v for k, v in s.items()
                                                      if k.startswith(("cache_", "disk_"))})
                assert digest(bytes(got)) == digest(data), rnd
                os.posix_fadvise(f.fileno(), 0, 0, os.POSIX_FADV_DONTNEED)
            # read whole: its blocks go at the release (asynchronous after close());
            # before the kernel's out-of-order first READs were taken as one stream,
            # 16-23 blocks stayed here in 3 of 19 runs
            assert eventually(lambda: mem()[0] <= 0), (rnd, mem())
            s = mem()[1]
            assert s["buffers_reused"] > 0, {k: v for k, v in s.items() if k.startswith(
                ("buffers", "cache_", "mem_", "disk_", "readahead"))}
        assert s["bytes_fetched"] == len(data)     # the second read never went remote

"""The write path held to what POSIX tools expect (issue 18): findings of fsx and
pjdfstest, each reproduced here on a real --writable mount of a real SeaweedFS
bucket, plus the limits that keep a bad syscall from taking the node down (names and
lengths the remote cannot hold, the uploads' memory budget)."""
import errno
import os
import threading
import time

import pytest
import trio

from conftest import cli_env, eventually, mounted, needs_fuse, new_bucket, payload, run_cli
from test_e2e import stats
from test_write import (RefusingProxy, bucket, env, in_bucket, keys_in, put_tree, s3,  # noqa: F401
                        seaweed, shared_bucket, split, sync)     # the write tests' server and fixtures

MB = 1 << 20
TIB = 1 << 40

e2e = [needs_fuse, pytest.mark.e2e]


def wmount(seaweed, bucket, tmp_path, *args, endpoint=None):
    return mounted(f"s3://{bucket}", tmp_path / "mnt", env=cli_env(seaweed),
                   cache_dir=tmp_path / "cache",
                   args=["--endpoint-url", endpoint or seaweed.endpoint, "--writable", *args])


def errno_of(fn, *args) -> int:
    try:
        fn(*args)
    except OSError as exc:
        return exc.errno
    return 0


# -- fsmodel seed 979: a read-only descriptor and another one that writes ----------------
@pytest.mark.e2e
@needs_fuse
def test_a_read_only_descriptor_reads_what_another_one_wrote_and_extended(
        seaweed, s3, bucket, tmp_path, env):
    """Opened read-only while the file was only on the remote, then another descriptor
    writes and extends it: reads through the first one return the new bytes (they
    returned the old object's: 0 bytes past its end).  Then the same for a descriptor
    opened while the journal held the file (a copy on write since: it read its own,
    old staging file)."""
    data = payload(2, 60_000)
    put_tree(s3, bucket, {"m.bin": data})
    with wmount(seaweed, bucket, tmp_path) as mp:
        p = mp / "m.bin"
        r = os.open(p, os.O_RDONLY)
        try:
            assert os.pread(r, 100_000, 0) == data
            with open(p, "r+b") as w:
                w.seek(3)
                w.write(b"XYZ")
                w.truncate(9 * MB)
                w.flush()
                want = data[:3] + b"XYZ" + data[6:]
                assert os.pread(r, 1990, 59_880) == want[59_880:] + bytes(1990 - 120)
                assert os.pread(r, 6, 0) == want[:6]
                assert os.pread(r, 10, 9 * MB - 4) == bytes(4)
            with open(p, "r+b") as w:            # a read-only open of the journal's copy
                w.seek(1)
                w.write(b"Q")
                w.flush()
                r2 = os.open(p, os.O_RDONLY)
            try:
                with open(p, "r+b") as w:        # copied on write (or from the remote)
                    w.seek(2)
                    w.write(b"R")
                want = want[:1] + b"QR" + want[3:]
                assert os.pread(r, 4, 0) == want[:4]
                assert os.pread(r2, 4, 0) == want[:4]
                assert os.pread(r2, 10, 9 * MB - 4) == bytes(4)
            finally:
                os.close(r2)
        finally:
            os.close(r)
        sync(mp, env)
        got = in_bucket(s3, bucket)["m.bin"]
        assert got[:4] == want[:4] and len(got) == 9 * MB


# -- fsx's first failure: close, reopen for writing, read ----------------------------
@pytest.mark.e2e
@needs_fuse
def test_reopen_for_update_reads_what_was_written(seaweed, s3, bucket, tmp_path, env):
    data = payload(1, 100_000)
    with wmount(seaweed, bucket, tmp_path) as mp:
        p = mp / "db.bin"
        with open(p, "wb") as f:
            f.write(data)
        with open(p, "r+b") as f:            # sqlite, numpy.memmap r+, h5py r+
            assert f.read() == data
            f.seek(10)
            f.write(b"XYZ")
            f.seek(0)
            assert f.read(16) == data[:10] + b"XYZ" + data[13:16]
        want = data[:10] + b"XYZ" + data[13:]
        with open(p, "ab") as f:             # an appending log, reopened
            f.write(b"tail")
        assert p.read_bytes() == want + b"tail"
        sync(mp, env)
        assert in_bucket(s3, bucket) == {"db.bin": want + b"tail"}


# -- bench.tools.fsmodel seeds 5 and 12 at 200 steps: a file opened for update, not yet
# written, then replaced by a rename (or unlinked); POSIX writes go on into the old file
@pytest.mark.e2e
@needs_fuse
def test_write_through_a_descriptor_of_a_replaced_or_unlinked_file(seaweed, s3, bucket,
                                                                   tmp_path, env):
    old, new = payload(2, 300_000), payload(3, 50_000)
    with wmount(seaweed, bucket, tmp_path) as mp:
        (mp / "d").write_bytes(old)
        (mp / "u").write_bytes(old)
        sync(mp, env)                          # both only on the remote now
        (mp / "b").write_bytes(new)
        fd = os.open(mp / "d", os.O_RDWR)
        fu = os.open(mp / "u", os.O_RDWR)
        try:
            assert os.pread(fd, 1 << 20, 0) == old
            os.rename(mp / "b", mp / "d")      # d is b's now; fd holds the old d
            os.unlink(mp / "u")
            assert os.pwrite(fd, b"XYZ", 9_000) == 3
            assert os.pwrite(fu, b"tail", len(old)) == 4
            assert os.pread(fd, 1 << 20, 0) == old[:9_000] + b"XYZ" + old[9_003:]
            assert os.pread(fu, 1 << 20, 0) == old + b"tail"
            assert (mp / "d").read_bytes() == new
            assert not (mp / "u").exists()
        finally:
            os.close(fd)
            os.close(fu)
        sync(mp, env)
        assert in_bucket(s3, bucket) == {"d": new}


# -- fsmodel seed 117 at 300 steps: the same, when another descriptor of the file had
# written (the journal held it): the one that had not got ENOENT
@pytest.mark.e2e
@needs_fuse
def test_a_descriptor_that_has_not_written_keeps_the_file_another_one_wrote(
        seaweed, s3, bucket, tmp_path, env):
    old, new = payload(4, 200_000), payload(5, 30_000)
    with wmount(seaweed, bucket, tmp_path) as mp:
        (mp / "d").write_bytes(old)
        (mp / "r").write_bytes(old)
        sync(mp, env)                          # both only on the remote now
        (mp / "b").write_bytes(new)
        idle = [os.open(mp / n, os.O_RDWR) for n in ("d", "r")]      # not written yet
        busy = [os.open(mp / n, os.O_WRONLY) for n in ("d", "r")]
        try:
            for fd in busy:
                assert os.pwrite(fd, b"W", 10) == 1
            os.unlink(mp / "d")
            os.rename(mp / "b", mp / "r")      # r is b's now
            for fd in idle:
                assert os.pwrite(fd, b"A", 20) == 1
                assert os.pread(fd, 1 << 20, 0) == old[:10] + b"W" + old[11:20] + b"A" \
                    + old[21:]
            assert (mp / "r").read_bytes() == new
            assert not (mp / "d").exists()
        finally:
            for fd in idle + busy:
                os.close(fd)
        sync(mp, env)
        assert in_bucket(s3, bucket) == {"r": new}


# -- fsmodel seed 30 at 200 steps: fsync of a replaced file waited for the new file's
# upload, which waits for its own writer to close: the fsync hung
@pytest.mark.e2e
@needs_fuse
def test_fsync_of_a_replaced_file_does_not_wait_for_its_successor(seaweed, s3, bucket,
                                                                  tmp_path, env):
    with wmount(seaweed, bucket, tmp_path) as mp:
        (mp / "a").write_bytes(b"old a")
        old = os.open(mp / "a", os.O_RDWR)
        (mp / "b").write_bytes(b"new a")
        os.rename(mp / "b", mp / "a")            # old holds the replaced file
        keep = os.open(mp / "a", os.O_RDWR)      # the new a stays open for writing...
        os.pwrite(keep, b"N", 0)
        other = os.open(mp / "a", os.O_RDWR)
        os.close(other)                          # ...and is journaled, not sealed
        done = threading.Event()
        t = threading.Thread(target=lambda: (os.fsync(old), done.set()), daemon=True)
        t.start()
        try:
            assert done.wait(10.0), "fsync of the replaced file waits for the new one"
            assert os.pread(old, 100, 0) == b"old a"
        finally:
            os.close(keep)                       # unblocks a hung fsync either way
            t.join(30.0)
            os.close(old)
        sync(mp, env)
        assert in_bucket(s3, bucket) == {"a": b"New a"}


# -- names and lengths the remote cannot hold ------------------------------------------
@pytest.mark.e2e
@needs_fuse
def test_names_and_keys_the_remote_cannot_hold_are_enametoolong(seaweed, s3, bucket,
                                                                 tmp_path, env):
    with wmount(seaweed, bucket, tmp_path) as mp:
        long_name = "n" * 256
        assert errno_of(open, mp / long_name, "wb") == errno.ENAMETOOLONG
        assert errno_of(os.mkdir, mp / long_name) == errno.ENAMETOOLONG
        (mp / "ok.bin").write_bytes(b"x")
        assert errno_of(os.rename, mp / "ok.bin", mp / long_name) == errno.ENAMETOOLONG
        # every component fits, the key does not: S3 keys are at most 1,024 bytes
        deep = mp
        for i in range(4):
            deep = deep / (str(i) * 200)
            deep.mkdir()
        assert errno_of(open, deep / ("f" * 250), "wb") == errno.ENAMETOOLONG
        # a file whose key is 20 bytes short of the limit (the prefix counts)
        prefix = bucket.partition("/")[2] + "/"
        fits = "s" * (1024 - 20 - len(prefix) - 4 * 201)
        (deep / fits).write_bytes(b"fits")
        # a directory rename that would push it past the limit
        assert errno_of(os.rename, mp / ("0" * 200), mp / ("z" * 230)) == errno.ENAMETOOLONG
        assert (deep / fits).read_bytes() == b"fits"       # nothing moved
        r = run_cli("sync", mp, env=env)       # nothing is stuck: the barrier passes
        assert r.returncode == 0, r.stderr
        assert set(in_bucket(s3, bucket)) == {
            "ok.bin", "/".join([str(i) * 200 for i in range(4)]) + "/" + fits}
    assert not (tmp_path / "mnt" / "ok.bin").exists()      # unmounted cleanly


@pytest.mark.e2e
@needs_fuse
def test_lengths_past_the_largest_object_are_efbig_and_cost_no_memory(seaweed, s3, bucket,
                                                                       tmp_path, env):
    with wmount(seaweed, bucket, tmp_path) as mp:
        pid = stats(mp)["pid"]
        p = mp / "huge.bin"
        p.write_bytes(b"start")
        assert errno_of(os.truncate, p, 6 * TIB) == errno.EFBIG
        assert errno_of(os.truncate, p, 5 * TIB + 1) == errno.EFBIG
        with open(p, "r+b") as f:
            assert errno_of(os.ftruncate, f.fileno(), 10 * TIB) == errno.EFBIG
            assert errno_of(os.pwrite, f.fileno(), b"x", 5 * TIB) == errno.EFBIG
        assert p.stat().st_size == 5 and p.read_bytes() == b"start"
        sync(mp, env)
        rss_kb = int(next(line.split()[1] for line in open(f"/proc/{pid}/status")
                          if line.startswith("VmHWM")))
        assert rss_kb < 1_000_000, rss_kb       # the old path reached 17 GB
    assert in_bucket(s3, bucket) == {"huge.bin": b"start"}


# -- fsmodel seed 15 at 200 steps: SeaweedFS keeps a directory entry after its last
# object is deleted; a --writable mount shows it and must let the job use it
@pytest.mark.e2e
@needs_fuse
def test_a_directory_the_store_keeps_empty_can_be_written_into(seaweed, s3, bucket,
                                                                tmp_path, env):
    name, prefix = split(bucket)
    s3.put_object(Bucket=name, Key=prefix + "keep.bin", Body=b"keep")
    s3.put_object(Bucket=name, Key=prefix + "ckpt/old.bin", Body=b"old")
    s3.delete_object(Bucket=name, Key=prefix + "ckpt/old.bin")
    with wmount(seaweed, bucket, tmp_path) as mp:
        os.makedirs(mp / "ckpt", exist_ok=True)      # EEXIST: the store shows it
        assert not (mp / "ckpt" / "latest.pt").exists()   # listed inside: empty
        assert (mp / "ckpt").is_dir()
        (mp / "ckpt" / "new.bin").write_bytes(b"new")
        assert os.listdir(mp / "ckpt") == ["new.bin"]
        sync(mp, env)
    assert in_bucket(s3, bucket) == {"keep.bin": b"keep", "ckpt/new.bin": b"new"}


# -- what pjdfstest checks ---------------------------------------------------------------
@pytest.mark.e2e
@needs_fuse
def test_link_counts_and_directory_times(seaweed, s3, bucket, tmp_path, env):
    with wmount(seaweed, bucket, tmp_path) as mp:
        d = mp / "d"
        d.mkdir()
        assert os.stat(d).st_nlink == 2
        (d / "a").mkdir()
        (d / "b").mkdir()
        (d / "f").write_bytes(b"file")
        assert os.stat(d).st_nlink == 4           # ".", its entry, two ".."s
        fd = os.open(d / "f", os.O_RDONLY)
        try:
            os.unlink(d / "f")
            assert os.fstat(fd).st_nlink == 0     # unlinked but open
        finally:
            os.close(fd)

        def changes(what):
            before = os.stat(d)
            time.sleep(0.02)
            what()
            after = os.stat(d)
            return (after.st_mtime_ns > before.st_mtime_ns,
                    after.st_ctime_ns > before.st_ctime_ns)

        assert changes(lambda: os.rmdir(d / "b")) == (True, True)
        assert changes(lambda: os.mkdir(d / "c")) == (True, True)
        assert changes(lambda: (d / "g").write_bytes(b"g")) == (True, True)
        assert changes(lambda: os.rename(d / "g", d / "h")) == (True, True)
        assert changes(lambda: os.unlink(d / "h")) == (True, True)
        assert os.stat(d).st_nlink == 4
        # utimensat sets mtime; ctime is the time of that change
        os.utime(mp / "d" / "a", ns=(10**9, 10**9))
        st = os.stat(mp / "d" / "a")
        assert st.st_mtime_ns == 10**9 and st.st_ctime_ns > 10**18


# -- fsmodel seed 226 at 300 steps: a file renamed after its upload ended (a descriptor
# still open for writing), then closed, was dropped from the journal as "uploaded" under
# its old name: reads of the new name got ESTALE until the remote's rename ended
@pytest.mark.e2e
@needs_fuse
def test_a_file_renamed_after_its_upload_reads_back_while_the_remote_renames_it(
        seaweed, s3, bucket, tmp_path, env):
    data = payload(6, 70_000)
    with RefusingProxy(seaweed.endpoint, seaweed.access_key, seaweed.secret_key) as proxy:
        with wmount(seaweed, bucket, tmp_path, endpoint=proxy.endpoint) as mp:
            proxy.refuse = True                  # the upload waits until the open below
            (mp / "a").write_bytes(data)
            fd = os.open(mp / "a", os.O_RDWR)    # a writer, not writing
            try:
                proxy.refuse = False
                sync(mp, env)                    # uploaded while fd is open
                proxy.refuse = True              # the remote's rename (a copy) waits
                os.rename(mp / "a", mp / "b")
            finally:
                os.close(fd)
            assert (mp / "b").read_bytes() == data
            proxy.refuse = False
            sync(mp, env)
            assert in_bucket(s3, bucket) == {"b": data}
            assert (mp / "b").read_bytes() == data


# -- the journal belongs to the bucket, not to the endpoint ---------------------------------
@pytest.mark.e2e
@needs_fuse
def test_pending_uploads_are_finished_through_another_endpoint(seaweed, s3, bucket,
                                                               tmp_path, env):
    with RefusingProxy(seaweed.endpoint, seaweed.access_key, seaweed.secret_key) as proxy:
        proxy.refuse = True
        with wmount(seaweed, bucket, tmp_path, endpoint=proxy.endpoint) as mp:
            (mp / "ckpt.bin").write_bytes(b"written through a proxy that refused it")
            r = run_cli("umount", mp, "--force", env=env)   # leave it in the journal
            assert r.returncode == 0, r.stderr
    assert in_bucket(s3, bucket) == {}
    with wmount(seaweed, bucket, tmp_path) as mp:          # another endpoint, same bucket
        assert in_bucket(s3, bucket) == {"ckpt.bin": b"written through a proxy that refused it"}
        assert stats(mp)["upload_pending_ops"] == 0
    log = (tmp_path / "cache" / "neuralcache.log").read_text()
    assert "finished through" in log


# -- the uploads' memory budget, without a kernel -------------------------------------------
def _hwm_kb() -> int:
    with open("/proc/self/status") as f:
        return int(next(line.split()[1] for line in f if line.startswith("VmHWM")))


def test_uploads_hold_at_most_their_memory_budget_whatever_the_part_size(seaweed, tmp_path,
                                                                         monkeypatch):
    """A 512 MiB sparse file whose parts are 128 MiB each (the 10,000-part limit
    lowered to 4 stands in for a 5 TiB object's 525 MiB parts): the parts go from the
    staging file, so the process's peak memory grows by far less than one part."""
    from neuralcache.backends.s3 import S3Backend
    from neuralcache.write import uploader as upmod
    from neuralcache.write.journal import Committer, Journal
    from neuralcache.write.opqueue import OpQueue

    s3c = seaweed.client()
    name = new_bucket(s3c)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", seaweed.access_key)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", seaweed.secret_key)
    monkeypatch.setattr(upmod, "MAX_PARTS", 4)
    backend = S3Backend(name, endpoint_url=seaweed.endpoint)
    j = Journal(str(tmp_path / "j"))
    j.open()
    staging, fd = j.create_staging()
    os.pwrite(fd, b"head", 0)
    os.pwrite(fd, b"tail", 512 * MB - 4)
    os.close(fd)
    q = OpQueue()

    async def main():
        c = Committer(j, lambda: [])
        up = upmod.Uploader(backend, j, c, q, sealed=lambda s: True, on_done=lambda *a: None)
        async with trio.open_nursery() as n:
            await n.start(c.run)
            await n.start(up.run)
            op = q.new("put", "big.bin", staging=staging, size=512 * MB)
            op.durable = True
            q.notify()
            await q.wait([op])
            n.cancel_scope.cancel()

    with open("/proc/self/clear_refs", "w") as f:   # reset VmHWM to the current RSS
        f.write("5")
    base = _hwm_kb()
    trio.run(main)
    grown_mb = (_hwm_kb() - base) / 1024
    j.close()
    backend.close()
    head = s3c.get_object(Bucket=name, Key="big.bin", Range="bytes=0-3")["Body"].read()
    tail = s3c.get_object(Bucket=name, Key="big.bin",
                          Range=f"bytes={512 * MB - 4}-{512 * MB - 1}")["Body"].read()
    assert (head, tail) == (b"head", b"tail")
    assert s3c.head_object(Bucket=name, Key="big.bin")["ContentLength"] == 512 * MB
    assert grown_mb < 64, f"peak memory grew by {grown_mb:.0f} MiB for 128 MiB parts"


@pytest.mark.e2e
@needs_fuse
def test_an_upload_that_keeps_failing_ends_with_its_file(seaweed, s3, bucket, tmp_path, env):
    """A file whose upload the remote refuses, then deleted: nothing is left to do, so
    sync and umount pass (they used to wait for that upload forever)."""
    with RefusingProxy(seaweed.endpoint, seaweed.access_key, seaweed.secret_key) as proxy:
        with wmount(seaweed, bucket, tmp_path, endpoint=proxy.endpoint) as mp:
            proxy.refuse = True
            (mp / "doomed.bin").write_bytes(b"never uploaded")
            r = run_cli("sync", mp, env=env)
            assert r.returncode == 1                   # refused, as it should be
            os.unlink(mp / "doomed.bin")
            proxy.refuse = False
            r = run_cli("sync", mp, env=env)
            assert r.returncode == 0, r.stderr
            assert stats(mp)["upload_pending_ops"] == 0
    assert in_bucket(s3, bucket) == {}


# -- pjdfstest truncate/00.t: a length changed twice by path ---------------------------
@pytest.mark.e2e
@needs_fuse
def test_truncate_by_path_twice(seaweed, s3, bucket, tmp_path, env):
    with wmount(seaweed, bucket, tmp_path) as mp:
        p = mp / "t.bin"
        p.write_bytes(b"")
        for size in (1234567, 567, 23456, 1):
            os.truncate(p, size)
            assert os.stat(p).st_size == size
        os.unlink(p)
        p.write_bytes(b"")
        os.truncate(p, 1234567)
        sync(mp, env)                         # the first length is on the remote now
        os.truncate(p, 567)
        assert p.read_bytes() == bytes(567)
        sync(mp, env)
        assert in_bucket(s3, bucket) == {"t.bin": bytes(567)}


# -- a file unlinked while open for reading: its readers read it to the end -----------
@pytest.mark.e2e
@needs_fuse
def test_a_file_unlinked_while_open_for_reading_keeps_its_object_until_the_last_close(
        seaweed, s3, bucket, tmp_path, env):
    """As NFS's silly rename: the remote delete waits for the last reader here (the
    old code deleted at once, and reads of what was not cached failed ENOENT).  The
    unlink itself is journaled at once: a kill -9 meanwhile still deletes it, and so
    does a new file of that name, and `neuralcache sync`."""
    data, small = payload(11, 20 * MB), payload(12, 1000)    # 3 blocks
    put_tree(s3, bucket, {"u.bin": data, "r.bin": small, "k.bin": small, "s.bin": small,
                          "f.bin": data, "n.bin": small})
    with wmount(seaweed, bucket, tmp_path, "--readahead", "off", "--prefetch", "off") as mp:
        fds = [os.open(mp / "u.bin", os.O_RDONLY) for _ in range(2)]
        assert os.pread(fds[0], 4096, 0) == data[:4096]
        os.unlink(mp / "u.bin")
        assert not (mp / "u.bin").exists() and "u.bin" not in os.listdir(mp)
        assert os.fstat(fds[0]).st_nlink == 0
        time.sleep(1.0)                         # (the old code: gone in milliseconds)
        assert "u.bin" in keys_in(s3, bucket)
        assert stats(mp)["upload_held_deletes"] == 1
        os.close(fds[0])
        assert os.pread(fds[1], len(data), 0) == data     # to its end, every byte
        time.sleep(0.5)
        assert "u.bin" in keys_in(s3, bucket)           # one reader is left
        os.close(fds[1])
        assert eventually(lambda: "u.bin" not in keys_in(s3, bucket), 10.0)
        assert stats(mp)["upload_held_deletes"] == 0
        # a new file of that name: the delete runs first, then its upload
        fd = os.open(mp / "r.bin", os.O_RDONLY)
        os.unlink(mp / "r.bin")
        (mp / "r.bin").write_bytes(b"new r")
        sync(mp, env)
        assert in_bucket(s3, bucket)["r.bin"] == b"new r"
        os.close(fd)
        # a barrier does not run it, nor wait for it (review: `neuralcache umount`,
        # refused as busy, had run it): `neuralcache sync`, an fsync of the root, the
        # umount itself; nor does a new file of that name that is never uploaded
        fd = os.open(mp / "s.bin", os.O_RDONLY)
        os.unlink(mp / "s.bin")
        scratch = os.open(mp / "s.bin", os.O_CREAT | os.O_WRONLY)
        os.unlink(mp / "s.bin")
        os.close(scratch)
        sync(mp, env)
        root = os.open(mp, os.O_RDONLY | os.O_DIRECTORY)
        os.fsync(root)
        os.close(root)
        r = run_cli("umount", mp, env=env)
        assert r.returncode != 0 and "busy" in r.stderr
        assert "s.bin" in keys_in(s3, bucket)
        assert os.pread(fd, 2000, 0) == small
        os.close(fd)
        assert eventually(lambda: "s.bin" not in keys_in(s3, bucket), 10.0)
        # renamed, then unlinked before the rename's copy is done: the reader follows
        # the copy (review: it read the old name, which the rename deletes)
        fd = os.open(mp / "f.bin", os.O_RDONLY)
        assert os.pread(fd, 4096, 0) == data[:4096]
        os.rename(mp / "f.bin", mp / "g.bin")
        os.unlink(mp / "g.bin")
        time.sleep(1.0)
        assert os.pread(fd, len(data), 0) == data
        os.close(fd)
        assert eventually(lambda: not {"f.bin", "g.bin"} & keys_in(s3, bucket), 10.0)
        # kill -9 while held: the next mount finishes the journaled delete
        fd = os.open(mp / "k.bin", os.O_RDONLY)
        os.unlink(mp / "k.bin")
        pid = stats(mp)["pid"]
        os.kill(pid, 9)
        try:
            os.close(fd)
        except OSError:                         # ECONNABORTED: the daemon is gone
            pass
        assert "k.bin" in keys_in(s3, bucket)
        r = run_cli("umount", mp, env=env)
        assert r.returncode == 0, r.stderr
    with wmount(seaweed, bucket, tmp_path) as mp:
        assert in_bucket(s3, bucket) == {"r.bin": b"new r", "n.bin": small}
        assert sorted(os.listdir(mp)) == ["n.bin", "r.bin"]

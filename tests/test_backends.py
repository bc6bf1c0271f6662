"""One contract test over every backend (S3 on a real SeaweedFS, and POSIX)."""
import os
import time

import boto3
import pytest

from conftest import new_bucket, payload, upload_tree
from neuralcache.backends import open_backend
from neuralcache.backends.s3 import S3Backend, describe_check_error
from neuralcache.errors import NotFound, PermissionDenied, Unavailable, UserError, VersionChanged

FILES = {
    "train/class0/a.bin": payload(1, 1000),
    "train/class0/b.bin": payload(2, 70_000),
    "train/class1/c d ü.bin": payload(3, 12345),
    "empty.bin": b"",
    "top.txt": b"hello",
}


@pytest.fixture(params=["s3", "posix"])
def backend(request, tmp_path, monkeypatch):
    if request.param == "s3":
        sw = request.getfixturevalue("seaweed")
        s3 = request.getfixturevalue("s3")
        bucket = new_bucket(s3)
        upload_tree(s3, bucket, FILES, prefix="pre/")
        s3.put_object(Bucket=bucket, Key="outside.bin", Body=b"not under the prefix")
        for k, v in sw.env().items():
            monkeypatch.setenv(k, v)
        b = open_backend(f"s3://{bucket}/pre", endpoint_url=sw.endpoint)

        def replace(key, data):
            s3.put_object(Bucket=bucket, Key="pre/" + key, Body=data)
    else:
        root = tmp_path / "src"
        for k, v in FILES.items():
            p = root / k
            p.parent.mkdir(parents=True, exist_ok=True)
            p.write_bytes(v)
        b = open_backend(str(root))

        def replace(key, data):
            p = root / key
            tmp = p.with_suffix(".new")
            tmp.write_bytes(data)
            os.replace(tmp, p)
    b.replace = replace
    yield b
    b.close()


def test_check_and_list(backend):
    backend.check()
    listed = {o.key: o for o in backend.list_all()}
    assert set(listed) == set(FILES)
    for k, v in FILES.items():
        assert listed[k].size == len(v)
        assert listed[k].version


def test_stat_and_ranged_reads(backend):
    info = backend.stat("train/class0/b.bin")
    data = FILES["train/class0/b.bin"]
    assert info.size == len(data)
    assert backend.read(info.key, 0, 100, info.version) == data[:100]
    assert backend.read(info.key, 69_000, 1000, info.version) == data[69_000:]
    assert backend.read("empty.bin", 0, 0, "") == b""
    with pytest.raises(NotFound):
        backend.stat("nope.bin")
    with pytest.raises(NotFound):
        backend.read("nope.bin", 0, 10, "")


def test_read_is_pinned_to_version(backend):
    info = backend.stat("top.txt")
    time.sleep(0.01)
    backend.replace("top.txt", b"HELLO, changed")
    with pytest.raises(VersionChanged):
        backend.read("top.txt", 0, 5, info.version)
    new = backend.stat("top.txt")
    assert new.version != info.version
    assert backend.read("top.txt", 0, 5, new.version) == b"HELLO"


def test_s3_missing_bucket(seaweed, monkeypatch):
    for k, v in seaweed.env().items():
        monkeypatch.setenv(k, v)
    b = S3Backend("no-such-bucket-xyz", endpoint_url=seaweed.endpoint)
    with pytest.raises(NotFound) as e:
        b.check()
    msg = str(describe_check_error(e.value, "s3://no-such-bucket-xyz", seaweed.endpoint))
    assert "no-such-bucket-xyz" in msg and "does not exist" in msg


def test_s3_bad_credentials(seaweed, s3, monkeypatch):
    bucket = new_bucket(s3)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "wrong")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "wrong")
    b = S3Backend(bucket, endpoint_url=seaweed.endpoint)
    with pytest.raises(PermissionDenied) as e:
        b.check()
    assert "denied" in str(describe_check_error(e.value, "s3://" + bucket, seaweed.endpoint))


def test_s3_unreachable_endpoint_fails_fast(monkeypatch):
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "x")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "y")
    b = S3Backend("bucket", endpoint_url="http://127.0.0.1:9")   # discard port: refused
    t0 = time.monotonic()
    with pytest.raises(Unavailable) as e:
        b.check()
    assert time.monotonic() - t0 < 5
    assert "cannot reach" in str(describe_check_error(e.value, "s3://bucket",
                                                      "http://127.0.0.1:9"))


def test_posix_missing_source(tmp_path):
    with pytest.raises(UserError):
        open_backend(str(tmp_path / "nope")).check()


def test_posix_symlink_escape_is_skipped(tmp_path):
    root = tmp_path / "src"
    root.mkdir()
    (tmp_path / "secret").write_text("x")
    (root / "ok.txt").write_text("ok")
    os.symlink(tmp_path / "secret", root / "escape")
    keys = {o.key for o in open_backend(str(root)).list_all()}
    assert keys == {"ok.txt"}

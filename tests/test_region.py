"""Issue 14, item 1: a bucket in another region just works; dotted bucket names go path
style; credentials that expire during a run are refreshed.  No AWS: tests/awsproxy.py
stands in front of the session's SeaweedFS and answers like AWS (301 + the bucket's
region for a request signed for another region, ExpiredToken for an expired key)."""
import logging
import sys
import time
import uuid
from concurrent.futures import ThreadPoolExecutor

import pytest

from awsproxy import AwsProxy
from conftest import (cli_env, digest, is_mounted, mounted, needs_fuse, new_bucket, payload,
                      read_tree, run_cli, upload_tree)
from neuralcache.backends.s3 import S3Backend
from neuralcache.errors import Unavailable, UserError

MB = 1 << 20
REGION = "eu-west-1"
FILES = {
    "a.bin": payload(1, 1000),
    "dir/b c.bin": payload(2, 70_000),
    "dir/ü.bin": payload(3, 1),
    "big.bin": payload(4, 3 * MB + 12345),        # four 1 MiB blocks (--block-size 1M)
    "empty.bin": b"",
}


@pytest.fixture(scope="module")
def proxy(seaweed):
    with AwsProxy(seaweed.endpoint, seaweed.access_key, seaweed.secret_key) as p:
        yield p


@pytest.fixture(scope="module")
def eu_bucket(s3, proxy):
    b = new_bucket(s3)
    upload_tree(s3, b, FILES)
    proxy.regions[b] = REGION
    return b


def env_for(seaweed, **extra):
    env = cli_env(seaweed, **extra)
    env.pop("AWS_REGION", None)               # the client's region: us-east-1
    return env


def proxy_mount(seaweed, proxy, bucket, tmp_path, *args, env=None):
    return mounted(f"s3://{bucket}", tmp_path / "mnt", env=env or env_for(seaweed),
                   cache_dir=tmp_path / "cache",
                   args=["--endpoint-url", proxy.endpoint, "--block-size", "1M", *args])


def object_gets(proxy, bucket):
    return [s for s in proxy.seen(bucket) if s.method == "GET" and s.key]


# -- mounts -----------------------------------------------------------------------------
@needs_fuse
@pytest.mark.e2e
@pytest.mark.parametrize("flags", [(), ("--region", REGION)], ids=["found", "given"])
def test_bucket_in_another_region_reads_every_byte(seaweed, proxy, eu_bucket, tmp_path,
                                                   flags):
    proxy.clear()
    with proxy_mount(seaweed, proxy, eu_bucket, tmp_path, *flags) as mp:
        got = read_tree(mp)
    assert {k: digest(v) for k, v in got.items()} == {k: digest(v) for k, v in FILES.items()}
    log = (tmp_path / "cache" / "neuralcache.log").read_text()
    assert f"bucket {eu_bucket!r} is in region {REGION}" in log, log
    gets = object_gets(proxy, eu_bucket)
    assert gets and {(s.region, s.status) for s in gets} <= {(REGION, 200), (REGION, 206)}


@needs_fuse
@pytest.mark.e2e
def test_wrong_region_flag_fails_the_mount_in_one_line(seaweed, proxy, eu_bucket, tmp_path):
    env = env_for(seaweed)
    mp = tmp_path / "mnt"
    mp.mkdir()
    r = run_cli("mount", f"s3://{eu_bucket}", mp, "--endpoint-url", proxy.endpoint,
                "--region", "us-east-1", "--cache-dir", tmp_path / "cache", env=env,
                timeout=60)
    try:
        assert r.returncode == 1, (r.stdout, r.stderr)
        assert r.stderr.count("\n") == 1, r.stderr
        assert REGION in r.stderr and "--region" in r.stderr, r.stderr
        assert "Traceback" not in r.stderr
        assert not is_mounted(mp)
    finally:
        if is_mounted(mp):
            run_cli("umount", mp, env=env)


@needs_fuse
@pytest.mark.e2e
def test_dotted_bucket_name_reads_path_style(seaweed, s3, proxy, tmp_path):
    bucket = "t.dotted." + uuid.uuid4().hex[:8]
    s3.create_bucket(Bucket=bucket)           # SeaweedFS accepts dotted names
    upload_tree(s3, bucket, FILES)
    proxy.regions[bucket] = REGION
    proxy.clear()
    with proxy_mount(seaweed, proxy, bucket, tmp_path) as mp:
        got = read_tree(mp)
    assert {k: digest(v) for k, v in got.items()} == {k: digest(v) for k, v in FILES.items()}
    seen = proxy.seen(bucket)
    assert object_gets(proxy, bucket)
    assert {(s.style, s.host) for s in seen} == {("path", f"127.0.0.1:{proxy.port}")}
    assert all(s.path.startswith(f"/{bucket}") for s in seen)


# A credential_process that issues a new key id on every call.  botocore refreshes
# when fewer than 15 minutes remain (advisory; 10 min mandatory), so an Expiration
# 15 min + 3 s away is refreshed after ~3 s; the proxy refuses the key after LIFE_S.
LIFE_S = 6
CRED_SCRIPT = """\
import datetime, json, sys, time, uuid
now = time.time()
exp = datetime.datetime.fromtimestamp(now + 15 * 60 + 3, datetime.timezone.utc)
print(json.dumps({"Version": 1, "SecretAccessKey": "secret", "SessionToken": "token",
                  "AccessKeyId": "EXP%dX%s" % (int(now) + int(sys.argv[1]),
                                               uuid.uuid4().hex[:8].upper()),
                  "Expiration": exp.strftime("%Y-%m-%dT%H:%M:%SZ")}))
"""


@needs_fuse
@pytest.mark.e2e
def test_expiring_credentials_are_refreshed(seaweed, s3, proxy, tmp_path):
    bucket = new_bucket(s3)
    files = {f"d{i:02d}/x.bin": payload(100 + i, 40_000 + i) for i in range(30)}
    upload_tree(s3, bucket, files)
    script = tmp_path / "creds.py"
    script.write_text(CRED_SCRIPT)
    config = tmp_path / "aws-config"
    config.write_text(f"[default]\ncredential_process = {sys.executable} {script} {LIFE_S}\n")
    (tmp_path / "aws-credentials").write_text("")
    env = env_for(seaweed, AWS_CONFIG_FILE=str(config),
                  AWS_SHARED_CREDENTIALS_FILE=str(tmp_path / "aws-credentials"))
    for k in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN",
              "AWS_PROFILE"):
        env.pop(k, None)
    proxy.clear()
    with proxy_mount(seaweed, proxy, bucket, tmp_path, "--readahead", "off",
                     "--prefetch", "off", env=env) as mp:
        t0 = time.monotonic()
        for i, (k, v) in enumerate(files.items()):     # a fresh file every 0.5 s: each
            assert digest((mp / k).read_bytes()) == digest(v), k   # read reaches the proxy
            time.sleep(max(0.0, t0 + 0.5 * (i + 1) - time.monotonic()))
    gets = object_gets(proxy, bucket)
    assert len(gets) >= len(files)
    assert gets[-1].t - gets[0].t > 2 * LIFE_S
    assert len({s.akid for s in gets}) > 2, {s.akid for s in gets}
    assert all(s.akid.startswith("EXP") and s.status in (200, 206) for s in gets)


# -- the backend on its own (no FUSE): the read path's own redirect handling ------------
@pytest.fixture
def creds_env(seaweed, monkeypatch):
    for k, v in seaweed.env().items():
        monkeypatch.setenv(k, v)
    monkeypatch.delenv("AWS_REGION", raising=False)


@pytest.mark.parametrize("mode", ["redirect", "malformed"])
def test_read_follows_the_region_once(seaweed, eu_bucket, creds_env, mode, caplog):
    """No check() first: the ranged GETs themselves meet 301 (or 400
    AuthorizationHeaderMalformed) with x-amz-bucket-region, switch once, retry."""
    with AwsProxy(seaweed.endpoint, seaweed.access_key, seaweed.secret_key,
                  {eu_bucket: REGION}, wrong_region=mode) as p:
        b = S3Backend(eu_bucket, endpoint_url=p.endpoint, concurrency=16)
        data = FILES["big.bin"]
        chunks = [(off, min(MB, len(data) - off)) for off in range(0, len(data), MB)] * 4
        caplog.set_level(logging.INFO, logger="neuralcache.backends.s3")
        with ThreadPoolExecutor(16) as pool:
            got = list(pool.map(lambda c: b.read("big.bin", c[0], c[1], ""), chunks))
        assert all(g == data[o:o + n] for g, (o, n) in zip(got, chunks))
        assert b.region == REGION
        switched = [r for r in caplog.records if REGION in r.getMessage()]
        assert len(switched) == 1, [r.getMessage() for r in caplog.records]
        gets = object_gets(p, eu_bucket)
        assert gets[-1].region == REGION and sum(s.region != REGION for s in gets) <= 16
        b.close()


def test_check_finds_the_region_and_refuses_a_wrong_flag(seaweed, proxy, eu_bucket,
                                                         creds_env):
    b = S3Backend(eu_bucket, endpoint_url=proxy.endpoint)
    b.check()
    assert b.region == REGION and b._client.meta.region_name == REGION
    pinned = S3Backend(eu_bucket, endpoint_url=proxy.endpoint, region="us-east-1")
    with pytest.raises(UserError) as e:
        pinned.check()
    assert str(e.value) == (f"bucket {eu_bucket!r} is in region {REGION}, not us-east-1 "
                            "(--region): drop --region (the region is found automatically)"
                            " or correct it")
    with pytest.raises(Unavailable) as e:       # and a read never silently switches
        pinned.read("a.bin", 0, 10, "")
    assert REGION in str(e.value)


def test_a_server_without_regions_changes_nothing(seaweed, s3, creds_env):
    bucket = new_bucket(s3)
    s3.put_object(Bucket=bucket, Key="k", Body=b"hello")
    b = S3Backend(bucket, endpoint_url=seaweed.endpoint)
    b.check()
    assert b.region == "us-east-1"
    assert b.read("k", 0, 5, "") == b"hello"

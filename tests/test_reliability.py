"""Reliability: link faults, remote outage, kill -9, disk full, security defaults, bad
input and a short soak.  The long forms (2 GiB of verified reads, 10-minute soak) are
in bench/ (python -m bench.soak)."""
import errno
import os
import signal
import subprocess
import threading
import time
import urllib.parse
import urllib.request
import uuid
from pathlib import Path

import pytest

from bench.systems.ncmount import stats
from bench.servers.seaweed import SeaweedServer
from bench.tools.soak import random_reads
from bench.systems.pagecache import drop_page_cache
from bench.wan import WanProxy
from conftest import (cli_env, digest, eventually, mounted, needs_fuse, new_bucket, payload,
                      run_cli, small_tmpfs, upload_tree)
from neuralcache.store.tiers import DiskTier

pytestmark = [needs_fuse, pytest.mark.e2e]
MB = 1 << 20
SOAK_EXTRA = os.environ.get("NC_SOAK_EXTRA", "").split()


@pytest.fixture(scope="module")
def files():
    return {f"f/{i:02d}.bin": payload(900 + i, 3 * MB + i * 1000) for i in range(16)}


@pytest.fixture(scope="module")
def fault_bucket(s3, files):
    b = new_bucket(s3)
    upload_tree(s3, b, files)
    return b


@pytest.mark.parametrize("resets,stalls", [(0.05, 0.0), (0.0, 0.05), (0.1, 0.1)])
def test_link_faults_exact_bytes_or_eio(seaweed, fault_bucket, files, tmp_path, resets, stalls):
    with WanProxy(f"127.0.0.1:{seaweed.s3_port}", rtt_ms=10, reset_rate=resets,
                  stall_rate=stalls, stall_s=20.0, seed=7) as proxy:
        with mounted(f"s3://{fault_bucket}", tmp_path / "mnt", env=cli_env(seaweed),
                     cache_dir=tmp_path / "c",
                     args=["--endpoint-url", proxy.endpoint, "--block-size", "256K",
                           "--memory-cache-size", "4M", "--cache-size", "4M"]) as mp:
            res = random_reads(mp, files, 8, seconds=12.0, max_len=512 << 10,
                               seed=int(resets * 100 + stalls))
            # progress, not a rate: 12 s read 2.8-14.5 GB here (most from the page
            # cache once the 48 MB are in it), but once 20 MB in CI, where 20 s stalls
            # at 10 % kept the cold start going; a mount that makes none fails here
            if res["bytes"] <= 20 * MB:
                more = random_reads(mp, files, 8, seconds=30.0, max_len=512 << 10,
                                    seed=1, max_bytes=20 * MB + 1 - res["bytes"])
                res = {k: v + more[k] if k != "slowest" else max(v, more[k])
                       for k, v in res.items()}
            s = stats(mp)
        pstats = proxy.stats()
    # (what a run saw, for `pytest -rP`: bench/RESULTS.md forty-first sitting)
    print(f"verified {res['bytes'] >> 20} MiB in {res['reads']} reads, {res['eio']} EIO, "
          f"slowest {res['slowest']:.1f} s; proxy resets {pstats.get('resets', 0)}, "
          f"stalls {pstats.get('stalls', 0)}; retries {s['backend_retries']}, hedges "
          f"{s['hedged_requests']}")
    assert res["wrong"] == 0 and res["other"] == 0, (res["wrong_reads"], res["errors"])
    assert res["bytes"] > 20 * MB
    assert res["slowest"] < 35.0              # the documented demand deadline (30 s) + slack
    faults = pstats.get("resets", 0) + pstats.get("stalls", 0)
    assert faults > 0, pstats                 # the faults really happened
    assert s["backend_retries"] + s["hedged_requests"] > 0


def test_remote_outage_then_recovery(tmp_path, files):
    sw = SeaweedServer(tmp_path / "sw")
    sw.start()
    try:
        s3 = sw.client()
        b = new_bucket(s3)
        # two directories: the first open in f/ warms its siblings (prefetch.py), and
        # the outage must meet data that is not cached yet
        upload_tree(s3, b, {"f/00.bin": files["f/00.bin"], "g/01.bin": files["f/01.bin"]})
        with mounted(f"s3://{b}", tmp_path / "mnt", env=cli_env(sw), cache_dir=tmp_path / "c",
                     args=["--endpoint-url", sw.endpoint]) as mp:
            assert (mp / "f/00.bin").read_bytes() == files["f/00.bin"]
            time.sleep(0.5)
            sw.stop()
            served = stats(mp)["bytes_served"]
            # the kernel's copy goes (drop_caches as root, else fadvise on the file) ...
            assert drop_page_cache([mp / "f/00.bin"]) != "none"
            # ... so the cached data that stays readable comes from the daemon's cache
            assert digest((mp / "f/00.bin").read_bytes()) == digest(files["f/00.bin"])
            assert stats(mp)["bytes_served"] - served >= len(files["f/00.bin"])
            # uncached data fails fast with EIO instead of hanging
            t0 = time.monotonic()
            with pytest.raises(OSError) as e:
                (mp / "g/01.bin").read_bytes()
            assert e.value.errno == errno.EIO
            assert time.monotonic() - t0 < 15
            sw.start()
            # and service resumes by itself
            assert digest((mp / "g/01.bin").read_bytes()) == digest(files["f/01.bin"])
    finally:
        sw.stop()


def test_kill9_during_reads_leaves_a_valid_cache(seaweed, fault_bucket, files, tmp_path):
    env = cli_env(seaweed)
    args = ["--endpoint-url", seaweed.endpoint, "--block-size", "512K"]
    with mounted(f"s3://{fault_bucket}", tmp_path / "mnt", env=env, cache_dir=tmp_path / "c",
                 args=args) as mp:
        pid = stats(mp)["pid"]
        readers = threading.Thread(target=random_reads, args=(mp, files, 8),
                                   kwargs={"seconds": 3.0, "max_len": MB, "seed": 3})
        readers.start()
        time.sleep(1.0)
        os.kill(pid, signal.SIGKILL)
        readers.join()
        r = run_cli("umount", mp, env=env)
        assert r.returncode == 0, r.stderr
    sub = next(p for p in (tmp_path / "c").iterdir() if p.is_dir())
    disk = DiskTier(str(sub), 1 << 40)
    assert disk.load() > 0
    assert not list(sub.rglob("*.tmp"))        # partial downloads discarded
    good, bad = disk.verify_all()
    assert bad == 0 and good > 0
    t0 = time.monotonic()
    with mounted(f"s3://{fault_bucket}", tmp_path / "mnt", env=env, cache_dir=tmp_path / "c",
                 args=args) as mp:
        serving = time.monotonic() - t0
        got = {k: (mp / k).read_bytes() for k in files}
    assert all(digest(got[k]) == digest(files[k]) for k in files)
    assert serving < 15, serving


def test_disk_full_reads_pass_through_and_recover(seaweed, fault_bucket, files, tmp_path):
    with small_tmpfs(tmp_path, "3M") as cache, \
            mounted(f"s3://{fault_bucket}", tmp_path / "mnt", env=cli_env(seaweed),
                    cache_dir=cache, args=["--endpoint-url", seaweed.endpoint,
                                           "--cache-size", "1G", "--block-size", "1M"]) as mp:
        keys = sorted(files)
        for k in keys[:4]:
            assert digest((mp / k).read_bytes()) == digest(files[k])
        time.sleep(0.5)
        assert stats(mp)["disk_cache_writable"] is False
        log = (cache / "neuralcache.log").read_text()
        assert log.count("disk cache write failed") == 1     # one warning, not a flood
        subprocess.run(["mount", "-o", "remount,size=256M", str(cache)], check=True)
        time.sleep(5.5)                   # the disk tier retries writes every 5 s
        for k in keys[4:8]:
            assert digest((mp / k).read_bytes()) == digest(files[k])
        time.sleep(0.5)
        s = stats(mp)
        assert s["disk_cache_writable"] is True and s["cache_disk_blocks"] > 0


def test_security_defaults(seaweed, fault_bucket, tmp_path):
    env = cli_env(seaweed)
    secret = env["AWS_SECRET_ACCESS_KEY"]
    with mounted(f"s3://{fault_bucket}", tmp_path / "mnt", env=env, cache_dir=tmp_path / "c",
                 args=["--endpoint-url", seaweed.endpoint, "--debug"]) as mp:
        (mp / "f/00.bin").read_bytes()
        with open("/proc/self/mountinfo") as f:
            line = next(ln for ln in f if ln.split()[4] == str(mp))
        assert "allow_other" not in line
        assert oct(os.stat(tmp_path / "c").st_mode & 0o777) == "0o700"
        sub = next(p for p in (tmp_path / "c").iterdir() if p.is_dir())
        assert oct(os.stat(sub).st_mode & 0o777) == "0o700"
        ctl = mp / ".neuralcache"
        assert oct(os.stat(ctl).st_mode & 0o777) == "0o500"
        assert oct(os.stat(ctl / "hints").st_mode & 0o777) == "0o600"
        assert oct(os.stat(ctl / "trace").st_mode & 0o777) == "0o400"
        texts = [(ctl / "stats.json").read_text(), (ctl / "trace").read_text()]
    texts.append((tmp_path / "c" / "neuralcache.log").read_text())
    for t in texts:
        assert secret not in t and "Signature=" not in t and "X-Amz-Signature" not in t


def test_bad_hints_change_nothing(seaweed, fault_bucket, tmp_path):
    with mounted(f"s3://{fault_bucket}", tmp_path / "mnt", env=cli_env(seaweed),
                 cache_dir=tmp_path / "c", args=["--endpoint-url", seaweed.endpoint]) as mp:
        hints = mp / ".neuralcache" / "hints"
        hints.write_text("f/00.bin\nf/01.bin\n")
        assert eventually(lambda: stats(mp)["hints"] == 2)
        for bad in (b"f/00.bin\n\xff\xfe\n", b"../../etc/passwd\n", b"f/00.bin\x00x\n",
                    b"f//00.bin\n", b"/etc/passwd\n"):
            with pytest.raises(OSError) as e:
                with open(hints, "wb") as f:
                    f.write(bad)
            assert e.value.errno == errno.EINVAL, bad
            assert stats(mp)["hints"] == 2
        with pytest.raises(OSError) as e:              # past the largest hint file
            with open(hints, "wb") as f:
                f.seek((1 << 30) - 1)
                f.write(b"xx")
        assert e.value.errno in (errno.EFBIG, errno.EINVAL)
        assert stats(mp)["hints"] == 2
        assert (mp / "f/00.bin").read_bytes()[:10]          # the mount still serves


def _filer_put(sw: SeaweedServer, bucket: str, key: str, body: bytes) -> None:
    """Store ``key`` through SeaweedFS's filer HTTP API, which takes names its S3 API
    refuses: a NUL byte (PUT), a last component '.' or '..' (a multipart POST into the
    key's directory: in a URL path they would be resolved)."""
    base = f"http://127.0.0.1:{sw.filer_port}/buckets/{bucket}/"
    folder, _, name = key.rpartition("/")
    if name not in (".", ".."):
        req = urllib.request.Request(base + urllib.parse.quote(key), data=body, method="PUT")
    else:
        sep = uuid.uuid4().hex
        form = (f'--{sep}\r\nContent-Disposition: form-data; name="file"; filename="{name}"'
                "\r\nContent-Type: application/octet-stream\r\n\r\n").encode() + body + \
            f"\r\n--{sep}--\r\n".encode()
        req = urllib.request.Request(
            base + urllib.parse.quote(folder) + "/", data=form, method="POST",
            headers={"Content-Type": f"multipart/form-data; boundary={sep}"})
    with urllib.request.urlopen(req, timeout=30) as r:
        assert r.status == 201, r.status


def test_unusual_names(seaweed, s3, tmp_path):
    b = new_bucket(s3)
    odd = {"sp ace/ü ñ.bin": b"1", "émoji/😀.txt": b"22", "a/..b": b"3", "x/...": b"4",
           "deep/" + "/".join(["d"] * 30) + "/f": b"5", "zero.bin": b"",
           "big/ä ö.bin": payload(77, 3 * MB + 17)}
    upload_tree(s3, b, odd)
    # keys a mount cannot show inside its root: a '..' or '.' component, a NUL byte
    bad = ["up/..", "here/.", "nul\x00x"]
    for k in bad:
        _filer_put(seaweed, b, k, b"bad")
    listed = {o["Key"] for o in s3.list_objects_v2(Bucket=b)["Contents"]}
    assert listed == set(odd) | set(bad)          # the bucket really holds the bad keys
    with mounted(f"s3://{b}", tmp_path / "mnt", env=cli_env(seaweed), cache_dir=tmp_path / "c",
                 args=["--endpoint-url", seaweed.endpoint]) as mp:
        # the valid names (the control directory is not listed); a prefix holding only
        # invalid keys ("up/", "here/") shows as a directory until it is listed, then
        # goes: no trace of the invalid names themselves
        tops = set(os.listdir(mp))
        assert tops - {"up", "here"} == {k.split("/")[0] for k in odd}
        for d in tops & {"up", "here"}:       # empty, or gone already (listed ahead)
            try:
                assert os.listdir(mp / d) == []
            except FileNotFoundError:
                pass
        assert set(os.listdir(mp)) == {k.split("/")[0] for k in odd}
        seen = set()
        for dirpath, dirs, fs in os.walk(mp):
            seen |= {str((Path(dirpath) / f).relative_to(mp)) for f in fs}
        assert seen == set(odd)
        for name in ("up", "here", "nul", "up/..", "here/."):
            with pytest.raises(FileNotFoundError):
                os.stat(mp / name)
        with pytest.raises(FileNotFoundError):
            os.listdir(mp / "up")
        # the unusual valid names read back byte-exact
        for k, v in odd.items():
            assert os.stat(mp / k).st_size == len(v), k
            assert digest((mp / k).read_bytes()) == digest(v), k


def test_short_soak_16_readers(seaweed, fault_bucket, files, tmp_path):
    with mounted(f"s3://{fault_bucket}", tmp_path / "mnt", env=cli_env(seaweed),
                 cache_dir=tmp_path / "c",
                 args=["--endpoint-url", seaweed.endpoint, "--memory-cache-size", "16M", *SOAK_EXTRA,
                       "--cache-size", "24M", "--block-size", "1M"]) as mp:
        pid = stats(mp)["pid"]
        res = random_reads(mp, files, 16, seconds=15.0, max_len=256 << 10, seed=11)
        # FUSE's RELEASE is a background request: the kernel queues it behind the
        # readahead it has in flight (at most max_background at once), so on a busy
        # host a backlog of closes can still be arriving.  A leaked handle never goes.
        eventually(lambda: stats(mp)["open_handles"] == 0, timeout=30.0)
        s = stats(mp)
        rss_kb = int(next(ln for ln in open(f"/proc/{pid}/status")
                          if ln.startswith("VmHWM")).split()[1])
        fds = len(os.listdir(f"/proc/{pid}/fd"))
    assert res["wrong"] == 0 and res["eio"] == 0 and res["other"] == 0, \
        (res["wrong_reads"], res["errors"])
    assert res["bytes"] > 50 * MB
    assert s["open_handles"] == 0 and s["read_errors"] == 0
    assert s["cache_mem_bytes"] <= 16 * MB and s["cache_disk_bytes"] <= 24 * MB
    assert rss_kb < 400 * 1024, rss_kb                # peak RSS vs a 16 MiB memory cache
    assert fds < 100, fds

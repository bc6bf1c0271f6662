"""The write path (issue 12) end to end: real FUSE mounts with --writable over a real
SeaweedFS bucket (and a POSIX directory); every byte checked by xxh3 against what
was written, through the mount and in the bucket (boto3)."""
import errno
import gc
import os
import random
import shutil
import signal
import subprocess
import threading
import time

import pytest
import xxhash

from awsproxy import AwsProxy, _error_xml
from conftest import (cli_env, digest, eventually, is_mounted, mounted, needs_fuse,
                      new_bucket, payload, run_cli, small_tmpfs, upload_tree)
from test_e2e import read_tree, stats

pytestmark = [needs_fuse, pytest.mark.e2e]

MB = 1 << 20


@pytest.fixture(scope="module")
def seaweed(seaweed_writes):
    """The write tests' own server (conftest.py says why)."""
    return seaweed_writes


@pytest.fixture(scope="module")
def s3(seaweed):
    return seaweed.client()


@pytest.fixture(scope="module")
def shared_bucket(s3):
    return new_bucket(s3)


@pytest.fixture
def bucket(shared_bucket, request):
    """``BUCKET/PREFIX`` of this test: mounts are of s3://BUCKET/PREFIX."""
    return f"{shared_bucket}/{request.node.name}"


def split(where: str) -> tuple[str, str]:
    name, _, prefix = where.partition("/")
    return name, prefix + "/" if prefix else ""


def put_tree(s3, where, files: dict[str, bytes]) -> None:
    name, prefix = split(where)
    upload_tree(s3, name, files, prefix=prefix)


def keys_in(s3, where) -> set[str]:
    name, prefix = split(where)
    return {o["Key"][len(prefix):]
            for page in s3.get_paginator("list_objects_v2").paginate(Bucket=name,
                                                                      Prefix=prefix)
            for o in page.get("Contents", [])}


@pytest.fixture
def env(seaweed):
    return cli_env(seaweed)


def s3_mount(seaweed, bucket, tmp_path, *args, cache="cache", writable=True):
    return mounted(f"s3://{bucket}", tmp_path / "mnt", env=cli_env(seaweed),
                   cache_dir=tmp_path / cache,
                   args=["--endpoint-url", seaweed.endpoint,
                         *(["--writable"] if writable else []), *args])


def in_bucket(s3, where) -> dict[str, bytes]:
    name, prefix = split(where)
    return {k: s3.get_object(Bucket=name, Key=prefix + k)["Body"].read()
            for k in keys_in(s3, where)}


def digests(files: dict[str, bytes]) -> dict[str, str]:
    return {k: digest(v) for k, v in files.items()}


def sync(mp, env):
    r = run_cli("sync", mp, env=env)
    assert r.returncode == 0, r.stderr
    return r


# -- the basic contract ------------------------------------------------------------------
def test_create_write_close_read_back_through_mount_and_bucket(seaweed, s3, bucket, tmp_path,
                                                              env):
    files = {"ckpt/model.bin": payload(1, 20 * MB + 123),   # multipart (8 MiB parts)
             "ckpt/small.json": b'{"step": 100}',
             "ckpt/empty": b"",
             "top.txt": payload(2, 100_000)}
    with s3_mount(seaweed, bucket, tmp_path) as mp:
        assert os.statvfs(mp).f_bavail > 0            # room in the journal
        (mp / "ckpt").mkdir()
        with open(mp / "ckpt" / "model.bin", "wb") as f:
            data = files["ckpt/model.bin"]
            for off in range(0, len(data), MB):
                f.write(data[off:off + MB])
                f.flush()
                assert os.fstat(f.fileno()).st_size == min(len(data), off + MB)
                assert os.stat(mp / "ckpt" / "model.bin").st_size == min(len(data), off + MB)
        for k in ("ckpt/small.json", "ckpt/empty", "top.txt"):
            (mp / k).write_bytes(files[k])
        # read-after-write on this node: immediate, before any upload finished
        assert digests(read_tree(mp)) == digests(files)
        assert oct(os.stat(mp / "top.txt").st_mode & 0o777) == "0o644"
        sync(mp, env)
        assert digests(in_bucket(s3, bucket)) == digests(files)
        s = stats(mp)
        assert s["upload_pending_files"] == 0 and s["uploaded_files"] >= 4
        assert s["written_bytes"] == sum(len(v) for v in files.values())
        # after the upload the read cache serves the new version
        assert digest((mp / "ckpt/model.bin").read_bytes()) == digest(files["ckpt/model.bin"])
    with s3_mount(seaweed, bucket, tmp_path, writable=False) as mp:   # a fresh mount sees it
        assert digests(read_tree(mp)) == digests(files)


def test_parts_are_uploaded_while_a_new_file_is_written(seaweed, s3, bucket, tmp_path, env):
    """A checkpoint written forward is mostly on the remote before close(); a write
    back into a part already sent stops that (the file goes up after close)."""
    fwd, back = payload(13, 40 * MB + 7), bytearray(payload(14, 24 * MB))
    with s3_mount(seaweed, bucket, tmp_path) as mp:
        with open(mp / "forward.bin", "wb") as f:
            for off in range(0, len(fwd), MB):
                f.write(fwd[off:off + MB])
            f.flush()
            deadline = time.monotonic() + 20
            while stats(mp)["upload_streamed_bytes"] < 32 * MB and time.monotonic() < deadline:
                time.sleep(0.1)
            assert stats(mp)["upload_streamed_bytes"] >= 32 * MB    # 4 of 5 parts, open
            assert "forward.bin" not in keys_in(s3, bucket)        # not published yet
        fd = os.open(mp / "backward.bin", os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
        try:
            os.pwrite(fd, bytes(back), 0)
            time.sleep(1)                                          # parts 1-3 go out
            os.pwrite(fd, b"rewritten", 100)                       # back into part 1
            back[100:109] = b"rewritten"
        finally:
            os.close(fd)
        sync(mp, env)
        want = {"forward.bin": fwd, "backward.bin": bytes(back)}
        assert digests(in_bucket(s3, bucket)) == digests(want)
        assert digests(read_tree(mp)) == digests(want)


def test_overwrite_append_random_offsets_truncate(seaweed, s3, bucket, tmp_path, env):
    put_tree(s3, bucket, {"a.bin": payload(3, 3 * MB), "b.log": b"line 1\n",
                             "c.bin": payload(4, 9 * MB)})
    model = {"a.bin": bytearray(payload(3, 3 * MB)), "b.log": bytearray(b"line 1\n"),
             "c.bin": bytearray(payload(4, 9 * MB))}
    rnd = random.Random(5)
    with s3_mount(seaweed, bucket, tmp_path) as mp:
        new = payload(6, 2 * MB + 5)                          # O_TRUNC overwrite
        (mp / "a.bin").write_bytes(new)
        model["a.bin"] = bytearray(new)
        with open(mp / "b.log", "ab") as f:                    # append to a remote file
            f.write(b"line 2\n")
        model["b.log"] += b"line 2\n"
        fd = os.open(mp / "c.bin", os.O_RDWR)                  # random writes in place
        try:
            assert os.pread(fd, 100, 4 * MB) == bytes(model["c.bin"][4 * MB:4 * MB + 100])
            for _ in range(40):
                off = rnd.randrange(0, 10 * MB)
                chunk = rnd.randbytes(rnd.randrange(1, 300_000))
                os.pwrite(fd, chunk, off)
                if off > len(model["c.bin"]):
                    model["c.bin"] += b"\0" * (off - len(model["c.bin"]))
                model["c.bin"][off:off + len(chunk)] = chunk
                assert os.pread(fd, len(chunk), off) == chunk
            os.ftruncate(fd, 5 * MB + 1)                       # shrink with the file open
            del model["c.bin"][5 * MB + 1:]
        finally:
            os.close(fd)
        os.truncate(mp / "b.log", 20)                          # extend by path
        model["b.log"] += b"\0" * (20 - len(model["b.log"]))
        os.truncate(mp / "a.bin", MB)                          # shrink by path
        del model["a.bin"][MB:]
        want = {k: bytes(v) for k, v in model.items()}
        assert digests(read_tree(mp)) == digests(want)
        sync(mp, env)
        assert digests(in_bucket(s3, bucket)) == digests(want)


def test_rename_files_and_a_directory_of_20(seaweed, s3, bucket, tmp_path, env):
    uploaded = {f"run/step-100/shard-{i:02d}.bin": payload(100 + i, 50_000 + i)
                for i in range(10)}
    put_tree(s3, bucket, {**uploaded, "keep.txt": b"old target"})
    pending = {f"run/step-100/shard-{i:02d}.bin": payload(100 + i, 60_000 + i)
               for i in range(10, 20)}
    with s3_mount(seaweed, bucket, tmp_path) as mp:
        for k, v in pending.items():
            (mp / k).write_bytes(v)
        # a file replacing an existing target (safetensors/torch style temp + rename)
        (mp / "keep.tmp").write_bytes(b"new content")
        os.rename(mp / "keep.tmp", mp / "keep.txt")
        assert (mp / "keep.txt").read_bytes() == b"new content"
        # a directory of 10 uploaded + 10 pending files, renamed at once
        os.rename(mp / "run" / "step-100", mp / "run" / "final")
        moved = {k.replace("step-100", "final"): v for k, v in {**uploaded, **pending}.items()}
        assert not (mp / "run" / "step-100").exists()
        # readable at once under the new names (the remote may still be copying)
        assert digests(read_tree(mp / "run")) == digests(
            {k[len("run/"):]: v for k, v in moved.items()})
        sync(mp, env)
        want = {**moved, "keep.txt": b"new content"}
        assert digests(in_bucket(s3, bucket)) == digests(want)
        assert stats(mp)["uploaded_files"] == 11               # pending files uploaded once
    with s3_mount(seaweed, bucket, tmp_path, writable=False) as mp:
        assert digests(read_tree(mp)) == digests(want)


def test_unlink_mkdir_rmdir_and_rotation_keeps_last_2_of_5(seaweed, s3, bucket, tmp_path, env):
    with s3_mount(seaweed, bucket, tmp_path) as mp:
        os.mkdir(mp / "empty")
        with pytest.raises(FileExistsError):
            os.mkdir(mp / "empty")
        assert sorted(os.listdir(mp)) == ["empty"]
        os.rmdir(mp / "empty")
        keep = []
        for step in range(5):                     # a trainer saving and rotating
            d = mp / "ckpts" / f"step-{step}"
            d.mkdir(parents=True)
            (d / "model.pt").write_bytes(payload(step, 200_000))
            (d / "opt.pt").write_bytes(payload(50 + step, 100_000))
            keep.append(d)
            if len(keep) > 2:
                shutil.rmtree(keep.pop(0))
            if step == 2:
                sync(mp, env)                     # some rotations delete uploaded files
        assert sorted(os.listdir(mp / "ckpts")) == ["step-3", "step-4"]
        with pytest.raises(OSError) as e:
            os.rmdir(mp / "ckpts")
        assert e.value.errno == errno.ENOTEMPTY
        (mp / "gone.txt").write_bytes(b"x")
        os.unlink(mp / "gone.txt")
        assert not (mp / "gone.txt").exists()
        sync(mp, env)
        want = {f"ckpts/step-{s}/{n}": payload(s if n == "model.pt" else 50 + s,
                                                 200_000 if n == "model.pt" else 100_000)
                for s in (3, 4) for n in ("model.pt", "opt.pt")}
        assert digests(in_bucket(s3, bucket)) == digests(want)


def test_changes_survive_relisting_while_uploads_are_pending(seaweed, s3, bucket, tmp_path,
                                                            env):
    """Re-listing every second (--metadata-ttl 1) while files are written, renamed and
    deleted: the mount keeps showing its own changes, before and after the remote has
    them."""
    put_tree(s3, bucket, {"a/old1.bin": b"one", "a/old2.bin": b"two", "b/x.bin": b"x"})
    with s3_mount(seaweed, bucket, tmp_path, "--metadata-ttl", "1") as mp:
        (mp / "a" / "new.bin").write_bytes(payload(60, 2 * MB))
        os.rename(mp / "a" / "old1.bin", mp / "b" / "moved.bin")
        os.unlink(mp / "a" / "old2.bin")
        os.mkdir(mp / "empty")
        os.rename(mp / "b", mp / "c")
        with open(mp / "open.bin", "wb") as f:         # still being written
            f.write(b"partial")
            f.flush()                                  # out of Python's buffer
            want = {"a/new.bin": payload(60, 2 * MB), "c/moved.bin": b"one", "c/x.bin": b"x",
                    "open.bin": b"partial"}
            for _ in range(3):
                time.sleep(1.3)                        # at least one re-listing
                assert digests(read_tree(mp)) == digests(want)
                assert sorted(os.listdir(mp)) == ["a", "c", "empty", "open.bin"]
            f.write(b" and the rest")
        want["open.bin"] = b"partial and the rest"
        sync(mp, env)
        time.sleep(1.5)
        assert digests(read_tree(mp)) == digests(want)
        assert sorted(os.listdir(mp)) == ["a", "c", "empty", "open.bin"]
        assert digests(in_bucket(s3, bucket)) == digests(want)


# -- the libraries that write checkpoints ------------------------------------------------
def test_torch_save_load_and_safetensors_temp_then_rename(seaweed, s3, bucket, tmp_path, env):
    torch = pytest.importorskip("torch")
    st = pytest.importorskip("safetensors.torch")
    g = torch.Generator().manual_seed(0)
    state = {f"layer{i}.weight": torch.randn(256, 256, generator=g) for i in range(8)}
    with s3_mount(seaweed, bucket, tmp_path) as mp:
        torch.save(state, mp / "model.pt")
        st.save_file(state, str(mp / "model.safetensors.tmp"))
        os.replace(mp / "model.safetensors.tmp", mp / "model.safetensors")
        for loaded in (torch.load(mp / "model.pt"), st.load_file(str(mp / "model.safetensors"))):
            assert all(torch.equal(loaded[k], v) for k, v in state.items())
        del loaded                    # safetensors maps the file: unmap before unmounting
        gc.collect()
        local = tmp_path / "local"
        local.mkdir()
        torch.save(state, local / "model.pt")
        st.save_file(state, str(local / "model.safetensors"))
        sync(mp, env)
        got = in_bucket(s3, bucket)
        assert sorted(got) == ["model.pt", "model.safetensors"]
        assert digest(got["model.safetensors"]) == digest((local / "model.safetensors").read_bytes())
        assert len(got["model.pt"]) == (local / "model.pt").stat().st_size
    with s3_mount(seaweed, bucket, tmp_path, writable=False) as mp:
        loaded = torch.load(mp / "model.pt")
        assert all(torch.equal(loaded[k], v) for k, v in state.items())


def test_hugging_face_save_pretrained_and_from_pretrained(seaweed, s3, bucket, tmp_path, env):
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    cfg = transformers.LlamaConfig(vocab_size=256, hidden_size=64, intermediate_size=128,
                                   num_hidden_layers=2, num_attention_heads=4,
                                   num_key_value_heads=2, max_position_embeddings=128)
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(cfg)             # built in code: no download
    local = tmp_path / "local"
    model.save_pretrained(local)
    with s3_mount(seaweed, bucket, tmp_path) as mp:
        model.save_pretrained(mp / "hf")
        back = transformers.LlamaForCausalLM.from_pretrained(mp / "hf")
        want, got = model.state_dict(), back.state_dict()
        assert want.keys() == got.keys() and all(torch.equal(want[k], got[k]) for k in want)
        del back, got                         # safetensors maps the file: unmap first
        gc.collect()
        sync(mp, env)
    in_b = in_bucket(s3, bucket)
    assert sorted(in_b) == sorted(f"hf/{p.name}" for p in local.iterdir())
    assert digest(in_b["hf/model.safetensors"]) == digest((local / "model.safetensors").read_bytes())


DCP_WORKER = """
import os, sys, torch, torch.distributed as dist, torch.distributed.checkpoint as dcp
rank, path = int(os.environ["RANK"]), sys.argv[1]
dist.init_process_group("gloo", rank=rank, world_size=2)
g = torch.Generator().manual_seed(rank)
state = {f"rank{rank}.weight": torch.randn(512, 512, generator=g),
         "shared.step": torch.tensor([1000])}
dcp.save(state, checkpoint_id=path)
back = {k: torch.zeros_like(v) for k, v in state.items()}
dcp.load(back, checkpoint_id=path)
assert all(torch.equal(back[k], v) for k, v in state.items()), "loaded != saved"
dist.destroy_process_group()
print("ok", rank)
"""


def test_torch_distributed_checkpoint_two_gloo_ranks(seaweed, s3, bucket, tmp_path, env):
    pytest.importorskip("torch.distributed.checkpoint")
    import socket
    import sys

    script = tmp_path / "dcp_worker.py"
    script.write_text(DCP_WORKER)
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    with s3_mount(seaweed, bucket, tmp_path) as mp:
        procs = [subprocess.Popen([sys.executable, str(script), str(mp / "dcp" / "step-10")],
                                  env=dict(os.environ, RANK=str(r), WORLD_SIZE="2",
                                           MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port)),
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
                 for r in range(2)]
        outs = [p.communicate(timeout=180) for p in procs]
        assert all(p.returncode == 0 for p in procs), outs
        names = sorted(os.listdir(mp / "dcp" / "step-10"))
        assert ".metadata" in names and not [n for n in names if n.endswith(".tmp")]
        local = {n: (mp / "dcp" / "step-10" / n).read_bytes() for n in names}
        sync(mp, env)
    assert digests(in_bucket(s3, bucket)) == digests(
        {f"dcp/step-10/{n}": v for n, v in local.items()})


def test_fsspec_local_transaction(seaweed, s3, bucket, tmp_path, env):
    """The pattern behind Lightning's atomic save: write to a temp file in a
    transaction, move it into place on commit."""
    fsspec = pytest.importorskip("fsspec")
    fs = fsspec.filesystem("file")
    data = payload(70, 3 * MB)
    with s3_mount(seaweed, bucket, tmp_path) as mp:
        fs.makedirs(str(mp / "lightning"), exist_ok=True)
        with fs.transaction:
            with fs.open(str(mp / "lightning" / "last.ckpt"), "wb") as f:
                f.write(data)
            assert not fs.exists(str(mp / "lightning" / "last.ckpt"))   # not yet committed
        assert digest((mp / "lightning" / "last.ckpt").read_bytes()) == digest(data)
        shutil.copy2(mp / "lightning" / "last.ckpt", mp / "lightning" / "copy.ckpt")  # chmod ok
        sync(mp, env)
    assert digests(in_bucket(s3, bucket)) == digests({"lightning/last.ckpt": data,
                                                       "lightning/copy.ckpt": data})


# -- faults -------------------------------------------------------------------------------
def write_stream(path, seed: int, size: int, chunk: int = 8 * MB) -> str:
    """Write ``size`` bytes of a seeded stream; its xxh3-128, without holding it all."""
    h = xxhash.xxh3_128()
    rnd = random.Random(seed)
    with open(path, "wb") as f:
        left = size
        while left:
            b = rnd.randbytes(min(chunk, left))
            f.write(b)
            h.update(b)
            left -= len(b)
    return h.hexdigest()


def bucket_digest(s3, where, key) -> str:
    name, prefix = split(where)
    h = xxhash.xxh3_128()
    for chunk in s3.get_object(Bucket=name, Key=prefix + key)["Body"].iter_chunks(8 * MB):
        h.update(chunk)
    return h.hexdigest()


# The big file of the kill -9 test: the issue asks for 1 GiB; the suite uses 256 MiB to
# stay within its time budget on two shared cores (NEURALCACHE_KILL9_MB=1024 for the
# full size).
KILL9_MB = int(os.environ.get("NEURALCACHE_KILL9_MB", "256"))


def test_kill9_right_after_close_loses_no_acknowledged_byte(seaweed, s3, bucket, tmp_path,
                                                            env):
    from bench.wan import WanProxy

    put_tree(s3, bucket, {"old/a.bin": payload(7, 1000), "old/b.bin": payload(8, 2000)})
    acked = {}
    # through 100 ms of round trip, so the last files' uploads are still in flight at
    # the kill however slowly this process writes (direct, on a loaded machine, all
    # of them had finished 1 time in 15: the guard below failed)
    with WanProxy(f"127.0.0.1:{seaweed.s3_port}", rtt_ms=100) as proxy, \
            s3_mount(seaweed, bucket, tmp_path, "--endpoint-url", proxy.endpoint) as mp:
        pid = stats(mp)["pid"]
        os.rename(mp / "old" / "a.bin", mp / "renamed.bin")    # intents: rename, delete
        os.unlink(mp / "old" / "b.bin")
        acked["renamed.bin"] = digest(payload(7, 1000))
        acked["big.bin"] = write_stream(mp / "big.bin", 9, KILL9_MB * MB)
        for i in range(8):
            data = payload(20 + i, 300_000 + i)
            with open(mp / f"small-{i}.bin", "wb") as f:
                f.write(data)
            acked[f"small-{i}.bin"] = digest(data)   # close() returned: acknowledged
        os.kill(pid, signal.SIGKILL)                 # at once, uploads in flight
        pending_at_kill = set(acked) - keys_in(s3, bucket)
        r = run_cli("umount", mp, env=env)            # cleans up the dead mount
        assert r.returncode == 0, r.stderr
    assert pending_at_kill, "everything was uploaded before the kill: the test proves nothing"
    # the next mount of the same source and cache dir finishes the journal before it
    # reports ready: the bucket is complete when `mount` returns
    with s3_mount(seaweed, bucket, tmp_path) as mp:
        got = keys_in(s3, bucket)
        assert got == set(acked), (got, set(acked))
        assert {k: bucket_digest(s3, bucket, k) for k in acked} == acked
        assert stats(mp)["upload_pending_ops"] == 0
        assert "finishing" in (tmp_path / "cache" / "neuralcache.log").read_text()


def test_resets_and_stalls_during_uploads_lose_nothing(seaweed, s3, bucket, tmp_path, env):
    """5 % of requests reset and 2 % stalled for 20 s (a short outage) while a
    checkpoint uploads: every file arrives whole."""
    from bench.wan import WanProxy

    files = {f"ckpt/shard-{i:02d}.bin": payload(80 + i, MB // 4 + i) for i in range(64)}
    files["ckpt/big.bin"] = payload(90, 40 * MB)

    def faults(p):
        return p.get("resets", 0) + p.get("stalls", 0)

    with WanProxy(f"127.0.0.1:{seaweed.s3_port}", rtt_ms=10, reset_rate=0.05,
                  stall_rate=0.02, stall_s=20.0, seed=3) as proxy:
        with mounted(f"s3://{bucket}", tmp_path / "mnt", env=env, cache_dir=tmp_path / "c",
                     args=["--endpoint-url", proxy.endpoint, "--writable"]) as mp:
            # the daemon warms its connections once it serves (daemon.py
            # WARM_CONNECTIONS) and forgives those requests their faults: count only
            # the faults after it is done (a stalled ping ends at the read timeout)
            t_end = time.monotonic() + 60
            while stats(mp).get("connections_warmed") is None:
                assert time.monotonic() < t_end, "the daemon never warmed its connections"
                time.sleep(0.2)
            f0, s0 = faults(proxy.stats()), stats(mp)
            for k, v in files.items():
                (mp / k).parent.mkdir(exist_ok=True)
                (mp / k).write_bytes(v)
            r = run_cli("sync", mp, env=env, timeout=300)
            f1, s1 = faults(proxy.stats()), stats(mp)
    assert r.returncode == 0, r.stderr
    assert f1 > f0, "no fault hit the uploads: the test proves nothing"
    assert (s1["upload_errors"] + s1["backend_retries"]
            > s0["upload_errors"] + s0["backend_retries"]), \
        f"{f1 - f0} faults hit the uploads but the daemon counted no retry"
    assert digests(in_bucket(s3, bucket)) == digests(files)


def test_journal_disk_full_gives_enospc_and_keeps_earlier_files(seaweed, s3, bucket,
                                                               tmp_path, env):
    first = payload(10, 20 * MB)
    with small_tmpfs(tmp_path, "64m") as cache, \
            mounted(f"s3://{bucket}", tmp_path / "mnt", env=env, cache_dir=cache,
                    args=["--endpoint-url", seaweed.endpoint, "--writable",
                          "--cache-size", "8M", "--block-size", "1M"]) as mp:
        (mp / "first.bin").write_bytes(first)
        with pytest.raises(OSError) as e:
            with open(mp / "huge.bin", "wb") as f:
                for _ in range(80):
                    f.write(payload(11, MB))
        assert e.value.errno == errno.ENOSPC
        assert digest((mp / "first.bin").read_bytes()) == digest(first)
        # close() has returned, but the kernel sends RELEASE in the background: the
        # staging file goes at the later of the release and the unlink (CI once
        # wrote after.bin between the two and got ENOSPC)
        assert eventually(lambda: stats(mp)["open_handles"] == 0, timeout=30.0)
        os.unlink(mp / "huge.bin")                 # frees its journal space
        (mp / "after.bin").write_bytes(b"room again")
        sync(mp, env)
        got = in_bucket(s3, bucket)
        assert digest(got["first.bin"]) == digest(first)
        assert got["after.bin"] == b"room again" and "huge.bin" not in got


def test_a_save_into_a_full_journal_waits_for_the_last_upload(seaweed, s3, bucket,
                                                              tmp_path, env):
    """Checkpoints saved back to back on a small journal disk: the second fills the disk
    while the first still uploads (a 48 Mbit/s link).  Its writes wait for that upload
    to free its staging file instead of failing with ENOSPC, and both arrive whole.  A
    reader of the first left open does not hold its space: the full journal makes it
    give up the deleted staging file, and it reads the uploaded copy after."""
    from bench.wan import WanProxy

    first, second = payload(12, 36 * MB), payload(13, 36 * MB)
    with small_tmpfs(tmp_path, "64m") as cache, \
            WanProxy(f"127.0.0.1:{seaweed.s3_port}", rtt_ms=20, mbit=48) as proxy, \
            mounted(f"s3://{bucket}", tmp_path / "mnt", env=env, cache_dir=cache,
                    args=["--endpoint-url", proxy.endpoint, "--writable",
                          "--cache-size", "8M", "--block-size", "1M"]) as mp:
        (mp / "step-1.pt").write_bytes(first)            # uploads for ~6 s
        with open(mp / "step-1.pt", "rb", buffering=0) as reader:   # left open
            head = reader.read(MB)
            (mp / "step-2.pt").write_bytes(second)       # no room until it ends
            assert stats(mp)["journal_full_waits"] >= 1
            assert digest(head + reader.read()) == digest(first)
        sync(mp, env)
        got = in_bucket(s3, bucket)
        assert digests(got) == digests({"step-1.pt": first, "step-2.pt": second})
        assert digest((mp / "step-2.pt").read_bytes()) == digest(second)


def test_two_files_written_by_8_threads_each(seaweed, s3, bucket, tmp_path, env):
    size, threads = 16 * MB, 8
    datas = {name: payload(30 + i, size) for i, name in enumerate(["x.bin", "y.bin"])}
    with s3_mount(seaweed, bucket, tmp_path) as mp:
        fds = {name: os.open(mp / name, os.O_WRONLY | os.O_CREAT | os.O_TRUNC) for name in datas}
        errors = []

        def writer(name, t):
            try:
                piece = size // threads
                for off in range(t * piece, (t + 1) * piece, 256 * 1024):
                    os.pwrite(fds[name], datas[name][off:off + 256 * 1024], off)
            except Exception as exc:  # noqa: BLE001 - reported below
                errors.append(exc)

        ts = [threading.Thread(target=writer, args=(n, t)) for n in datas for t in range(threads)]
        for t in ts:
            t.start()
        for t in ts:
            t.join()
        for fd in fds.values():
            os.close(fd)
        assert not errors, errors
        assert digests(read_tree(mp)) == digests(datas)
        sync(mp, env)
        assert digests(in_bucket(s3, bucket)) == digests(datas)


class RefusingProxy(AwsProxy):
    """The AWS-like front of tests/awsproxy.py, answering 403 AccessDenied to every
    write while ``refuse`` is set (a bucket policy that changed under the mount)."""
    refuse = False

    def forward(self, method, path, headers, body):
        if self.refuse and method in ("PUT", "POST", "DELETE"):
            return 403, [("Content-Type", "application/xml")], _error_xml(
                "AccessDenied", "Access Denied")
        return super().forward(method, path, headers, body)


def test_remote_refusing_writes_fails_fsync_and_sync_until_discarded(seaweed, s3, bucket,
                                                                     tmp_path, env):
    with RefusingProxy(seaweed.endpoint, seaweed.access_key, seaweed.secret_key) as proxy, \
            mounted(f"s3://{bucket}", tmp_path / "mnt", env=env, cache_dir=tmp_path / "c",
                    args=["--endpoint-url", proxy.endpoint, "--writable"]) as mp:
        (mp / "ok.bin").write_bytes(b"uploaded first")
        sync(mp, env)
        proxy.refuse = True                           # the remote now refuses every write
        (mp / "lost.bin").write_bytes(b"cannot go anywhere")
        (mp / "kept.bin").write_bytes(b"uploaded once the remote accepts writes")
        fd = os.open(mp / "lost.bin", os.O_RDONLY)
        try:
            t0 = time.monotonic()
            with pytest.raises(OSError) as e:
                os.fsync(fd)
            assert e.value.errno == errno.EIO and time.monotonic() - t0 < 20
        finally:
            os.close(fd)
        r = run_cli("sync", mp, env=env)
        assert r.returncode == 1 and r.stderr.count("\n") == 1, r.stderr
        assert "access denied" in r.stderr.lower() and "Traceback" not in r.stderr
        s = stats(mp)
        assert s["upload_errors"] > 0 and s["upload_pending_files"] == 2
        assert s["upload_oldest_pending_s"] > 0
        assert (mp / "lost.bin").read_bytes() == b"cannot go anywhere"   # kept locally
        r = run_cli("sync", mp, "--discard", str(mp / "lost.bin"), env=env)
        assert r.returncode == 0, r.stderr
        assert not (mp / "lost.bin").exists()         # the remote never had it
        r = run_cli("sync", mp, "--discard", "lost.bin", env=env)
        assert r.returncode == 1 and "no data waiting" in r.stderr
        proxy.refuse = False
        sync(mp, env)
        assert in_bucket(s3, bucket) == {"ok.bin": b"uploaded first",
                                         "kept.bin": b"uploaded once the remote accepts writes"}


def test_unmount_waits_for_pending_uploads(seaweed, s3, bucket, tmp_path, env):
    with s3_mount(seaweed, bucket, tmp_path) as mp:
        want = write_stream(mp / "ckpt.bin", 12, 48 * MB)
        r = run_cli("umount", mp, env=env)
        assert r.returncode == 0, r.stderr
        assert not is_mounted(mp)
    assert bucket_digest(s3, bucket, "ckpt.bin") == want


def test_write_stats_and_metrics(seaweed, s3, bucket, tmp_path, env):
    import socket
    import urllib.request

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    with s3_mount(seaweed, bucket, tmp_path, "--metrics-port", str(port)) as mp:
        (mp / "a.bin").write_bytes(payload(50, 3 * MB))
        sync(mp, env)
        text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read()
        r = run_cli("stats", mp, env=env)
    metrics = dict(line.rsplit(" ", 1) for line in text.decode().splitlines()
                   if line.startswith("neuralcache_") and " " in line)
    assert float(metrics["neuralcache_uploaded_bytes_total"]) == 3 * MB
    assert float(metrics["neuralcache_written_bytes_total"]) == 3 * MB
    assert float(metrics["neuralcache_upload_pending_files"]) == 0
    assert "neuralcache_upload_oldest_pending_seconds" in metrics
    assert "neuralcache_upload_errors_total" in metrics
    assert r.returncode == 0 and "pending upload" in r.stdout and "3.0M" in r.stdout


def test_read_only_without_writable_is_erofs(seaweed, s3, bucket, tmp_path):
    put_tree(s3, bucket, {"d/a.bin": b"data"})
    with s3_mount(seaweed, bucket, tmp_path, writable=False) as mp:
        for call in (lambda: open(mp / "new.bin", "wb"), lambda: open(mp / "d/a.bin", "r+b"),
                     lambda: os.truncate(mp / "d/a.bin", 0), lambda: os.unlink(mp / "d/a.bin"),
                     lambda: os.rename(mp / "d/a.bin", mp / "b.bin"), lambda: os.rmdir(mp / "d"),
                     lambda: os.mkdir(mp / "x")):
            with pytest.raises(OSError) as e:
                call()
            assert e.value.errno in (errno.EROFS, errno.EACCES), call
        assert stats(mp)["writable"] is False
        assert not (mp / ".neuralcache" / "sync").exists()
        r = run_cli("sync", mp)
        assert r.returncode == 1 and "--writable" in r.stderr
    assert in_bucket(s3, bucket) == {"d/a.bin": b"data"}


@needs_fuse
@pytest.mark.e2e
def test_posix_source_sparse_file_and_a_length_past_the_journals_largest_file(tmp_path):
    """A checkpoint truncated to 1 GiB with a few bytes at its end lands in the source
    as sparse as it was written (it was written out as a gigabyte of zeros; a terabyte
    filled the disk); a write past the largest file the journal's filesystem holds is
    EFBIG at the syscall (it was answered, then killed the daemon)."""
    from neuralcache.write.limits import largest_file

    src = tmp_path / "src"
    src.mkdir()
    cache = tmp_path / "cache"
    cache.mkdir()
    limit = min(largest_file(str(cache)), largest_file(str(src)))
    with mounted(str(src), tmp_path / "mnt", cache_dir=cache, args=["-o", "rw"]) as mp:
        with open(mp / "sparse.pt", "wb") as f:
            f.write(b"head")
            f.truncate(1 << 30)
            f.seek((1 << 30) - 4)
            f.write(b"tail")
        (mp / "keep.bin").write_bytes(b"kept")
        if limit < (1 << 62):                # (a filesystem of 2**63 - 1: no such write)
            fd = os.open(mp / "big.pt", os.O_CREAT | os.O_WRONLY, 0o644)
            try:
                with pytest.raises(OSError) as e:
                    os.pwrite(fd, b"x", limit)
                assert e.value.errno == errno.EFBIG
            finally:
                os.close(fd)
            os.unlink(mp / "big.pt")
        sync(mp, None)
        assert (mp / "keep.bin").read_bytes() == b"kept"        # the daemon is alive
        with open(mp / "sparse.pt", "rb") as f:
            assert f.read(4) == b"head"
            f.seek((1 << 30) - 4)
            assert f.read() == b"tail"
    st = (src / "sparse.pt").stat()
    assert st.st_size == 1 << 30 and st.st_blocks * 512 < 16 << 20
    assert (src / "keep.bin").read_bytes() == b"kept" and not (src / "big.pt").exists()


def test_posix_source_writes(tmp_path):
    src = tmp_path / "src"
    (src / "data").mkdir(parents=True)
    (src / "data" / "old.bin").write_bytes(payload(40, 10_000))
    files = {"ckpt/a.bin": payload(41, 12 * MB), "ckpt/b.txt": b"hello"}
    with mounted(str(src), tmp_path / "mnt", cache_dir=tmp_path / "cache",
                 args=["-o", "rw"]) as mp:
        for k, v in files.items():
            (mp / k).parent.mkdir(exist_ok=True)
            (mp / k).write_bytes(v)
        os.rename(mp / "ckpt", mp / "final")
        os.rename(mp / "data" / "old.bin", mp / "final" / "old.bin")
        sync(mp, None)
        want = {"final/a.bin": files["ckpt/a.bin"], "final/b.txt": b"hello",
                "final/old.bin": payload(40, 10_000)}
        assert digests(read_tree(src)) == digests(want)
        assert not [p for p in src.rglob("*") if p.name.startswith(".neuralcache-tmp")]

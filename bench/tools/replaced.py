"""Does a `--writable` mount show a file replaced on the remote whole?  A file of 10
bytes is held open through the mount, the object is replaced on the remote by 20
bytes, and after the metadata TTL (1 s) the tool prints `stat` and the bytes read,
five times.  Every line should say 20 / 20.

    python -m bench.tools.replaced CODE_DIR

CODE_DIR: a checkout whose neuralcache/ the daemon runs.  bench/RESULTS.md (tenth
sitting) ran it on a worktree whose `Operations` set `enable_writeback_cache = True`
on writable mounts (neuralcache/fs/operations.py, one line): the kernel then kept the
old size, 10 / 10 with the new object's bytes -- why the kernel's write-back cache is
not used.  Starts its own SeaweedFS in a temporary directory and removes it.
"""
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def main() -> int:
    code = os.path.abspath(sys.argv[1]) if len(sys.argv) > 1 else os.getcwd()
    from bench.servers.seaweed import SeaweedServer
    base = Path(tempfile.mkdtemp(prefix="replaced-"))
    env = dict(os.environ, PYTHONPATH=code)
    nc = [sys.executable, "-m", "neuralcache"]
    try:
        with SeaweedServer(base / "sw") as sw:
            env.update(sw.env())
            s3 = sw.client()
            s3.create_bucket(Bucket="replaced")
            s3.put_object(Bucket="replaced", Key="ckpt.pt", Body=b"x" * 10)
            mp = base / "mnt"
            mp.mkdir()
            r = subprocess.run(nc + ["mount", "s3://replaced", str(mp), "--cache-dir",
                                     str(base / "c"), "--endpoint-url", sw.endpoint,
                                     "--writable", "--metadata-ttl", "1"],
                               env=env, cwd=code, capture_output=True, text=True)
            if r.returncode != 0:
                print(r.stderr.strip(), file=sys.stderr)
                return 1
            try:
                f = mp / "ckpt.pt"
                fd = os.open(f, os.O_RDONLY)       # the kernel keeps the inode
                print(f"before: stat {os.stat(f).st_size}, read {len(f.read_bytes())}")
                s3.put_object(Bucket="replaced", Key="ckpt.pt", Body=b"y" * 20)
                time.sleep(3)
                for _ in range(5):
                    data = f.read_bytes()
                    print(f"after:  stat {os.stat(f).st_size}, read {len(data)} "
                          f"({data[:3]!r}...)")
                    time.sleep(1.5)
                os.close(fd)
            finally:
                subprocess.run(nc + ["umount", str(mp), "--force"], env=env, cwd=code,
                               capture_output=True)
    finally:
        shutil.rmtree(base, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

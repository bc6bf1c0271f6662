"""Operations: systemd unit, Type=notify start, mount(8)/fstab, config files, Prometheus
metrics + Grafana dashboard, warm, stats --watch."""
import json
import os
import pty
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from conftest import (NEURALCACHE, cli_env, digest, is_mounted, mounted, needs_fuse, new_bucket,
                      payload, run_cli, upload_tree)
from neuralcache.admin.metrics import exported_names

REPO = Path(__file__).resolve().parent.parent
DATA = {f"d/{i:03d}.bin": payload(500 + i, 50_000 + i) for i in range(40)}


@pytest.fixture(scope="module")
def bucket(seaweed, s3):
    b = new_bucket(s3)
    upload_tree(s3, b, DATA)
    return b


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_systemd_unit_verifies(tmp_path):
    if not shutil.which("systemd-analyze"):
        pytest.skip("systemd-analyze not installed")
    exe = shutil.which("neuralcache") or str(Path(sys.executable).parent / "neuralcache")
    unit = (REPO / "systemd" / "neuralcache@.service").read_text()
    assert "Type=notify" in unit and "network-online.target" in unit
    assert "Restart=on-failure" in unit
    # verify the unit as installed, with the binary where this machine has it
    (tmp_path / "neuralcache@test.service").write_text(
        unit.replace("/usr/local/bin/neuralcache", exe))
    r = subprocess.run(["systemd-analyze", "verify", str(tmp_path / "neuralcache@test.service")],
                       capture_output=True, text=True)
    assert r.returncode == 0 and r.stderr.strip() == "", r.stderr


def test_example_config_is_valid():
    from neuralcache.admin.config import load_config_file

    cfg = load_config_file(str(REPO / "systemd" / "example.toml"))
    assert cfg["source"].startswith("s3://") and cfg["cache_size"] == 500 << 30


def test_config_unknown_key_is_named(tmp_path):
    from neuralcache.admin.config import load_config_file
    from neuralcache.errors import UserError

    f = tmp_path / "c.toml"
    f.write_text('source = "s3://b"\nmountpoint = "/mnt"\ncache_szie = "1G"\n')
    with pytest.raises(UserError) as e:
        load_config_file(str(f))
    assert "cache_szie" in str(e.value)
    f.write_text("source = [\n")
    with pytest.raises(UserError) as e:
        load_config_file(str(f))
    assert "not valid TOML" in str(e.value)


@needs_fuse
def test_notify_start_like_systemd_then_sigterm_unmounts(seaweed, bucket, tmp_path):
    """Run the daemon the way the unit's ExecStart does, with a NOTIFY_SOCKET."""
    mp = tmp_path / "mnt"
    mp.mkdir()
    conf = tmp_path / "job.toml"
    conf.write_text(f'source = "s3://{bucket}"\nmountpoint = "{mp}"\n'
                    f'endpoint_url = "{seaweed.endpoint}"\ncache_dir = "{tmp_path / "c"}"\n'
                    'memory_cache_size = "64M"\n')
    sock_path = str(tmp_path / "notify.sock")
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(sock_path)
    sock.settimeout(60)
    proc = subprocess.Popen(NEURALCACHE + ["mount", "--config", str(conf), "--foreground"],
                            env=cli_env(seaweed, NOTIFY_SOCKET=sock_path),
                            stderr=subprocess.PIPE, text=True)
    try:
        msg = sock.recv(4096).decode()
        assert "READY=1" in msg
        assert is_mounted(mp)                        # READY only once the mount serves
        assert digest((mp / "d/000.bin").read_bytes()) == digest(DATA["d/000.bin"])
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0
        assert not is_mounted(mp)
        assert "STOPPING=1" in sock.recv(4096).decode()
    finally:
        if proc.poll() is None:
            proc.kill()
        subprocess.run(["fusermount3", "-u", "-z", str(mp)], capture_output=True)
        sock.close()


@needs_fuse
def test_mount_t_fuse_neuralcache_and_fstab(seaweed, bucket, tmp_path):
    if os.geteuid() != 0 or not shutil.which("mount"):
        pytest.skip("needs root and mount(8)")
    helper = Path(sys.executable).parent / "mount.fuse.neuralcache"
    target = Path("/usr/sbin/mount.fuse.neuralcache")
    created = False
    if not target.exists():
        target.symlink_to(helper)
        created = True
    mp = tmp_path / "mnt"
    mp.mkdir()
    opts = (f"endpoint_url={seaweed.endpoint},cache_dir={tmp_path / 'c'},"
            "memory_cache_size=64M,_netdev,nofail")
    env = cli_env(seaweed)
    try:
        r = subprocess.run(["mount", "-t", "fuse.neuralcache", f"s3://{bucket}", str(mp),
                            "-o", opts], env=env, capture_output=True, text=True, timeout=120)
        assert r.returncode == 0, r.stderr
        assert is_mounted(mp)
        assert (mp / "d/001.bin").read_bytes() == DATA["d/001.bin"]
        r = subprocess.run(["umount", str(mp)], capture_output=True, text=True)
        assert r.returncode == 0, r.stderr
        assert not is_mounted(mp)
        fstab = tmp_path / "fstab"
        fstab.write_text(f"s3://{bucket} {mp} fuse.neuralcache {opts} 0 0\n")
        r = subprocess.run(["mount", "-T", str(fstab), str(mp)], env=env, capture_output=True,
                           text=True, timeout=120)
        assert r.returncode == 0, r.stderr
        assert (mp / "d/002.bin").read_bytes() == DATA["d/002.bin"]
    finally:
        if is_mounted(mp):
            subprocess.run(["umount", "-l", str(mp)])
        if created:
            target.unlink()


@needs_fuse
def test_metrics_endpoint_and_dashboard(seaweed, bucket, tmp_path):
    port = free_port()
    with mounted(f"s3://{bucket}", tmp_path / "mnt", env=cli_env(seaweed),
                 cache_dir=tmp_path / "c",
                 args=["--endpoint-url", seaweed.endpoint, "--metrics-port", str(port)]) as mp:
        for k in list(DATA)[:10]:
            assert (mp / k).read_bytes() == DATA[k]
        body = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read()
        text = body.decode()
    series = {m.group(1) for m in re.finditer(r"^([a-z_]+)(?:\{|\s)", text, re.M)}
    assert exported_names() <= series, exported_names() - series
    served = float(re.search(r"^neuralcache_served_bytes_total (\S+)", text, re.M).group(1))
    assert served >= sum(len(DATA[k]) for k in list(DATA)[:10])
    count = float(re.search(r"^neuralcache_read_duration_seconds_count (\S+)", text,
                            re.M).group(1))
    pushed = float(re.search(r"^neuralcache_pushed_files_total (\S+)", text, re.M).group(1))
    assert count + pushed >= 10         # a pushed file is read with no READ request
    assert float(re.search(r"^neuralcache_backend_request_duration_seconds_count (\S+)",
                           text, re.M).group(1)) >= 10
    opens = float(re.search(r'^neuralcache_fuse_requests_total\{op="open"\} (\S+)', text,
                            re.M).group(1))
    assert opens >= 10
    # every metric the dashboard queries is exported
    dash = json.loads((REPO / "neuralcache" / "grafana" / "dashboard.json").read_text())
    exprs = [t["expr"] for p in dash["panels"] for t in p["targets"]]
    queried = {n for e in exprs for n in re.findall(r"\bneuralcache_[a-z_]+", e)}
    assert queried and queried <= exported_names(), queried - exported_names()
    assert dash["__inputs"][0]["pluginId"] == "prometheus"
    titles = " ".join(p["title"].lower() for p in dash["panels"])
    for word in ("throughput", "hit rate", "precision", "latency", "fill", "errors"):
        assert word in titles


def test_metrics_bound_to_loopback_by_default():
    from neuralcache.admin.config import MountConfig

    assert MountConfig().metrics_addr == "127.0.0.1" and MountConfig().metrics_port is None


@needs_fuse
def test_warm_with_progress_check_and_stats_watch(seaweed, bucket, tmp_path):
    env = cli_env(seaweed)
    total = sum(len(v) for v in DATA.values())
    with mounted(f"s3://{bucket}", tmp_path / "mnt", env=env, cache_dir=tmp_path / "c",
                 args=["--endpoint-url", seaweed.endpoint, "--prefetch", "off"]) as mp:
        r = run_cli("warm", mp, "--check", env=env)
        assert r.returncode == 0 and "0 of 40 files complete" in r.stdout, r.stdout
        # on a terminal: a progress bar redrawn in place
        pid, fd = pty.fork()
        if pid == 0:
            os.execvpe(NEURALCACHE[0], NEURALCACHE + ["warm", str(mp), "d"], env)
        out = b""
        while True:
            try:
                chunk = os.read(fd, 4096)
            except OSError:
                break
            if not chunk:
                break
            out += chunk
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0, out
        assert b"\r[" in out and b"40/40 files" in out and b"ETA" in out
        r = run_cli("warm", mp, "--check", env=env)
        assert "40 of 40 files complete" in r.stdout and "100.0%" in r.stdout, r.stdout
        s = json.loads(run_cli("stats", mp, "--json", env=env).stdout)
        assert s["bytes_fetched"] == total
        # not a terminal: plain lines
        r = run_cli("warm", mp, "d/000.bin", env=env)
        assert r.returncode == 0 and "\r" not in r.stderr and "1/1 files" in r.stderr
        r = run_cli("warm", mp, "no/such", env=env)
        assert r.returncode == 1 and "no such file" in r.stderr
        # SIGINT back to its default in the child: a suite started in the background
        # by a shell without job control inherits it ignored (a watch then never ends)
        p = subprocess.Popen(NEURALCACHE + ["stats", str(mp), "--watch", "--interval", "0.3"],
                             env=env, stdout=subprocess.PIPE, text=True,
                             preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
        lines, deadline = [], time.monotonic() + 20    # a loaded machine is slow to start
        while len([ln for ln in lines if "served" in ln]) < 3 and time.monotonic() < deadline:
            lines.append(p.stdout.readline())
        p.send_signal(signal.SIGINT)
        out = "".join(lines) + p.communicate(timeout=10)[0]
        assert "hit rate" in out and out.count("served") >= 3

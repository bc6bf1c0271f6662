"""Peers (client systems) and the train-files scenario, checked without long runs."""
from __future__ import annotations

import contextlib
import os
from pathlib import Path

import pytest

from bench.scenarios import registry as scenarios
from bench.scenarios import train_files as trainfiles
from bench.report import results as report
from bench.scenarios.datasets import Dataset, materialize
from bench.scenarios.harness import Ctx
from bench.systems import cpu, loader, peers
from bench.systems.base import Mounted, MountOptions, SystemEnv
from bench.systems.registry import ALL_SYSTEMS, PEER_SYSTEMS, make_system

ROW_KEYS = {"scenario", "system", "phase", "value", "unit", "seconds", "bytes",
            "verify_errors", "link_bytes_down", "link_bytes_up", "link_connections",
            "cpu_s", "cpu_client_s", "cpu_daemon_s"}


def _env(tmp_path: Path) -> SystemEnv:
    return SystemEnv(work_dir=tmp_path / "mnt", data_dir=tmp_path / "data", bucket="b",
                     endpoint="http://127.0.0.1:1", access_key="k", secret_key="s")


def test_peers_are_registered_systems(tmp_path):
    assert set(PEER_SYSTEMS) <= set(ALL_SYSTEMS)
    assert {peers.base(n) for n in PEER_SYSTEMS} == set(peers.PEERS)
    for name in PEER_SYSTEMS:
        s = make_system(name, _env(tmp_path))
        assert s.kind == "client" and s.name == name
        assert s.tuned == name.endswith("-tuned")
    assert make_system("rclone", _env(tmp_path)).kind == "mount"


def test_scenarios_run_only_the_peers_that_have_their_workload():
    allsys = ["link", "local", "neuralcache", "neuralcache-hints", *PEER_SYSTEMS]
    assert set(scenarios.systems_for("train-files", allsys)) == set(allsys)
    shards = scenarios.systems_for("shards", allsys)
    assert "s3torchconnector" in shards and "mosaic" not in shards and "litdata" not in shards
    assert not set(PEER_SYSTEMS) & set(scenarios.systems_for("fio", allsys))
    note = scenarios.peers_note(["shards", "train-files"], allsys)
    assert "mosaic (+ -tuned) in shards" in note and "s3torchconnector" not in note


def test_missing_peer_is_one_line(monkeypatch):
    real = peers.importlib.util.find_spec
    monkeypatch.setattr(peers.importlib.util, "find_spec",
                        lambda m: None if m == "litdata" else real(m))
    msg = peers.missing("litdata-tuned")
    assert msg and "\n" not in msg and "litdata" in msg and "pip install" in msg


class _Proxy:
    proc = None

    def stats(self):
        return {"bytes_up": 0, "bytes_down": 0, "connections": 0}


def _ctx(tmp_path, systems, quick=True) -> Ctx:
    env = _env(tmp_path)
    return Ctx(quick=quick, seed=0, out_dir=tmp_path, work_dir=tmp_path, data_dir=env.data_dir,
               systems=systems, rtt_ms=60, mbit=None, bucket="b", seaweed=None, s3=None,
               s3_link=None, proxy=_Proxy(), sys_env=env, timeout_s=60)


def test_missing_peer_gives_an_error_row_and_the_run_goes_on(tmp_path, monkeypatch):
    monkeypatch.setattr(peers, "missing", lambda name: f"{name} not installed (pip install x)")
    ctx = _ctx(tmp_path, ["mosaic", "local"])
    rows = ctx.each_mounted("samples", ["mosaic", "local"],
                            lambda ctx, m: [{"phase": "cold", "value": 1.0, "unit": "files/s"}])
    assert rows[0]["system"] == "mosaic" and "\n" not in rows[0]["error"]
    assert "mosaic not installed" in rows[0]["error"]
    assert rows[1]["system"] == "local" and rows[1]["value"] == 1.0
    assert "ERROR mosaic not installed" in report.table(rows, {"argv": []}).replace(
        "SystemUnavailable: ", "")


def test_client_system_opens_without_a_mountpoint(tmp_path, monkeypatch):
    if peers.missing("s3torchconnector"):
        pytest.skip("s3torchconnector not installed")
    env = _env(tmp_path)
    os.environ.pop("AWS_ACCESS_KEY_ID", None)
    imported = []
    real = peers.import_peer
    monkeypatch.setattr(peers, "import_peer", lambda name: imported.append(name) or real(name))
    with make_system("s3torchconnector", env).open(MountOptions()) as m:
        # imported before the first row's clock: its start-up is not a row's time
        assert imported == ["s3torchconnector"]
        assert isinstance(m, Mounted) and m.kind == "client" and m.root is None
        assert os.environ["AWS_ACCESS_KEY_ID"] == "k"
        assert hasattr(m.client, "samples_epoch") and m.daemon_pids() == []
    assert "AWS_ACCESS_KEY_ID" not in os.environ      # the environment is restored


def test_cpu_meter_counts_reaped_children():
    import multiprocessing as mp

    m = cpu.CpuMeter().start()
    ps = [mp.get_context("fork").Process(target=_burn, args=(0.2,)) for _ in range(2)]
    for p in ps:
        p.start()
    for p in ps:
        p.join()
    r = m.stop()
    assert r["cpu_s"] >= 0.35 and r["cpu_daemon_s"] == 0


def _burn(s):
    import time
    t = time.process_time()
    while time.process_time() - t < s:
        pass


TREE = Dataset("train-files", "samples", {"files": 96, "classes": 4,
                                          "size_lo": 2000, "size_hi": 4000})


def test_train_files_on_local_rows(tmp_path, monkeypatch):
    """The train-files scenario body on local disk: two epoch rows with windows, stall,
    CPU and the uniform row shape; every sample verified."""
    pytest.importorskip("torch")
    monkeypatch.setattr(trainfiles, "dataset", lambda quick: TREE)
    monkeypatch.setattr(trainfiles, "COMPUTE_S", 0.001)
    monkeypatch.setattr(loader, "WORKERS", 2)
    ctx = _ctx(tmp_path, ["local"])
    monkeypatch.setattr(ctx, "add_dataset", lambda ds: materialize(ds, ctx.data_dir, 0))
    monkeypatch.setattr(trainfiles, "warm_loader_machinery", lambda workers=2: None)

    @contextlib.contextmanager
    def fake_local(system, opts=None):
        yield Mounted("local", ctx.data_dir, remote=False)
    monkeypatch.setattr(ctx, "mount", fake_local)
    rows = trainfiles.scenario(ctx)
    assert [r["phase"] for r in rows] == ["epoch1", "epoch2"]
    for r in rows:
        assert ROW_KEYS <= set(r) and "error" not in r
        assert r["verify_errors"] == 0 and r["samples"] == 96 and r["unit"] == "samples/s"
        assert r["windows"] and r["windows"][-1]["batch"] == r["batches"]
        assert 0 <= r["stall_fraction"] <= 1 and r["cpu_s"] > 0


def test_train_files_catches_corruption_and_reshuffles(tmp_path):
    pytest.importorskip("torch")
    man = materialize(TREE, tmp_path, 0)
    p = tmp_path / "train-files" / sorted(man["files"])[5]
    b = bytearray(p.read_bytes())
    b[100] ^= 1
    p.write_bytes(bytes(b))
    ld = trainfiles.mount_loader(tmp_path, "train-files", man, seed=1, workers=0)
    orders = []
    for e in (1, 2):
        orders.append([rec[0] for batch in ld.epoch(e) for rec in batch])
    assert orders[0] != orders[1] and sorted(orders[0]) == sorted(orders[1])
    r = loader.train_files(ld.epoch, man, 0.0, 2, 3)
    assert r["verify_errors"] == 1 and r["samples"] == 96


def test_train_files_rows_get_ratios_notes_and_one_plot_per_epoch(tmp_path):
    w = lambda v: [{"batch": b, "t": b / 10, "samples_per_s": v} for b in (10, 20, 30, 40)]  # noqa: E731
    rows = [{"scenario": "train-files", "system": s, "phase": ph, "value": v, "unit": "samples/s",
             "mbps": v / 10, "windows": w(v), "stall_fraction": 0.1, "cpu_s": 1.0,
             "workers": 8, "verify_errors": 0}
            for s, v in (("local", 1000.0), ("mosaic", 500.0)) for ph in ("epoch1", "epoch2")]
    rows[2]["conversion"] = {"format": "mds", "convert_s": 3.0, "upload_s": 1.0,
                             "converted_bytes": 10**8, "original_bytes": 10**8, "objects": 3}
    rows = report.annotate(rows)
    assert rows[2]["x_local"] == 0.5 and rows[2]["within5_batch"] is None
    text = report.table(rows, {"argv": []})
    assert "converted copy 100 MB (1.00x, 3 objects)" in text and "within 5% of local at batch never" in text
    made = report.plots(rows, tmp_path)
    assert [p.name for p in made] == ["train-files-epoch1.png", "train-files-epoch2.png"]


def test_mosaic_workers_do_not_inherit_the_parents_s3_client(tmp_path, monkeypatch):
    """streaming downloads index.json in this process and keeps the boto3 client; forked
    DataLoader workers that share its kept-alive socket store pieces of each other's
    responses as shards (mosaic-tuned's "Relative sample index .. is not present").
    The adapter drops the client before the loader forks; every sample still verifies."""
    pytest.importorskip("torch")
    if peers.missing("mosaic"):
        pytest.skip("mosaicml-streaming not installed")
    peers.import_streaming()
    from streaming.base.storage.download import S3Downloader
    man = materialize(TREE, tmp_path / "data", 0)
    mds = tmp_path / "mds"
    peers.convert("mds", tmp_path / "data" / "train-files", man, mds, 1)
    downloaders = []

    def fake_download(self, remote, local, timeout):
        self._s3_client = object()          # what a real download leaves behind
        downloaders.append(self)
        Path(local).write_bytes((mds / os.path.basename(remote)).read_bytes())
    monkeypatch.setattr(S3Downloader, "_download_file_impl", fake_download)
    monkeypatch.setattr(loader, "WORKERS", 2)
    client = peers.MosaicClient(peers.ClientSystem(_env(tmp_path), "mosaic"), tmp_path / "w")
    client.conv = {"prefix": "mds-1mb/train-files"}
    try:
        ld = client.loader("train-files", man, seed=1, batch=8)
        assert downloaders and all(d._s3_client is None for d in downloaders)
        r = loader.train_files(ld.epoch, man, 0.0, 10 ** 9, 1)
        assert r["verify_errors"] == 0 and r["samples"] == 96
    finally:
        client.close()


@pytest.mark.parametrize("peer", sorted(peers.PEERS))
def test_each_installed_peer_imports_as_its_workload_does(peer):
    """open() imports the library first; MosaicML's package __init__ needs torchvision,
    which these machines do not have (scripts/setup.sh): a plain import of it made
    every mosaic row an error."""
    if peers.missing(peer):
        pytest.skip(f"{peer} not installed")
    assert peers.import_peer(peer) is not None

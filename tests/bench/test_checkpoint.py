"""The checkpoint scenario (bench/scenarios/checkpoint.py): listed, its payload, and its local +
neuralcache path for real at a tiny size (SeaweedFS, the WAN proxy, a FUSE mount)."""
from __future__ import annotations

import contextlib
import io

import pytest

from bench.scenarios import checkpoint as ck
from bench.scenarios import registry as scenarios
from bench.report import results as report
from bench.scenarios.harness import Ctx
from bench.systems.base import SystemEnv
from bench.systems.registry import PEER_SYSTEMS
from conftest import delete_bucket, needs_fuse, new_bucket


def test_checkpoint_is_listed_and_opt_in(capsys):
    from bench import __main__ as cli

    assert cli.main(["list"]) == 0
    line = next(ln for ln in capsys.readouterr().out.splitlines()
                if ln.startswith("checkpoint "))
    assert "[not in 'all']" in line and "close" in line
    assert "checkpoint" not in scenarios.DEFAULT
    got = scenarios.systems_for("checkpoint", ["link", "local", "neuralcache",
                                               "neuralcache-hints", "rclone", *PEER_SYSTEMS])
    assert got == ["link", "local", "neuralcache", "rclone", "s3torchconnector"]


@pytest.mark.parametrize("use_torch", [True, False])
def test_payload_saves_what_it_hashes_and_checks_a_reload(monkeypatch, use_torch):
    if use_torch:
        pytest.importorskip("torch")
    else:
        _without_torch(monkeypatch)
    p = ck.Payload(16 << 20, seed=1)
    assert p.torch == use_torch
    buf = io.BytesIO()
    w = p.save(buf)
    data = buf.getvalue()
    assert w["bytes"] == len(data) >= 16 << 20
    assert w["xxh3"] == ck.xxhash.xxh3_64_hexdigest(data)
    assert p.load(io.BytesIO(data)) == 0
    other = io.BytesIO()
    ck.Payload(16 << 20, seed=2).save(other)
    assert p.load(io.BytesIO(other.getvalue())) > 0          # other bytes: caught


@contextlib.contextmanager
def _ctx(tmp_path, seaweed, s3, systems, proxy=True):
    from bench.wan import WanProxyProcess

    bucket = new_bucket(s3)
    host_port = seaweed.endpoint.rsplit("//", 1)[1]
    with (WanProxyProcess(host_port, rtt_ms=2) if proxy else contextlib.nullcontext()) as px:
        env = SystemEnv(work_dir=tmp_path / "mnt", data_dir=tmp_path / "data", bucket=bucket,
                        endpoint=px.endpoint if px else seaweed.endpoint,
                        access_key=seaweed.access_key, secret_key=seaweed.secret_key,
                        direct_endpoint=seaweed.endpoint)
        try:
            yield Ctx(quick=True, seed=0, out_dir=tmp_path, work_dir=tmp_path,
                      data_dir=env.data_dir, systems=systems, rtt_ms=2, mbit=None,
                      bucket=bucket, seaweed=seaweed, s3=s3,
                      s3_link=seaweed.client(px.endpoint) if px else None,
                      proxy=px or _NoProxy(), sys_env=env, timeout_s=60)
        finally:
            delete_bucket(s3, bucket)


class _NoProxy:
    proc = None

    def stats(self):
        return {"bytes_up": 0, "bytes_down": 0, "connections": 0}


def _without_torch(monkeypatch):
    real = ck.importlib.util.find_spec
    monkeypatch.setattr(ck.importlib.util, "find_spec",
                        lambda name, *a: None if name == "torch" else real(name, *a))


@needs_fuse
@pytest.mark.parametrize("use_torch", [True, False])
def test_checkpoint_scenario_local_and_neuralcache(tmp_path, seaweed, s3, monkeypatch,
                                                   use_torch):
    """The scenario for real at 24 MiB (more than two 8 MiB parts, so NeuralCache
    streams parts while the save writes): link, local and a --writable NeuralCache mount;
    every phase verified, durable by `neuralcache sync`, reloaded through a fresh mount;
    a torch state dict, and plain bytes as without torch."""
    monkeypatch.setattr(ck, "QUICK_BYTES", 24 << 20)
    if not use_torch:
        _without_torch(monkeypatch)
    with _ctx(tmp_path, seaweed, s3, ["link", "local", "neuralcache"]) as ctx:
        rows = ck.scenario(ctx)
        assert [r for r in rows if "error" in r] == []
        got = {(r["system"], r["phase"]) for r in rows}
        assert got == {(s, ph) for s in ("local", "neuralcache")
                       for ph in ("save", "durable", "reload")} | {
            ("link", "durable"), ("link", "reload")}
        by = {(r["system"], r["phase"]): r for r in rows}
        nc_save, nc_dur = by["neuralcache", "save"], by["neuralcache", "durable"]
        assert nc_dur["durable_by"] == "sync" and nc_dur["polls"] == 1
        assert nc_dur["seconds"] >= nc_save["seconds"] and nc_dur["xxh3"] == nc_save["xxh3"]
        assert "--writable" in nc_save["mount"]["cmd"]
        # every system started from the same state: dirty pages written back, the page
        # cache dropped and the store's files read back in (harness.Ctx.fresh_start)
        start = nc_save["mount"]["start"]
        assert start["method"] in ("drop_caches", "none") and start["store_bytes_warmed"] > 0
        head = s3.head_object(Bucket=ctx.bucket, Key="checkpoint/neuralcache/model.pt")
        assert head["ContentLength"] == nc_save["bytes"] >= 24 << 20
        assert by["local", "durable"]["durable_by"] == "fsync"
        for r in rows:
            if r["phase"] == "reload":
                assert r["verify_errors"] == 0 and r["unit"] == "MB/s" and r["value"] > 0
        assert nc_dur["link_bytes_up"] >= nc_save["bytes"]      # it went up the link
        assert "x_link_upload" in nc_dur and "x_local_close" in nc_save
        assert nc_save["x_local_durable"] == pytest.approx(
            nc_save["seconds"] / by["local", "durable"]["seconds"])
        assert any("x local close + fsync" in n for n in ctx.notes)
        assert "x_link_download" in by["neuralcache", "reload"]
        assert any(n.startswith("checkpoint neuralcache: close") for n in ctx.notes)
        assert not (ctx.data_dir / "checkpoint").exists()         # the local copy is gone
        text = report.table(report.annotate(rows), {"argv": []}, ctx.notes)
        assert "s close" in text and "s durable" in text


def test_checkpoint_bytes_that_differ_are_an_error_row(tmp_path, seaweed, s3, monkeypatch):
    """A save whose bytes are not what it hashed: an error row for `durable`, no reload."""
    monkeypatch.setattr(ck, "QUICK_BYTES", 1 << 20)
    real = ck.Payload.save
    monkeypatch.setattr(ck.Payload, "save", lambda self, f: {**real(self, f), "xxh3": "0"})
    with _ctx(tmp_path, seaweed, s3, ["local"], proxy=False) as ctx:
        rows = ck.scenario(ctx)
    assert [r["phase"] for r in rows] == ["save", "durable"]
    assert "!= written" in rows[1]["error"] and rows[1]["system"] == "local"

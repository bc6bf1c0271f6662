"""The ``maze`` bench scenario: train the maze LLaMA from each system, then cold-start it.

    python -m bench run --scenario maze --systems local,neuralcache,rclone [--quick]

1. Writes the maze training set (``bench.scenarios.maze.prepare``, both layouts) under the run's
   data dir and uploads the same bytes to the bucket under ``maze/``.
2. Per system (fresh mount, empty cache): runs ``python -m bench.scenarios.maze.train`` in its own
   process on the ``files`` layout (one small file per maze: a round trip per sample over
   the WAN) with a seeded sampler, ``WORKERS`` DataLoader workers and 1 torch thread. The
   job writes its planned read order to ``.neuralcache/hints`` where that exists (on a
   NeuralCache mount; nowhere else). Rows: samples/s overall and per window of batches,
   stall fraction, accuracy on the 64 eval mazes before/after, the bytes digest and the
   largest loss-curve difference against local.
3. Each run's checkpoint (safetensors) goes to ``maze/checkpoints/SYSTEM/``: NeuralCache
   is mounted ``--writable`` for training, the job saves its checkpoint into
   ``MNT/maze/checkpoints/SYSTEM/`` and ``neuralcache sync`` makes it durable (then it is
   fetched from the bucket for the comparisons); the other systems' checkpoints are
   uploaded from the job's local output.  Then per system mounts fresh again and times a
   new process loading the checkpoint that the first remote system trained and
   generating its first token (``bench.scenarios.maze.ttft``).
4. Writes ``maze_throughput.png`` (samples/s per batch window, all systems) and
   ``maze_loss.png`` (loss curves overlaid) next to results.json.
"""
from __future__ import annotations

import contextlib
import importlib.util
import json
import shutil
import subprocess
import sys
import time
import types
from pathlib import Path

import xxhash

from bench.report import results as report
from bench.scenarios import datasets
from bench.systems.base import MountOptions
from bench.systems.cpu import cpu_seconds

from . import config, data, prepare

PREFIX = "maze"
# DataLoader worker processes. Four keep rclone's per-file round trips (one at a time per
# worker) near the trainer's pace on this 2-core machine; more workers only add RSS.
WORKERS = 4
# Batches per samples/s window: 10 shows the warm-up (the seed's claim: within 100-150
# batches); the printed per-window table widens to 100 after the first 100 batches.
WINDOW = 10
# Watchdog per system: training is compute-bound at ~1 s/step on one core of this
# machine; a mount that stalls the job for 3x that is hung, not slow.
SECONDS_PER_STEP_LIMIT = 3.0
# Watchdog per system for the cold start (a fresh process loads the checkpoint).
TTFT_LIMIT_S = 600.0


# What the training and TTFT jobs import (pyproject's "torch" extra).
TORCH_MODULES = ("torch", "transformers", "safetensors")
INSTALL = "pip install 'neuralcache[torch]'"


def requirements() -> str | None:
    """None if the scenario can run here, else one line saying what to install (the
    runner asks before it starts anything)."""
    missing = [m for m in TORCH_MODULES if importlib.util.find_spec(m) is None]
    if missing:
        return f"the maze scenario needs {', '.join(missing)}: {INSTALL}"
    return None


def _limit_s(cfg: dict) -> float:
    return cfg["steps"] * SECONDS_PER_STEP_LIMIT + 600


def _dataset_dir(ctx) -> Path:
    return Path(ctx.data_dir) / PREFIX


def _prepare(ctx, cfg: dict) -> dict:
    """Write the data (reused when the manifest on disk matches) and upload it."""
    root = _dataset_dir(ctx)
    man_path = root / "manifest.json"
    want = {k: cfg[k] for k in ("rows", "cols", "n_train", "shard_size")}
    want.update(seed=ctx.seed, answer_format=cfg["fmt"])
    man = None
    with contextlib.suppress(OSError, ValueError):
        man = data.load_manifest(root)
        if any(man.get(k) != v for k, v in want.items()):
            man = None
    t0 = time.monotonic()
    if man is None:
        man = prepare(root, seed=ctx.seed, quick=ctx.quick)
    t1 = time.monotonic()
    files = dict(man["files"])
    files["manifest.json"] = {"size": man_path.stat().st_size}
    n = datasets.upload(types.SimpleNamespace(name=PREFIX), {"files": files}, ctx.data_dir,
                        ctx.s3, ctx.bucket)
    ctx.log(f"maze data: {len(files)} files, {sum(f['size'] for f in files.values()) / 1e6:.1f} MB "
            f"(generate {t1 - t0:.1f} s, upload {n / 1e6:.1f} MB {time.monotonic() - t1:.1f} s)")
    return man


def _writable(system: str) -> bool:
    """The systems whose training run saves its checkpoint through the mount."""
    return system.startswith("neuralcache")


def _train(ctx, root: Path, out: Path, cfg: dict, ckpt_dir: Path | None = None) -> dict:
    """One training job in a fresh process; returns its result.json.  The checkpoint goes
    to ``ckpt_dir`` (a writable mount) or OUT/checkpoint."""
    out.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, "-m", "bench.scenarios.maze.train", "--data-root", str(root),
           "--layout", "files", "--steps", str(cfg["steps"]),
           "--batch-size", str(cfg["batch_size"]), "--workers", str(WORKERS),
           "--threads", "1", "--preset", cfg["preset"], "--lr", str(cfg["lr"]),
           "--window", str(WINDOW), "--seed", str(ctx.seed), "--hints", "--out", str(out)]
    if ckpt_dir is not None:
        cmd += ["--checkpoint-dir", str(ckpt_dir)]
    with open(out / "train.log", "wb") as log:
        r = subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=log,
                           timeout=_limit_s(cfg))
    if r.returncode != 0:
        tail = (out / "train.log").read_text(errors="replace").strip().splitlines()[-1:]
        raise RuntimeError(f"training exited {r.returncode}: {tail[0] if tail else '?'}")
    return json.loads((out / "result.json").read_text())


def _ttft(ckpt: Path, out: Path) -> dict:
    r = subprocess.run([sys.executable, "-m", "bench.scenarios.maze.ttft", str(ckpt),
                        "--threads", "1"],
                       capture_output=True, text=True, timeout=600)
    (out / "ttft.log").write_text(r.stderr)
    if r.returncode != 0:
        raise RuntimeError(f"ttft exited {r.returncode}: {r.stderr.strip()[-200:]}")
    return json.loads(r.stdout.strip().splitlines()[-1])


def _upload_checkpoint(ctx, ckpt: Path, key_prefix: str) -> str:
    """Put the checkpoint files under key_prefix; returns the safetensors' xxh64."""
    digest = ""
    for f in sorted(ckpt.iterdir()):
        body = f.read_bytes()
        ctx.s3.put_object(Bucket=ctx.bucket, Key=f"{key_prefix}/{f.name}", Body=body)
        if f.suffix == ".safetensors":
            digest = xxhash.xxh64_hexdigest(body)
    return digest


def _fetch_checkpoint(ctx, key_prefix: str, dest: Path, written: dict[str, str]) -> str:
    """Download what a writable mount put under ``key_prefix`` (straight from SeaweedFS)
    into ``dest``, checking each file against the xxh64 the mount showed (``written``:
    name -> xxh64); returns the safetensors' xxh64."""
    shutil.rmtree(dest, ignore_errors=True)
    dest.mkdir(parents=True)
    got = {}
    pages = ctx.s3.get_paginator("list_objects_v2").paginate(Bucket=ctx.bucket,
                                                              Prefix=key_prefix + "/")
    for page in pages:
        for o in page.get("Contents", []):
            name = o["Key"][len(key_prefix) + 1:]
            if name in written:
                body = ctx.s3.get_object(Bucket=ctx.bucket, Key=o["Key"])["Body"].read()
                (dest / name).write_bytes(body)
                got[name] = xxhash.xxh64_hexdigest(body)
    if got != written:
        bad = sorted(n for n in written if got.get(n) != written[n])
        raise RuntimeError(f"after neuralcache sync the bucket lacks or differs in "
                           f"{', '.join(bad)} under {key_prefix}/")
    return next((d for n, d in got.items() if n.endswith(".safetensors")), "")


def _save_through_mount(ctx, m, r: dict) -> None:
    """The job saved its checkpoint into the writable mount: sync, then check and fetch
    what landed in the bucket (the local copy the TTFT phase and local disk use)."""
    ck = Path(r["_result"]["checkpoint"])
    written = {f.name: xxhash.xxh64_hexdigest(f.read_bytes())
               for f in sorted(ck.iterdir()) if f.is_file()}
    t0 = time.monotonic()
    m.sync()
    r["checkpoint_sync_s"] = time.monotonic() - t0
    local = Path(ctx.out_dir) / "maze" / m.name / "checkpoint"
    r["checkpoint_xxh64"] = _fetch_checkpoint(ctx, f"{PREFIX}/checkpoints/{m.name}", local,
                                              written)
    r["checkpoint_via"] = "mount"
    r["_result"]["checkpoint"] = str(local)


def _cpu_s(pids: list[int | None]) -> list[float | None]:
    """utime + stime per process (None for a missing or finished one)."""
    out = []
    for pid in pids:
        try:
            out.append(cpu_seconds(pid) if pid else None)
        except (OSError, IndexError, ValueError):
            out.append(None)
    return out


def _remote_side_pids(ctx) -> list[int]:
    """SeaweedFS and the WAN proxy: the emulated far side, which shares this machine's
    two cores with the job (on a real cluster it runs elsewhere)."""
    return [p.pid for p in (getattr(ctx.seaweed, "proc", None), getattr(ctx.proxy, "proc", None))
            if p is not None]


def _windows(res: dict) -> list[dict]:
    """The job's windows in the harness's shape (``batch`` = last batch of the window)."""
    return [{"batch": w["last_step"], "samples_per_s": w["samples_per_s"],
             "stall_fraction": w["stall_fraction"], "loss": w["loss"]}
            for w in res["windows"] if w["samples_per_s"]]


def _rate(per_batch: list[dict], lo: int, hi: int) -> float | None:
    """samples/s over batches lo..hi (1-based, inclusive)."""
    sel = per_batch[lo - 1:hi]
    dur = sum(b["step_s"] for b in sel)
    return sum(b["samples"] for b in sel) / dur if dur else None


def window_table(results: dict[str, dict], steps: int) -> list[str]:
    """Samples/s per window of batches, one column per system (10-batch windows for the
    first 100 batches, then 100-batch windows)."""
    edges = [(a, min(a + WINDOW - 1, steps)) for a in range(1, min(steps, 100) + 1, WINDOW)]
    edges += [(a, min(a + 99, steps)) for a in range(101, steps + 1, 100)]
    names = list(results)
    lines = ["maze samples/s per window of batches: "
             + f"{'batches':>11} " + " ".join(f"{n:>12}" for n in names)]
    for lo, hi in edges:
        cells = []
        for n in names:
            v = _rate(results[n]["per_batch"], lo, hi)
            cells.append(f"{v:12.1f}" if v is not None else f"{'-':>12}")
        lines.append(f"{'':39}{f'{lo}-{hi}':>11} " + " ".join(cells))
    return lines


def _plots(ctx, results: dict[str, dict]) -> None:
    out = Path(ctx.out_dir)
    report.windows_plot(out / "maze_throughput.png",
                        [(f"{name} ({res['samples_per_s']:.1f} samples/s overall)", _windows(res))
                         for name, res in results.items()],
                        f"maze training over a {ctx.rtt_ms:.0f} ms link: samples/s per window",
                        xlabel=f"batch (windows of {WINDOW})")

    fig, ax = report.pyplot().subplots(figsize=(8, 4.5))
    styles = ["-", "--", ":", "-."]
    for i, (name, res) in enumerate(results.items()):
        ax.plot(range(1, len(res["loss_curve"]) + 1), res["loss_curve"],
                ls=styles[i % len(styles)], lw=1.2, label=name)
    ax.set_yscale("log")
    ax.set_xlabel("batch")
    ax.set_ylabel("loss (answer tokens)")
    ax.set_title("maze training: loss curves (identical bytes give identical curves)")
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    report.save_figure(fig, out / "maze_loss.png")


def scenario(ctx) -> list[dict]:
    """The maze LLaMA trained from each system, then its cold time-to-first-token."""
    missing = requirements()
    if missing:
        raise RuntimeError(missing)
    cfg = config(ctx.quick)
    man = _prepare(ctx, cfg)
    systems = [s for s in ctx.systems if s != "link"]
    if "link" in ctx.systems:
        ctx.notes.append("maze: no link row (the job is compute-bound; see the samples "
                         "scenario for the per-file ceiling)")
    out_base = Path(ctx.out_dir) / "maze"
    results: dict[str, dict] = {}
    ckpt_digest: dict[str, str] = {}

    def train(ctx, m) -> list[dict]:
        # the mount daemon (rclone/s3fs: their process; neuralcache: its stats)
        pids = [m.info.get("pid") or (m.stats() or {}).get("pid")]
        pids += _remote_side_pids(ctx)
        cpu0 = _cpu_s(pids)
        ckpt_dir = m.root / PREFIX / "checkpoints" / m.name if m.sync_fn else None
        r = ctx.measure(m, "train", lambda: _as_row(_train(
            ctx, m.root / PREFIX, out_base / m.name, cfg, ckpt_dir)))
        cpu1 = _cpu_s(pids)
        d = [b - a if a is not None and b is not None else None for a, b in zip(cpu0, cpu1)]
        r["daemon_cpu_s"] = d[0]
        r["remote_side_cpu_s"] = sum(x for x in d[1:] if x is not None)
        if ckpt_dir is not None:
            _save_through_mount(ctx, m, r)
        else:
            r["checkpoint_xxh64"] = _upload_checkpoint(
                ctx, Path(r["_result"]["checkpoint"]), f"{PREFIX}/checkpoints/{m.name}")
            r["checkpoint_via"] = "upload"
        return [r]

    rows = []
    for s in systems:          # NeuralCache writable: the job saves through the mount
        rows += ctx.each_mounted("maze", [s], train, timeout_s=_limit_s(cfg), phase="train",
                                 step=f"train ({cfg['steps']} steps x {cfg['batch_size']})",
                                 opts=MountOptions(writable=_writable(s)))
    for r in rows:                      # the systems that trained and unmounted cleanly
        if "_result" in r:
            results[r["system"]] = r.pop("_result")
            ckpt_digest[r["system"]] = r["checkpoint_xxh64"]

    # Compare each run with local: the same bytes in the same order, the same loss curve.
    ref = results.get("local")
    for r in rows:
        res = results.get(r["system"])
        if res is None or ref is None or "error" in r or r["system"] == "local":
            continue
        r["same_bytes_as_local"] = res["bytes_digest"] == ref["bytes_digest"]
        n = min(len(res["loss_curve"]), len(ref["loss_curve"]))
        r["loss_max_diff"] = max((abs(a - b) for a, b in
                                  zip(res["loss_curve"][:n], ref["loss_curve"][:n])), default=None)
        r["same_weights_as_local"] = ckpt_digest.get(r["system"]) == ckpt_digest.get("local")

    # Cold start: a fresh process loads one checkpoint through each fresh mount.
    trained = [s for s in systems if s in results]
    source = next((s for s in trained if s != "local"), trained[0] if trained else None)
    if source is not None:
        key_dir = f"{PREFIX}/checkpoints/{source}"
        local_ckpt = _dataset_dir(ctx) / "checkpoints" / source
        shutil.copytree(results[source]["checkpoint"], local_ckpt, dirs_exist_ok=True)
        ctx.notes.append(f"maze ttft: a fresh `python -m bench.scenarios.maze.ttft` process "
                         f"loads {key_dir}/ (trained on {source}, {ckpt_digest[source]}) "
                         "through a fresh mount with an empty cache; local: page cache "
                         "dropped first")

        def ttft(ctx, m) -> list[dict]:
            ck = m.root / PREFIX / "checkpoints" / source
            return [ctx.measure(m, "ttft", lambda: _ttft_row(ck, out_base / m.name))]

        rows += ctx.each_mounted("maze", systems, ttft, timeout_s=TTFT_LIMIT_S, phase="ttft",
                                 step="ttft")

    if results:
        ctx.notes.extend(_summary(results, rows, cfg, man))
        try:
            _plots(ctx, results)
        except Exception as exc:  # plots are a nicety; never lose the results over them
            ctx.log(f"maze plots failed: {exc}")
    return rows


def _as_row(res: dict) -> dict:
    return {"value": res["samples_per_s"], "unit": "samples/s", "bytes": res["bytes_read"],
            "seconds": res["train_s"], "windows": _windows(res),
            "stall_fraction": res["stall_fraction"],
            "accuracy_before": res["accuracy_before"], "accuracy_after": res["accuracy_after"],
            "bytes_digest": res["bytes_digest"], "cpu_s": res["cpu_s"],
            "cpu_workers_s": res["cpu_workers_s"], "hints": res["hints"],
            "steps": res["steps"], "_result": res}


def _ttft_row(ckpt: Path, out: Path) -> dict:
    out.mkdir(parents=True, exist_ok=True)
    t = _ttft(ckpt, out)
    return {"value": t["ttft_s"], "unit": "s ttft", "bytes": t["ckpt_bytes"],
            "seconds": t["ttft_s"], "load_s": t["load_s"], "first_token_s": t["first_token_s"],
            "import_s": t["import_s"], "total_s": t["total_s"],
            "first_token_correct": t["first_token_correct"]}


def _summary(results: dict, rows: list[dict], cfg: dict, man: dict) -> list[str]:
    any_res = next(iter(results.values()))
    lines = [f"maze: {man['rows']}x{man['cols']} mazes, {man['n_train']} training files "
             f"(one per maze, layout 'files'), {any_res['n_params'] / 1e6:.2f} M-param LLaMA, "
             f"{cfg['steps']} steps x {cfg['batch_size']}, {WORKERS} DataLoader workers, "
             "1 torch thread; the job writes its read order to .neuralcache/hints where it exists"]
    for r in rows:
        if r.get("phase") != "train" or "error" in r:
            continue
        res = results[r["system"]]
        parts = [f"maze {r['system']}: {res['samples_per_s']:.1f} samples/s",
                 f"accuracy {res['accuracy_before']:.1%} -> {res['accuracy_after']:.1%}",
                 f"CPU: trainer {res['cpu_s']:.0f} s"
                 + (f", mount daemon {r['daemon_cpu_s']:.0f} s" if r.get("daemon_cpu_s") else "")
                 + f", SeaweedFS + WAN proxy {r.get('remote_side_cpu_s') or 0:.0f} s"]
        if r.get("checkpoint_via") == "mount":
            parts.append(f"checkpoint saved through the mount (--writable), neuralcache "
                         f"sync {r['checkpoint_sync_s']:.1f} s, checked in the bucket")
        if "same_bytes_as_local" in r:
            parts.append("same bytes as local" if r["same_bytes_as_local"]
                         else "BYTES DIFFER FROM LOCAL")
            parts.append(f"loss curve max |diff| vs local {r['loss_max_diff']:.3g}")
            parts.append("same weights" if r["same_weights_as_local"] else "weights differ")
        lines.append("; ".join(parts))
    lines += window_table(results, cfg["steps"])
    return lines

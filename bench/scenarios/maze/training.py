"""Train the maze LLaMA from a data root (local disk or a mount) and report what happened.

    python -m bench.scenarios.maze.train --data-root DIR --layout files|shards --steps N \
        --batch-size B --workers W --out OUTDIR [--seed S] [--preset small] [--eval-every K]
        [--checkpoint-dir DIR]

Determinism: the model init, the sampler order (files) or shard order + shuffle buffers
(shards), the thread count and the optimizer are all fixed by --seed, so two runs that read
identical bytes produce an identical loss curve. `bytes_digest` folds the xxh64 of every
sample the DataLoader delivered, in delivery order, so the harness can check that local
disk and a mount served the same bytes in the same order.
"""
from __future__ import annotations

import argparse
import json
import math
import resource
import struct
import sys
import time
from pathlib import Path

import xxhash

from . import data, mazes

DEFAULTS = {"steps": 3000, "batch_size": 64, "workers": 2, "lr": 2e-3, "preset": "small",
            "threads": 1, "window": 10}


def planned_batches(n: int, steps: int, batch_size: int, seed: int) -> list[list[int]]:
    """Shuffled epochs over range(n), one seeded permutation per epoch, cut into batches."""
    import torch

    order: list[int] = []
    epoch = 0
    while len(order) < steps * batch_size:
        g = torch.Generator().manual_seed(seed * 1_000_003 + epoch)
        order += torch.randperm(n, generator=g).tolist()
        epoch += 1
    return [order[i * batch_size:(i + 1) * batch_size] for i in range(steps)]


def _write_hints(root: Path, paths: list[str]) -> str:
    """Hand the read order to the NeuralCache mount holding ``root`` (its control
    directory may sit above the data root); harmless anywhere else."""
    try:
        from neuralcache.hints import HintError, publish_order
    except ImportError:
        return "neuralcache not installed"
    try:
        n = publish_order(str(root), [str(root / p) for p in paths])
    except HintError as e:
        return f"not sent: {e}"
    except OSError as e:
        return f"refused: {e}"
    return f"ok ({n} paths)"


def _lr_lambda(steps: int):
    warm = max(1, min(100, steps // 10))

    def f(s: int) -> float:
        if s < warm:
            return (s + 1) / warm
        return 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(1.0, (s - warm) / max(1, steps - warm))))
    return f


def _cpu_s(who) -> float:
    r = resource.getrusage(who)
    return r.ru_utime + r.ru_stime


def train(data_root, *, layout: str = "files", steps: int = DEFAULTS["steps"],
          batch_size: int = DEFAULTS["batch_size"], workers: int = DEFAULTS["workers"],
          out=None, seed: int = 0, preset: str = DEFAULTS["preset"], lr: float = DEFAULTS["lr"],
          threads: int = DEFAULTS["threads"], window: int = DEFAULTS["window"],
          eval_every: int = 0, hints: bool = False, log=None, checkpoint_dir=None) -> dict:
    """Run one training job; returns the result dict (also written to OUT/result.json).
    The checkpoint goes to ``checkpoint_dir`` (default OUT/checkpoint), e.g. a writable
    mount."""
    import torch
    from torch.utils.data import DataLoader

    from . import model as M

    t_start = time.perf_counter()
    cpu0, cpu_children0 = _cpu_s(resource.RUSAGE_SELF), _cpu_s(resource.RUSAGE_CHILDREN)
    torch.set_num_threads(threads)
    torch.use_deterministic_algorithms(True, warn_only=True)
    root = Path(data_root)
    man = data.load_manifest(root)
    rows, cols = man["rows"], man["cols"]
    eval_tasks = mazes.eval_set(rows, cols, man["eval_seed"], man.get("n_eval", 64))
    fmt = man.get("answer_format", "path")

    net = M.build(rows, cols, preset, seed)
    net.config.maze_rows, net.config.maze_cols = rows, cols
    net.config.maze_eval_seed = man["eval_seed"]
    net.config.maze_answer_format = fmt
    opt = torch.optim.AdamW(net.parameters(), lr=lr, weight_decay=0.01, betas=(0.9, 0.98))
    sched = torch.optim.lr_scheduler.LambdaLR(opt, _lr_lambda(steps))

    te = time.perf_counter()
    evals = [{"step": 0, **M.evaluate(net, eval_tasks, fmt)}]
    eval_s = time.perf_counter() - te

    hint_status = "off"
    if layout == "files":
        batches = planned_batches(man["n_train"], steps, batch_size, seed)
        if hints:
            hint_status = _write_hints(root, [data.file_relpath(i) for b in batches for i in b])
        loader = DataLoader(data.file_dataset(root, man["n_train"]), batch_sampler=batches,
                            num_workers=workers, collate_fn=data.collate)
    elif layout == "shards":
        n_sh = man["n_shards"]
        if hints:
            epochs = math.ceil(steps * batch_size / man["n_train"]) + 1
            hint_status = _write_hints(root, [data.shard_relpath(k) for e in range(epochs)
                                              for k in data.shard_order(n_sh, seed, e)])
        loader = DataLoader(data.shard_dataset(root, n_sh, seed), batch_size=batch_size,
                            num_workers=workers, collate_fn=data.collate)
    else:
        raise ValueError(f"unknown layout {layout!r}")

    digest = xxhash.xxh64()
    nbytes = 0
    per_batch = []
    net.train()
    t_train0 = time.perf_counter()
    t_prev = t_train0
    it = iter(loader)
    for step in range(1, steps + 1):
        batch = next(it)
        t_got = time.perf_counter()
        for d in batch["digest"]:
            digest.update(struct.pack("<Q", d))
        nbytes += batch["nbytes"]
        loss = M.path_loss(net, batch["input_ids"], batch["labels"])
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(net.parameters(), 1.0)
        opt.step()
        sched.step()
        t_done = time.perf_counter()
        per_batch.append({"step": step, "t": round(t_done - t_train0, 6),
                          "wait_s": round(t_got - t_prev, 6), "step_s": round(t_done - t_prev, 6),
                          "samples": len(batch["digest"]), "loss": loss.item()})
        if log and (step % 50 == 0 or step == steps):
            log(f"step {step}/{steps} loss {loss.item():.4f} "
                f"{len(batch['digest']) / (t_done - t_prev):.1f} samples/s")
        if eval_every and step % eval_every == 0 and step != steps:
            te = time.perf_counter()
            evals.append({"step": step, **M.evaluate(net, eval_tasks, fmt)})
            eval_s += time.perf_counter() - te
            if log:
                log(f"eval step {step}: accuracy {evals[-1]['accuracy']:.4f}")
            t_done = time.perf_counter()
        t_prev = t_done
    del it, loader  # stops the workers; their CPU time lands in RUSAGE_CHILDREN
    train_s = sum(b["step_s"] for b in per_batch)

    te = time.perf_counter()
    evals.append({"step": steps, **M.evaluate(net, eval_tasks, fmt)})
    eval_s += time.perf_counter() - te

    ckpt = None
    if out is not None or checkpoint_dir is not None:
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()
        ckpt = Path(checkpoint_dir) if checkpoint_dir is not None else Path(out) / "checkpoint"
        net.save_pretrained(ckpt, safe_serialization=True)

    samples = sum(b["samples"] for b in per_batch)
    windows = []
    for i in range(0, len(per_batch), window):
        w = per_batch[i:i + window]
        dur = sum(b["step_s"] for b in w)
        windows.append({"first_step": w[0]["step"], "last_step": w[-1]["step"],
                        "samples_per_s": sum(b["samples"] for b in w) / dur if dur else None,
                        "stall_fraction": sum(b["wait_s"] for b in w) / dur if dur else None,
                        "loss": sum(b["loss"] for b in w) / len(w)})
    result = {
        "data_root": str(root), "layout": layout, "steps": steps, "batch_size": batch_size,
        "workers": workers, "seed": seed, "preset": preset, "lr": lr, "threads": threads,
        "grid": [rows, cols], "answer_format": fmt, "n_train": man["n_train"], "n_params": M.n_params(net),
        "torch": torch.__version__,
        "samples": samples, "train_s": train_s,
        "samples_per_s": samples / train_s if train_s else None,
        "stall_fraction": sum(b["wait_s"] for b in per_batch) / train_s if train_s else None,
        "windows": windows,
        "loss_curve": [b["loss"] for b in per_batch],
        "per_batch": per_batch,
        "accuracy_before": evals[0]["accuracy"], "accuracy_after": evals[-1]["accuracy"],
        "evals": evals, "eval_s": eval_s,
        "bytes_read": nbytes, "bytes_digest": digest.hexdigest(),
        "hints": hint_status,
        "wall_s": time.perf_counter() - t_start,
        "cpu_s": _cpu_s(resource.RUSAGE_SELF) - cpu0,
        "cpu_workers_s": _cpu_s(resource.RUSAGE_CHILDREN) - cpu_children0,
        "checkpoint": str(ckpt) if ckpt else None,
    }
    if out is not None:
        Path(out).mkdir(parents=True, exist_ok=True)
        (Path(out) / "result.json").write_text(json.dumps(result, indent=1))
    return result


def summary(result: dict) -> dict:
    """The result without the per-batch arrays, for printing."""
    return {k: v for k, v in result.items() if k not in ("per_batch", "loss_curve", "windows")}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.scenarios.maze.train", description=__doc__.split("\n")[0])
    p.add_argument("--data-root", required=True, help="directory written by bench.scenarios.maze.prepare (or a mount of it)")
    p.add_argument("--layout", choices=["files", "shards"], default="files")
    p.add_argument("--steps", type=int, default=DEFAULTS["steps"])
    p.add_argument("--batch-size", type=int, default=DEFAULTS["batch_size"])
    p.add_argument("--workers", type=int, default=DEFAULTS["workers"])
    p.add_argument("--out", required=True, help="writes result.json and checkpoint/ here")
    p.add_argument("--checkpoint-dir", default=None,
                   help="save the checkpoint here instead of OUT/checkpoint (e.g. on a "
                        "writable mount)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--preset", default=DEFAULTS["preset"], help="model size: tiny|small|base")
    p.add_argument("--lr", type=float, default=DEFAULTS["lr"])
    p.add_argument("--threads", type=int, default=DEFAULTS["threads"], help="torch intra-op threads (fixed for determinism; 1 leaves a core to the I/O stack)")
    p.add_argument("--window", type=int, default=DEFAULTS["window"], help="batches per samples/s window")
    p.add_argument("--eval-every", type=int, default=0, help="also evaluate every K steps (0: before/after only)")
    p.add_argument("--hints", action="store_true", help="write the read order to DATA_ROOT/.neuralcache/hints if present")
    p.add_argument("--full-json", action="store_true", help="print the per-batch arrays too")
    a = p.parse_args(argv)
    try:
        data.load_manifest(a.data_root)
    except (OSError, ValueError) as e:
        print(f"bench.scenarios.maze.train: cannot read manifest under {a.data_root}: {e}", file=sys.stderr)
        return 1
    res = train(a.data_root, layout=a.layout, steps=a.steps, batch_size=a.batch_size,
                workers=a.workers, out=a.out, seed=a.seed, preset=a.preset, lr=a.lr,
                threads=a.threads, window=a.window, eval_every=a.eval_every, hints=a.hints,
                checkpoint_dir=a.checkpoint_dir,
                log=lambda m: print(m, file=sys.stderr, flush=True))
    print(json.dumps(res if a.full_json else summary(res), indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())

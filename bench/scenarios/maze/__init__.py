"""The maze-solving LLaMA demo, at CPU scale: data, model, training, cold start.

    from bench.scenarios import maze
    manifest = maze.prepare("/data/maze", seed=0, quick=False)   # write the training set
    result = maze.train("/mnt/maze", layout="files", steps=..., out="/tmp/run")

See README.md next to this file for the CLI and the measured trajectories. torch and
transformers are imported only by `train` (and bench.scenarios.maze.model / ttft), so `prepare`
works without them.
"""
from __future__ import annotations

from . import data, mazes

# The configurations the harness runs. `quick` measures throughput and warm-up only
# (a few minutes); `full` trains to >= 95 % on the 64 eval mazes (see README.md).
# 4x4 grids: a step costs ~1 CPU-s here, and the exploration runs in README.md reached
# 96.9 % by step 1000, so 1200 steps fit the 30 CPU-minute budget of the demo. 5x5 (HARD)
# needs ~2000 steps at ~1.4 CPU-s each (98.4 % at 2000, 100 % at 3000; ~69 CPU-minutes).
FULL = {"rows": 4, "cols": 4, "n_train": 32_768, "shard_size": 2048, "fmt": "walk",
        "steps": 1200, "batch_size": 64, "preset": "small", "lr": 2e-3}
QUICK = {"rows": 4, "cols": 4, "n_train": 8_192, "shard_size": 1024, "fmt": "walk",
         "steps": 100, "batch_size": 64, "preset": "small", "lr": 2e-3}
HARD = {"rows": 5, "cols": 5, "n_train": 50_000, "shard_size": 2048, "fmt": "walk",
        "steps": 3000, "batch_size": 64, "preset": "small", "lr": 2e-3}


def config(quick: bool) -> dict:
    return dict(QUICK if quick else FULL)


def prepare(out_dir, seed: int = 0, quick: bool = False, *, layouts=("files", "shards"),
            pad_to: int = 0, **overrides) -> dict:
    """Write the training set (both layouts by default) under out_dir; return the manifest.

    Deterministic: the same (seed, quick, overrides) always give byte-identical files.
    """
    cfg = config(quick)
    cfg.update(overrides)
    return data.write_dataset(out_dir, seed=seed, rows=cfg["rows"], cols=cfg["cols"],
                              n_train=cfg["n_train"], layouts=layouts,
                              shard_size=cfg["shard_size"], pad_to=pad_to, fmt=cfg["fmt"])


def train(data_root, *, quick: bool = False, **kwargs) -> dict:
    """Train from data_root; defaults come from the quick/full config, kwargs override.

    kwargs are those of bench.scenarios.maze.training.train (layout, steps, batch_size,
    workers, out, seed, preset, lr, threads, window, eval_every, hints, log).
    """
    from . import training as _train

    cfg = config(quick)
    opts = {"steps": cfg["steps"], "batch_size": cfg["batch_size"], "preset": cfg["preset"],
            "lr": cfg["lr"]}
    opts.update(kwargs)
    return _train.train(data_root, **opts)


__all__ = ["prepare", "train", "config", "FULL", "QUICK", "HARD", "data", "mazes"]

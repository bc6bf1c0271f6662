"""The ``train-files`` workload: an ImageNet-like training loop the loader can lose.

Per-file samples (~100 KB ``nCLASS/IDX.jpg``), a ``torch.utils.data.DataLoader`` with
``WORKERS`` (8) worker processes and batches of ``BATCH`` (32), two epochs with a
reshuffle, and a fixed "GPU" step per batch (a sleep of ``COMPUTE_S``) at which local
disk delivers about ``TARGET_SAMPLES_PER_S`` (1,000) samples/s on this machine.  Any
shortfall is the loader's: at 1,000 samples/s a worker that reads its batch's 32 files
one after another over a 60 ms link (one round trip each) cannot keep up, so this loop
separates systems that prefetch from those that do not.

Every system produces batches of records ``(path, label, bytes, xxh3 ok)``: the worker
reads a sample, verifies it against the manifest and hands on only the record (decoding
and augmentation are not modelled; the compute step stands for them and the model).
The systems differ only in where the batches come from:

* a mount or local disk: ``FilesDataset`` (a plain map-style dataset over the files)
  with ``EpochSampler`` (a seeded permutation per epoch), optionally wrapped in
  ``neuralcache.torch.HintingSampler`` (the ``neuralcache-hints`` system);
* s3torchconnector: ``S3MapDataset`` with the same sampler (bench/systems/peers.py);
* MosaicML Streaming and LitData: their own datasets and loaders over their converted
  copies, shuffled by their own seeded algorithms (bench/systems/peers.py).

Calibration of ``COMPUTE_S`` (redo it when the machine changes): run the local system
with no compute step (``python -m bench.trainfiles calibrate``, which generates the
full-size dataset under /tmp, drops the page cache and prints the loader's own rate from
a cold and a warm disk and the per-batch loop overhead), then ``COMPUTE_S = BATCH /
TARGET - LOOP_OVERHEAD_S``; check that ``local`` in a run lands near 1,000 samples/s.
"""
from __future__ import annotations

import os
import random
import time
from pathlib import Path
from typing import Iterable

import xxhash

from bench.scenarios.datasets import Dataset

TARGET_SAMPLES_PER_S = 1000.0
BATCH = 32
WORKERS = 8
WINDOW = 10          # batches per throughput window (5 in --quick)
# Per-batch cost of the loop itself with the loader far ahead (next() on a ready batch:
# unpickling 32 records, bookkeeping, the sleep's own overshoot), measured by `calibrate`
# here: 6 ms with the machine's 2 cores loaded by others (load average 5), ~4 ms quieter.
# Calibration on 2026-12 (this VM): the loader alone delivers 3,800 samples/s from a cold
# local disk and 5,200 warm, so at COMPUTE_S the local run is compute-bound (~1,000/s).
LOOP_OVERHEAD_S = 0.005
COMPUTE_S = max(BATCH / TARGET_SAMPLES_PER_S - LOOP_OVERHEAD_S, 0.0)
EPOCHS = 2


def dataset(quick: bool) -> Dataset:
    """4,096 / 512 files of 80-120 KB in 32 / 8 class directories."""
    return Dataset("train-files", "samples", {"files": 512 if quick else 4096,
                                              "classes": 8 if quick else 32,
                                              "size_lo": 80_000, "size_hi": 120_000})


def label_of(rel: str) -> int:
    """The class index of ``nCCCC/IDX.jpg``."""
    return int(rel.split("/", 1)[0][1:])


class Verify:
    """A sample's bytes -> the record ``(path, label, bytes, ok)`` (picklable)."""

    def __init__(self, manifest: dict):
        self.expect = {rel: m["xxh3"] for rel, m in manifest["files"].items()}

    def __call__(self, rel: str, data) -> tuple:
        return (rel, label_of(rel), len(data),
                xxhash.xxh3_64_hexdigest(data) == self.expect.get(rel))


class FilesDataset:
    """Map-style dataset over ``root/<rel>`` for the sorted paths of a manifest."""

    def __init__(self, root: Path, manifest: dict):
        self.root = Path(root)
        self.paths = sorted(manifest["files"])
        self.verify = Verify(manifest)

    def __len__(self):
        return len(self.paths)

    def __getitem__(self, i):
        rel = self.paths[i]
        with open(self.root / rel, "rb", buffering=0) as f:
            data = f.read()
        return self.verify(rel, data)


class EpochSampler:
    """A seeded permutation of ``range(n)``, new each epoch (``set_epoch``)."""

    def __init__(self, n: int, seed: int):
        self.n, self.seed, self.epoch = n, seed, 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __iter__(self):
        order = list(range(self.n))
        random.Random(self.seed * 1000 + self.epoch).shuffle(order)
        return iter(order)

    def __len__(self):
        return self.n


def records(batch) -> list[tuple]:
    return list(batch)


class MapLoader:
    """A DataLoader over a map-style dataset with ``EpochSampler`` (optionally wrapped
    by ``wrap(sampler)``, e.g. HintingSampler); ``epoch(e)`` -> iterable of batches."""

    def __init__(self, ds, seed: int, workers: int = WORKERS, wrap=None,
                 batch: int = BATCH):
        import torch
        from torch.utils.data import DataLoader

        torch.set_num_threads(1)
        self.base = EpochSampler(len(ds), seed)
        self.sampler = wrap(self.base) if wrap else self.base
        self.loader = DataLoader(ds, batch_size=batch, sampler=self.sampler,
                                 num_workers=workers, collate_fn=records)
        self.workers = workers

    def epoch(self, e: int) -> Iterable:
        self.sampler.set_epoch(e)
        return self.loader


def mount_loader(root: Path, ds_name: str, manifest: dict, seed: int,
                 hints: bool = False, workers: int | None = None) -> MapLoader:
    """The plain map-style pipeline over a directory (local disk or a mount)."""
    workers = WORKERS if workers is None else workers
    ds = FilesDataset(Path(root) / ds_name, manifest)
    wrap = None
    if hints:
        from neuralcache.torch import HintingSampler

        paths = [f"{ds_name}/{rel}" for rel in ds.paths]
        wrap = lambda s: HintingSampler(s, paths=paths, mountpoint=str(root))  # noqa: E731
    return MapLoader(ds, seed, workers=workers, wrap=wrap)


def warm_loader_machinery(workers: int | None = None) -> None:
    """Start and stop ``workers`` DataLoader workers on a dummy dataset (not timed).

    Local disk's cold run follows ``drop_caches``, which also evicts torch's own
    libraries: without this the first epoch would time paging torch back in.  Done for
    every system, so each epoch 1 times the data, not the library's first page-in.
    """
    from torch.utils.data import DataLoader

    workers = WORKERS if workers is None else workers
    for _ in DataLoader(list(range(workers * 2)), batch_size=2, num_workers=workers):
        pass


def quiet_torch_warnings() -> None:
    import warnings

    warnings.filterwarnings("ignore", message=".*worker processes in total.*")


def run_epoch(batches: Iterable, compute_s: float = COMPUTE_S, window: int = WINDOW,
              batch: int = BATCH, t0: float | None = None) -> dict:
    """Consume one epoch: take a batch, "compute" ``compute_s * n / batch`` (a sleep).

    ``t0``: the clock start (default now), so that building a loader can count too.
    Returns samples/s overall and per window of ``window`` batches, the stall fraction
    (time waiting for a batch / wall time) and the verification counts.
    """
    t0 = time.monotonic() if t0 is None else t0
    stamps, counts = [], []
    wait = 0.0
    nbytes = samples = bad = 0
    seen: set[str] = set()
    it = iter(batches)
    while True:
        tw = time.monotonic()
        try:
            b = next(it)
        except StopIteration:
            break
        wait += time.monotonic() - tw
        for rel, _label, n, ok in b:
            nbytes += n
            bad += not ok
            seen.add(rel)
        time.sleep(compute_s * len(b) / batch)      # the "GPU" step
        samples += len(b)
        counts.append(len(b))
        stamps.append(time.monotonic() - t0)
    dt = time.monotonic() - t0
    windows = []
    for i in range(0, len(stamps), window):
        j = min(i + window, len(stamps)) - 1
        start = stamps[i - 1] if i else 0.0
        windows.append({"batch": j + 1, "t": round(stamps[j], 3),
                        "samples_per_s": sum(counts[i:j + 1]) / max(stamps[j] - start, 1e-9)})
    return {"seconds": dt, "bytes": nbytes, "samples": samples, "distinct": len(seen),
            "batches": len(stamps), "verify_errors": bad, "value": samples / dt,
            "unit": "samples/s", "mbps": nbytes / dt / 1e6, "stall_fraction": wait / dt,
            "windows": windows, "compute_s_per_batch": compute_s, "batch_size": batch}


def check_epoch(res: dict, manifest: dict) -> dict:
    """Count samples missing from (or repeated in) an epoch as verification errors."""
    n = len(manifest["files"])
    missing = n - res.pop("distinct")
    res["verify_errors"] += missing + max(res["samples"] - n, 0)
    if missing:
        res["missing_samples"] = missing
    return res


def train_files(loader_epoch, manifest: dict, compute_s: float, window: int,
                epoch: int, t0: float | None = None) -> dict:
    """One epoch of ``loader_epoch(epoch)`` through the loop, checked against the
    manifest."""
    t0 = time.monotonic() if t0 is None else t0
    return check_epoch(run_epoch(loader_epoch(epoch), compute_s, window, t0=t0), manifest)


# -- calibration ------------------------------------------------------------------------------
def calibrate(data_dir: Path, seed: int = 0) -> dict:
    """The loader's own rate from local disk (no compute step), cold then warm, and the
    loop's per-batch overhead with the loader far ahead."""
    from bench.scenarios.datasets import materialize
    from bench.systems.pagecache import drop_page_cache

    quiet_torch_warnings()
    man = materialize(dataset(False), data_dir, seed)
    ld = mount_loader(data_dir, "train-files", man, seed)
    files = [Path(data_dir) / "train-files" / rel for rel in man["files"]]
    out = {"cpus": os.cpu_count(), "drop": drop_page_cache(files)}
    out["cold_no_compute"] = train_files(ld.epoch, man, 0.0, WINDOW, 1)["value"]
    out["warm_no_compute"] = train_files(ld.epoch, man, 0.0, WINDOW, 2)["value"]
    # the overhead: a tiny compute step, loader far ahead -> per-batch time - compute
    r = train_files(ld.epoch, man, 0.01, WINDOW, 3)
    out["loop_overhead_s"] = r["seconds"] / r["batches"] - 0.01
    out["compute_s"] = BATCH / TARGET_SAMPLES_PER_S - out["loop_overhead_s"]
    drop_page_cache(files)
    r = train_files(ld.epoch, man, COMPUTE_S, WINDOW, 4)
    out["local_cold_at_COMPUTE_S"] = r["value"]
    return out


def main(argv: list[str] | None = None) -> int:
    """``python -m bench.trainfiles calibrate [DATA_DIR]``."""
    import json
    import sys

    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] != ["calibrate"]:
        print("usage: python -m bench.trainfiles calibrate [DATA_DIR]", file=sys.stderr)
        return 2
    d = Path(argv[1] if len(argv) > 1 else "/tmp/bench-trainfiles-calibrate")
    print(json.dumps(calibrate(d), indent=1))
    return 0

"""The loader contract of the train-files workload: what every system's loader yields,
and the loop that takes an epoch of it.

Every system produces batches of records ``(path, label, bytes, xxh3 ok)``: the worker
reads a sample, verifies it against the manifest (``Verify``) and hands on only the
record.  A mount's loader and s3torchconnector's are a ``MapLoader`` (a DataLoader with a
seeded ``EpochSampler``); the streaming libraries bring their own (peers.py).  The loop
(``train_files``: ``run_epoch`` then ``check_epoch``) takes a batch, "computes" for a
fixed time and counts samples/s per window, stalls and verification errors.  The
scenario with its compute step, dataset and calibration: bench/scenarios/train_files.py.
"""
from __future__ import annotations

import random
import time
from typing import Iterable, Iterator

import xxhash

BATCH = 32
WORKERS = 8


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


def quiet_torch_warnings() -> None:
    import warnings

    warnings.filterwarnings("ignore", message=".*worker processes in total.*")


def waited(batches: Iterable) -> Iterator[tuple[object, float]]:
    """Each batch of ``batches`` with the seconds the loop waited for it (``next()``)."""
    it = iter(batches)
    while True:
        tw = time.monotonic()
        try:
            b = next(it)
        except StopIteration:
            return
        yield b, time.monotonic() - tw


def windows(stamps: list[float], counts: list[int], window: int,
            ndigits: int | None = None) -> list[dict]:
    """samples/s per window of ``window`` batches, from each batch's end time (``stamps``,
    s since the start) and size (``counts``): ``{"batch": last batch, "t": its end time
    (rounded to ``ndigits`` if given), "samples_per_s"}``."""
    out = []
    for i in range(0, len(stamps), window):
        j = min(i + window, len(stamps)) - 1
        start = stamps[i - 1] if i else 0.0
        t = stamps[j] if ndigits is None else round(stamps[j], ndigits)
        out.append({"batch": j + 1, "t": t,
                    "samples_per_s": sum(counts[i:j + 1]) / max(stamps[j] - start, 1e-9)})
    return out


def run_epoch(batches: Iterable, compute_s: float, window: int, batch: int = BATCH,
              t0: float | None = None) -> dict:
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
    for b, waited_s in waited(batches):
        wait += waited_s
        for rel, _label, n, ok in b:
            nbytes += n
            bad += not ok
            seen.add(rel)
        time.sleep(compute_s * len(b) / batch)      # the "GPU" step
        samples += len(b)
        counts.append(len(b))
        stamps.append(time.monotonic() - t0)
    dt = time.monotonic() - t0
    return {"seconds": dt, "bytes": nbytes, "samples": samples, "distinct": len(seen),
            "batches": len(stamps), "verify_errors": bad, "value": samples / dt,
            "unit": "samples/s", "mbps": nbytes / dt / 1e6, "stall_fraction": wait / dt,
            "windows": windows(stamps, counts, window, ndigits=3),
            "compute_s_per_batch": compute_s, "batch_size": batch}


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

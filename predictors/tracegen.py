"""Synthetic access traces that replicate what real data loaders produce.

Sampler orders follow PyTorch's code paths:

* RandomSampler: one generator for the whole run, ``randperm(n)`` drawn from it each
  epoch (so every epoch is a fresh permutation);
* DistributedSampler: per epoch ``randperm(n)`` from a generator seeded with
  ``seed + epoch`` (if shuffle), padded by repeating the head up to a multiple of the
  world size (or truncated with drop_last), rank r takes ``indices[r:total:w]``;
  forgetting ``set_epoch`` gives the same order every epoch (the "repeated" family);
* a DataLoader with W workers hands batch b to worker b % W (round-robin), each worker
  opens and reads its batch's files one after another, all workers in parallel;
* WebDataset: the shard list shuffled each epoch, shards split over workers
  (``shards[k::W]``), each shard read sequentially in chunks.

Permutations come from numpy by default; pass ``perm=`` (a function (n, seed) -> list)
to use another generator, e.g. torch's, which the tests do when torch is installed.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from .events import Event

FAMILIES = ("sequential", "strided", "repeated", "shuffled", "webdataset", "random")
CLASSES = ("sequential", "strided", "repeated", "shuffled", "random")

Perm = Callable[[int, int], list]


def numpy_perm(n: int, seed: int) -> list[int]:
    return np.random.default_rng(seed).permutation(n).tolist()


def distributed_indices(n: int, rank: int, world: int, epoch: int = 0, seed: int = 0,
                        shuffle: bool = True, drop_last: bool = False,
                        perm: Perm = numpy_perm) -> list[int]:
    """torch.utils.data.DistributedSampler.__iter__ for one epoch."""
    indices = perm(n, seed + epoch) if shuffle else list(range(n))
    if drop_last and n % world != 0:
        num_samples = math.ceil((n - world) / world)
    else:
        num_samples = math.ceil(n / world)
    total = num_samples * world
    if not drop_last:
        pad = total - len(indices)
        if pad <= len(indices):
            indices += indices[:pad]
        else:
            indices += (indices * math.ceil(pad / len(indices)))[:pad]
    else:
        indices = indices[:total]
    return indices[rank:total:world]


def random_sampler_orders(n: int, epochs: int, seed: int = 0,
                          stream: Callable[[int], list] | None = None) -> list[list[int]]:
    """RandomSampler(replacement=False) with one generator for all epochs: a fresh
    permutation per epoch, drawn in sequence from the same generator. Like torch, each
    epoch also draws a second permutation for the ``num_samples % n`` tail (empty by
    default) — so epoch 2 is the generator's third permutation, not its second."""
    if stream is None:
        rng = np.random.default_rng(seed)
        stream = lambda n: rng.permutation(n).tolist()  # noqa: E731
    orders = []
    for _ in range(epochs):
        orders.append(stream(n))
        stream(n)[:0]           # the tail draw torch makes every epoch
    return orders


@dataclass
class TraceSpec:
    family: str = "shuffled"
    n_files: int = 400
    epochs: int = 3
    file_size: int = 100_000       # bytes per sample file (shards: per shard)
    workers: int = 4               # DataLoader workers (one pid each)
    batch: int = 8                 # samples per batch (shards: 1)
    rank: int = 0
    world: int = 1
    sample_s: float = 0.02         # compute+decode time per sample per worker
    chunk: int = 0                 # >0: files read sequentially in chunks of this size
    seed: int = 0
    base_pid: int = 1000


@dataclass
class Trace:
    spec: TraceSpec
    catalog: list[tuple[str, int]]
    events: list[Event]
    labels: list[str]                         # class label of each event
    epoch_of: list[int]                       # epoch of each event (ground truth)
    order: list[str] = field(default_factory=list)   # sampler order (what hints would say)


def _epoch_orders(s: TraceSpec, perm: Perm) -> list[list[int]]:
    n, rng = s.n_files, np.random.default_rng(s.seed + 7919)
    f = s.family
    if f == "sequential":
        return [list(range(n)) for _ in range(s.epochs)]
    if f == "strided":
        return [distributed_indices(n, s.rank, s.world, e, s.seed, shuffle=False)
                for e in range(s.epochs)]
    if f == "repeated":   # DistributedSampler whose set_epoch was never called
        return [distributed_indices(n, s.rank, s.world, 0, s.seed, perm=perm)
                for _ in range(s.epochs)]
    if f == "shuffled":
        if s.world > 1:
            return [distributed_indices(n, s.rank, s.world, e, s.seed, perm=perm)
                    for e in range(s.epochs)]
        return random_sampler_orders(n, s.epochs, s.seed)
    if f == "webdataset":
        return [rng.permutation(n).tolist() for _ in range(s.epochs)]
    if f == "random":     # RandomSampler(replacement=True)
        return [rng.integers(0, n, size=n).tolist() for _ in range(s.epochs)]
    raise ValueError(f"unknown family {f!r}")


def _label(family: str, epoch: int, world: int = 1) -> str:
    if family == "webdataset":
        return "shuffled"
    if family == "shuffled" and world > 1 and epoch > 0:
        # DistributedSampler with set_epoch: this rank gets a different random 1/w of the
        # data every epoch, so there is no fixed working set to exploit
        return "random"
    if family == "repeated" and epoch == 0:
        return "shuffled"       # a first epoch of a fixed shuffle looks like any shuffle
    return family


def generate(spec: TraceSpec, perm: Perm = numpy_perm) -> Trace:
    s = spec
    shards = s.family == "webdataset"
    ext = "tar" if shards or s.chunk else "jpg"
    rng = np.random.default_rng(s.seed)
    sizes = np.maximum(1, rng.normal(s.file_size, s.file_size * 0.2, s.n_files)).astype(int)
    catalog = [(f"train/{i:06d}.{ext}", int(sizes[i])) for i in range(s.n_files)]
    batch = 1 if shards else s.batch
    chunk = s.chunk or (256 << 10 if shards else 0)
    timed: list[tuple[float, int, Event, str, int]] = []
    order: list[str] = []
    t0 = 0.0
    for e, idx in enumerate(_epoch_orders(s, perm)):
        order += [catalog[i][0] for i in idx]
        label = _label(s.family, e, s.world)
        if shards:   # WebDataset split_by_worker: worker k takes shards[k::W]
            per_worker = [idx[k::s.workers] for k in range(s.workers)]
        else:        # DataLoader: batch b goes to worker b % W
            batches = [idx[i:i + batch] for i in range(0, len(idx), batch)]
            per_worker = [[i for b in batches[k::s.workers] for i in b]
                          for k in range(s.workers)]
        end = t0
        for k, items in enumerate(per_worker):
            t = t0 + rng.uniform(0, s.sample_s)
            pid = s.base_pid + k
            for i in items:
                path, size = catalog[i]
                timed.append((t, len(timed), Event(round(t, 6), "open", path, 0, 0, pid, size),
                              label, e))
                step = chunk if chunk else size
                for off in range(0, size, step):
                    t += 0.0002 + (s.sample_s * step / size if chunk else 0.0)
                    ln = min(step, size - off)
                    timed.append((t, len(timed), Event(round(t, 6), "read", path, off, ln, pid,
                                                        size), label, e))
                t += s.sample_s * rng.uniform(0.8, 1.2)
            end = max(end, t)
        t0 = end + 0.001
    timed.sort(key=lambda x: (x[0], x[1]))
    return Trace(spec, catalog, [x[2] for x in timed], [x[3] for x in timed],
                 [x[4] for x in timed], order)


def family_spec(family: str, seed: int = 0, **kw) -> TraceSpec:
    """Representative spec of each family (used by the evaluator and tests)."""
    base = dict(family=family, seed=seed)
    if family == "strided":
        base.update(rank=1, world=4, n_files=1600)
    elif family == "webdataset":
        base.update(n_files=60, file_size=4 << 20, workers=2, sample_s=0.2)
    elif family == "shuffled":
        base.update(rank=0, world=1)
    base.update(kw)
    return TraceSpec(**base)


def random_spec(family: str, rng: np.random.Generator) -> TraceSpec:
    """A randomized spec for training the classifier: vary sizes, workers, batch, world."""
    world = int(rng.choice([1, 2, 4, 8]))
    kw = dict(n_files=int(rng.integers(150, 600)), epochs=3,
              workers=int(rng.choice([1, 2, 4, 8])), batch=int(rng.choice([1, 4, 8, 16])),
              sample_s=float(rng.uniform(0.005, 0.05)), seed=int(rng.integers(1 << 30)))
    if family == "strided":
        world = max(world, 2)
        kw.update(n_files=kw["n_files"] * world)
    if family == "shuffled" and rng.random() < 0.75:
        world = 1           # mostly RandomSampler; sometimes one rank of DistributedSampler
    if family in ("strided", "repeated", "shuffled"):
        kw.update(world=world, rank=int(rng.integers(world)))
    if family == "webdataset":
        kw.update(n_files=int(rng.integers(40, 120)), file_size=int(rng.integers(1, 5)) << 20,
                  workers=int(rng.choice([1, 2, 4])), sample_s=float(rng.uniform(0.05, 0.3)))
    elif rng.random() < 0.2 and family != "random":
        kw.update(chunk=64 << 10, file_size=512 << 10)    # shard-like files read in chunks
    return TraceSpec(family=family, **kw)

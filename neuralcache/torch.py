"""PyTorch sampler wrapper that publishes each epoch's order to a NeuralCache mount.

    from neuralcache.torch import HintingSampler
    sampler = HintingSampler(DistributedSampler(ds, num_replicas=w, rank=r),
                             paths=ds.paths, mountpoint="/mnt/imagenet")
    loader = DataLoader(ds, sampler=sampler, num_workers=8)
    for epoch in range(n):
        sampler.set_epoch(epoch)        # forwarded to the wrapped sampler
        for batch in loader: ...

At the start of each iteration (each epoch) the wrapper materialises the wrapped
sampler's indices, publishes ``paths[i]`` for them in order, then yields the same
indices, so the mount prefetches exactly what this rank will read, in the order it
will read it.  A failure to publish (not a NeuralCache mount, a refused hint) is a
warning, never an error: training goes on without hints.  torch is optional: this
module imports it only when the wrapper is built.
"""
from __future__ import annotations

import logging
from typing import Callable, Iterator, Sequence

from .hints import HintError, publish_order

log = logging.getLogger(__name__)


class HintingSampler:
    def __init__(self, sampler, paths: Sequence[str] | Callable[[int], str | list[str]],
                 mountpoint: str):
        """``paths``: a sequence indexed by dataset index, or a function from an index
        to a path (or to several paths, e.g. the members of a sample)."""
        import torch.utils.data  # noqa: F401  (fails early, clearly, without torch)

        self.sampler = sampler
        self.paths = paths
        self.mountpoint = mountpoint
        self.published = 0

    def _paths_for(self, i: int) -> list[str]:
        p = self.paths(i) if callable(self.paths) else self.paths[i]
        return [p] if isinstance(p, str) else list(p)

    def __iter__(self) -> Iterator[int]:
        order = list(iter(self.sampler))
        try:
            self.published = publish_order(
                self.mountpoint, [p for i in order for p in self._paths_for(i)])
        except (HintError, OSError) as exc:
            log.warning("could not publish the epoch order to %s: %s", self.mountpoint, exc)
        return iter(order)

    def __len__(self) -> int:
        return len(self.sampler)

    def set_epoch(self, epoch: int) -> None:
        if hasattr(self.sampler, "set_epoch"):
            self.sampler.set_epoch(epoch)

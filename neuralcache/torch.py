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
will read it.  When the next epoch's order is already known -- a sampler with
``set_epoch`` whose order is a function of its seed and epoch, as DistributedSampler's
is -- the hints go on with it (``lookahead_epochs``), so the mount starts on the next
epoch's first files while this one ends, and the epoch boundary does not stall.  With a
shared tier (``--shared-cache``) these prefetches read what other ranks already fetched
from the in-region bucket and go to the origin only for what no node has.  A failure to
publish (not a NeuralCache mount, a refused hint) is a warning, never an error:
training goes on without hints.  torch is optional: this
module imports it only when the wrapper is built.
"""
from __future__ import annotations

import copy
import logging
from typing import Callable, Iterator, Sequence

from .hints import HintError, publish_order

log = logging.getLogger(__name__)


class HintingSampler:
    def __init__(self, sampler, paths: Sequence[str] | Callable[[int], str | list[str]],
                 mountpoint: str, lookahead_epochs: int = 1):
        """``paths``: a sequence indexed by dataset index, or a function from an index
        to a path (or to several paths, e.g. the members of a sample).
        ``lookahead_epochs``: how many following epochs' orders to append to the hints
        when the sampler's order is deterministic per epoch (0: this epoch only)."""
        import torch.utils.data  # noqa: F401  (fails early, clearly, without torch)

        self.sampler = sampler
        self.paths = paths
        self.mountpoint = mountpoint
        self.lookahead_epochs = lookahead_epochs
        self.published = 0
        self.epoch = 0

    def _paths_for(self, i: int) -> list[str]:
        p = self.paths(i) if callable(self.paths) else self.paths[i]
        return [p] if isinstance(p, str) else list(p)

    def upcoming_orders(self) -> list[list[int]]:
        """The orders of the next ``lookahead_epochs`` epochs, from copies of the
        sampler set to those epochs; none unless the order is known in advance: the
        sampler has ``set_epoch`` and a ``seed`` (DistributedSampler), so the same
        epoch gives the same order."""
        if not (hasattr(self.sampler, "set_epoch") and hasattr(self.sampler, "seed")):
            return []
        out = []
        for k in range(1, self.lookahead_epochs + 1):
            ahead = copy.copy(self.sampler)
            ahead.set_epoch(self.epoch + k)
            out.append(list(iter(ahead)))
        return out

    def __iter__(self) -> Iterator[int]:
        order = list(iter(self.sampler))
        try:
            ahead = [i for o in self.upcoming_orders() for i in o]
            self.published = publish_order(
                self.mountpoint, [p for i in order + ahead for p in self._paths_for(i)])
        except (HintError, OSError) as exc:
            log.warning("could not publish the epoch order to %s: %s", self.mountpoint, exc)
        return iter(order)

    def __len__(self) -> int:
        return len(self.sampler)

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch
        if hasattr(self.sampler, "set_epoch"):
            self.sampler.set_epoch(epoch)

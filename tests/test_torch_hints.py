"""HintingSampler: each epoch's hints go on with the next epoch's order when the
sampler's order is a function of seed and epoch (DistributedSampler)."""
import pytest

torch = pytest.importorskip("torch")

from torch.utils.data import DistributedSampler, SequentialSampler  # noqa: E402

import neuralcache.torch as nct  # noqa: E402


class _Data:
    def __len__(self):
        return 40


def test_hints_cover_the_next_epoch_of_a_distributed_sampler(monkeypatch):
    sent = []
    monkeypatch.setattr(nct, "publish_order", lambda mp, paths: sent.append(list(paths))
                        or len(sent[-1]))
    paths = [f"s/{i:03d}" for i in range(40)]
    s = nct.HintingSampler(DistributedSampler(_Data(), num_replicas=4, rank=1, seed=7),
                           paths=paths, mountpoint="/mnt")
    orders = []
    for epoch in range(3):
        s.set_epoch(epoch)
        orders.append(list(iter(s)))
    assert len(set(map(tuple, orders))) == 3          # reshuffled every epoch
    for epoch in range(3):
        this = [paths[i] for i in orders[epoch]]
        assert sent[epoch][:len(this)] == this
        if epoch < 2:     # the tail is exactly what the next epoch then read
            assert sent[epoch][len(this):] == [paths[i] for i in orders[epoch + 1]]
    # the wrapped sampler itself was not moved to another epoch by the look-ahead
    assert s.sampler.epoch == 2


def test_no_lookahead_without_a_deterministic_epoch_order(monkeypatch):
    sent = []
    monkeypatch.setattr(nct, "publish_order", lambda mp, paths: sent.append(list(paths)) or 0)
    s = nct.HintingSampler(SequentialSampler(range(5)), paths=[str(i) for i in range(5)],
                           mountpoint="/mnt")
    assert list(iter(s)) == [0, 1, 2, 3, 4] and sent == [["0", "1", "2", "3", "4"]]
    s = nct.HintingSampler(DistributedSampler(_Data(), num_replicas=2, rank=0),
                           paths=[str(i) for i in range(40)], mountpoint="/mnt",
                           lookahead_epochs=0)
    assert len(list(iter(s))) == 20 and len(sent[-1]) == 20

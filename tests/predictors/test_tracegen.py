import importlib.util
import math

import pytest

from predictors.tracegen import (FAMILIES, TraceSpec, distributed_indices, generate,
                                 random_sampler_orders)


def test_distributed_sampler_padding_and_slicing():
    n, w = 10, 4
    shards = [distributed_indices(n, r, w, shuffle=False) for r in range(w)]
    assert shards[0] == [0, 4, 8] and shards[1] == [1, 5, 9] and shards[2] == [2, 6, 0]
    assert all(len(s) == math.ceil(n / w) for s in shards)
    dl = [distributed_indices(n, r, w, shuffle=False, drop_last=True) for r in range(w)]
    assert sorted(i for s in dl for i in s) == list(range(8))


def test_shuffled_epochs_differ_and_are_permutations():
    a, b = random_sampler_orders(50, 2, seed=3)
    assert sorted(a) == list(range(50)) == sorted(b) and a != b
    e0 = distributed_indices(50, 0, 2, epoch=0, seed=1)
    e1 = distributed_indices(50, 0, 2, epoch=1, seed=1)
    assert e0 != e1 and e0 == distributed_indices(50, 0, 2, epoch=0, seed=1)


def test_dataloader_worker_round_robin():
    tr = generate(TraceSpec(family="sequential", n_files=64, workers=4, batch=4, epochs=1))
    by_pid: dict[int, list[int]] = {}
    for ev in tr.events:
        if ev.op == "open":
            by_pid.setdefault(ev.pid, []).append(int(ev.path[-10:-4]))
    assert by_pid[1000][:8] == [0, 1, 2, 3, 16, 17, 18, 19]     # batches 0 and 4
    assert by_pid[1001][:4] == [4, 5, 6, 7]


@pytest.mark.parametrize("family", FAMILIES)
def test_generated_traces_are_deterministic_and_time_ordered(family):
    a = generate(TraceSpec(family=family, n_files=40, epochs=2))
    b = generate(TraceSpec(family=family, n_files=40, epochs=2))
    assert a.events == b.events
    ts = [e.t for e in a.events]
    assert ts == sorted(ts)


@pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason="torch not installed")
def test_orders_match_pytorch_samplers():
    import torch
    from torch.utils.data import DistributedSampler, RandomSampler

    def torch_perm(n, seed):
        g = torch.Generator()
        g.manual_seed(seed)
        return torch.randperm(n, generator=g).tolist()

    ds = list(range(37))
    for shuffle in (False, True):
        for drop_last in (False, True):
            for r in range(4):
                s = DistributedSampler(ds, num_replicas=4, rank=r, shuffle=shuffle, seed=5,
                                       drop_last=drop_last)
                s.set_epoch(2)
                assert list(s) == distributed_indices(37, r, 4, epoch=2, seed=5,
                                                      shuffle=shuffle, drop_last=drop_last,
                                                      perm=torch_perm)
    g = torch.Generator()
    g.manual_seed(9)
    rs = RandomSampler(ds, generator=g)
    got = [list(rs) for _ in range(3)]
    g2 = torch.Generator()
    g2.manual_seed(9)
    ours = random_sampler_orders(37, 3, stream=lambda n: torch.randperm(n, generator=g2).tolist())
    assert got == ours

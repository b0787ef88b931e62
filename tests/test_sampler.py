"""ReplicaSampler: each replica its share of the dataset, each step its micro-batches, every sample once an epoch."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch.utils.data import DistributedSampler, TensorDataset

from hintpipe.sampler import ReplicaSampler


def _epoch(size: int, replicas: int, epoch: int, seed: int = 0) -> list[list[list[list[int]]]]:
    """Every replica's steps of ``epoch`` (2 micro-batches of 3 samples)."""
    samplers = [
        ReplicaSampler(size, microbatches=2, microbatch_size=3, replicas=replicas, replica=r, seed=seed)
        for r in range(replicas)
    ]
    for sampler in samplers:
        sampler.set_epoch(epoch)
    return [list(sampler) for sampler in samplers]


def _samples(steps: list[list[list[int]]]) -> list[int]:
    return [i for step in steps for mb in step for i in mb]


def test_every_sample_once_per_epoch_across_replicas() -> None:
    for epoch in range(3):
        replicas = _epoch(24, 2, epoch)
        assert [len(steps) for steps in replicas] == [2, 2]  # 24 samples / (2 replicas x 2 x 3)
        assert all(len(step) == 2 and all(len(mb) == 3 for mb in step) for steps in replicas for step in steps)
        seen = [i for steps in replicas for i in _samples(steps)]
        assert sorted(seen) == list(range(24))  # each exactly once


def test_a_remainder_is_left_out_never_repeated() -> None:
    replicas = _epoch(29, 2, epoch=0)  # 29 = 2 steps of 12, and 5 left over
    seen = [i for steps in replicas for i in _samples(steps)]
    assert len(seen) == len(set(seen)) == 24


def test_deterministic_for_a_seed_new_for_each_epoch_and_torchs_permutation() -> None:
    assert _epoch(24, 2, epoch=1) == _epoch(24, 2, epoch=1)
    assert _epoch(24, 2, epoch=1) != _epoch(24, 2, epoch=2)
    assert _epoch(24, 2, epoch=1) != _epoch(24, 2, epoch=1, seed=5)
    share: DistributedSampler[Any] = DistributedSampler(
        TensorDataset(torch.arange(24)), num_replicas=2, rank=1, seed=0, drop_last=True
    )
    share.set_epoch(1)
    assert _samples(_epoch(24, 2, epoch=1)[1]) == list(share)  # torch's own share, in steps


def test_a_step_by_number_is_the_step_iteration_gives() -> None:
    sampler = ReplicaSampler(range(40), microbatches=2, microbatch_size=2, replicas=2, replica=0, seed=3)
    sampler.set_epoch(4)
    assert [sampler.step(i) for i in range(len(sampler))] == list(sampler)  # a resumed run asks by number
    assert sampler.epoch == 4
    with pytest.raises(IndexError, match=r"^step 5 is outside the epoch's steps 0\.\.4$"):
        sampler.step(5)


def test_without_shuffle_the_dataset_order_dealt_round_robin() -> None:
    steps = [
        list(ReplicaSampler(8, microbatches=2, microbatch_size=2, replicas=2, replica=r, shuffle=False))
        for r in range(2)
    ]
    assert steps == [[[[0, 2], [4, 6]]], [[[1, 3], [5, 7]]]]


def test_micro_batches_index_a_dataset() -> None:
    data = torch.arange(12.0).reshape(12, 1)
    sampler = ReplicaSampler(data, microbatches=3, microbatch_size=2)  # any sized dataset: a tensor here
    inputs = [data[mb] for mb in sampler.step(0)]
    assert [x.shape for x in inputs] == [torch.Size([2, 1])] * 3
    values = torch.cat(inputs).flatten().tolist()
    assert len(set(values)) == 6 and set(values) <= set(range(12))


@pytest.mark.parametrize(
    ("keywords", "message"),
    [
        ({"microbatches": 0}, "microbatches must be at least 1, got 0"),
        ({"microbatch_size": 0}, "microbatch_size must be at least 1, got 0"),
        ({"replica": 2}, "replica 2 does not exist: there are replicas 0..1"),
        (
            {"microbatches": 8},
            "the dataset has 24 samples, fewer than one step's 48 (replicas 2 x microbatches 8 x microbatch_size 3): "
            "use fewer or smaller micro-batches",
        ),
    ],
)
def test_bad_input_is_refused_in_one_line(keywords: dict[str, int], message: str) -> None:
    arguments: dict[str, Any] = {"microbatches": 2, "microbatch_size": 3, "replicas": 2, "replica": 0} | keywords
    with pytest.raises(ValueError) as refused:
        ReplicaSampler(24, **arguments)
    assert str(refused.value) == message

"""Every rank's parameters in storage of its own (:mod:`hintpipe.runtime.private_storage`): a tensor the launcher
put in shared memory is copied, in place, keeping its identity; one already private is left as it is."""

from __future__ import annotations

import torch
from torch import nn

from hintpipe.runtime.private_storage import own_storage


def test_shared_parameters_and_buffers_get_a_private_copy_and_keep_their_identity() -> None:
    first, second = nn.Linear(2, 2), nn.BatchNorm1d(2)
    first.weight.data.share_memory_()
    second.running_mean.share_memory_()
    shared_mean = second.running_mean
    tied = nn.Linear(2, 2)
    tied.weight = first.weight  # one parameter on two stages of this rank
    weight = first.weight
    optimizer = torch.optim.SGD([weight], lr=1.0)
    assert own_storage({0: first, 1: second, 2: tied}) == 2  # the tied weight once, the buffer once
    assert first.weight is weight and tied.weight is weight and not weight.untyped_storage().is_shared()
    assert second.running_mean is not shared_mean and not second.running_mean.untyped_storage().is_shared()
    assert torch.equal(second.running_mean, shared_mean)
    assert optimizer.param_groups[0]["params"][0] is weight  # the optimizer steps the private copy
    assert own_storage({0: first, 1: second, 2: tied}) == 0  # private already: nothing to do


def test_a_buffer_two_modules_share_gets_one_copy_they_still_share() -> None:
    shared = torch.zeros(3).share_memory_()
    a, b = nn.Module(), nn.Module()
    a.register_buffer("table", shared)
    b.register_buffer("table", shared)
    assert own_storage({0: a, 1: b}) == 1
    assert a.table is b.table and a.table is not shared

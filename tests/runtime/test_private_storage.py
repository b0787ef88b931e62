"""Every rank's parameters in storage of its own (:mod:`hintpipe.runtime.private_storage`): a tensor the launcher
put in shared memory is copied, in place, keeping its identity; one already private is left as it is."""

from __future__ import annotations

import torch
from torch import nn

from hintpipe.runtime.private_storage import own_storage


def _shared(tensor: torch.Tensor) -> torch.Tensor:
    """``tensor`` moved into shared memory, as ``torch.multiprocessing`` moves a spawned process's arguments."""
    tensor.share_memory_()  # type: ignore[no-untyped-call]
    return tensor


def _with_buffer(buffer: torch.Tensor) -> nn.Module:
    module = nn.Module()
    module.register_buffer("table", buffer)
    return module


def test_shared_parameters_and_buffers_get_a_private_copy_and_keep_their_identity() -> None:
    first = nn.Linear(2, 2)
    _shared(first.weight.data)
    shared_table = _shared(torch.arange(3.0))
    second = _with_buffer(shared_table)
    tied = nn.Linear(2, 2)
    tied.weight = first.weight  # one parameter on two stages of this rank
    weight = first.weight
    optimizer = torch.optim.SGD([weight], lr=1.0)
    assert own_storage({0: first, 1: second, 2: tied}) == 2  # the tied weight once, the buffer once
    assert first.weight is weight and tied.weight is weight and not weight.untyped_storage().is_shared()
    table = second.get_buffer("table")
    assert table is not shared_table and not table.untyped_storage().is_shared()
    assert torch.equal(table, shared_table)
    assert optimizer.param_groups[0]["params"][0] is weight  # the optimizer steps the private copy
    assert own_storage({0: first, 1: second, 2: tied}) == 0  # private already: nothing to do


def test_a_buffer_two_modules_share_gets_one_copy_they_still_share() -> None:
    shared = _shared(torch.zeros(3))
    a, b = _with_buffer(shared), _with_buffer(shared)
    assert own_storage({0: a, 1: b}) == 1
    assert a.get_buffer("table") is b.get_buffer("table") and a.get_buffer("table") is not shared

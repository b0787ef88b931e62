"""Every stage of every architecture in the zoo is a module like any other: its code names no device, it runs
on ``meta`` fed the meta outputs of the stage before it, and on the CPU the stages give the unsplit model's
eval logits exactly.

``meta`` stands in for a GPU here: a stage that kept the capture's device anywhere makes a CPU tensor there
and fails beside the meta ones, and a stage that takes a number through ``.item()`` of a received tensor
fails outright ("Tensor.item() cannot be called on meta tensors": GPT-2's and Llama's later stages did, as
the sequence length crossed each cut as a 0-d tensor; on a GPU that ``.item()`` waited for the stream once
per micro-batch per cut). Each model is planned into 3 stages from a real profile, so the cuts fall where
the profile puts them; a failure names them.
"""

from __future__ import annotations

import copy
from typing import Any

import pytest
import torch
from torch import nn

from hf_zoo import ARCHITECTURES, KWARGS, VOCAB, planned
from hintpipe.planner.plan import Plan
from hintpipe.runtime.loop.executor import as_input
from hintpipe.runtime.transport.wire import Value
from stage_code import named_devices

STAGES = 3


@pytest.fixture(name="planned", params=sorted(ARCHITECTURES))
def planned_fixture(request: pytest.FixtureRequest) -> tuple[str, nn.Module, Plan]:
    """Architecture and its plan into :data:`STAGES` stages, made once per test process (:func:`hf_zoo.planned`)."""
    return (request.param, *planned(request.param, STAGES))


def _ids() -> torch.Tensor:
    """Token ids of another length than the plan's example (every dimension of a capture varies)."""
    return torch.randint(0, VOCAB, (2, 12), generator=torch.Generator().manual_seed(2))


def _forward(stage: nn.Module, values: tuple[Value, ...], first: bool) -> tuple[Value, ...]:
    """What ``stage`` sends on, fed ``values`` as a pipeline feeds it: the first stage the batch, a later one
    what the stage before sent, as received (tensors as leaves, numbers as they are: :func:`as_input`)."""
    out: Any = stage(*(values if first else (as_input(v) for v in values)))
    return out if isinstance(out, tuple) else (out,)


def test_no_stage_names_a_device(planned: tuple[str, nn.Module, Plan]) -> None:
    name, _, made = planned
    assert made.stages == STAGES
    for index in range(made.stages):
        stage = made.build_stage(index)
        assert named_devices(stage) == [], f"{name}, cuts {made.partition.cuts}, stage {index}"
        assert ".item()" not in str(stage.code)  # a number it receives is a number, never a tensor to read back


def test_every_stage_runs_on_meta_fed_the_stage_before(planned: tuple[str, nn.Module, Plan]) -> None:
    """Stage ``i`` on ``meta``, fed stage ``i - 1``'s meta outputs: every tensor it sends is on ``meta``, and
    the numbers it sends (the sequence length, at every cut of these models) are Python numbers."""
    name, _, made = planned
    values: tuple[Value, ...] = (_ids().to("meta"),)
    for index in range(made.stages):
        where = f"{name}, cuts {made.partition.cuts}, stage {index}"
        stage = copy.deepcopy(made.build_stage(index)).to("meta")  # a copy: the plan's parameters stay
        values = _forward(stage, values, first=index == 0)
        tensors = [v for v in values if isinstance(v, torch.Tensor)]
        numbers = [v for v in values if not isinstance(v, torch.Tensor)]
        assert [t.device.type for t in tensors] == ["meta"] * len(tensors), where
        assert all(isinstance(n, (int, float)) for n in numbers), where
        if index < made.stages - 1:
            assert 12 in numbers, where  # the sequence length crosses the cut as the number it is
    (logits,) = values
    assert isinstance(logits, torch.Tensor) and logits.shape == (2, 12, VOCAB), name


def test_the_stages_give_the_unsplit_model_s_eval_logits_exactly(planned: tuple[str, nn.Module, Plan]) -> None:
    name, model, made = planned
    ids = _ids()
    with torch.no_grad():
        expected = copy.deepcopy(model).eval()(ids, **KWARGS).logits
        values: tuple[Value, ...] = (ids,)
        for index in range(made.stages):
            values = _forward(made.build_stage(index).eval(), values, first=index == 0)
    (logits,) = values
    assert isinstance(logits, torch.Tensor)
    assert torch.equal(logits, expected), f"{name}, cuts {made.partition.cuts}"

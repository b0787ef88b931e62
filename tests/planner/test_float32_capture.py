"""``plan(..., autocast=False)``: a model that torch.export captures is exported once, for float32 training alone.

By default a torch.export capture is made twice, the second time under a bfloat16 autocast, so that the stages
follow one ([Note: a dtype read off a tensor] in ``hintpipe.planner.autocast_dtypes``); that second export is
half of what planning a Hugging Face model costs. A run that trains in float32 alone (``hintpipe train`` without
``--precision bf16``) skips it. Qwen3 is the model here: its query and key norms read a dtype off a tensor, so its
two captures differ. Its float32 plan computes the unsplit model's logits exactly, its stages refuse an autocast
in words (pickled as ranks get them, and loaded from a plan file that keeps the choice), and a plan file written
before the choice existed loads as a plan that follows one.
"""

from __future__ import annotations

import argparse
import pickle
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
import transformers
from torch import nn

import hf_zoo
from conftest import parse_cli
from hintpipe.planner import export_trace
from hintpipe.planner.plan import Plan, plan
from hintpipe.planner.plan_file import load_plan, save_plan
from hintpipe.planner.portable import FollowingOp
from hintpipe.runtime.loop.executor import as_input

NAME, STAGES = "qwen3", 3
REFUSED = (
    "stage {} of this plan was captured for float32 alone (autocast=False), and runs under an autocast to "
    "bfloat16: plan with autocast=True to train with precision bf16"
)


@pytest.fixture(name="exports")
def exports_fixture(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[nn.Module]]:
    """The models torch.export captured while the test ran, one entry per export."""
    made: list[nn.Module] = []
    once = export_trace._export_once

    def counted(root: nn.Module, example: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        made.append(root)
        return once(root, example, kwargs)

    monkeypatch.setattr(export_trace, "_export_once", counted)
    yield made


def _model() -> nn.Module:
    torch.manual_seed(0)
    model: nn.Module = transformers.AutoModelForCausalLM.from_config(hf_zoo.ARCHITECTURES[NAME]())  # type: ignore[no-untyped-call]
    return model


def _ids() -> torch.Tensor:
    return torch.randint(0, hf_zoo.VOCAB, (2, 12), generator=torch.Generator().manual_seed(2))


def _float32_plan(model: nn.Module) -> Plan:
    ids = torch.randint(0, hf_zoo.VOCAB, (2, 9), generator=torch.Generator().manual_seed(1))
    return plan(model, ids, ranks=STAGES, microbatches=STAGES, repeats=1, kwargs=hf_zoo.KWARGS, autocast=False)


def _logits(made: Plan, ids: torch.Tensor) -> torch.Tensor:
    values: tuple[Any, ...] = (ids,)
    with torch.no_grad():
        for index in range(made.stages):
            stage = made.build_stage(index)
            out = stage(*(values if index == 0 else tuple(as_input(v) for v in values)))
            values = out if isinstance(out, tuple) else (out,)
    (logits,) = values
    assert isinstance(logits, torch.Tensor)
    return logits


def _followed(made: Plan) -> int:
    """The dtype arguments of ``made``'s graph that follow an autocast."""
    return sum(isinstance(m, FollowingOp) and m.autocast_dtype_at is not None for m in made.graph.module.modules())


def _refusal(made: Plan, index: int, values: tuple[Any, ...]) -> str:
    stage = made.build_stage(index)
    with pytest.raises(ValueError) as caught, torch.no_grad(), torch.autocast("cpu", torch.bfloat16):
        stage(*values)
    return str(caught.value)


def test_a_float32_plan_exports_once_and_gives_the_unsplit_logits(exports: list[nn.Module]) -> None:
    model = _model()
    made = _float32_plan(model)
    assert len(exports) == 1
    assert not made.graph.follows_autocast and not made.spec.autocast
    assert _followed(made) == 0
    _, followed = hf_zoo.planned(NAME, STAGES)  # the zoo's plan of the same model, by default
    assert followed.graph.follows_autocast and _followed(followed) >= 2  # its query and key norms, at least
    with torch.no_grad():
        expected = model(_ids(), use_cache=False).logits
    assert torch.equal(_logits(made, _ids()), expected)


def test_its_stages_refuse_an_autocast_as_ranks_get_them() -> None:
    made = pickle.loads(pickle.dumps(_float32_plan(_model())))  # as every rank receives a plan
    assert not made.graph.follows_autocast
    assert _refusal(made, 0, (_ids(),)) == REFUSED.format(0)
    with torch.no_grad():
        sent = made.build_stage(0)(_ids())
    assert _refusal(made, 1, tuple(as_input(v) for v in sent)) == REFUSED.format(1)


def test_a_plan_file_keeps_the_choice_and_one_written_before_it_follows_an_autocast(
    tmp_path: Path, exports: list[nn.Module]
) -> None:
    model = _model()
    path = save_plan(_float32_plan(model), tmp_path / "float32.plan")
    exports.clear()
    loaded, _ = load_plan(path, model)
    assert len(exports) == 1 and not loaded.graph.follows_autocast
    assert _refusal(loaded, 0, (_ids(),)) == REFUSED.format(0)
    _, followed = hf_zoo.planned(NAME, STAGES)
    older = torch.load(save_plan(followed, tmp_path / "older.plan"), weights_only=True)
    del older["spec"]["autocast"]  # as a file written before the choice
    torch.save(older, tmp_path / "older.plan")
    exports.clear()
    loaded, _ = load_plan(tmp_path / "older.plan", model)
    assert len(exports) == 2 and loaded.graph.follows_autocast  # captured again as every plan then was


class _Planned(Exception):
    """What the stand-in for ``plan`` raises: the ``autocast`` it was given."""


@pytest.mark.parametrize(("precision", "autocast"), [("fp32", False), ("bf16", True)])
def test_the_command_line_captures_to_follow_an_autocast_under_bf16_alone(
    monkeypatch: pytest.MonkeyPatch, precision: str, autocast: bool
) -> None:
    from hintpipe.cli.train import config_from
    from hintpipe.planner import plan as planning

    def stand_in(*args: Any, autocast: bool = True, **kwargs: Any) -> Plan:
        raise _Planned(autocast)

    monkeypatch.setattr(planning, "plan", stand_in)
    argv = [
        "train", "--model", "hf-gpt2", "--layers", "2", "--hidden", "32", "--ranks", "2", "--microbatches", "2",
        "--steps", "1",
    ]  # fmt: skip
    args: argparse.Namespace = parse_cli([*argv, "--precision", precision])
    with pytest.raises(_Planned) as planned:
        config_from(args, args.policy)
    assert planned.value.args == (autocast,)

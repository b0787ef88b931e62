"""``hint="auto"`` (:mod:`hintpipe.apps.split_costs`): the split backward measured as the runtime runs it, once,
in the launcher, leaving the model's gradients and buffers as they were; the run keeps the hint chosen on those
costs."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from conftest import copied
from hintpipe.apps import split_costs
from hintpipe.apps.model_config import ModelConfig
from hintpipe.apps.models import SeqLenDist, gpt_layers, lm_loss, split_layers
from hintpipe.apps.split_costs import measure_stage_costs
from hintpipe.apps.train_config import TrainConfig


def test_the_costs_are_measured_both_ways_and_leave_the_gradients_as_they_were() -> None:
    torch.manual_seed(0)
    modules = split_layers(gpt_layers(ModelConfig(layers=2, hidden=32, vocab=64)), 2)
    before = [p.grad for m in modules for p in m.parameters()]
    tokens = torch.randint(0, 64, (2, 17))
    costs = measure_stage_costs(modules, [tokens[:, :-1]], tokens[:, 1:], lm_loss, repeats=2)
    columns = (costs.forward, costs.backward, costs.backward_input, costs.weight, costs.split_forward)
    assert [len(column) for column in columns] == [2] * 5
    assert all(c > 0 for c in (*costs.forward, *costs.backward, *costs.weight, *costs.split_forward))
    assert costs.backward_input[1] > 0
    assert [p.grad for m in modules for p in m.parameters()] == before


def test_measuring_leaves_a_batch_norms_statistics_as_they_were() -> None:
    """Before, each of the 2 x (repeats + 1) forwards counted a batch in the stages' batch norms, which
    ``--emulate`` then trained from."""
    torch.manual_seed(0)
    modules = [torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.BatchNorm1d(4)), torch.nn.Linear(4, 2)]
    before = {name: b.clone() for name, b in modules[0].named_buffers()}
    measure_stage_costs(modules, [torch.randn(3, 4)], torch.randn(3, 2), torch.nn.functional.mse_loss, repeats=2)
    assert all(torch.equal(b, before[name]) for name, b in modules[0].named_buffers())


def test_auto_names_its_choice_and_the_run_keeps_it(capsys: pytest.CaptureFixture[str]) -> None:
    config = TrainConfig.of(model=ModelConfig(layers=2, hidden=32), ranks=2, microbatches=4, hint="auto")
    assert config.pipeline.hint in ("1f1b", "zb-h1") and config.resolved_hint.name == config.pipeline.hint
    assert capsys.readouterr().err.startswith(f"hint auto: {config.pipeline.hint} (the step simulated on the stages' ")


def test_auto_is_refused_where_it_cannot_measure_once(monkeypatch: pytest.MonkeyPatch) -> None:
    model = ModelConfig(layers=2, hidden=32)
    with pytest.raises(ValueError, match=r"^hint auto chooses among hints of one stage per rank, got chunks 2$"):
        TrainConfig.of(model=model, ranks=2, microbatches=4, hint="auto", chunks=2, seq_len_dist=SeqLenDist(16))
    for name, value in {"RANK": "0", "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1"}.items():  # torchrun's
        monkeypatch.setenv(name, value)
    with pytest.raises(ValueError, match=r"^hint auto measures the stages in the launcher, and under torchrun "):
        TrainConfig.of(model=model, ranks=2, microbatches=4, hint="auto")


def test_a_resume_keeps_the_hint_its_checkpoint_records(
    saved_run: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # Measured again, auto could choose the other hint, and the resumed run would go on in another order.
    folder = copied(saved_run, tmp_path)

    def measured(*args: object, **kwargs: object) -> None:
        raise AssertionError("a resume measured the stages again")

    monkeypatch.setattr(split_costs, "auto_hint", measured)
    config = TrainConfig.of(
        model=ModelConfig(layers=2, hidden=32), ranks=2, microbatches=4, hint="auto", resume=True,
        checkpoint_dir=str(folder),
    )  # fmt: skip
    assert config.pipeline.hint == "1f1b"
    assert capsys.readouterr().err == f"hint auto: 1f1b (the run's, as {folder / 'step-00000002'} records)\n"

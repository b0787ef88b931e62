"""``hint="auto"``: the split backward measured as the runtime runs it, and the hint whose simulated step is
shorter on those costs (see [Note: what a split backward costs] in ``hintpipe.apps.split_costs``)."""

from __future__ import annotations

import pytest
import torch

from hintpipe.apps.model_config import ModelConfig
from hintpipe.apps.models import SeqLenDist, gpt_layers, lm_loss, split_layers
from hintpipe.apps.split_costs import measure_stage_costs
from hintpipe.apps.train_config import TrainConfig
from hintpipe.sim.hint_choice import choose_hint, predicted_steps

ONES = (1.0, 1.0)


def test_a_free_split_fills_the_bubble_and_is_chosen() -> None:
    # 2 ranks, 8 micro-batches, F = 1, B = 2 whole or 1 + 1 split: 1F1B (m + p - 1)(F + B) = 27; ZB-H1
    # m(F + B + W) + (p - 1)(F + B - W) = 25.
    predicted = predicted_steps(2, 8, ONES, (2.0, 2.0), ONES, ONES)
    assert predicted == {"1f1b": 27.0, "zb-h1": 25.0}
    assert choose_hint(predicted) == "zb-h1"


def test_a_split_that_costs_more_than_its_bubble_is_not_chosen() -> None:
    # The split's two parts 1.5 each (3 for a whole backward of 2: the second traversal's price).
    predicted = predicted_steps(2, 8, ONES, (2.0, 2.0), (1.5, 1.5), (1.5, 1.5))
    assert predicted["1f1b"] == 27.0 and predicted["zb-h1"] > 27.0
    assert choose_hint(predicted) == "1f1b"


def test_a_tie_goes_to_the_hint_without_a_split() -> None:
    assert choose_hint({"1f1b": 10.0, "zb-h1": 10.0}) == "1f1b"


def test_the_costs_are_measured_both_ways_and_leave_the_gradients_as_they_were() -> None:
    torch.manual_seed(0)
    modules = split_layers(gpt_layers(ModelConfig(layers=2, hidden=32, vocab=64)), 2)
    before = [p.grad for m in modules for p in m.parameters()]
    tokens = torch.randint(0, 64, (2, 17))
    costs = measure_stage_costs(modules, [tokens[:, :-1]], tokens[:, 1:], lm_loss, repeats=2)
    assert [len(column) for column in (costs.forward, costs.backward, costs.backward_input, costs.weight)] == [2] * 4
    assert all(c > 0 for c in (*costs.forward, *costs.backward, *costs.weight, costs.backward_input[1]))
    assert [p.grad for m in modules for p in m.parameters()] == before


def test_auto_names_its_choice_and_the_run_keeps_it(capsys: pytest.CaptureFixture[str]) -> None:
    config = TrainConfig(model=ModelConfig(layers=2, hidden=32), ranks=2, microbatches=4, hint="auto")
    assert config.hint in ("1f1b", "zb-h1") and config.resolved_hint.name == config.hint
    assert capsys.readouterr().err.startswith(f"hint auto: {config.hint} (the step simulated on the stages' ")


def test_auto_is_refused_where_it_cannot_measure_once(monkeypatch: pytest.MonkeyPatch) -> None:
    model = ModelConfig(layers=2, hidden=32)
    with pytest.raises(ValueError, match=r"^hint auto chooses among hints of one stage per rank, got chunks 2$"):
        TrainConfig(model=model, ranks=2, microbatches=4, hint="auto", chunks=2, seq_len_dist=SeqLenDist(16))
    for name, value in {"RANK": "0", "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1"}.items():  # torchrun's
        monkeypatch.setenv(name, value)
    with pytest.raises(ValueError, match=r"^hint auto measures the stages in the launcher, and under torchrun "):
        TrainConfig(model=model, ranks=2, microbatches=4, hint="auto")

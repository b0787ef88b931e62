"""A model of the user's own from the command line (:mod:`hintpipe.apps.factory_model`): ``module:function``'s
``(model, example, loss_fn)``, its sizes read from its output on the example, and every other answer refused in
one line naming what it was."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from hintpipe.apps.factory_model import factory_sizes, made
from hintpipe.apps.model_config import ModelConfig

FACTORIES = """
import torch
from torch import nn

def build():
    model = nn.Sequential(nn.Embedding(11, 4), nn.Linear(4, 11))
    return model, torch.zeros(2, 6, dtype=torch.long), nn.functional.cross_entropy

def two():
    return nn.Linear(1, 1), torch.zeros(1, 1, dtype=torch.long)

def floats():
    return nn.Linear(1, 1), torch.zeros(2, 3), nn.functional.mse_loss

def not_a_model():
    return "gpt", torch.zeros(2, 3, dtype=torch.long), len

class Flat(nn.Module):
    def forward(self, ids):
        return ids.float()

def flat():
    return Flat(), torch.zeros(2, 6, dtype=torch.long), len

class Normed(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed, self.norm, self.head = nn.Embedding(11, 4), nn.BatchNorm1d(4), nn.Linear(4, 11)

    def forward(self, ids):
        return self.head(self.norm(self.embed(ids).transpose(1, 2)).transpose(1, 2))

def normed():
    return Normed(), torch.zeros(2, 6, dtype=torch.long), nn.functional.cross_entropy

not_callable = 3
"""


@pytest.fixture
def factories(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    """A module of factories, importable by a name of this test's own (``made`` keeps each answer)."""
    name = f"factories_{tmp_path.name}"
    (tmp_path / f"{name}.py").write_text(FACTORIES)
    monkeypatch.syspath_prepend(str(tmp_path))
    return name


def test_a_factorys_model_is_sized_by_its_output_on_the_example(factories: str) -> None:
    model, example, _ = made(f"{factories}:build")
    assert example.shape == (2, 6)
    assert made(f"{factories}:build")[0] is model  # called once per process
    assert factory_sizes(f"{factories}:build", seed=5) == ModelConfig(
        "factory", layers=1, hidden=1, heads=1, vocab=11, max_seq_len=7, seed=5, source=f"{factories}:build"
    )


@pytest.mark.parametrize(
    ("function", "why"),
    [
        ("absent", "{m} has no function absent"),
        ("not_callable", "{m} has no function not_callable"),
        ("two", "two() must return (model, example, loss_fn), not a tuple"),
        ("not_a_model", "not_a_model() must return (model, example, loss_fn): an nn.Module, a batch of token ids "
         "and a function, not (a str, a torch.int64 tensor of shape [2, 3], a builtin_function_or_method)"),
        ("floats", "the example must be token ids, an int64 tensor [rows, T], not a torch.float32 tensor of shape "
         "[2, 3]; the command line trains models of token ids (others train through the Python API)"),
    ],
)  # fmt: skip
def test_an_answer_of_another_shape_is_refused_naming_it(factories: str, function: str, why: str) -> None:
    with pytest.raises(ValueError) as refused:
        made(f"{factories}:{function}")
    assert str(refused.value) == f"--model {factories}:{function}: {why.format(m=factories)}"


def test_a_model_that_gives_no_logits_or_a_missing_module_or_another_init_is_refused(factories: str) -> None:
    with pytest.raises(ValueError) as refused:
        factory_sizes(f"{factories}:flat")
    assert str(refused.value) == (
        f"--model {factories}:flat: the model maps ids [2, 6] to [2, 6]; it must give logits [rows, T, vocab]"
    )
    with pytest.raises(ValueError, match=r"^--model no_such_module_here:build: cannot import no_such_module_here \("):
        made("no_such_module_here:build")
    with pytest.raises(
        ValueError, match=r"^--init random: --model m:f is a factory, its weights are the ones it makes$"
    ):
        factory_sizes("m:f", init="random")


def test_sizing_a_factorys_model_counts_no_batch_in_its_state(factories: str) -> None:
    """Sizing runs the model on the example; before, that forward counted a batch in its batch norm (the trained
    model's ``num_batches_tracked`` one more than the batches it trained on) and moved its running statistics."""
    model = made(f"{factories}:normed")[0]
    before = {name: b.clone() for name, b in model.named_buffers()}
    assert factory_sizes(f"{factories}:normed").vocab == 11
    for name, value in model.named_buffers():
        assert torch.equal(value, before[name]), name

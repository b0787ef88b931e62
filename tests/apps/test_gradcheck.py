"""``--check-grads`` (hintpipe.apps.gradcheck): the unsplit model runs under the precision the pipeline runs
under, the tolerance is the precision's, and a model whose dropout would make the two steps differ is refused
before anything runs."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import torch
from torch import nn

from hintpipe.apps.gradcheck import (
    BF16_RELATIVE_TOLERANCE,
    RELATIVE_TOLERANCE,
    _reference_backward,
    relative_tolerance,
)
from hintpipe.apps.model_config import ModelConfig, SeqLenDist
from hintpipe.apps.train_config import TrainConfig
from hintpipe.modes import Precision
from hintpipe.option import said_as_flags


def test_the_tolerance_is_the_precision_s() -> None:
    assert (RELATIVE_TOLERANCE, BF16_RELATIVE_TOLERANCE) == (1e-4, 2e-2)
    assert relative_tolerance("fp32") == relative_tolerance(Precision.FP32) == 1e-4
    assert relative_tolerance("bf16") == relative_tolerance(Precision.BF16) == 2e-2


def _grads(model: nn.Module, precision: Precision) -> list[torch.Tensor]:
    torch.manual_seed(1)
    batches = [([torch.randn(3, 4), torch.randn(3, 4)], [torch.randn(3, 2), torch.randn(3, 2)])]
    _reference_backward(model, torch.device("cpu"), batches, nn.functional.mse_loss, {}, None, precision)
    return [p.grad.clone() for p in model.parameters() if p.grad is not None]


def test_under_bf16_the_unsplit_model_runs_under_the_pipeline_s_autocast() -> None:
    # Before, the unsplit model ran in float32 beside a bf16 pipeline: every bf16 run's check found the
    # precision's own error (0.7% on gpt-mini) over a float32 tolerance, and failed.
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 2))
    by_hand = copy.deepcopy(model)
    torch.manual_seed(1)
    xs, ys = [torch.randn(3, 4), torch.randn(3, 4)], [torch.randn(3, 2), torch.randn(3, 2)]
    for x, y in zip(xs, ys, strict=True):
        with torch.autocast("cpu", torch.bfloat16):
            loss = nn.functional.mse_loss(by_hand(x), y) / 2
        torch.autograd.backward(loss)
    expected = [p.grad for p in by_hand.parameters() if p.grad is not None]
    bf16 = _grads(copy.deepcopy(model), Precision.BF16)
    fp32 = _grads(copy.deepcopy(model), Precision.FP32)
    assert all(torch.equal(got, want) for got, want in zip(bf16, expected, strict=True))
    assert not all(torch.equal(got, want) for got, want in zip(fp32, expected, strict=True))


def _gpt2_folder(folder: Path, dropout: float) -> str:
    transformers = pytest.importorskip("transformers")
    config = transformers.GPT2Config(
        vocab_size=300, n_embd=16, n_layer=2, n_head=2, n_positions=64, bos_token_id=0, eos_token_id=0,
        resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=dropout,
    )  # fmt: skip
    transformers.GPT2LMHeadModel(config).save_pretrained(folder)
    return str(folder)


def test_a_model_with_dropout_is_refused_for_a_gradient_check_in_the_caller_s_words(tmp_path: Path) -> None:
    # Before, a GPT-2 folder (attn_pdrop 0.1 by default) failed every check: max rel diff 1.4, the masks'.
    folder = _gpt2_folder(tmp_path / "gpt2", dropout=0.1)
    model = ModelConfig("hf-folder", source=folder, vocab=300, max_seq_len=64)
    with pytest.raises(ValueError) as refused:
        TrainConfig.of(model=model, ranks=2, microbatches=2, check_grads=True)
    assert str(refused.value) == (
        f"check_grads compares a step with the unsplit model's, and {folder}'s dropout (attn_pdrop 0.1) draws "
        "other masks in each: check the model with its dropout at 0, or leave check_grads out"
    )
    with said_as_flags(), pytest.raises(ValueError) as refused:
        TrainConfig.of(model=ModelConfig("hf-gpt2", dropout=0.25), ranks=2, microbatches=2, check_grads=True)
    assert str(refused.value) == (
        "--check-grads compares a step with the unsplit model's, and hf-gpt2's dropout (0.25) draws other masks "
        "in each: check the model with its dropout at 0, or leave --check-grads out"
    )
    # Without dropout (GPT-2's summary_first_dropout, 0.1, is a head a causal language model does not build)
    # the check goes ahead, and without the check any dropout trains.
    quiet = _gpt2_folder(tmp_path / "quiet", dropout=0.0)
    checked = TrainConfig.of(model=ModelConfig("hf-folder", source=quiet), ranks=2, microbatches=2, check_grads=True)
    assert checked.training.check_grads
    assert not TrainConfig.of(model=model, ranks=2, microbatches=2, seq_len_dist=SeqLenDist(32)).training.check_grads

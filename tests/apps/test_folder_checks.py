"""What a model folder must be to be fine-tuned (:mod:`hintpipe.apps.folder_checks`): all the weights of a causal
language model. Whole folders are refused in tests/apps/test_model_folders.py; here, each rule's edges."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from hintpipe.apps.folder_checks import check_causal, check_loaded


def test_weights_that_leave_the_causal_model_unfilled_or_belong_to_another_head_are_refused() -> None:
    check_loaded("f", "LlamaForCausalLM", "LlamaForCausalLM", {"missing_keys": set(), "unexpected_keys": set()})
    # A causal LM's own folder may hold more (the hub's GPT-2 keeps attn.masked_bias buffers): taken.
    check_loaded("f", "GPT2LMHeadModel", "GPT2LMHeadModel", {"unexpected_keys": {"h.0.attn.masked_bias"}})
    check_loaded("f", "LlamaModel", "LlamaForCausalLM", {})  # a body whose head is its tied embedding: whole
    with pytest.raises(ValueError) as refused:
        check_loaded("f", "LlamaForSequenceClassification", "LlamaForCausalLM", {"unexpected_keys": {"score.weight"}})
    assert str(refused.value) == (
        "--model f holds a LlamaForSequenceClassification, not the weights of LlamaForCausalLM (it holds "
        "score.weight): hintpipe fine-tunes a causal language model from all of its weights; give the folder of a "
        "causal LM's save_pretrained, or --init random"
    )
    missing = {f"model.layers.{i}.mlp.up_proj.weight" for i in range(5)}
    with pytest.raises(ValueError) as refused:
        check_loaded("f", "LlamaForCausalLM", "LlamaForCausalLM", {"missing_keys": missing})
    assert "(it lacks model.layers.0.mlp.up_proj.weight, model.layers.1.mlp.up_proj.weight, " in str(refused.value)
    assert "model.layers.2.mlp.up_proj.weight and 2 more)" in str(refused.value)


class _Causal(nn.Module):
    def __init__(self, sees_ahead: bool) -> None:
        super().__init__()
        self.embed, self.head, self.sees_ahead = nn.Embedding(16, 8), nn.Linear(8, 16), sees_ahead

    def forward(self, ids: torch.Tensor, use_cache: bool = False) -> torch.Tensor:
        hidden = self.embed(ids)
        mixed = hidden.mean(1, keepdim=True) if self.sees_ahead else hidden.cumsum(1)  # all positions, or the past
        logits: torch.Tensor = self.head(hidden + mixed)
        return logits


def test_a_model_whose_logits_change_with_a_later_token_is_refused_and_left_in_its_mode() -> None:
    model = _Causal(sees_ahead=False)
    check_causal(model, "f", 16, 64, {"use_cache": False})
    assert model.training  # as it came
    ahead = _Causal(sees_ahead=True)
    with pytest.raises(ValueError) as refused:
        check_causal(ahead, "f", 16, 64, {"use_cache": False})
    assert str(refused.value) == (
        "--model f is not a causal language model: its logits at one position change with a later token (its "
        "attention sees the tokens it is to predict; a BERT-like model wants is_decoder in its config.json)"
    )
    assert ahead.training


class _RescaledInEval(_Causal):
    """RWKV's habit: its forward in eval mode divides a weight in place and sets a flag (see [Note: a probe leaves
    the model as it was] in hintpipe.planner.state_kept)."""

    def __init__(self) -> None:
        super().__init__(sees_ahead=False)
        self.rescaled = False

    def forward(self, ids: torch.Tensor, use_cache: bool = False) -> torch.Tensor:
        if not self.training and not self.rescaled:
            with torch.no_grad():
                self.head.weight.div_(2.0)
            self.rescaled = True
        return super().forward(ids, use_cache)


def test_the_check_leaves_a_model_that_changes_itself_in_eval_mode_as_it_was() -> None:
    model = _RescaledInEval()
    weight = model.head.weight.detach().clone()
    check_causal(model, "f", vocab=16, positions=8, kwargs={})
    assert model.training and not model.rescaled and torch.equal(model.head.weight, weight)


class _Broken(_Causal):
    """A folder whose sizes disagree: the model's own forward raises (a real case: a config.json edited by hand)."""

    def __init__(self) -> None:
        super().__init__(sees_ahead=False)

    def forward(self, ids: torch.Tensor, use_cache: bool = False) -> torch.Tensor:
        raise RuntimeError("The size of tensor a (2) must match the size of tensor b (4) at non-singleton dimension 1")


def test_a_model_whose_own_forward_fails_is_refused_in_one_line() -> None:
    with pytest.raises(ValueError) as refused:
        check_causal(_Broken(), "./broken", vocab=16, positions=8, kwargs={})
    assert str(refused.value) == (
        "--model ./broken: its own forward fails on 8 tokens, before hintpipe cuts it: RuntimeError: The size of "
        "tensor a (2) must match the size of tensor b (4) at non-singleton dimension 1; check the folder's "
        "config.json (its sizes agree?) with AutoModelForCausalLM.from_pretrained(folder)(ids)"
    )

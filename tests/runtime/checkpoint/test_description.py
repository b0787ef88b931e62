"""What a checkpoint says about its model (:mod:`hintpipe.runtime.checkpoint.description`): plain JSON that
rebuilds it, refused at once, in words, where it could not."""

from __future__ import annotations

import json
from typing import Any

import pytest
import torch

from hintpipe.runtime.checkpoint.description import checked_description, description_problem, hf_description


class TinyConfig:
    """Stands for a transformers config: its JSON as ``config.json`` holds it."""

    def to_json_string(self, use_diff: bool = True) -> str:
        return json.dumps({"model_type": "tiny", "hidden_size": 8, "use_diff": use_diff})


class TinyForCausalLM(torch.nn.Module):
    config = TinyConfig()


def test_a_hugging_face_model_is_described_by_its_class_and_its_whole_config() -> None:
    assert hf_description(TinyForCausalLM()) == {
        "kind": "hf",
        "architecture": "TinyForCausalLM",
        "config": {"model_type": "tiny", "hidden_size": 8, "use_diff": False},  # every field, not the diff
    }
    with pytest.raises(TypeError, match=r"^hf_description takes a transformers PreTrainedModel, not a Linear$"):
        hf_description(torch.nn.Linear(1, 1))


@pytest.mark.parametrize(
    ("description", "problem"),
    [
        ({"kind": "hf", "architecture": "GPT2LMHeadModel", "config": {"model_type": "gpt2"}}, None),
        ({"kind": "hintpipe", "hintpipe_model": {"name": "gpt-mini"}}, None),
        ({"kind": 3}, "it has no 'kind' (a string: 'hf' or 'hintpipe'), it has 3"),
        ({"kind": "hf", "config": {"model_type": "gpt2"}},
         "an 'hf' description needs an 'architecture' (the transformers class's name, a string)"),
        ({"kind": "hf", "architecture": "GPT2LMHeadModel", "config": {"n_layer": 2}},
         "an 'hf' description needs a 'config' (the model's config.to_dict(), with its 'model_type')"),
        ({"kind": "hintpipe", "hintpipe_model": "gpt-mini"},
         "a 'hintpipe' description needs a 'hintpipe_model' (the ModelConfig's fields)"),
    ],
)  # fmt: skip
def test_what_cannot_be_rebuilt_is_said_in_words(description: dict[str, Any], problem: str | None) -> None:
    assert description_problem(description) == problem


def test_a_description_is_recorded_as_a_copy_of_plain_json_or_refused() -> None:
    given = {"kind": "hintpipe", "hintpipe_model": {"layers": (2, 3)}}
    recorded = checked_description(given)
    assert recorded == {"kind": "hintpipe", "hintpipe_model": {"layers": [2, 3]}}  # as JSON reads it back
    assert recorded["hintpipe_model"] is not given["hintpipe_model"]
    with pytest.raises(ValueError) as refused:
        checked_description({"kind": "hintpipe", "hintpipe_model": {"dropout": float("nan")}})
    assert str(refused.value).startswith(  # Python 3.13 adds the value to json's own words
        "model_description must hold plain JSON values (dicts, lists, strings, numbers): Out of range float values "
        "are not JSON compliant"
    )
    with pytest.raises(ValueError, match=r"^model_description is not a model's description: a 'hintpipe' descr"):
        checked_description({"kind": "hintpipe"})

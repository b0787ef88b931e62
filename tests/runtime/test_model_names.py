"""The model's own names for a rank's tensors (:mod:`hintpipe.runtime.model_names`): a sequential's layers counted
from the model's first, a plan's paths as they are, a tied tensor kept once under its first name and given back
under every name."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from hintpipe.runtime.model_names import ModelNames, Naming, view


def test_a_sequentials_slices_are_named_by_the_models_layers() -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(2, 3), nn.Tanh(), nn.Linear(3, 1))
    names = ModelNames.of_sequential(model, [0, 2, 3])
    assert (names.naming, names.offsets) == (Naming.SEQUENTIAL, (0, 2))
    assert names.model_key(1, "0.weight") == "2.weight"
    assert names.model_key(1, "0.unknown") is None  # a name the model does not have
    # Each stage counts its layers from 0 (``nn.Sequential(*model[a:b])``, as split_layers makes them).
    layers = list(model)
    held = names.named_tensors({0: nn.Sequential(*layers[0:2]), 1: nn.Sequential(*layers[2:3])})
    assert list(held) == list(model.state_dict())
    assert held["2.bias"] is model[2].bias  # the tensors themselves, parameters as parameters


def test_stages_given_as_they_are_are_named_by_their_stage() -> None:
    names = ModelNames()
    assert names.model_key(3, "norm.weight") == "3.norm.weight"
    assert list(names.named_tensors({1: nn.Linear(1, 1)})) == ["1.weight", "1.bias"]


def test_a_tied_tensor_is_kept_once_under_its_first_name_and_given_back_under_each() -> None:
    keys = ["embed.weight", "h.0.weight", "head.weight"]
    names = ModelNames.of_model(keys, [["head.weight", "embed.weight", "not.in.model"], ["h.0.weight", "gone"]])
    assert names.aliases == (("embed.weight", "head.weight"),)  # in model order; a group of one name is no tie
    assert (names.canonical("head.weight"), names.canonical("h.0.weight")) == ("embed.weight", "h.0.weight")
    embedding, layer = torch.ones(2), torch.zeros(2)
    expanded = names.expand({"h.0.weight": layer, "embed.weight": embedding, "extra": layer})
    assert list(expanded) == ["embed.weight", "h.0.weight", "head.weight", "extra"]
    assert expanded["head.weight"] is embedding


def test_a_parameter_without_a_name_in_the_model_is_refused_not_lost() -> None:
    names = ModelNames.of_model(["a.weight", "b.weight"], [])
    with pytest.raises(ValueError) as refused:
        names.named_tensors({0: nn.Linear(1, 1)})
    assert str(refused.value) == (
        "stage 0's parameters ['weight', 'bias'] have no name in the model (2 names, such as ['a.weight', "
        "'b.weight']): build the pipeline from the model it was cut from"
    )


def test_a_view_holds_tensors_under_their_dotted_names() -> None:
    weight, mean = nn.Parameter(torch.ones(2)), torch.zeros(2)
    module = view({"h.0.attn.weight": weight, "h.0.norm.mean": mean})
    assert dict(module.named_parameters()) == {"h.0.attn.weight": weight}
    assert dict(module.named_buffers()) == {"h.0.norm.mean": mean}

"""The built-in models (``hintpipe.apps.models``): their layers sized on the meta device as built for real."""

from __future__ import annotations

import pytest

from hintpipe.apps.models import ModelConfig, build_layers, meta_layers


@pytest.mark.parametrize("name", ["gpt-mini", "mlp", "mm-mini"])
def test_meta_layers_size_every_parameter_as_the_built_model_and_allocate_none(name: str) -> None:
    config = ModelConfig(name, layers=3, hidden=32, heads=2, vocab=64, max_seq_len=65)
    built, sized = build_layers(config), meta_layers(config)
    shapes = [[(n, p.shape, p.dtype) for n, p in layer.named_parameters()] for layer in built]
    assert [[(n, p.shape, p.dtype) for n, p in layer.named_parameters()] for layer in sized] == shapes
    assert all(p.is_meta for layer in sized for p in layer.parameters())

"""Built-in example models for the CLI: ``mlp``, ``gpt-mini`` and ``mm-mini`` (:mod:`hintpipe.apps.multimodal`),
and the data of ``hf-gpt2``/``hf-llama``.

Both are lists of layers that split into contiguous stages. ``gpt-mini`` is a
small causal transformer: token and position embedding on the first stage,
transformer blocks, final norm and LM head on the last; its micro-batches may
have different sequence lengths, drawn from a seeded distribution. The data is
synthetic (a noisy counting language) so that the loss visibly falls.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from torch.overrides import TorchFunctionMode

from hintpipe.apps.gpt_layers import Block as Block
from hintpipe.apps.gpt_layers import Embedding as Embedding
from hintpipe.apps.gpt_layers import Head as Head
from hintpipe.apps.gpt_layers import counting_text as counting_text
from hintpipe.apps.model_config import MODELS as MODELS
from hintpipe.apps.model_config import ModelConfig as ModelConfig
from hintpipe.apps.model_config import SeqLenDist as SeqLenDist
from hintpipe.apps.model_spec import MODEL_SPECS

LossFunction = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


def build_layers(config: ModelConfig) -> list[nn.Module]:
    """The model as a list of layers (same weights on every rank for the same seed), as its kind's row builds
    it.

    Raises:
        ValueError: a planned kind, which is no list of layers.
    """
    layers: list[nn.Module] = config.spec.layer_builder()(config)
    return layers


def meta_layers(config: ModelConfig) -> list[nn.Module]:
    """The model's layers on the ``meta`` device: every parameter sized, none allocated or given values, for
    checks that count parameters of a model too large to build.

    Initialisers do nothing there (a meta tensor has no values to set): torch's ``normal_`` on a meta tensor
    imports ``torch._dynamo``, about a second of CPU that a launcher sizing a model before its ranks start
    does not need (the ranks' fork server imports it for them)."""
    with torch.device("meta"), _MetaValuesUnset():
        return build_layers(config)


class _MetaValuesUnset(TorchFunctionMode):
    """A normal initialiser (``Tensor.normal_``, ``nn.init.normal_``, ``trunc_normal_``, ``xavier_normal_``,
    ...) given a meta tensor returns it as it is (see :func:`meta_layers`). ``nn.init``'s are caught as
    themselves: inside a mode's handler the mode is off, so the ``Tensor.normal_`` they call would pass by."""

    def __torch_function__(
        self, func: Any, types: Any, args: tuple[Any, ...] = (), kwargs: dict[str, Any] | None = None
    ) -> Any:
        kwargs = kwargs or {}
        tensor = args[0] if args else kwargs.get("tensor")  # nn.init's pass it by keyword
        if getattr(func, "__name__", "").endswith("normal_") and isinstance(tensor, torch.Tensor) and tensor.is_meta:
            return tensor
        return func(*args, **kwargs)


def mlp_layers(config: ModelConfig) -> list[nn.Module]:
    """``mlp``: ``layers`` x (Linear + Tanh) of width ``hidden``."""
    torch.manual_seed(config.seed)
    return [nn.Sequential(nn.Linear(config.hidden, config.hidden), nn.Tanh()) for _ in range(config.layers)]


def gpt_layers(config: ModelConfig) -> list[nn.Module]:
    """``gpt-mini``: token and position embedding, ``layers`` transformer blocks, final norm and LM head."""
    torch.manual_seed(config.seed)
    return [Embedding(config), *(Block(config) for _ in range(config.layers)), Head(config)]


class Chain(nn.Sequential):
    """``nn.Sequential`` for layers that take and return several tensors: a tuple output is the next
    layer's positional arguments (``mm-mini`` carries its text ids through the image encoder)."""

    def forward(self, *inputs: Any) -> Any:
        value: Any = inputs if len(inputs) != 1 else inputs[0]
        for layer in self:
            value = layer(*value) if isinstance(value, tuple) else layer(value)
        return value


def whole_model(config: ModelConfig) -> tuple[nn.Module, dict[str, Any]]:
    """The model ``config`` describes as one module, as the planner captures it, and the keyword inputs every
    call of it takes (a Hugging Face model's ``use_cache=False``): built by its kind's row
    (:mod:`hintpipe.apps.model_spec`)."""
    built: tuple[nn.Module, dict[str, Any]] = config.spec.builder()(config)
    return built


def whole_layer_model(config: ModelConfig) -> tuple[nn.Module, dict[str, Any]]:
    """A built-in list of layers as one module (``mlp``, ``gpt-mini``, ``mm-mini``)."""
    layers = build_layers(config)
    # Chain (several tensors between layers) where a micro-batch is several: fx wants one-input forwards elsewhere.
    return (Chain(*layers) if config.spec.inputs > 1 else nn.Sequential(*layers)), {}


def split_layers(layers: list[nn.Module], stages: int) -> list[nn.Module]:
    """Cut ``layers`` into ``stages`` contiguous stages with layer counts as even as possible.

    Raises:
        ValueError: if there are fewer layers than stages.
    """
    if stages > len(layers):
        raise ValueError(
            f"{len(layers)} layers cannot fill {stages} stages: give at least {stages} layers, or fewer stages"
        )
    bounds = layer_bounds(len(layers), stages)
    return [Chain(*layers[a:b]) for a, b in itertools.pairwise(bounds)]


def layer_bounds(layers: int, stages: int) -> list[int]:
    """Where :func:`split_layers` cuts: each stage's first layer, then the layer count."""
    return [round(i * layers / stages) for i in range(stages + 1)]


def loss_fn_for(model: ModelConfig | str) -> LossFunction:
    """The loss a model (its config, or a built-in's name) trains with: next-token cross-entropy for a model of
    token ids, else mean squared error."""
    spec = model.spec if isinstance(model, ModelConfig) else MODEL_SPECS[model]
    maker = spec.loss_maker()
    if maker is not None:
        loss: LossFunction = maker(model)
        return loss
    return lm_loss if spec.reads_text else mse_loss


def lm_loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Mean next-token cross-entropy."""
    return F.cross_entropy(logits.flatten(0, 1), targets.flatten())


def lm_loss_sum(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Next-token cross-entropy summed over the tokens, padding (target -100) ignored: with the step's tokens
    as ``loss_divisor``, the mean over every token of the step, however the micro-batches were formed."""
    return F.cross_entropy(logits.flatten(0, 1), targets.flatten(), ignore_index=-100, reduction="sum")


def mse_loss(output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    return F.mse_loss(output, target)


def make_batch(
    config: ModelConfig,
    microbatches: int,
    microbatch_size: int,
    seq_len: SeqLenDist,
    step: int,
    data_seed: int = 0,
) -> tuple[list[Any], list[torch.Tensor], list[int]]:
    """One step's micro-batches: (inputs, targets, tokens per micro-batch), as the model's kind makes them.

    Deterministic in ``(data_seed, step)``, so every policy sees the same data.
    """
    made: tuple[list[Any], list[torch.Tensor], list[int]] = config.spec.batch_maker()(
        config, microbatches, microbatch_size, seq_len, step, data_seed
    )
    return made


def mlp_batch(
    config: ModelConfig, microbatches: int, microbatch_size: int, seq_len: SeqLenDist, step: int, data_seed: int = 0
) -> tuple[list[Any], list[torch.Tensor], list[int]]:
    """``mlp``'s data: random rows, the target their sine."""
    del seq_len  # rows, not sequences
    generator = _generator(data_seed, step)[1]
    inputs, targets, tokens = [], [], []
    for _ in range(microbatches):
        x = torch.randn(microbatch_size, config.hidden, generator=generator)
        inputs.append(x)
        targets.append(torch.sin(x))
        tokens.append(microbatch_size)
    return inputs, targets, tokens


def text_batch(
    config: ModelConfig, microbatches: int, microbatch_size: int, seq_len: SeqLenDist, step: int, data_seed: int = 0
) -> tuple[list[Any], list[torch.Tensor], list[int]]:
    """A language model's synthetic data: counting text of the model's vocabulary, ``seq_len`` long."""
    rng, generator = _generator(data_seed, step)
    inputs, targets, tokens = [], [], []
    for length in seq_len.sample(microbatches, rng, config.max_seq_len - 1):
        start = torch.randint(0, config.vocab, (microbatch_size, 1), generator=generator)
        sequence = counting_text(start, length, config.vocab, generator)
        inputs.append(sequence[:, :-1].contiguous())
        targets.append(sequence[:, 1:].contiguous())
        tokens.append(microbatch_size * length)
    return inputs, targets, tokens


def _generator(data_seed: int, step: int) -> tuple[np.random.Generator, torch.Generator]:
    rng = np.random.default_rng([data_seed, step])
    return rng, torch.Generator().manual_seed(int(rng.integers(2**31)))

"""A model of the user's own from the command line: ``hintpipe train --model module:function``.

The function takes no arguments and returns ``(model, example, loss_fn)``: an ``nn.Module`` that maps token
ids ``[rows, T]`` (int64) to next-token logits ``[rows, T, vocab]``, an example batch of such ids (its shape
is what the planner captures), and ``loss_fn(logits, targets)``, the mean loss of a micro-batch (as
``hintpipe.plan`` and ``Pipeline`` take it in Python). So the command line trains what Python trains: the
same model, planned and cut by the planner, on the run's data (``--data`` corpora or counting text of the
model's vocabulary). Models of other inputs train through the Python API.

``module`` is imported as Python imports it, with the working folder first on the path (where a user's
``train.py`` lives); the function is called once per process and its answer kept.
"""

from __future__ import annotations

import functools
import importlib
import os
import sys
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from hintpipe.apps.model_config import ModelConfig
from hintpipe.planner.state_kept import state_kept

LossFunction = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


@functools.cache
def made(source: str) -> tuple[nn.Module, torch.Tensor, LossFunction]:
    """What ``module:function`` returns, checked (called once per process).

    Raises:
        ValueError: in one line: the module or function missing, or an answer of another shape.
    """
    module_name, _, function_name = source.partition(":")
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ValueError(f"--model {source}: cannot import {module_name} ({exc})") from None
    function = getattr(module, function_name, None)
    if not callable(function):
        raise ValueError(f"--model {source}: {module_name} has no function {function_name}")
    answer = function()
    if not (isinstance(answer, tuple) and len(answer) == 3):
        raise ValueError(
            f"--model {source}: {function_name}() must return (model, example, loss_fn), not {_kind(answer)}"
        )
    model, example, loss_fn = answer
    if not isinstance(model, nn.Module) or not callable(loss_fn):
        raise ValueError(
            f"--model {source}: {function_name}() must return (model, example, loss_fn): an nn.Module, a batch of "
            f"token ids and a function, not ({_kind(model)}, {_kind(example)}, {_kind(loss_fn)})"
        )
    if not (isinstance(example, torch.Tensor) and example.dtype == torch.int64 and example.dim() == 2):
        raise ValueError(
            f"--model {source}: the example must be token ids, an int64 tensor [rows, T], not {_kind(example)}; the "
            "command line trains models of token ids (others train through the Python API)"
        )
    return model, example, loss_fn


def _kind(value: Any) -> str:
    if isinstance(value, torch.Tensor):
        return f"a {value.dtype} tensor of shape {list(value.shape)}"
    return f"a {type(value).__name__}"


def factory_sizes(source: str, *, init: str = "pretrained", seed: int = 0) -> ModelConfig:
    """The :class:`ModelConfig` of ``module:function``'s model: its vocabulary from its output on the example,
    its positions the example's length (a longer sequence is cropped to it). ``init``: the factory's weights are
    its own (``pretrained``, the one choice)."""
    if init != "pretrained":
        raise ValueError(f"--init {init}: --model {source} is a factory, its weights are the ones it makes")
    model, example, _ = made(source)
    with torch.no_grad(), state_kept(model):  # the model trained is the one the factory made, as it made it
        logits = _logits(model(example))
    if logits.dim() != 3 or tuple(logits.shape[:2]) != tuple(example.shape):
        raise ValueError(
            f"--model {source}: the model maps ids {list(example.shape)} to {list(logits.shape)}; it must give "
            "logits [rows, T, vocab]"
        )
    return ModelConfig(
        "factory",
        layers=1,
        hidden=1,  # unknown: the memory checks that use it take the least
        heads=1,
        vocab=int(logits.shape[-1]),
        max_seq_len=int(example.shape[1]) + 1,
        seed=seed,
        source=source,
    )


def _logits(output: Any) -> torch.Tensor:
    logits = getattr(output, "logits", output)
    if not isinstance(logits, torch.Tensor):
        raise ValueError(f"the model's output is {_kind(output)}, not logits")
    return logits


def whole_factory_model(config: ModelConfig) -> tuple[nn.Module, dict[str, Any]]:
    """The factory's model (the one object it returned in this process), with no keyword inputs."""
    assert config.source is not None
    return made(config.source)[0], {}


def factory_loss(config: ModelConfig) -> LossFunction:
    """The loss the factory returned."""
    assert config.source is not None
    return made(config.source)[2]

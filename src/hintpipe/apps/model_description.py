"""A model as plain values and back: the description a checkpoint or a plan file keeps of the model, and the
model rebuilt from it (see :mod:`hintpipe.runtime.checkpoint.description` for the two kinds).

A built-in model is its :class:`~hintpipe.apps.model_config.ModelConfig`; a
built-in ``hf-*`` model is also its ``transformers`` class and config, so that
it is rebuilt with ``transformers`` alone (``from_pretrained`` after ``hintpipe
export``) and by someone who never saw :mod:`hintpipe.apps.hf_models`. A
Hugging Face model of the caller's own is rebuilt from its class and config:
the class must be a ``transformers.PreTrainedModel`` (the description names a
class; nothing else of ``transformers`` is called by name), the config one
``transformers`` knows, asking for nothing but its own code (no download, no
kernel or code from the Hub: see [Note: a model built from a description
fetches nothing] in :mod:`hintpipe.own_code`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from torch import nn

from hintpipe.apps.model_config import ModelConfig
from hintpipe.own_code import refuse_hub_code
from hintpipe.runtime.checkpoint.description import HF, HINTPIPE, description_problem


def describe_model(config: ModelConfig) -> dict[str, Any]:
    """The description of the built-in model ``config`` names (plain JSON values).

    Raises:
        ImportError: an ``hf-*`` model without transformers, naming the extra.
    """
    describer = config.spec.describer()
    if describer is not None:
        described: dict[str, Any] = describer(config)
        return described
    return {"kind": HINTPIPE, "hintpipe_model": dataclasses.asdict(config)}


def architecture_of(description: Mapping[str, Any]) -> str:
    """What the description says the model is: the ``transformers`` class, or the built-in model's name."""
    if description.get("kind") == HF:
        return str(description["architecture"])
    return str(description["hintpipe_model"]["name"])


def rebuild_model(description: Mapping[str, Any]) -> nn.Module:
    """The model ``description`` describes, its weights freshly drawn (load the checkpoint's into it).

    Raises:
        ValueError: a description of another kind or of another version, one this hintpipe or this
            ``transformers`` cannot build, or transformers missing for a Hugging Face model (naming the extra).
    """
    problem = description_problem(description)
    if problem is not None:
        raise ValueError(f"its model description is not one: {problem}")
    kind = description["kind"]
    if kind == HF:
        return _hf_model(str(description["architecture"]), dict(description["config"]))
    if kind == HINTPIPE:
        return _built_in(dict(description["hintpipe_model"]))
    raise ValueError(
        f"its model is of kind {kind!r}, which this hintpipe does not build (it builds {HF!r} and {HINTPIPE!r})"
    )


def built_in_config(fields: Mapping[str, Any]) -> ModelConfig:
    """The :class:`ModelConfig` of a description's ``hintpipe_model`` (or of ``hintpipe_model.json``).

    Raises:
        ValueError: fields that are not a ModelConfig's, or values it refuses.
    """
    try:
        return ModelConfig(**fields)
    except TypeError as exc:  # a field this hintpipe's ModelConfig does not have
        raise ValueError(f"its hintpipe_model is not this hintpipe's ModelConfig ({exc})") from None


def _built_in(fields: dict[str, Any]) -> nn.Module:
    from hintpipe.apps.models import whole_model

    config = built_in_config(fields)
    if config.spec.sourced:  # a folder or the user's code: never loaded or run because a description says so
        raise ValueError(
            f"its hintpipe_model is a {config.name} ({config.source}), which a description does not rebuild"
        )
    return whole_model(config)[0]


def _hf_model(architecture: str, config: dict[str, Any]) -> nn.Module:
    try:
        import transformers
    except ImportError:
        raise ValueError(f"its model is a Hugging Face {architecture}: pip install -e '.[hf]' (transformers)") from None
    refuse_hub_code(config, "its config")  # see [Note: a model built from a description fetches nothing]
    model_type = str(config["model_type"])
    try:
        config_class = transformers.CONFIG_MAPPING[model_type]
    except KeyError:
        raise ValueError(
            f"transformers {transformers.__version__} has no model type {model_type!r} (the {architecture}'s)"
        ) from None
    model_class = getattr(transformers, architecture, None)
    if not (isinstance(model_class, type) and issubclass(model_class, transformers.PreTrainedModel)):
        raise ValueError(f"{architecture!r} is not a model class of transformers {transformers.__version__}")
    settings = config_class.from_dict(config)
    expected = getattr(model_class, "config_class", None)
    if isinstance(expected, type) and not isinstance(settings, expected):
        raise ValueError(f"{architecture} takes a {expected.__name__}, its config is a {type(settings).__name__}")
    model: nn.Module = model_class(settings)
    return model

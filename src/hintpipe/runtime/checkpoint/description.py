"""What a checkpoint says about the model it holds, so that the model can be rebuilt without the code that
trained it.

A checkpoint keeps tensors by the model's names, nothing more: loading them
needs the model, and the model of a run configured on the command line was
built from sizes that lived only in that command (``hintpipe train --model
hf-gpt2 --layers 4``: its vocabulary, its positions and its dropout are the
command line's own). So a checkpoint's manifest may carry the model's
*description*, plain JSON values that rebuild it (``hintpipe export`` reads
it; :mod:`hintpipe.apps.model_description` rebuilds from it):

- ``{"kind": "hf", "architecture": "GPT2LMHeadModel", "config": {...}}``: a
  Hugging Face model, its class in ``transformers`` and its config as
  ``config.json`` holds it (:func:`hf_description` makes one from a model);
- ``{"kind": "hintpipe", "hintpipe_model": {...}}``: one of hintpipe's
  built-in models, its :class:`~hintpipe.apps.model_config.ModelConfig`'s fields
  (a built-in ``hf-*`` model's ``hf`` description carries them too).

It is recorded for the reader, never compared: a resumed run writes its own.
This module is torch-free and imports no ``transformers``.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

__all__ = ["HF", "HINTPIPE", "checked_description", "description_problem", "hf_description"]

#: The kinds of description hintpipe rebuilds.
HF = "hf"
HINTPIPE = "hintpipe"


def hf_description(model: Any) -> dict[str, Any]:
    """The description of a Hugging Face model (a ``transformers.PreTrainedModel``), for
    ``Checkpointer(..., model_description=hf_description(model))``: its class's name and its whole config, as
    ``save_pretrained`` would write ``config.json``.

    Raises:
        TypeError: ``model`` has no transformers config.
    """
    config = getattr(model, "config", None)
    if not callable(getattr(config, "to_json_string", None)):
        raise TypeError(f"hf_description takes a transformers PreTrainedModel, not a {type(model).__name__}")
    return described_hf(type(model).__name__, config)


def described_hf(architecture: str, config: Any) -> dict[str, Any]:
    """``architecture`` (a class of ``transformers``) with ``config`` (a ``PretrainedConfig``) as a description:
    the config through transformers' own JSON (what ``config.json`` holds: its dtypes as names, every field)."""
    return {"kind": HF, "architecture": architecture, "config": json.loads(config.to_json_string(use_diff=False))}


def description_problem(description: Mapping[str, Any]) -> str | None:
    """What makes ``description`` one that cannot be recorded or rebuilt, in words, or None."""
    kind = description.get("kind")
    if not isinstance(kind, str):
        return f"it has no 'kind' (a string: {HF!r} or {HINTPIPE!r}), it has {kind!r}"
    if kind == HF:
        config = description.get("config")
        if not isinstance(description.get("architecture"), str):
            return "an 'hf' description needs an 'architecture' (the transformers class's name, a string)"
        if not isinstance(config, Mapping) or not isinstance(config.get("model_type"), str):
            return "an 'hf' description needs a 'config' (the model's config.to_dict(), with its 'model_type')"
    if kind == HINTPIPE and not isinstance(description.get("hintpipe_model"), Mapping):
        return "a 'hintpipe' description needs a 'hintpipe_model' (the ModelConfig's fields)"
    return None


def checked_description(description: Mapping[str, Any]) -> dict[str, Any]:
    """``description`` as a manifest holds it (a copy, through JSON), refused here rather than at the first save.

    Raises:
        ValueError: not plain JSON values, or not a description (see :func:`description_problem`).
    """
    try:
        plain: dict[str, Any] = json.loads(json.dumps(dict(description), allow_nan=False))
    except (TypeError, ValueError) as exc:
        raise ValueError(
            f"model_description must hold plain JSON values (dicts, lists, strings, numbers): {exc}"
        ) from None
    problem = description_problem(plain)
    if problem is not None:
        raise ValueError(f"model_description is not a model's description: {problem}")
    return plain

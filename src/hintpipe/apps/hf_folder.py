"""A Hugging Face causal language model from its folder: what ``hintpipe train --model FOLDER`` trains.

The folder is what ``save_pretrained`` writes (``config.json`` and the weights, and often the tokenizer
beside them): a pretrained model to fine-tune, or one fine-tuned before. It is read as Hugging Face's own
loaders read it, with local files only and no code from the folder (``trust_remote_code=False``: a folder
whose config maps to its own Python is refused, in one line). ``init``:

- ``pretrained`` (the default): the folder's weights, in float32 (``from_pretrained``);
- ``random``: the folder's config with weights drawn from the run's seed (``from_config``): the same
  architecture trained from scratch.

Any ``AutoModelForCausalLM`` class of the installed ``transformers`` whose graph torch.export captures is
taken; the planner cuts it like a built-in ``hf-*`` model. Its sizes (layers, width, vocabulary, positions)
are read from its config (:func:`folder_sizes`), so that the command line checks the run before any rank
starts.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import torch
from torch import nn

from hintpipe.apps.folder_checks import check_causal, check_loaded
from hintpipe.apps.hf_models import CALL_KWARGS, without_progress_bars
from hintpipe.apps.model_config import ModelConfig
from hintpipe.own_code import refuse_hub_code, refuse_own_code

#: Positions assumed for a config that names none (rotary models without a limit).
_DEFAULT_POSITIONS = 2048


def _transformers() -> Any:
    try:
        import transformers
    except ImportError:
        raise ValueError("--model FOLDER (a Hugging Face model) needs transformers: pip install -e '.[hf]'") from None
    return transformers


def folder_config(folder: str) -> Any:
    """The folder's ``transformers`` config (local files only, no code from the folder).

    Raises:
        ValueError: in one line: no config transformers reads, a config that asks for the folder's own code,
            or a model that is not a causal language model.
    """
    transformers = _transformers()
    try:
        refuse_own_code(folder, ("config.json",), what="model", required=True)
        refuse_hub_code(
            json.loads(Path(folder, "config.json").read_text(encoding="utf-8")), f"{folder}: its config.json"
        )
    except ValueError as exc:
        raise ValueError(f"--model {exc}") from None
    try:
        config = transformers.AutoConfig.from_pretrained(folder, local_files_only=True, trust_remote_code=False)
    except Exception as exc:  # transformers raises OSError, ValueError, KeyError, ... for a config it cannot read
        first = (str(exc).strip().splitlines() or [""])[0]
        raise ValueError(f"--model {folder}: transformers cannot read its config.json ({first})") from None
    if architecture(config) is None:
        raise ValueError(
            f"--model {folder}: its model type {config.model_type!r} has no causal language model in transformers "
            f"{transformers.__version__} (AutoModelForCausalLM)"
        )
    return config


def architecture(config: Any) -> str | None:
    """The ``transformers`` class that ``AutoModelForCausalLM`` builds for ``config`` (None: none does)."""
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    name = MODEL_FOR_CAUSAL_LM_MAPPING_NAMES.get(config.model_type)
    return name if isinstance(name, str) else None


def folder_sizes(folder: str, *, init: str = "pretrained", seed: int = 0) -> ModelConfig:
    """The :class:`ModelConfig` of the model in ``folder``: its sizes as its config says them.

    Raises:
        ValueError: as :func:`folder_config`.
    """
    return _sizes(folder_config(folder), source=str(Path(folder).resolve()), init=init, seed=seed)


def described_sizes(description: dict[str, Any], *, label: str, seed: int = 0) -> ModelConfig:
    """The :class:`ModelConfig` of a Hugging Face model's description (a plan file's, made in Python): its
    sizes as its config says them, ``label`` its source (what output names it by); the model itself is
    rebuilt from the description.

    Raises:
        ValueError: a description transformers cannot read.
    """
    transformers = _transformers()
    settings = dict(description["config"])
    refuse_hub_code(settings, f"{label}: its model description's config")
    try:
        config = transformers.CONFIG_MAPPING[str(settings["model_type"])].from_dict(settings)
    except (KeyError, ValueError) as exc:
        raise ValueError(f"{label}: its model description is not one transformers reads ({exc})") from None
    return _sizes(config, source=label, init="pretrained", seed=seed)


def _sizes(config: Any, *, source: str, init: str, seed: int) -> ModelConfig:
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    hidden = int(getattr(text, "hidden_size", 0) or 1)
    positions = getattr(text, "max_position_embeddings", None) or _DEFAULT_POSITIONS
    return ModelConfig(
        "hf-folder",
        layers=int(getattr(text, "num_hidden_layers", 0) or 1),
        hidden=hidden,
        heads=int(getattr(text, "num_attention_heads", 0) or 1),
        vocab=int(text.vocab_size),
        max_seq_len=int(positions),
        seed=seed,
        source=source,
        init=init,
    )


def folder_dropout(folder: str) -> tuple[str, float] | None:
    """The first dropout probability above 0 that the folder's model trains with (its config's ``*_pdrop`` and
    ``*dropout*`` fields, not those of heads a causal language model does not build: ``summary_*``,
    ``classifier_*``), as ``(field, p)``; None where every one is 0."""
    config = folder_config(folder)
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    for field, value in sorted(vars(text).items()):
        named = field.endswith("pdrop") or "dropout" in field
        if named and not field.startswith(("summary_", "classifier_")) and isinstance(value, float) and value > 0:
            return field, value
    return None


def whole_folder_model(config: ModelConfig) -> tuple[nn.Module, dict[str, Any]]:
    """The folder's model as ``config.init`` says (its weights, or its config with weights from the seed), in
    float32 and in training mode, with the keywords of every call."""
    transformers = _transformers()
    assert config.source is not None
    settings = folder_config(config.source)
    if config.init == "pretrained":
        with without_progress_bars():
            model, info = transformers.AutoModelForCausalLM.from_pretrained(
                config.source,
                config=settings,
                local_files_only=True,
                trust_remote_code=False,
                dtype=torch.float32,
                output_loading_info=True,
            )
        saved = (getattr(settings, "architectures", None) or [type(model).__name__])[0]
        check_loaded(config.source, saved, type(model).__name__, info)  # [Note: a folder holds a causal language model]
    else:
        torch.manual_seed(config.seed)
        model = transformers.AutoModelForCausalLM.from_config(settings, trust_remote_code=False, dtype=torch.float32)
    check_causal(model, config.source, config.vocab, config.max_seq_len, dict(CALL_KWARGS))
    model.train()  # from_pretrained hands it back in eval mode; a run trains it (dropout as its config says)
    return model, dict(CALL_KWARGS)


def folder_description(config: ModelConfig) -> dict[str, Any]:
    """The folder model's description for checkpoints and plan files: its ``transformers`` class and whole
    config (``hintpipe export`` writes it with ``save_pretrained``), and the run's ModelConfig."""
    from hintpipe.runtime.checkpoint.description import described_hf

    assert config.source is not None
    settings = folder_config(config.source)
    name = architecture(settings)
    assert name is not None  # folder_config refused it otherwise
    return {**described_hf(name, settings), "hintpipe_model": dataclasses.asdict(config)}

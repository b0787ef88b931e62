"""Hugging Face causal language models from small configs built in code (no download).

``hf-gpt2`` is ``GPT2LMHeadModel`` and ``hf-llama`` ``LlamaForCausalLM`` (with
``tie_word_embeddings``), weights drawn from the seed, dropout ``--dropout`` (0 by
default, so that a pipeline and the unsplit model compute the same). ``transformers`` is the
optional extra ``hf`` (``pip install -e .[hf]``).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch
from torch import nn

from hintpipe.apps.model_config import ModelConfig

#: The keyword inputs every capture and call of these models uses.
CALL_KWARGS = {"use_cache": False}
#: Each model's class in ``transformers``.
ARCHITECTURES = {"hf-gpt2": "GPT2LMHeadModel", "hf-llama": "LlamaForCausalLM"}


@contextlib.contextmanager
def without_progress_bars() -> Iterator[None]:
    """transformers' progress bars off within (its ``Loading weights`` bar on every ``from_pretrained``, its
    ``save_pretrained``'s), as they were after: a command says what it does in its own lines, and under
    ``--json`` or ``torchrun`` a bar per load is noise on every rank's stderr."""
    from transformers.utils import logging as hf_logging

    shown = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()  # type: ignore[no-untyped-call]
    try:
        yield
    finally:
        if shown:
            hf_logging.enable_progress_bar()  # type: ignore[no-untyped-call]


def whole_hf_model(config: ModelConfig) -> tuple[nn.Module, dict[str, Any]]:
    """The model row ``hf-gpt2``/``hf-llama`` builds (:mod:`hintpipe.apps.model_spec`), with its call's keywords."""
    return build_hf_model(config), dict(CALL_KWARGS)


def build_hf_model(config: ModelConfig) -> nn.Module:
    """The model ``config`` names, its weights drawn from ``config.seed``.

    Raises:
        ImportError: when transformers is not installed, naming the extra.
    """
    import transformers  # hf_config said it is there

    settings = hf_config(config)
    torch.manual_seed(config.seed)
    model: nn.Module = getattr(transformers, ARCHITECTURES[config.name])(settings)
    return model


def built_in_description(config: ModelConfig) -> dict[str, Any]:
    """The description of ``hf-gpt2``/``hf-llama`` (:mod:`hintpipe.apps.model_description`): its
    ``transformers`` class and config, and its ModelConfig's fields."""
    import dataclasses

    from hintpipe.runtime.checkpoint.description import described_hf

    return {**described_hf(ARCHITECTURES[config.name], hf_config(config)), "hintpipe_model": dataclasses.asdict(config)}


def hf_config(config: ModelConfig) -> Any:
    """The ``transformers`` config of the model ``config`` names (a ``PretrainedConfig``): what a checkpoint's
    description keeps of it, so that the model is rebuilt without these lines.

    Raises:
        ImportError: when transformers is not installed, naming the extra.
    """
    try:
        import transformers
    except ImportError as exc:
        raise ImportError(f"{config.name} needs transformers: pip install -e '.[hf]'") from exc
    if config.name == "hf-gpt2":
        return transformers.GPT2Config(
            n_layer=config.layers, n_embd=config.hidden, n_head=config.heads, vocab_size=config.vocab,
            n_positions=config.max_seq_len, resid_pdrop=config.dropout, embd_pdrop=config.dropout,
            attn_pdrop=config.dropout, bos_token_id=0,
            eos_token_id=0,
        )  # fmt: skip
    return transformers.LlamaConfig(
        hidden_size=config.hidden, intermediate_size=4 * config.hidden, num_hidden_layers=config.layers,
        num_attention_heads=config.heads, num_key_value_heads=config.heads, vocab_size=config.vocab,
        max_position_embeddings=config.max_seq_len, tie_word_embeddings=True, pad_token_id=0, bos_token_id=0,
        eos_token_id=0, attention_dropout=config.dropout,
    )  # fmt: skip

"""The flags that say which model a command trains or plans, and the :class:`ModelConfig` they make.

``--model`` takes what users have (:func:`~hintpipe.apps.model_spec.model_kind`): a built-in name, a folder a
Hugging Face model was saved to, or ``module:function``. A built-in model is shaped by its flags (``--layers``,
``--hidden``, ``--heads``, ``--vocab``, ``--max-seq-len``, ``--dropout``); a folder's model by its own config,
so those flags are refused beside it (one line: the folder says them), and ``--init`` says whether it starts
from the folder's weights or from its config alone. ``--max-seq-len`` alone is taken beside a folder (or a factory):
not the model's positions but the context it trains on, rows of at most that many tokens (Hugging Face's
``run_clm.py --block_size``); a model of 131,072 positions otherwise trains on rows as long (every row, under
``--forming concat``).

This module is torch-free (a folder's config is read with transformers, imported then).
"""

from __future__ import annotations

import argparse
import dataclasses
from typing import Any

from hintpipe.apps.model_config import INITS, ModelConfig
from hintpipe.apps.model_spec import BUILT_IN, DEFAULT_MODEL, MODEL_SPECS, model_kind
from hintpipe.cli.common import whole_number

#: The flags that shape a built-in model, with their defaults (a folder's config says them instead).
SIZES: dict[str, Any] = {"layers": 4, "hidden": 64, "heads": 4, "vocab": None, "max_seq_len": 256, "dropout": 0.0}


def add_model_flags(parser: argparse.ArgumentParser, *, from_plan: bool = False) -> None:
    """``--model``, ``--init`` and the built-in models' sizes; defaults None, resolved by :func:`model_config`
    (``from_plan``: a ``--plan`` file may say them instead)."""
    plan = "; with --plan, the plan file's" if from_plan else ""
    kinds = "; ".join(f"{name}: {MODEL_SPECS[name].summary}" for name in BUILT_IN)
    parser.add_argument(
        "--model",
        metavar="NAME|DIR|MODULE:FUNCTION",
        help=f"the model: a built-in ({kinds}), a folder written by a Hugging Face model's save_pretrained (any "
        f"causal LM), or module:function, a factory of your own (default gpt-mini{plan})",
    )
    parser.add_argument(
        "--init",
        choices=INITS,
        help="a model folder's weights: pretrained (the folder's, to fine-tune) or random (its config, weights from "
        "--seed) (default pretrained)",
    )
    parser.add_argument(
        "--layers", type=whole_number, metavar="N", help=f"a built-in model's blocks / MLP layers (default 4{plan})"
    )
    parser.add_argument(
        "--hidden", type=whole_number, metavar="H", help=f"a built-in model's hidden size (default 64{plan})"
    )
    parser.add_argument(
        "--heads", type=whole_number, metavar="N", help="a built-in model's attention heads (default 4)"
    )
    parser.add_argument(
        "--vocab", type=whole_number, metavar="V", help="a built-in model's vocabulary (default: the data's, else 128)"
    )
    parser.add_argument(
        "--max-seq-len",
        type=whole_number,
        metavar="T",
        help="a built-in model's positions (default 256); beside a model folder or a factory, the context it trains "
        "on: rows of at most T tokens, at most its positions (default: its positions)",
    )
    parser.add_argument("--dropout", type=float, metavar="P", help="a built-in model's dropout probability (default 0)")


def given_sizes(args: argparse.Namespace) -> dict[str, Any]:
    """The size flags given (not None)."""
    return {name: getattr(args, name) for name in SIZES if getattr(args, name, None) is not None}


def model_config(args: argparse.Namespace, *, seed: int, data_vocab: int | None) -> ModelConfig:
    """The model the flags name, sized (a folder's sizes read from its config; transformers imported then).

    Raises:
        ValueError: in one line: a ``--model`` that is none of its three forms, size flags beside a folder,
            ``--init`` beside a built-in model, sizes a model refuses.
    """
    kind, source = model_kind(args.model or DEFAULT_MODEL)
    sizes = given_sizes(args)
    if source is not None:
        context = sizes.pop("max_seq_len", None)
        if sizes:
            flags = " ".join(f"--{name.replace('_', '-')}" for name in sizes)
            raise ValueError(f"{flags}: --model {args.model} is sized by its own config; leave {flags} out")
        sourced = _sourced(kind, source, init=args.init or "pretrained", seed=seed)
        return sourced if context is None else _trained_context(sourced, context)
    if args.init is not None:
        raise ValueError(
            f"--init {args.init}: --model {kind} is a built-in model, its weights always start from --seed; "
            "--init is for a model folder"
        )
    values = {name: default for name, default in SIZES.items() if default is not None} | sizes
    values.setdefault("vocab", data_vocab if data_vocab is not None else ModelConfig.vocab)
    try:
        return ModelConfig(kind, seed=seed, **values)
    except ValueError as exc:
        raise ValueError(f"--model {kind}: {exc}") from None


def _trained_context(model: ModelConfig, context: int) -> ModelConfig:
    """A sourced ``model`` trained on rows of at most ``context`` tokens (``--max-seq-len``), within its positions.

    Raises:
        ValueError: a context past the model's positions, or under 2 tokens.
    """
    if not 2 <= context <= model.max_seq_len:
        raise ValueError(
            f"--max-seq-len {context}: {model.label}'s positions end at {model.max_seq_len} tokens; give the context "
            f"it trains on, 2 to {model.max_seq_len}"
        )
    return dataclasses.replace(model, max_seq_len=context)


def _sourced(kind: str, source: str, *, init: str, seed: int) -> ModelConfig:
    """A sourced model's config, as its kind's row reads it from the source."""
    config: ModelConfig = MODEL_SPECS[kind].sizer()(source, init=init, seed=seed)
    return config

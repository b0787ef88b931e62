"""A Hugging Face folder that asks for its own Python code is refused before ``transformers`` reads it.

A model folder's ``config.json``, or a tokenizer folder's ``tokenizer_config.json`` or ``config.json``, may
hold an ``auto_map``: the classes to import from Python files in the folder. ``transformers`` then runs those
files if ``trust_remote_code=True``, and with the argument left out it *asks* on stdin (a ``y`` runs them;
unanswered it waits 15 s; off a terminal it prints the question on stdout). hintpipe runs no code from a
folder: every ``from_pretrained`` it calls passes ``trust_remote_code=False``, and a folder with an
``auto_map`` is refused here first, in one line that says what to use instead, never by transformers'
message about the repository.

This module is torch-free.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path


def refuse_own_code(folder: str, files: Sequence[str], *, what: str, required: bool = False) -> None:
    """Refuse ``folder`` when one of its JSON ``files`` maps to Python code in it (``auto_map``).

    ``what``: the folder's kind in the message (``model``, ``tokenizer``); ``required``: a missing or unreadable
    file is refused too (a model folder's ``config.json``); otherwise it is left for transformers to judge.

    Raises:
        ValueError: ``<folder>: its <file> maps to Python code in the folder (auto_map), ...``; the caller puts
            its option's name in front.
    """
    for name in files:
        path = Path(folder, name)
        if not required and not path.is_file():
            continue
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            if not required:
                continue  # transformers reads it, or says why it cannot
            raise ValueError(f"{folder}: its {name} is not JSON ({exc})") from None
        if not isinstance(data, dict):
            if not required:
                continue
            raise ValueError(f"{folder}: its {name} is not a JSON object")
        if "auto_map" in data:
            raise ValueError(
                f"{folder}: its {name} maps to Python code in the folder (auto_map), and hintpipe runs no code from "
                f"a {what} folder; use a {what} class that transformers ships"
            )


#: The attention and experts implementations transformers ships as its own code. Any other value is a kernel it
#: fetches from the Hugging Face Hub (``kernels-community/flash-attn2``, ``org/repo``) or, for
#: ``flash_attention_*`` without the ``flash_attn`` package, a kernel it fetches in its place.
BUILT_IN_IMPLEMENTATIONS = {
    "attn_implementation": ("eager", "sdpa", "flex_attention"),
    "experts_implementation": ("eager", "batched_mm", "grouped_mm"),
}


def refuse_hub_code(config: object, where: str) -> None:
    """Refuse a model config (a ``config.json``, a description's ``config``) that would make transformers fetch
    or run code when the model is built from it.

    [Note: a model built from a description fetches nothing]
    A config is data, but some of its keys name code: ``attn_implementation`` (and ``experts_implementation``)
    may name a kernel on the Hugging Face Hub, which transformers downloads and loads when the model is built
    (``"kernels-community/flash-attn2"``; ``flash_attention_2`` without ``flash_attn`` installed falls back to
    one); ``auto_map`` names Python classes beside the config; ``quantization_config`` hands the weights to a
    quantizer package. ``hintpipe export`` and ``train --plan FILE`` build the model a checkpoint's or a plan
    file's description names, and ``train --model FOLDER`` the one a folder's ``config.json`` names: each config
    is allowed only what transformers builds with its own code, checked here (sub-configs too: a multimodal
    model's ``text_config``), and anything else is refused in one line naming the key and its value.

    Raises:
        ValueError: ``<where>'s <key> is <value>, ...``; the caller puts its context in front.
    """
    for path, key, value in _entries(config, ()):
        name = key.lstrip("_").removesuffix("_internal")
        label = ".".join((*path, key))
        if name in BUILT_IN_IMPLEMENTATIONS:
            allowed = BUILT_IN_IMPLEMENTATIONS[name]
            values = value.values() if isinstance(value, dict) else [value]
            for one in values:
                if one is not None and one not in allowed:
                    raise ValueError(
                        f"{where}'s {label} is {one!r}, not one of transformers' own ({', '.join(allowed)}): "
                        "hintpipe builds a model with transformers' own code only, no kernel from the Hub; use "
                        "one of those or leave it out"
                    )
        elif name in ("auto_map", "quantization_config", "trust_remote_code", "use_kernels") and value:
            raise ValueError(
                f"{where}'s {label} is {value!r}: hintpipe builds a model with transformers' own code only (no "
                "code from a folder or the Hub, no quantizer); remove it"
            )


def _entries(config: object, path: tuple[str, ...]) -> list[tuple[tuple[str, ...], str, object]]:
    """Every ``(path, key, value)`` of a JSON object and the objects inside it, depth first."""
    if not isinstance(config, dict):
        return []
    found: list[tuple[tuple[str, ...], str, object]] = []
    for key, value in config.items():
        found.append((path, str(key), value))
        if isinstance(value, dict) and not str(key).lstrip("_").startswith(("attn_impl", "experts_impl")):
            found.extend(_entries(value, (*path, str(key))))
    return found

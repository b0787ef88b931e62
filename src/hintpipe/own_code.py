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

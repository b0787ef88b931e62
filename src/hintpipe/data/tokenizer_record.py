"""The tokenizer a run trained with, recorded so that ``hintpipe export`` hands it on beside the model.

A model without its tokenizer cannot be used: ``from_pretrained(OUT_DIR)`` for the model, then
``AutoTokenizer.from_pretrained(OUT_DIR)`` for its tokens. A run records which tokenizer folder it used (the
``--tokenizer`` folder, or a model folder's own) in its checkpoints' model description, with a digest of
each of its files; the export copies those files when they are still there and unchanged, and says so in a
note when they are not (a moved or edited folder is never copied silently as if it were the run's).

The ``bytes`` tokenizer has no files: its token ids are a text's UTF-8 bytes (``list(text.encode())``), and
nothing is written for it.

This module is torch-free.
"""

from __future__ import annotations

import hashlib
import shutil
from collections.abc import Mapping
from pathlib import Path
from typing import Any

#: The files a saved Hugging Face tokenizer may consist of.
TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "added_tokens.json",
    "vocab.json",
    "vocab.txt",
    "merges.txt",
    "tokenizer.model",
    "spiece.model",
    "chat_template.jinja",
)


def tokenizer_record(folder: str) -> dict[str, Any]:
    """The record of tokenizer folder ``folder``: its absolute path and each tokenizer file's SHA-256."""
    root = Path(folder).resolve()
    files = {name: _digest(root / name) for name in TOKENIZER_FILES if (root / name).is_file()}
    return {"folder": str(root), "files": files}


def copy_tokenizer(record: Mapping[str, Any], out: Path) -> str | None:
    """Copy the recorded tokenizer's files into ``out``; returns a note where they could not be (None: copied).
    Nothing is copied unless every file is there with its recorded digest."""
    root = Path(str(record.get("folder", "")))
    files = record.get("files")
    if not isinstance(files, Mapping) or not files:
        return f"the run's tokenizer ({root}) was recorded without files: copy it into the export by hand"
    for name, digest in files.items():
        path = root / str(name)
        if Path(str(name)).name != name or not path.is_file():
            return f"the run's tokenizer was not copied: {path} is gone; copy the tokenizer into the export by hand"
        if _digest(path) != digest:
            return f"the run's tokenizer was not copied: {path} changed since the run; copy the one it used by hand"
    for name in files:
        shutil.copyfile(root / str(name), out / str(name))
    return None


def _digest(path: Path) -> str:
    with open(path, "rb") as handle:
        return hashlib.file_digest(handle, "sha256").hexdigest()

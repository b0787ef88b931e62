"""A prepared folder's ``manifest.json``: what its shards were made from, by which tokenizer, how.

It is written last, into the folder before the folder is renamed into place, so a folder with a manifest is
a whole one. Its fields (every size in bytes, times in nanoseconds, as their keys say)::

    format, version           "hintpipe-prepared-data", 1 (a newer version is refused, not misread)
    tokenizer                 {"name": "bytes"} or {"name": "folder", "folder": ..., "sha256": ...}
    tokenizer_given           the --tokenizer as given (a folder's path as written)
    vocab, dtype              the tokenizer's vocabulary, the shards' integer type
    split, field              --data-split and --data-field as given
    sources                   per source: given, path (absolute), kind, documents, tokens, and its files
                              (path, size_bytes, mtime_ns, sha256): what "changed since" is checked against
    documents, tokens         the corpus's (documents of fewer than 2 tokens are left out: short_left_out)
    held_out                  the held-out rule (every, rule): document i is held out when i % 20 == 19
    shards                    per shard: tokens_file, offsets_file, documents, tokens
    command                   the command that prepares the same again

This module is torch-free.
"""

from __future__ import annotations

import dataclasses
import json
import shlex
from pathlib import Path
from typing import Any

from hintpipe.data.refusal import DataRefused
from hintpipe.data.shards import ShardRecord
from hintpipe.data.tokenizer import TokenizerIdentity

FORMAT = "hintpipe-prepared-data"
VERSION = 1
MANIFEST = "manifest.json"
#: Document ``i`` (counted after the short ones are left out) is held out when ``i % HELD_OUT_EVERY`` is
#: ``HELD_OUT_EVERY - 1``.
HELD_OUT_EVERY = 20
HELD_OUT_RULE = (
    f"document i (counted from 0) is held out when i % {HELD_OUT_EVERY} == {HELD_OUT_EVERY - 1}; a corpus of fewer "
    f"than {HELD_OUT_EVERY} documents holds none out (it trains on all, and its held-out loss is on all)"
)


@dataclasses.dataclass(frozen=True)
class FileRecord:
    """A source file as it was read: enough to tell whether it changed since."""

    path: str
    size_bytes: int
    mtime_ns: int
    sha256: str


@dataclasses.dataclass(frozen=True)
class SourceRecord:
    """One source of a prepared corpus: as given, where, what kind, its files and what it gave."""

    given: str
    path: str
    kind: str
    files: tuple[FileRecord, ...]
    documents: int
    tokens: int


@dataclasses.dataclass(frozen=True)
class Manifest:
    """What a prepared folder holds (the module's docstring lists the fields)."""

    tokenizer: TokenizerIdentity
    tokenizer_given: str
    vocab: int
    dtype: str
    split: str
    field: str
    sources: tuple[SourceRecord, ...]
    documents: int
    tokens: int
    short_left_out: int
    shards: tuple[ShardRecord, ...]

    @property
    def command(self) -> str:
        """The ``hintpipe data prepare`` command that prepares these sources the same way, from any folder (the
        paths absolute; ``--out`` left to the caller)."""
        tokenizer = self.tokenizer.folder or self.tokenizer_given
        words = ["hintpipe", "data", "prepare", *(s.path for s in self.sources), "--tokenizer", tokenizer]
        if self.split != "blank":
            words += ["--data-split", self.split]
        if self.field != "text":
            words += ["--data-field", self.field]
        return shlex.join(words)

    def to_json(self) -> dict[str, Any]:
        return {
            "format": FORMAT,
            "version": VERSION,
            "tokenizer": self.tokenizer.to_json(),
            "tokenizer_given": self.tokenizer_given,
            "vocab": self.vocab,
            "dtype": self.dtype,
            "split": self.split,
            "field": self.field,
            "sources": [dataclasses.asdict(s) for s in self.sources],
            "documents": self.documents,
            "tokens": self.tokens,
            "short_left_out": self.short_left_out,
            "held_out": {"every": HELD_OUT_EVERY, "rule": HELD_OUT_RULE},
            "shards": [dataclasses.asdict(s) for s in self.shards],
            "command": self.command,
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Manifest:
        sources = tuple(
            SourceRecord(**(s | {"files": tuple(FileRecord(**f) for f in s["files"])})) for s in data["sources"]
        )
        return cls(
            tokenizer=TokenizerIdentity.from_json(data["tokenizer"]),
            tokenizer_given=str(data["tokenizer_given"]),
            vocab=int(data["vocab"]),
            dtype=str(data["dtype"]),
            split=str(data["split"]),
            field=str(data["field"]),
            sources=sources,
            documents=int(data["documents"]),
            tokens=int(data["tokens"]),
            short_left_out=int(data["short_left_out"]),
            shards=tuple(ShardRecord(**s) for s in data["shards"]),
        )


def is_prepared(folder: Path) -> bool:
    """Whether ``folder`` is a prepared folder (a manifest of this format in it)."""
    path = folder / MANIFEST
    if not path.is_file():
        return False
    try:
        with open(path, encoding="utf-8") as handle:
            return bool(json.load(handle).get("format") == FORMAT)
    except (OSError, ValueError, AttributeError):
        return False


def write_manifest(folder: Path, manifest: Manifest) -> None:
    with open(folder / MANIFEST, "w", encoding="utf-8") as handle:
        json.dump(manifest.to_json(), handle, indent=2)
        handle.write("\n")


def read_manifest(folder: Path) -> Manifest:
    """The manifest of prepared folder ``folder``.

    Raises:
        DataRefused: (``data``) a manifest that cannot be read, of a newer version, or with missing fields.
    """
    path = folder / MANIFEST
    try:
        with open(path, encoding="utf-8") as handle:
            data = json.load(handle)
    except (OSError, ValueError) as exc:
        raise DataRefused("data", f"{folder}: its {MANIFEST} cannot be read ({exc})") from None
    version = data.get("version") if isinstance(data, dict) else None
    if not isinstance(version, int) or version > VERSION:
        raise DataRefused(
            "data",
            f"{folder} was prepared by a newer hintpipe (format version {version}, this one reads {VERSION}): "
            "upgrade hintpipe, or prepare the sources again with this one",
        )
    try:
        return Manifest.from_json(data)
    except (KeyError, TypeError, ValueError) as exc:
        raise DataRefused(
            "data", f"{folder}: its {MANIFEST} lacks a field ({type(exc).__name__}: {exc}); prepare it again"
        ) from None

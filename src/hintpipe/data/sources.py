"""What ``--data`` names: one entry (a path and its weight), what kind of source the path is, the files it
reads, and its documents as text, streamed.

An entry is ``PATH`` or ``PATH:WEIGHT`` (``corpus.jsonl:0.7``): the weight is the share of a step's documents
drawn from it beside the run's other entries (:mod:`~hintpipe.data.mixture`); a path that exists as written
is a path, colon and all. A path is, by what it is:

- ``hf:BUILDER:FILES`` (``hf:parquet:data/*.parquet``): local files read by Hugging Face ``datasets``'
  ``load_dataset(BUILDER, data_files=FILES, streaming=True)``, ``BUILDER`` one of :data:`HF_BUILDERS`; a
  ``.parquet`` file is ``hf:parquet:`` itself;
- a folder with a ``manifest.json`` of this package's format: prepared before (:mod:`~hintpipe.data.manifest`);
- a folder a ``datasets.Dataset`` was saved to (``save_to_disk``: ``state.json`` beside
  ``dataset_info.json``), read with ``load_from_disk`` (memory-mapped Arrow);
- any other folder: its files, in sorted path order. With ``--data-split blank`` or a separator, every
  ``*.txt``, ``*.jsonl``, ``*.parquet``, ``*.csv`` and ``*.tsv`` file under it, or, in a folder laid out in a
  dataset's splits, its train split's (see [Note: a folder in splits] in :mod:`~hintpipe.data.dataset_splits`);
  with ``--data-split file``, every file under it but hidden ones and ``__pycache__`` (a folder of source code,
  one file one document);
- ``DIR/SPLIT``, not a path on disk, where ``DIR`` is laid out in splits: that split's files;
- a ``.jsonl``, ``.ndjson`` or ``.json`` file: JSON records, the document under ``--data-field``: one object
  per line, or (``.json``) one array of objects (:func:`~hintpipe.data.reading.json_documents`);
- a ``.csv`` or ``.tsv`` file: ``hf:csv:`` itself (tab-separated for ``.tsv``), the document the column
  ``--data-field`` names;
- any other file: plain text, documents split by ``--data-split`` (:mod:`~hintpipe.data.split`).

A file's format is read from its name without a compression's suffix: ``corpus.jsonl.gz`` is a compressed
``.jsonl`` file (:func:`~hintpipe.data.reading.plain_name`). Before, a ``.json`` or ``.csv`` file was read as
plain text, and trained on its syntax (``{"text": ...``) without a word.

This module is torch-free.
"""

from __future__ import annotations

import dataclasses
import enum
import glob
import math
import os
from collections.abc import Callable, Iterator
from pathlib import Path

from hintpipe.data import hf_datasets
from hintpipe.data.dataset_splits import folder_splits, names_a_split
from hintpipe.data.manifest import is_prepared
from hintpipe.data.reading import COMPRESSIONS, Digest, json_documents, plain_name, read_blocks
from hintpipe.data.refusal import DataRefused
from hintpipe.data.split import DocumentSplit

#: The data that are not files: counting text and the standard library's source (:mod:`hintpipe.apps.corpus`).
BUILT_IN_DATA = ("synthetic", "stdlib")
#: ``load_dataset``'s builders for local files that ``hf:BUILDER:FILES`` takes.
HF_BUILDERS = ("json", "text", "parquet", "csv")
#: The suffixes of files of JSON records (:func:`~hintpipe.data.reading.json_documents`).
JSON_SUFFIXES = (".jsonl", ".ndjson", ".json")
#: The suffixes of files ``load_dataset`` reads for hintpipe (a file so named is ``hf:BUILDER:`` itself).
HF_FILE_SUFFIXES = {".parquet": "parquet", ".csv": "csv", ".tsv": "csv"}
#: Files a folder's documents come from, unless ``--data-split file`` says every file (compressed too: see
#: :func:`~hintpipe.data.reading.plain_name`): read here, or by ``datasets`` (:data:`HF_FILE_SUFFIXES`). Not
#: ``.json``: a folder's ``.json`` files are as often its descriptions (``dataset_info.json``) as its records.
TEXT_SUFFIXES = (".txt", ".jsonl", ".ndjson", *HF_FILE_SUFFIXES)


class SourceKind(enum.Enum):
    TEXT = "text"
    JSONL = "jsonl"
    FOLDER = "folder"
    HF_SAVED = "hf-saved"
    HF_FILES = "hf-files"
    PREPARED = "prepared"


@dataclasses.dataclass(frozen=True)
class DataEntry:
    """One ``--data`` value: ``given`` as written, its ``path`` and its ``weight`` (1 unless given)."""

    given: str
    path: str
    weight: float = 1.0

    @classmethod
    def parse(cls, given: str) -> DataEntry:
        """``PATH`` or ``PATH:WEIGHT``.

        Raises:
            DataRefused: (``data``) a weight that is not a positive finite number.
        """
        head, colon, tail = given.rpartition(":")
        if not colon or not head or os.path.exists(given):
            return cls(given, given)
        try:
            weight = float(tail)
        except ValueError:
            return cls(given, given)  # a colon of the path's own (hf:json:FILES)
        if not (math.isfinite(weight) and weight > 0):
            raise DataRefused(
                "data", f"{given}: the weight {tail} must be a positive number (PATH:WEIGHT, e.g. {head}:0.5)"
            )
        return cls(given, head, weight)


def data_entries(data: str | tuple[str, ...]) -> tuple[DataEntry, ...]:
    """The run's ``data`` (one value, or several) as entries.

    Raises:
        DataRefused: (``data``) a bad weight, or built-in data beside other entries.
    """
    entries = tuple(DataEntry.parse(given) for given in ((data,) if isinstance(data, str) else data))
    built_in = [e.given for e in entries if e.path in BUILT_IN_DATA]
    if built_in and len(entries) > 1:
        raise DataRefused(
            "data", f"{built_in[0]} is built-in data and takes no other --data beside it; give it alone, or only paths"
        )
    return entries


@dataclasses.dataclass(frozen=True)
class Source:
    """A path to read documents from, and what kind of source it is."""

    path: str
    kind: SourceKind
    builder: str = ""  # HF_FILES: load_dataset's builder
    pattern: str = ""  # HF_FILES: the data files, a glob
    split: str = ""  # FOLDER given as DIR/SPLIT: the split of DIR it reads (see hintpipe.data.dataset_splits)

    @classmethod
    def of(cls, path: str) -> Source:
        """The source at ``path``.

        Raises:
            DataRefused: (``data``) no such path, an unknown ``hf:`` builder, a saved ``DatasetDict`` (one of its
                splits is a source), a folder that reads no file.
        """
        if path.startswith("hf:"):
            builder, colon, pattern = path[3:].partition(":")
            if not colon or builder not in HF_BUILDERS or not pattern:
                raise DataRefused(
                    "data",
                    f"{path}: hf:BUILDER:FILES takes a builder of {', '.join(HF_BUILDERS)} and the files, "
                    "e.g. hf:parquet:data/*.parquet",
                )
            return cls(path, SourceKind.HF_FILES, builder, pattern)
        where = Path(path)
        if where.is_dir():
            if is_prepared(where):
                return cls(path, SourceKind.PREPARED)
            if (where / "dataset_dict.json").is_file():
                raise DataRefused("data", f"{path}: a saved DatasetDict; {_splits_advice(where)}")
            if (where / "state.json").is_file() and (where / "dataset_info.json").is_file():
                return cls(path, SourceKind.HF_SAVED)
            return cls(path, SourceKind.FOLDER)
        if where.is_file():
            suffix = plain_name(where).suffix
            if suffix in HF_FILE_SUFFIXES:
                return cls(path, SourceKind.HF_FILES, HF_FILE_SUFFIXES[suffix], path)
            return cls(path, SourceKind.JSONL if suffix in JSON_SUFFIXES else SourceKind.TEXT)
        if (
            len(where.parts) > 1
            and not where.suffix
            and names_a_split(where.name)
            and where.parent.is_dir()
            and not is_prepared(where.parent)
        ):
            splits = folder_splits(where.parent, _readable(where.parent))
            if splits is not None and where.name in splits:
                return cls(path, SourceKind.FOLDER, split=where.name)
            if splits is not None:
                raise DataRefused(
                    "data", f"{path}: no such file or folder, nor a split of {where.parent} ({', '.join(splits)})"
                )
        raise DataRefused("data", f"{path}: no such file or folder")

    @property
    def root(self) -> Path:
        """The file or folder read (a split's folder, for ``DIR/SPLIT``)."""
        return Path(self.path).parent if self.split else Path(self.path)

    @property
    def absolute(self) -> str:
        """The path made absolute (an ``hf:`` source's files pattern), as a manifest records it."""
        if self.path.startswith("hf:"):
            return f"hf:{self.builder}:{os.path.abspath(self.pattern)}"
        return str(Path(self.path).resolve())

    @property
    def reads_field(self) -> bool:
        """Whether ``--data-field`` says which of its records' fields is the document."""
        if self.kind is SourceKind.FOLDER:
            return any(_is_json(p) or _read_by_datasets(p) for p in _text_files(self.root))
        return self.kind in (SourceKind.JSONL, SourceKind.HF_SAVED, SourceKind.HF_FILES)

    def files(self, split: DocumentSplit) -> list[Path]:
        """The files this source's documents come from (its identity: a change to any of them is a change to
        the source), in the order they are read.

        Raises:
            DataRefused: (``data``) a folder without a file to read, a pattern that matches no file.
        """
        if self.kind in (SourceKind.TEXT, SourceKind.JSONL):
            return [Path(self.path)]
        if self.kind is SourceKind.HF_FILES:
            found = sorted(Path(p) for p in glob.glob(self.pattern, recursive=True) if Path(p).is_file())
            if not found:
                raise DataRefused("data", f"{self.path}: no file matches {self.pattern}")
            return found
        root = self.root
        if self.split:
            splits = folder_splits(root, _readable(root))
            assert splits is not None, f"{root} was laid out in splits"
            return splits[self.split]
        if self.kind is SourceKind.HF_SAVED:
            return sorted(p for p in root.rglob("*") if p.is_file() and not _hidden(p.relative_to(root)))
        if split.by_file:
            found = sorted(p for p in root.rglob("*") if p.is_file() and not _hidden(p.relative_to(root)))
            if not found:
                raise DataRefused("data", f"{self.path}: a folder without a file in it")
            return found
        splits = folder_splits(root, _readable(root))
        if splits is not None:
            return splits["train"]
        found = _text_files(root)
        if not found:
            kinds = ", ".join(TEXT_SUFFIXES)
            raise DataRefused("data", f"{self.path}: a folder without a file of {kinds} in it{_other_files(root)}")
        return found

    def read_by_datasets(self, file: Path) -> bool:
        """Whether ``load_dataset`` reads ``file`` of this source (its bytes are digested apart), not this package."""
        return self.kind in (SourceKind.HF_SAVED, SourceKind.HF_FILES) or _read_by_datasets(file)

    def texts(
        self,
        split: DocumentSplit,
        field: str,
        *,
        on_bytes: Callable[[int], None] | None = None,
        digests: dict[Path, Digest] | None = None,
    ) -> Iterator[str]:
        """This source's documents as text, in order, streamed (none is left out here: short ones are left out
        once tokenized). ``on_bytes`` is told the bytes read as they are; ``digests`` maps a file to what
        digests its bytes (files read by ``datasets`` are not: their digests are taken apart).

        Raises:
            DataRefused: (``data``) as :func:`~hintpipe.data.reading.read_blocks`,
                :func:`~hintpipe.data.reading.json_documents` and :mod:`~hintpipe.data.hf_datasets` say.
        """
        if self.kind is SourceKind.HF_SAVED:
            yield from hf_datasets.saved_texts(self.path, field, on_bytes=on_bytes)
            return
        if self.kind is SourceKind.HF_FILES:
            files = [str(f) for f in self.files(split)]
            yield from hf_datasets.file_texts(self.path, self.builder, files, field, on_bytes=on_bytes)
            return
        assert self.kind is not SourceKind.PREPARED, "a prepared folder's documents are tokens already"
        for file in self.files(split):
            if _read_by_datasets(file) and not split.by_file:
                builder = HF_FILE_SUFFIXES[plain_name(file).suffix]
                yield from hf_datasets.file_texts(self.path, builder, [str(file)], field, on_bytes=on_bytes)
                continue
            blocks = read_blocks(file, on_bytes=on_bytes, digest=None if digests is None else digests.get(file))
            yield from json_documents(file, blocks, field) if _is_json(file) else split.documents(blocks)


def _text_files(root: Path) -> list[Path]:
    """A folder's files of :data:`TEXT_SUFFIXES`, compressed (:data:`~hintpipe.data.reading.COMPRESSIONS`) or
    not, in sorted path order; not hidden ones (a notebook's ``.ipynb_checkpoints/``, a download's ``.cache/``)."""
    readable = _readable(root)
    return sorted(p for p in root.rglob("*") if readable(p))


def _named_as_text(file: Path) -> bool:
    return (file.with_suffix("") if file.suffix in COMPRESSIONS else file).suffix in TEXT_SUFFIXES


#: The names a dataset's evaluation split goes by, in the order one is suggested.
EVALUATION_SPLITS = ("validation", "valid", "val", "eval", "test")


def evaluation_source(path: str) -> str:
    """What ``--eval-data PATH`` reads: ``PATH/SPLIT``, its evaluation split, where ``PATH`` is a folder laid out
    in splits (see [Note: a folder in splits] in :mod:`~hintpipe.data.dataset_splits`); else ``PATH``."""
    source = Source.of(path)
    if source.kind is not SourceKind.FOLDER or source.split:
        return path
    splits = folder_splits(source.root, _readable(source.root))
    if splits is None:
        return path
    chosen = next((name for name in EVALUATION_SPLITS if name in splits), None)
    return path if chosen is None else os.path.join(path, chosen)


def _splits_advice(folder: Path) -> str:
    """Which of a saved DatasetDict's split folders to give: one to train on, and where it has one besides, its
    evaluation split as the evaluation corpus (``eval_data``)."""
    splits = sorted(p.name for p in folder.iterdir() if p.is_dir())
    advice = f"give one of its splits' folders ({', '.join(str(folder / name) for name in splits)})"
    evaluation = next((name for name in EVALUATION_SPLITS if name in splits), None)
    if evaluation is None or len(splits) < 2:
        return advice
    return f"{advice}; {folder / evaluation} can be the evaluation corpus (--eval-data; eval_data in Python)"


def _other_files(root: Path) -> str:
    """What to give for a folder of files a folder source does not read (a dataset's ``.json`` records): their
    ``hf:json:FILES``, or nothing to add."""
    if any(p.is_file() for p in root.rglob("*.json")):
        return f"; for its .json files give hf:json:{root}/**/*.json"
    return ""


def _readable(root: Path) -> Callable[[Path], bool]:
    """Whether a path under ``root`` is a file a folder source reads (:data:`TEXT_SUFFIXES`, not hidden)."""

    def readable(file: Path) -> bool:
        return file.is_file() and _named_as_text(file) and not _hidden(file.relative_to(root))

    return readable


def _read_by_datasets(file: Path) -> bool:
    """A file of a folder that ``load_dataset`` reads (:data:`HF_FILE_SUFFIXES`)."""
    return plain_name(file).suffix in HF_FILE_SUFFIXES


def _is_json(file: Path) -> bool:
    return plain_name(file).suffix in JSON_SUFFIXES


def _hidden(relative: Path) -> bool:
    """A hidden file or one in a hidden folder (``.git``), or Python's byte code (``__pycache__``)."""
    return any(part.startswith(".") or part == "__pycache__" for part in relative.parts)

"""A folder laid out in a dataset's splits, as the Hugging Face Hub lays a dataset out
(``data/train-00000-of-00002.parquet``, ``validation.jsonl``, ``test/part-0.txt``): which of its files make
which split.

[Note: a folder in splits]
A dataset downloaded from the Hub, or written by a user who keeps ``train.jsonl`` beside ``test.jsonl``, is
one folder holding every split. Read whole, it would train on its validation and test documents, and a run
would evaluate on documents it trained on, without a word. ``load_dataset(folder)`` reads its ``train`` split
and names the others; so does hintpipe: ``--data DIR`` reads ``DIR``'s train split, ``--data DIR/validation``
(not a path on disk: a split's name after the folder's) its validation split, and ``--eval-data DIR`` the
first split of :data:`~hintpipe.data.sources.EVALUATION_SPLITS` it has. Which file belongs to which split is
found by ``datasets``' own patterns (:func:`datasets.data_files.get_data_patterns`), not by rules of this
package's. A folder is in splits where those patterns find a ``train`` split and another: a folder of
``corpus.txt`` and ``notes.txt`` is not, and is read whole, as before; nor is a folder read file by file
(``--data-split file``: source code, where ``tests/`` is no split).

This module is torch-free.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from hintpipe.data.refusal import DataRefused

#: The words the Hub's split names are made of (a file or folder named by none is in no split).
_SPLIT_WORDS = ("train", "valid", "val", "dev", "test", "eval")
_EXTRA = "pip install -e '.[data]'"


def names_a_split(name: str) -> bool:
    """Whether ``name`` could be a split's (``validation``, ``test``): a path that does not exist is looked for
    as a split of its folder only then, so that a mistyped path is not answered by walking its whole folder."""
    return any(word in name.lower() for word in _SPLIT_WORDS)


def folder_splits(root: Path, readable: Callable[[Path], bool]) -> dict[str, list[Path]] | None:
    """The files of each split of ``root`` that ``readable`` takes, in sorted path order, where ``root`` is in
    splits (see [Note: a folder in splits]); None where it is not.

    Raises:
        DataRefused: (``data``) a folder whose names say splits, without ``datasets`` to tell them apart.
    """
    names = [p.relative_to(root).as_posix().lower() for p in root.rglob("*") if readable(p)]
    if not any("train" in name for name in names) or not any(
        word in name for name in names for word in _SPLIT_WORDS if word != "train"
    ):
        return None  # no name of two splits: not worth importing datasets for
    try:
        from datasets.data_files import DataFilesDict, get_data_patterns
    except ImportError:
        raise DataRefused(
            "data",
            f"{root}: its files' names say splits (train and others); telling them apart needs datasets: {_EXTRA}",
        ) from None
    try:
        found = DataFilesDict.from_patterns(get_data_patterns(str(root)), base_path=str(root))
    except Exception:  # datasets' EmptyDatasetError, FileNotFoundError: no split it can name
        return None
    base = root.resolve()  # datasets gives absolute paths; a split's files are named as root's are
    splits = {
        str(name): sorted(p for p in (root / Path(f).relative_to(base) for f in files) if readable(p))
        for name, files in found.items()
    }
    splits = {name: files for name, files in splits.items() if files}
    return splits if "train" in splits and len(splits) > 1 else None

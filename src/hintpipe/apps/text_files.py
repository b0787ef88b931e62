"""The user's own text in memory: a file, folder or dataset's documents as token ids, for a corpus small
enough to hold (``hintpipe.text_corpus``, ``hintpipe.token_sequences``).

A run does not read text this way: it reads prepared shards (:mod:`hintpipe.data`), whatever the corpus's
size. This module gives the same documents, in the same order, held out by the same rule, to a user's own
loop and to tests: what ``PATH`` may be and how its text becomes documents is :mod:`hintpipe.data.sources`'s
and :mod:`hintpipe.data.split`'s; the tokenizer is :mod:`hintpipe.data.tokenizer`'s. A prepared folder is
read from its shards. Documents of fewer than 2 tokens are left out.

Held out (:func:`split_held_out`): every 20th document is held out of training, so that ``eval_every``'s
loss is on text no step trained on.

This module is torch-free.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Sequence
from typing import Any

import numpy as np

from hintpipe.data.manifest import HELD_OUT_EVERY
from hintpipe.data.prepare import SHORTEST
from hintpipe.data.prepared import open_prepared
from hintpipe.data.refusal import DataRefused
from hintpipe.data.sources import BUILT_IN_DATA as BUILT_IN_DATA
from hintpipe.data.sources import Source, SourceKind
from hintpipe.data.split import DocumentSplit
from hintpipe.data.tokenizer import BYTES as BYTES
from hintpipe.data.tokenizer import BYTES_VOCAB as BYTES_VOCAB
from hintpipe.data.tokenizer import TokenIds as TokenIds
from hintpipe.data.tokenizer import load_tokenizer

#: The field of a JSONL line that holds its document, unless ``field`` says another.
DEFAULT_FIELD = "text"


@dataclasses.dataclass(frozen=True, eq=False)
class TextCorpus:
    """A corpus loaded from files: every document's token ids, and how they split for training.

    Attributes:
        documents: every document of 2 tokens or more, in the order of the files and of the documents in them.
        training: the documents a training step draws from (all but the held-out ones).
        held_out: the documents the held-out loss draws from (see :func:`split_held_out`).
        vocab: the tokenizer's vocabulary (every token id is below it): the model's ``vocab``.
    """

    documents: tuple[TokenIds, ...]
    training: tuple[TokenIds, ...]
    held_out: tuple[TokenIds, ...]
    vocab: int


_CORPORA: dict[tuple[str, str, str, str], TextCorpus] = {}


def text_corpus(
    data: str, *, field: str = DEFAULT_FIELD, tokenizer: str = BYTES, split: str = "blank", cli: bool = False
) -> TextCorpus:
    """The corpus of the file, folder or dataset ``data``, tokenized by ``tokenizer`` (``bytes`` or a tokenizer
    folder), its plain text split by ``split`` (``blank``, ``file`` or a separator); or a prepared folder's
    documents: loaded on the first call in this process, kept for the next ones.

    Raises:
        ValueError: in one line naming the option (``--data`` on the command line, ``data`` in Python) and the
            path: a path that does not exist, a file that is not UTF-8, a JSONL line that is not an object with
            ``field`` as a string (its file and line number), a folder without text files, a corpus without a
            document of 2 tokens, a tokenizer folder that holds no tokenizer.
    """
    key = (os.path.abspath(data), field, tokenizer if tokenizer == BYTES else os.path.abspath(tokenizer), split)
    if key not in _CORPORA:
        try:
            documents, vocab = _load(data, field, tokenizer, split)
        except DataRefused as exc:
            raise exc.said(cli) from None
        training, held_out = split_held_out(documents)
        _CORPORA[key] = TextCorpus(documents, training, held_out, vocab)
    return _CORPORA[key]


def _load(data: str, field: str, tokenizer: str, split: str) -> tuple[tuple[TokenIds, ...], int]:
    source = Source.of(data)
    if source.kind is SourceKind.PREPARED:
        corpus = open_prepared(data)
        return tuple(np.array(corpus.documents[i]) for i in range(len(corpus.documents))), corpus.vocab
    encode, vocab = load_tokenizer(tokenizer)
    texts = _texts(data, field, split)
    documents = tuple(ids for ids in encode(list(texts)) if len(ids) >= SHORTEST)
    if not documents:
        raise DataRefused("data", f"{data}: no document of {SHORTEST} tokens or more (an empty corpus)")
    return documents, vocab


def split_held_out(documents: Sequence[Any]) -> tuple[tuple[Any, ...], tuple[Any, ...]]:
    """``(training, held_out)``: document ``i`` is held out when ``i % 20 == 19``, the others train. A corpus of
    fewer than 20 documents holds none out: it trains on all of them, and the held-out loss draws from all of
    them too (a loss on text the run trains on, rather than none)."""
    held_out = tuple(documents[HELD_OUT_EVERY - 1 :: HELD_OUT_EVERY])
    if not held_out:
        return tuple(documents), tuple(documents)
    training = tuple(d for i, d in enumerate(documents) if i % HELD_OUT_EVERY != HELD_OUT_EVERY - 1)
    return training, held_out


def read_documents(data: str, *, field: str = DEFAULT_FIELD, split: str = "blank") -> tuple[str, ...]:
    """The documents of the file, folder or dataset ``data`` as text, in order (before tokenizing: none left
    out).

    Raises:
        ValueError: as :func:`text_corpus` (naming the path, without the option).
    """
    try:
        return _texts(data, field, split)
    except DataRefused as exc:
        raise ValueError(str(exc)) from None


def _texts(data: str, field: str, split: str) -> tuple[str, ...]:
    source = Source.of(data)
    if source.kind is SourceKind.PREPARED:
        raise DataRefused("data", f"{data}: a prepared folder holds token ids, not text (read it with text_corpus)")
    return tuple(source.texts(DocumentSplit.parse(split), field))


__all__ = ["BUILT_IN_DATA", "BYTES", "BYTES_VOCAB", "TextCorpus", "read_documents", "split_held_out", "text_corpus"]

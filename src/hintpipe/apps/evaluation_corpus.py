"""What a run evaluates on: its evaluation corpus (``eval_data``) or its data's held-out documents, and the rules
that hold them to the run (see [Note: an evaluation corpus of its own] in :mod:`hintpipe.apps.batches`)."""

from __future__ import annotations

from typing import Any

from hintpipe.data.prepared import DocumentView, open_prepared
from hintpipe.data.run_data import document_parts
from hintpipe.data.sources import data_entries
from hintpipe.forming.form import Forming
from hintpipe.option import said


def evaluation_parts(config: Any) -> tuple[DocumentView, ...]:
    """The documents a run's evaluations draw from, per prepared folder (``config``: the run's config, or the
    command line's arguments with its folders resolved): all of its ``eval_data``'s, else its data's held-out
    ones (see [Note: an evaluation corpus of its own] in :mod:`hintpipe.apps.batches`)."""
    if getattr(config, "eval_data", None) is not None:
        return document_parts(config.eval_prepared, "all")
    return document_parts(config.prepared, "held_out")


def check_eval_batches(config: Any, parts: tuple[DocumentView, ...]) -> None:
    """Refuse ``eval_batches`` that the documents the run evaluates on (``parts``: :func:`evaluation_parts`)
    cannot fill without replacement (``config``: the run's config): documents, or under ``--forming concat``
    rows of its context's tokens (see [Note: documents end to end] in :mod:`hintpipe.apps.corpus`).

    Raises:
        ValueError: naming the option as the caller wrote it, the documents needed and held, and the fix.
    """
    count = getattr(config, "eval_batches", 0)
    if not count:
        return
    if not parts:
        raise ValueError(
            f"{said('eval_batches')} {count} evaluates on a file corpus's held-out documents; {said('data')} "
            f"{config.data} has none: leave {said('eval_batches')} out (each evaluation draws one batch)"
        )
    if config.forming is Forming.CONCAT:
        _check_eval_tokens(config, parts, count, config.model.max_seq_len - 1)
        return
    held = sum(len(part) for part in parts)
    per_batch = config.microbatches * config.microbatch_size * config.dp
    if count * per_batch > held:
        most = held // per_batch
        raise ValueError(
            f"{said('eval_batches')} {count} takes {count * per_batch:,} held-out documents ({count} x "
            f"{config.microbatches} micro-batches x {config.microbatch_size} x {config.dp} replicas, without "
            f"replacement); {_holder(config)} has {held:,}: {_fix(most)}"
        )


def _check_eval_tokens(config: Any, parts: tuple[DocumentView, ...], count: int, length: int) -> None:
    """:func:`check_eval_batches` under ``--forming concat``: the documents hold every batch's rows end to end
    (counted until they do, not over the whole corpus)."""
    rows = config.microbatches * config.microbatch_size
    need = count * config.dp * rows * length + 1
    held = 0
    for part in parts:
        for index in range(len(part)):
            held += len(part[index])
            if held >= need:
                return
    raise ValueError(
        f"{said('eval_batches')} {count} takes {need:,} held-out tokens under {said('forming')} concat ({count} x "
        f"{config.microbatches} micro-batches x {config.microbatch_size} rows of {length} x {config.dp} replicas, "
        f"and one, without replacement); {_holder(config)} has {held:,}: "
        f"{_fix((held - 1) // (config.dp * rows * length))}"
    )


def _holder(config: Any) -> str:
    """What the run evaluates on, as the caller named it."""
    evaluated = getattr(config, "eval_data", None)
    return "the run's held-out split" if evaluated is None else f"{said('eval_data')} {evaluated}"


def _fix(most: int) -> str:
    return f"use {said('eval_batches')} {most} or fewer" if most else "use fewer or smaller micro-batches"


def check_apart(eval_data: str | tuple[str, ...], evaluated: tuple[str, ...], trained: tuple[str, ...]) -> None:
    """Refuse an evaluation corpus that is also among the training data (a source file of the same contents, by
    its SHA-256 in the prepared folders' manifests, whatever its path): every one of its documents would train,
    then be evaluated on."""

    def contents(folder: str) -> set[str]:
        sources = open_prepared(folder).manifest.sources
        return {f.sha256 for source in sources for f in source.files if f.sha256}

    training = set().union(*(contents(folder) for folder in trained))
    for entry, folder in zip(data_entries(eval_data), evaluated, strict=True):
        if contents(folder) & training:
            data, kept = said("data"), said("eval_data")
            raise ValueError(
                f"{kept} {entry.path} is also in {data}: its documents would train and be evaluated on; evaluate "
                f"on a corpus of its own, or leave {kept} out (then every 20th document of {data} is held out)"
            )

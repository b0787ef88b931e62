"""What a run evaluates on: its evaluation corpus (``eval_data``) or its data's held-out documents, and the rules
that hold them to the run (see [Note: an evaluation corpus of its own] in :mod:`hintpipe.apps.batches`)."""

from __future__ import annotations

import dataclasses

from hintpipe.apps.run_sections import DataConfig
from hintpipe.data.prepared import DocumentView, open_prepared
from hintpipe.data.run_data import document_parts
from hintpipe.data.sources import data_entries
from hintpipe.forming.form import Forming
from hintpipe.option import said


def evaluation_parts(
    data: DataConfig, prepared: tuple[str, ...], eval_prepared: tuple[str, ...]
) -> tuple[DocumentView, ...]:
    """The documents a run's evaluations draw from, per prepared folder (``prepared``, ``eval_prepared``: the
    run's, resolved): all of its ``eval_data``'s, else its data's held-out ones (see [Note: an evaluation corpus
    of its own] in :mod:`hintpipe.apps.batches`)."""
    if data.eval_source is not None:
        return document_parts(eval_prepared, "all")
    return document_parts(prepared, "held_out")


@dataclasses.dataclass(frozen=True)
class Evaluations:
    """What a run's evaluations take: ``count`` batches (``eval_batches``; 0: one drawn each time) of
    ``microbatches`` x ``size`` rows on each of ``dp`` replicas, rows of ``length`` tokens under concat."""

    count: int
    microbatches: int
    size: int
    dp: int
    length: int


def check_eval_batches(data: DataConfig, evaluations: Evaluations, parts: tuple[DocumentView, ...]) -> None:
    """Refuse ``eval_batches`` that the documents the run evaluates on (``parts``: :func:`evaluation_parts`)
    cannot fill without replacement: documents, or under ``--forming concat`` rows of its context's tokens (see
    [Note: documents end to end] in :mod:`hintpipe.apps.corpus`).

    Raises:
        ValueError: naming the option as the caller wrote it, the documents needed and held, and the fix.
    """
    count = evaluations.count
    if not count:
        return
    if not parts:
        raise ValueError(
            f"{said('eval_batches')} {count} evaluates on a file corpus's held-out documents; {said('data')} "
            f"{data.source} has none: leave {said('eval_batches')} out (each evaluation draws one batch)"
        )
    if data.forming is Forming.CONCAT:
        _check_eval_tokens(data, evaluations, parts)
        return
    held = sum(len(part) for part in parts)
    microbatches, size, dp = evaluations.microbatches, evaluations.size, evaluations.dp
    per_batch = microbatches * size * dp
    if count * per_batch > held:
        most = held // per_batch
        raise ValueError(
            f"{said('eval_batches')} {count} takes {count * per_batch:,} held-out documents ({count} x "
            f"{microbatches} micro-batches x {size} x {dp} replicas, without replacement); {_holder(data)} has "
            f"{held:,}: {_fix(most)}"
        )


def _check_eval_tokens(data: DataConfig, evaluations: Evaluations, parts: tuple[DocumentView, ...]) -> None:
    """:func:`check_eval_batches` under ``--forming concat``: the documents hold every batch's rows end to end
    (counted until they do, not over the whole corpus)."""
    count, length, dp = evaluations.count, evaluations.length, evaluations.dp
    rows = evaluations.microbatches * evaluations.size
    need = count * dp * rows * length + 1
    held = 0
    for part in parts:
        for index in range(len(part)):
            held += len(part[index])
            if held >= need:
                return
    raise ValueError(
        f"{said('eval_batches')} {count} takes {need:,} held-out tokens under {said('forming')} concat ({count} x "
        f"{evaluations.microbatches} micro-batches x {evaluations.size} rows of {length} x {dp} replicas, "
        f"and one, without replacement); {_holder(data)} has {held:,}: "
        f"{_fix((held - 1) // (dp * rows * length))}"
    )


def _holder(data: DataConfig) -> str:
    """What the run evaluates on, as the caller named it."""
    evaluated = data.eval_source
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

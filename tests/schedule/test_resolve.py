"""The hint a run asks for (:mod:`hintpipe.schedule.resolve`): by name, by CSV file or as an object, checked
against the run's ranks and micro-batches with one resolver for the API and the command line."""

from __future__ import annotations

from pathlib import Path

import pytest

from hintpipe.schedule.generators import generate_hint
from hintpipe.schedule.hint import HintError
from hintpipe.schedule.hint_csv import save_hint_csv
from hintpipe.schedule.resolve import is_hint_file, resolve_hint


def test_a_name_generates_a_file_loads_and_an_object_is_taken(tmp_path: Path) -> None:
    named = resolve_hint("interleaved-1f1b", 2, 4, chunks=2)
    assert (named.name, named.ranks, named.microbatches, named.stages) == ("interleaved-1f1b", 2, 4, 4)
    path = tmp_path / "mine"  # a file without the .csv ending is still a file
    save_hint_csv(generate_hint("zb-h1", 2, 4), path)
    assert is_hint_file(str(path)) and is_hint_file("absent.csv") and not is_hint_file("zb-h1")
    loaded = resolve_hint(str(path), 2, 4)
    assert [tasks.kind.tolist() for tasks in loaded.lists] == [
        t.kind.tolist() for t in generate_hint("zb-h1", 2, 4).lists
    ]
    given = generate_hint("gpipe", 3, 2)
    assert resolve_hint(given, 3, 2) is given


def test_a_hint_of_another_size_is_refused_naming_both_sizes() -> None:
    with pytest.raises(HintError) as refused:
        resolve_hint(generate_hint("gpipe", 3, 2), 3, 4)
    assert (
        str(refused.value) == "hint 'gpipe' is for 3 ranks and 2 micro-batches, the run has 3 ranks and 4 micro-batches"
    )


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ((0, 4, None), "ranks and microbatches must be at least 1, got 0 and 4"),
        ((2, 0, None), "ranks and microbatches must be at least 1, got 2 and 0"),
        ((2, 4, 0), "chunks must be at least 1, got 0"),
    ],
)
def test_sizes_below_one_are_refused(args: tuple[int, int, int | None], message: str) -> None:
    with pytest.raises(ValueError) as refused:
        resolve_hint("1f1b", *args)
    assert str(refused.value) == message


def test_an_unknown_name_is_refused_listing_the_schedules() -> None:
    with pytest.raises(ValueError, match=r"^unknown hint 'pipedream': choose one of gpipe, 1f1b, "):
        resolve_hint("pipedream", 2, 4)

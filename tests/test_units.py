"""Sizes written for people (:mod:`hintpipe.units`): the units they take, the text they give back, and the one-line
refusals of a size that is not one."""

from __future__ import annotations

import pytest

from hintpipe.units import format_size, parse_size, parse_sizes


@pytest.mark.parametrize(
    ("text", "size"),
    [("512MiB", 512 * 2**20), ("2GiB", 2 * 2**30), ("1.5e9", 1.5e9), ("6", 6.0), (" 3 kb ", 3000.0), ("1TB", 1e12)],
)
def test_a_size_is_its_number_times_its_unit(text: str, size: float) -> None:
    assert parse_size(text) == size


@pytest.mark.parametrize(
    ("text", "why"),
    [
        ("12 apples", "expected a number with an optional unit such as 512MiB, 2GiB or 1e9"),
        ("", "expected a number with an optional unit such as 512MiB, 2GiB or 1e9"),
        ("-1GiB", "expected a number with an optional unit such as 512MiB, 2GiB or 1e9"),
        ("1e400", "not finite"),
    ],
)
def test_a_size_that_is_not_one_is_refused_naming_the_text(text: str, why: str) -> None:
    with pytest.raises(ValueError) as refused:
        parse_size(text)
    assert str(refused.value) == f"bad size {text!r}: {why}"


def test_a_size_is_written_in_the_largest_binary_unit_it_reaches() -> None:
    assert [format_size(v) for v in (6, 1023, 1536, 5 * 2**20, 150 * 2**30, 2.25 * 2**30)] == [
        "6",
        "1023",
        "1.5KiB",
        "5MiB",
        "150GiB",
        "2.25GiB",
    ]
    assert parse_size(format_size(3 * 2**20)) == 3 * 2**20  # what it writes, it reads back


def test_one_size_is_every_ranks_and_a_list_gives_one_each() -> None:
    assert parse_sizes("1GiB", 3, "--budget") == (2**30,) * 3
    assert parse_sizes(5, 2, "--budget") == (5.0, 5.0)
    assert parse_sizes("1KiB,2KiB", 2, "--budget") == (1024.0, 2048.0)
    assert parse_sizes(["1KiB", 7.0], 2, "--budget") == (1024.0, 7.0)
    with pytest.raises(ValueError, match=r"^--budget has 2 values for 3: give one, or one each$"):
        parse_sizes("1KiB,2KiB", 3, "--budget")

"""Options with a fixed set of values (:mod:`hintpipe.choice`): parsed once at the boundary, and an unknown value
refused with every known one and whatever else the option takes."""

from __future__ import annotations

import pytest

from hintpipe.choice import Choice


class Colour(Choice):
    RED = "red"
    BLUE = "blue"


class Shade(Choice):
    DARK = "dark"

    @classmethod
    def noun(cls) -> str:
        return "shade of grey"

    @classmethod
    def alternatives(cls) -> str:
        return ", or a number between 0 and 1"


def test_a_choice_is_parsed_from_its_value_or_taken_as_it_is() -> None:
    assert Colour.parse("blue") is Colour.BLUE
    assert Colour.parse(Colour.RED) is Colour.RED
    assert isinstance(Colour.BLUE, str) and f"{Colour.BLUE}" == "blue"  # a string wherever one is written


def test_an_unknown_value_is_refused_naming_the_option_and_every_known_value() -> None:
    with pytest.raises(ValueError) as refused:
        Colour.parse("Red")  # values are exact: no case folding
    assert str(refused.value) == "unknown colour 'Red': choose one of red, blue"
    assert refused.value.__cause__ is None and refused.value.__suppress_context__


def test_an_option_names_itself_and_what_else_it_takes() -> None:
    with pytest.raises(ValueError, match=r"^unknown shade of grey 'light': choose one of dark, or a number between"):
        Shade.parse("light")

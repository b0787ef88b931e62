"""The colon-spec grammar (:mod:`hintpipe.spec`) that ``--variability``, ``--inject`` and ``--seq-len-dist``
share: a word and its arguments, numbers and times read one way, and a refusal that names the spec."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from hintpipe.spec import Spec, SpecError, quantity


def test_a_spec_is_its_word_and_its_arguments() -> None:
    assert Spec.split(" lognormal:0.2:7 ") == Spec(" lognormal:0.2:7 ", "lognormal", ("0.2", "7"))
    assert Spec.split("none") == Spec("none", "none", ())
    assert Spec.split("slow:").args == ()  # nothing after the colon: no arguments
    assert Spec.split("slow::2").args == ("", "2")  # an empty one between two is kept, for its reader to refuse


def test_the_wrong_number_of_arguments_names_the_expected_form() -> None:
    spec = Spec.split("slow:1:2:3")
    spec.expect((1, 3), "slow:RANK[:FACTOR]")
    with pytest.raises(SpecError, match=r"^bad fault 'slow:1:2:3': expected slow:RANK\[:FACTOR\]$"):
        spec.expect((2,), "slow:RANK[:FACTOR]", kind="fault")


def test_numbers_and_integers_are_checked_against_their_minimum() -> None:
    spec = Spec.split("w:1.5:x:-1:4:inf")
    assert spec.number(0, "sigma") == 1.5
    assert spec.integer(3, "rank", minimum=1) == 4
    refusals: list[tuple[Callable[[], float], str]] = [
        (lambda: spec.number(1, "sigma"), "sigma 'x' is not a number"),
        (lambda: spec.number(2, "sigma"), "sigma must be a finite number >= 0, got '-1'"),
        (lambda: spec.number(4, "sigma"), "sigma must be a finite number >= 0, got 'inf'"),
        (lambda: spec.number(0, "sigma", minimum=2.5), "sigma must be a finite number >= 2.5, got '1.5'"),
        (lambda: spec.integer(0, "rank"), "rank '1.5' is not an integer >= 0"),
        (lambda: spec.integer(3, "rank", minimum=5), "rank '4' is not an integer >= 5"),
    ]
    for read, why in refusals:
        with pytest.raises(SpecError) as refused:
            read()
        assert str(refused.value) == f"bad spec 'w:1.5:x:-1:4:inf': {why}"


def test_a_quantity_with_a_unit_is_seconds_and_a_bare_number_is_cost_units() -> None:
    spec = Spec.split("delay:2ms:150us:0.1s:3:soon:1e999")
    assert quantity(spec, 0, "time") == (0.002, True)
    assert quantity(spec, 1, "time") == pytest.approx((150e-6, True))
    assert quantity(spec, 2, "time") == (0.1, True)
    assert quantity(spec, 3, "time") == (3.0, False)
    with pytest.raises(SpecError, match=r"^bad injection 'delay:.*': time 'soon' is not a number or a time such"):
        quantity(spec, 4, "time", kind="injection")
    with pytest.raises(SpecError, match=r"^bad spec 'delay:.*': time must be finite, got '1e999'$"):
        quantity(spec, 5, "time")

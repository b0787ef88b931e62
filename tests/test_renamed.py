"""What 0.7 renamed still works for a release (:mod:`hintpipe.renamed`): the old keyword is the new one with a
warning naming both, both at once are refused, and a retired attribute or module says where it went."""

from __future__ import annotations

import sys
import warnings
from typing import Any, cast

import pytest

from conftest import raised_here
from hintpipe.renamed import renamed, retired_attribute, retired_module


@renamed("scale", factor="times", base="start")
def scale(value: float, *, times: float = 1.0, start: float = 0.0) -> float:
    """Stands for a function whose ``factor=`` and ``base=`` keywords were renamed."""
    return start + value * times


#: :func:`scale` as a caller of the old keywords calls it (they are not in its signature).
old_scale = cast(Any, scale)


def test_an_old_keyword_is_its_new_name_with_a_warning_naming_both() -> None:
    with pytest.warns(DeprecationWarning, match=r"^scale\(factor=\.\.\.\) is now scale\(times=\.\.\.\)$") as caught:
        assert old_scale(2.0, factor=3.0) == 6.0
    assert [w.filename for w in raised_here(caught)] == [__file__]  # the caller's line, not the decorator's
    with pytest.warns(DeprecationWarning) as caught:
        assert old_scale(2.0, factor=3.0, base=1.0) == 7.0
    assert [str(w.message) for w in raised_here(caught)] == [
        "scale(factor=...) is now scale(times=...)",
        "scale(base=...) is now scale(start=...)",
    ]
    assert scale.__name__ == "scale" and scale.__doc__ is not None and "renamed" in scale.__doc__


def test_the_new_names_alone_warn_of_nothing() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert scale(2.0, times=3.0, start=1.0) == 7.0


def test_an_old_keyword_beside_its_new_name_is_refused() -> None:
    with pytest.raises(TypeError, match=r"^scale\(\) takes times= \(before 0\.7: factor=\), not both$"):
        old_scale(2.0, factor=3.0, times=3.0)


def _reads_a_retired_attribute() -> None:
    retired_attribute("Thing.old_name", "Thing.new_name")


def _imports_a_retired_module() -> None:
    retired_module("hintpipe.old_home", "hintpipe.new_home")


def test_a_retired_attribute_or_module_says_its_new_name_at_the_callers_line() -> None:
    with pytest.warns(DeprecationWarning, match=r"^Thing\.old_name is now Thing\.new_name$") as caught:
        _reads_a_retired_attribute()  # stands for a property's getter: the warning points past it, here
        line = sys._getframe().f_lineno - 1
    assert [(w.filename, w.lineno) for w in raised_here(caught)] == [(__file__, line)]
    with pytest.warns(DeprecationWarning, match=r"^hintpipe\.old_home is now hintpipe\.new_home$"):
        _imports_a_retired_module()

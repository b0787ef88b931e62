"""Keywords, attributes and modules renamed in 0.7, still taken for a release (CHANGELOG: "Renamed").

A retired keyword works as its new name does, with a ``DeprecationWarning`` that says
``"<where>(<old>=...) is now <where>(<new>=...)"``; giving both is a ``TypeError``.

This module is torch-free.
"""

from __future__ import annotations

import functools
import warnings
from collections.abc import Callable
from typing import Any, TypeVar, cast

F = TypeVar("F", bound=Callable[..., Any])

#: The release that drops the names retired in 0.7 (what the command line's warnings say).
REMOVED_IN = "0.8"


def renamed(where: str, **new_of_old: str) -> Callable[[F], F]:
    """A decorator: ``fn(old=...)`` is ``fn(new=...)`` for each ``old="new"`` given, with a warning naming
    both as ``where`` is called (``"Simulator.run"``, ``"Hint"``)."""

    def wrap(fn: F) -> F:
        @functools.wraps(fn)
        def call(*args: Any, **kwargs: Any) -> Any:
            for old, new in new_of_old.items():
                if old in kwargs:
                    if new in kwargs:
                        raise TypeError(f"{where}() takes {new}= (before 0.7: {old}=), not both")
                    warnings.warn(f"{where}({old}=...) is now {where}({new}=...)", DeprecationWarning, stacklevel=2)
                    kwargs[new] = kwargs.pop(old)
            return fn(*args, **kwargs)

        return cast(F, call)

    return wrap


def retired_attribute(old: str, new: str) -> None:
    """Warn that attribute ``old`` (``"Hint.num_microbatches"``) is now ``new``."""
    warnings.warn(f"{old} is now {new}", DeprecationWarning, stacklevel=3)


def retired_module(old: str, new: str) -> None:
    """Warn, as module ``old`` (``"hintpipe.scoreboard"``) is imported, that it is now ``new``: called from
    the body of the old module, kept for a release as a shim that re-exports the new one's names."""
    warnings.warn(f"{old} is now {new}", DeprecationWarning, stacklevel=3)

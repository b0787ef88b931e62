"""The colon-spec grammar shared by ``--variability``, ``--inject`` and ``--seq-len-dist``.

A spec is ``WORD:ARG[:ARG...]``. One word means one thing wherever it is
accepted: the simulator and the runtime parse the variability words with the
same function (:func:`hintpipe.dispatch.variability.parse_variability`). Times are
written with a unit (``2ms``, ``150us``, ``0.1s``); a bare number is in the
simulator's cost units.

This module is torch-free.
"""

from __future__ import annotations

import dataclasses
import math
import re


class SpecError(ValueError):
    """A spec that cannot be parsed: the message names the spec and what is wrong."""


@dataclasses.dataclass(frozen=True)
class Spec:
    """A spec split into its word and arguments, with the text for messages."""

    text: str
    word: str
    args: tuple[str, ...]

    @classmethod
    def split(cls, text: str) -> Spec:
        word, _, rest = text.strip().partition(":")
        return cls(text, word, tuple(rest.split(":")) if rest else ())

    def fail(self, what: str, kind: str = "spec") -> SpecError:
        return SpecError(f"bad {kind} {self.text!r}: {what}")

    def expect(self, counts: tuple[int, ...], usage: str, kind: str = "spec") -> None:
        """Refuse a wrong number of arguments, naming the expected form."""
        if len(self.args) not in counts:
            raise self.fail(f"expected {usage}", kind)

    def number(self, index: int, name: str, *, minimum: float = 0.0, kind: str = "spec") -> float:
        """Argument ``index`` as a finite number >= ``minimum``."""
        text = self.args[index]
        try:
            value = float(text)
        except ValueError:
            raise self.fail(f"{name} {text!r} is not a number", kind) from None
        if not math.isfinite(value) or value < minimum:
            raise self.fail(f"{name} must be a finite number >= {minimum:g}, got {text!r}", kind)
        return value

    def integer(self, index: int, name: str, *, minimum: int = 0, kind: str = "spec") -> int:
        """Argument ``index`` as an integer >= ``minimum``."""
        text = self.args[index]
        if not re.fullmatch(r"\d+", text) or int(text) < minimum:
            raise self.fail(f"{name} {text!r} is not an integer >= {minimum}", kind)
        return int(text)


_TIME = re.compile(r"([0-9]*\.?[0-9]+(?:[eE][+-]?[0-9]+)?)(us|ms|s)?")
_SECONDS = {"us": 1e-6, "ms": 1e-3, "s": 1.0}


def quantity(spec: Spec, index: int, name: str, kind: str = "spec") -> tuple[float, bool]:
    """Argument ``index`` as ``(value, is_time)``: seconds when it carries a unit
    (``2ms``), cost units when it is a bare number."""
    text = spec.args[index]
    match = _TIME.fullmatch(text)
    if match is None:
        raise spec.fail(f"{name} {text!r} is not a number or a time such as 2ms", kind)
    value = float(match.group(1))
    if not math.isfinite(value):
        raise spec.fail(f"{name} must be finite, got {text!r}", kind)
    unit = match.group(2)
    return (value * _SECONDS[unit], True) if unit else (value, False)
